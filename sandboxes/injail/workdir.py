"""The jail's scratch dirs and its work dir: path-guarded file access (uploads, downloads, a request's files) and
the wipe between executions.

`configure` runs once, in the zygote before any fork. A persistent session's earlier code may have planted
symlinks, FIFOs or directories at the paths a transfer names: nothing here follows a symlink (`open_in_work`),
only regular files are read or written, and `put`/`get` answer an error, never raise.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import stat

SCRATCH = ("/tmp", "/dev/shm")
WORK = "/tmp/work"
GET_MAX_BYTES = 48 << 20  # a download's bytes, base64-encoded, must fit in one frame (frames.MAX_FRAME_BYTES)
_modes: dict[str, int] = {}


def configure(scratch: list[str] | None) -> str:
    """Set the scratch dirs (the first holds the work dir) and remember what the wipe restores: the jail's uid
    owns these mounts, so a snippet can chmod them or tag them. Returns the work dir."""
    global SCRATCH, WORK
    SCRATCH = tuple(scratch or SCRATCH)
    WORK = os.path.join(SCRATCH[0], "work")
    _modes.update({top: os.stat(top).st_mode & 0o7777 for top in SCRATCH if os.path.isdir(top)})
    return WORK


def put(request: dict) -> dict:
    """Write a request's `files` ({relative path: base64}) into the work dir; the reply names what failed."""
    make_work()
    try:
        write_files(request.get("files", {}))
    except (OSError, ValueError) as exc:
        return {"error": f"cannot write {sorted(request.get('files', {}))}: {exc}"}
    return {"ok": True}


def get(request: dict) -> dict:
    """Read back one regular file of the work dir (base64), at most `max_bytes` (and one frame's worth)."""
    limit = min(request.get("max_bytes", GET_MAX_BYTES), GET_MAX_BYTES)
    try:
        with os.fdopen(open_in_work(request["path"], os.O_RDONLY), "rb") as handle:
            data = handle.read(limit + 1)
    except (OSError, ValueError) as exc:
        return {"error": f"cannot read {request['path']!r}: {exc}"}
    if len(data) > limit:
        return {"error": f"{request['path']!r} is larger than {limit} bytes, the most one download carries"}
    return {"data": base64.b64encode(data).decode()}


def write_files(files: dict) -> None:
    for rel, data in files.items():
        with os.fdopen(open_in_work(rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as handle:
            handle.write(base64.b64decode(data))


def open_in_work(rel: str, flags: int) -> int:
    """Open the regular file `rel` under the work dir without following a symlink on the way; with O_CREAT,
    missing directories are made. Raises OSError (a symlink: ELOOP or ENOTDIR; a FIFO: ENXIO; not a regular
    file: EINVAL) or ValueError (a path that leaves the work dir)."""
    parts = inside_work(rel)[len(WORK) + 1 :].split("/")
    fd = os.open(WORK, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            if flags & os.O_CREAT:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        # O_NONBLOCK: opening a FIFO never waits for its other end
        target = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(target).st_mode):
        os.close(target)
        raise OSError(errno.EINVAL, f"{rel!r} is not a regular file")
    os.set_blocking(target, True)
    return target


def inside_work(rel: str) -> str:
    """The absolute path of `rel` in the work dir; ValueError for one that leaves it (`..`, an absolute path)."""
    path = os.path.normpath(os.path.join(WORK, rel))
    if not path.startswith(WORK + "/"):
        raise ValueError(f"path {rel!r} leaves the work directory")
    return path


def make_work() -> None:
    """An empty work dir for the next spare (the cwd it runs code in), unless one is there."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(WORK)


def wipe() -> None:
    """Empty the scratch dirs (the work dir with them) and restore the mounts' own mode and xattrs, then re-make
    the work dir. Runs when every process of the jail but the zygote is dead."""
    for top, mode in _modes.items():
        with contextlib.suppress(OSError):  # where the jail's uid owns the mount (not in a container)
            os.chmod(top, mode)  # first: a read-only /tmp would keep its entries
            for name in os.listxattr(top):
                os.removexattr(top, name)
    for top in SCRATCH:
        try:
            entries = list(os.scandir(top))  # no os.path calls per entry: fewer pages written each run
        except OSError:
            continue
        for entry in entries:  # the work dir too: its mode, times or xattrs must not reach the next run
            try:
                os.rmdir(entry.path)  # an empty directory (the work dir, usually): one system call
            except OSError:
                _remove(entry.path)
    make_work()


def _remove(path: str) -> None:
    """Delete a file or a whole tree, even one whose directories a snippet made unreadable. By path
    (no shutil: its import maps bz2 and lzma into every fork), which is safe here: the jail's
    processes are all dead by now, none can swap a directory for a symlink under us."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            for root, dirs, _ in os.walk(path):
                for d in dirs:
                    entry = os.path.join(root, d)
                    if not os.path.islink(entry):  # chmod would follow it out of the tree
                        with contextlib.suppress(OSError):
                            os.chmod(entry, 0o700)
            for root, dirs, files in os.walk(path, topdown=False):
                for name in files:
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(root, name))
                for name in dirs:  # a symlink to a directory is listed here too
                    entry = os.path.join(root, name)
                    with contextlib.suppress(OSError):
                        if os.path.islink(entry):
                            os.unlink(entry)
                        else:
                            os.rmdir(entry)
            os.rmdir(path)
        else:
            os.unlink(path)
    except OSError:
        pass
