"""The `docker` provider: long-lived hardened containers, each running the same warm zygote as the
local jail, spoken to over the container's attach stream (length-prefixed JSON frames).

Containers: no network, read-only root, tmpfs /tmp and /dev/shm, all capabilities dropped,
no-new-privileges, pids/memory/CPU limits, uid 65534, an init process. The image is built locally
(`docker import` of a minimal rootfs made from this host's /usr/bin/python3 and its stdlib), so no
registry is ever contacted. Containers carry labels; ones left by a dead owner are removed at start-up.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import select
import shutil
import socket
import struct
import subprocess
import tarfile
import tempfile
import time

from sandboxes import jail, owner
from sandboxes.errors import SandboxUnavailable, WorkerDied
from sandboxes.limits import Limits
from sandboxes.pool import PoolBackend, WorkerPool
from sandboxes.worker import Worker

LABEL = "molt.sandboxes"
OWNER_LABEL = "molt.sandboxes.owner"
IMAGE_REPOSITORY = "molt-sandbox"
PYTHON = "/usr/bin/python3"
TOOLS = ("sh", "ls", "cat", "env", "wc", "sleep", "yes", "id", "true", "echo", "head")


def _owner() -> str:
    """This process as a container's owner: ``<host>:<owner tag>`` (see `sandboxes.owner`)."""
    return f"{socket.gethostname()}:{owner.tag()}"


def _client():
    try:
        import docker
    except ImportError:
        raise SandboxUnavailable("the docker provider needs the docker SDK: pip install docker") from None
    try:
        client = docker.from_env(timeout=30)
        client.ping()
        return client
    except Exception as exc:  # the SDK raises many unrelated types when no engine answers
        raise SandboxUnavailable(
            f"no Docker engine answered ({exc}). Start one, e.g. "
            "`dockerd --bridge=none --iptables=false --ip6tables=false --ip-masq=false`, or use provider='local'"
        ) from None


# ---- image ------------------------------------------------------------------------------------


