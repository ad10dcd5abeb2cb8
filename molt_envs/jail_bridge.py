"""Runs inside a sandbox jail (stdlib only, on the jail's ``python3 -I``): the harness's way to its session.

``python3 -I -c <this source> '<json>'`` with ``{"socket", "port", "argv", "env", "cwd", "log_dir"}``: listens on
``127.0.0.1:port`` of the jail's own network namespace (a loopback device and nothing else), forwards every
connection byte for byte to the session server's unix socket (bound read-only into the jail), runs ``argv`` with
``env`` added to the jail's environment, its output into ``log_dir``, and exits with its exit code after printing
one JSON line: ``{"exit_code", "stdout_tail", "stderr_tail"}``. So a harness that only speaks HTTP over TCP (Codex,
Claude Code) reaches its session and nothing else.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading

TAIL_BYTES = 4096


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                end.shutdown(how)


def _forward(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(os.path.getsize(path) - TAIL_BYTES, 0))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def main(config: dict) -> int:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", config["port"]))
    listener.listen(64)
    threading.Thread(target=_forward, args=(listener, config["socket"]), daemon=True).start()
    os.makedirs(config["log_dir"], exist_ok=True)
    out, err = (os.path.join(config["log_dir"], name) for name in ("stdout", "stderr"))
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        try:
            code = subprocess.call(
                config["argv"],
                env={**os.environ, **config["env"]},
                cwd=config["cwd"],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
            )
        except OSError as exc:
            stderr.write(f"cannot start {config['argv'][0]!r}: {exc}\n".encode())
            code = 127
    print(json.dumps({"exit_code": code, "stdout_tail": _tail(out), "stderr_tail": _tail(err)}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
