"""The local jail's ``network="loopback"`` and ``binds=``: TCP between the jail's own programs and a bound unix socket
to one host service, and still nothing else: not the host's loopback, not the internet; binds are read-only."""

from __future__ import annotations

import os
import socket
import tempfile
import textwrap

import pytest

import sandboxes

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(bool(sandboxes.probe().local_missing), reason="local isolation unavailable on this host"),
]

PROBE = textwrap.dedent(
    """
    import socket, threading
    out = []
    server = socket.socket(); server.bind(("127.0.0.1", 9000)); server.listen(1)  # the jail's own loopback
    threading.Thread(target=lambda: server.accept()[0].sendall(b"inside"), daemon=True).start()
    client = socket.create_connection(("127.0.0.1", 9000)); out.append(client.recv(16).decode())
    for addr in (("127.0.0.1", HOST_PORT), ("1.1.1.1", 53)):
        try:
            socket.create_connection(addr, timeout=2); out.append("reached")
        except OSError as exc:
            out.append(type(exc).__name__)
    unix = socket.socket(socket.AF_UNIX); unix.connect("/run/host/service.sock"); out.append(unix.recv(16).decode())
    try:
        open("/run/host/planted", "w"); out.append("wrote")
    except OSError as exc:
        out.append(type(exc).__name__)
    print(" ".join(out))
    """
)


async def test_loopback_jail_reaches_its_own_loopback_and_the_bound_socket_only():
    host_tcp = socket.socket()
    host_tcp.bind(("127.0.0.1", 0))
    host_tcp.listen(1)
    directory = tempfile.mkdtemp()
    os.chmod(directory, 0o755)
    path = os.path.join(directory, "service.sock")
    service = socket.socket(socket.AF_UNIX)
    service.bind(path)
    os.chmod(path, 0o666)
    service.listen(1)
    service.setblocking(False)
    import asyncio

    async def answer():
        loop = asyncio.get_running_loop()
        conn, _ = await loop.sock_accept(service)
        await loop.sock_sendall(conn, b"host")
        conn.close()

    task = asyncio.ensure_future(answer())
    code = PROBE.replace("HOST_PORT", str(host_tcp.getsockname()[1]))
    try:
        async with sandboxes.open("local", network="loopback", binds=((directory, "/run/host"),), workers=1) as sb:
            result = await sb.run_python(code)
        await task
    finally:
        host_tcp.close()
        service.close()
        os.unlink(path)
        os.rmdir(directory)
    assert result.status == "ok", result.stderr
    inside, host_loopback, internet, unix, write = result.stdout.split()
    assert inside == "inside" and unix == "host"
    assert host_loopback == "ConnectionRefusedError"  # the jail's 127.0.0.1 is not the host's
    assert internet in ("OSError", "TimeoutError")  # network unreachable: the namespace has no route
    assert write == "OSError"  # read-only bind
    assert not os.path.exists(os.path.join(directory, "planted"))


async def test_without_network_the_jail_still_gets_no_inet_socket():
    async with sandboxes.open("local", workers=1) as sb:
        result = await sb.run_python(
            "import socket\ntry:\n    socket.socket()\nexcept OSError as e:\n    print(e.errno)"
        )
    assert result.stdout.strip() == "1"  # EPERM from the seccomp filter, as before


def test_bad_network_and_binds_are_refused_naming_them():
    with pytest.raises(ValueError, match="network='wifi'"):
        sandboxes.local.make_pool(network="wifi")
    with pytest.raises(ValueError, match="binds entry"):
        sandboxes.local.make_pool(binds=(("/nonexistent-dir", "/x"),))


async def test_loopback_jails_do_not_reach_each_others_ports():
    """Two episodes' jails at once (one pool, as two harness episodes run): each has its own loopback, so a port one
    jail listens on (a harness's bridge to its session) is not there for the other."""
    listen = textwrap.dedent(
        """
        import socket, threading
        server = socket.socket(); server.bind(("127.0.0.1", 8080)); server.listen(4)
        def serve():
            while True:
                server.accept()[0].sendall(b"mine")
        threading.Thread(target=serve, daemon=True).start()
        """
    )
    connect = textwrap.dedent(
        """
        import socket
        try:
            print(socket.create_connection(("127.0.0.1", 8080), timeout=5).recv(16).decode())
        except OSError as exc:
            print(type(exc).__name__)
        """
    )
    first = sandboxes.open("local", network="loopback", persistent=True, workers=1)
    second = sandboxes.open("local", network="loopback", persistent=True, workers=1)
    async with first, second:
        listening = await first.run_python(listen)
        assert listening.status == "ok", listening.stderr
        other = await second.run_python(connect)
        own = await first.run_python(connect)  # the listener is still up in its own jail
    assert own.stdout.strip() == "mine", own.stderr
    assert other.stdout.strip() == "ConnectionRefusedError", other.stderr