def _libraries(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    found = set()
    for line in out.splitlines():
        parts = line.split()
        for part in parts:
            if part.startswith("/"):
                found.add(part)
    return found


def _copy_not_link(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """A tar filter for files archived under their host path: a file with more hard links than one (perf's ~/.debug
    cache links libc, say) goes in as a copy. As a hard-link entry its target could be a path through the image's
    ``lib -> usr/lib`` symlink, which docker's import refuses."""
    if info.islnk():
        info.type, info.linkname, info.size = tarfile.REGTYPE, "", os.stat("/" + info.name).st_size
    return info


def image_tag() -> str:
    """Content-addressed: the zygote's code and the interpreter it wraps."""
    digest = hashlib.sha256()
    for name in jail.IN_JAIL_MODULES:
        with open(os.path.join(jail.IN_JAIL_DIR, name), "rb") as handle:
            digest.update(handle.read())
    digest.update(os.path.realpath(PYTHON).encode() + str(os.stat(PYTHON).st_mtime).encode())
    return f"{IMAGE_REPOSITORY}:{digest.hexdigest()[:16]}"


def ensure_image(client) -> str:
    tag = image_tag()
    with contextlib.suppress(Exception):
        client.images.get(tag)
        return tag
    python = os.path.realpath(PYTHON)
    stdlib = f"/usr/lib/python{os.path.basename(python).removeprefix('python')}"
    binaries = [python] + [p for p in (shutil.which(t, path="/usr/bin:/bin") for t in TOOLS) if p]
    dynload = os.path.join(stdlib, "lib-dynload")
    extensions = [os.path.join(dynload, n) for n in os.listdir(dynload)] if os.path.isdir(dynload) else []
    files = set()
    for binary in binaries + extensions:
        if binary in binaries:
            files.add(os.path.realpath(binary))
        files |= {os.path.realpath(lib) for lib in _libraries(binary)} | _libraries(binary)
    with tempfile.NamedTemporaryFile(prefix="sandboxes-rootfs-", suffix=".tar") as handle:
        with tarfile.open(fileobj=handle, mode="w") as tar:
            for name in ("tmp", "proc", "dev", "sys", "etc", "opt/sandboxes", "usr/bin", "usr/lib", "usr/lib64"):
                info = tarfile.TarInfo(name)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
                tar.addfile(info)
            for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/bin")):
                info = tarfile.TarInfo(link)
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
            for path in sorted(files):
                tar.add(path, arcname=path.lstrip("/"), recursive=False, filter=_copy_not_link)
            for binary in binaries:
                if os.path.islink(binary) or binary != os.path.realpath(binary):
                    info = tarfile.TarInfo(binary.lstrip("/"))
                    info.type, info.linkname = tarfile.SYMTYPE, os.path.realpath(binary)
                    tar.addfile(info)
            info = tarfile.TarInfo("usr/bin/python3")
            info.type, info.linkname = tarfile.SYMTYPE, python
            tar.addfile(info)
            tar.add(
                stdlib,
                arcname=stdlib.lstrip("/"),
                filter=lambda t: None if "/test/" in t.name or t.name.endswith("/test") else _copy_not_link(t),
            )
            for name in jail.IN_JAIL_MODULES:
                tar.add(os.path.join(jail.IN_JAIL_DIR, name), arcname=f"opt/sandboxes/{name}")
            passwd = b"root:x:0:0::/:/bin/sh\nnobody:x:65534:65534::/tmp:/bin/sh\n"
            info = tarfile.TarInfo("etc/passwd")
            info.size = len(passwd)
            tar.addfile(info, io.BytesIO(passwd))
        handle.flush()
        repository, _, version = tag.partition(":")
        client.api.import_image_from_file(handle.name, repository=repository, tag=version)
    for image in client.images.list(name=IMAGE_REPOSITORY):  # images of older zygote code
        for old in image.tags:
            if old != tag:
                with contextlib.suppress(Exception):  # still used by some container: keep it
                    client.images.remove(old)
    return tag


def reap_orphans(client) -> int:
    """Remove sandbox containers whose owning process (on this host) is gone: by its pid and start time, so a
    reused pid does not keep them (a container outlives its owner's SIGKILL: nothing signals the engine)."""
    removed = 0
    host = socket.gethostname()
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        owner_host, _, owner_tag = container.labels.get(OWNER_LABEL, "").partition(":")
        if owner_host == host and owner.gone(owner_tag):
            with contextlib.suppress(Exception):
                container.remove(force=True)
                removed += 1
    return removed


# ---- worker -----------------------------------------------------------------------------------


class DockerWorker(Worker):
    """One hardened container running the zygote; the channel is its attach stream."""

    provider = "docker"

    def __init__(self, client, image: str, config: dict, limits: Limits) -> None:
        super().__init__()
        self._buffer = bytearray()
        self._eof = False
        memory = f"{limits.memory_mb + limits.cgroup_headroom_mb}m"
        self.container = client.containers.create(
            image,
            command=[PYTHON, "-I", "-S", "/opt/sandboxes/zygote.py", __import__("json").dumps(config)],
            stdin_open=True,
            tty=False,
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": f"size={jail.TMPFS_MB}m,mode=1777", "/dev/shm": "size=64m,mode=1777"},
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=limits.processes + 16,
            mem_limit=memory,
            memswap_limit=memory,
            nano_cpus=1_000_000_000,
            user="65534:65534",
            init=True,
            environment=jail.JAIL_ENV,
            working_dir="/tmp",
            hostname="sandbox",
            labels={LABEL: "1", OWNER_LABEL: _owner()},
        )
        try:
            self._socket = self.container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            self._raw = getattr(self._socket, "_sock", self._socket)
            self.container.start()
            self.handshake()
        except BaseException:
            self.close()
            raise

    def _send(self, data: bytes, deadline: float) -> None:
        self._raw.sendall(data)

    def _fill(self, deadline: float) -> None:
        """Read one multiplexed chunk ([stream, 0, 0, 0, size] + payload); keep only stdout."""
        header = self._read_raw(8, deadline)
        kind, size = header[0], struct.unpack(">I", header[4:])[0]
        payload = self._read_raw(size, deadline)
        if kind == 1:
            self._buffer += payload

    def _read_raw(self, n: int, deadline: float) -> bytes:
        chunks, need = [], n
        while need:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerDied("no reply within the deadline")
            waiter = select.poll()  # not select: many sessions' descriptors go past its 1,024
            waiter.register(self._raw, select.POLLIN)
            if not waiter.poll(remaining * 1000):
                continue
            chunk = self._raw.recv(need)
            if not chunk:
                self._eof = True
                raise WorkerDied("container stream closed")
            chunks.append(chunk)
            need -= len(chunk)
        return b"".join(chunks)

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        while len(self._buffer) < n:
            self._fill(deadline)
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def _alive(self) -> bool:
        return not self._eof

    def _kill(self) -> None:
        self._eof = True
        with contextlib.suppress(Exception):
            self.container.kill()

    def close(self) -> None:
        self._eof = True
        with contextlib.suppress(Exception):
            self._socket.close()
        with contextlib.suppress(Exception):
            self.container.remove(force=True)


class DockerBackend(PoolBackend):
    """`sandboxes.open("docker", workers=2, ...)`."""

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        workers: int | None = None,
        preload: tuple[str, ...] = (),
        recycle_after: int = 500,
    ) -> None:
        client = _client()
        reap_orphans(client)
        image = ensure_image(client)
        limits = limits or Limits()

        def factory(slot: int, persistent: bool) -> DockerWorker:
            config = jail.zygote_config(list(preload), [], persistent)
            return DockerWorker(client, image, config, limits)

        super().__init__(WorkerPool("docker", factory, workers or os.cpu_count() or 1, recycle_after=recycle_after))
        self.client = client
        self.image = image

    def close(self) -> None:
        super().close()
        with contextlib.suppress(Exception):
            for container in self.client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={_owner()}"}):
                container.remove(force=True)
        with contextlib.suppress(Exception):
            self.client.close()
