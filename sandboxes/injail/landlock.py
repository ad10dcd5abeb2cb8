"""Landlock through raw syscalls (ctypes): ABI query, a read-only file system with writable
scratch dirs and no TCP, and signal/abstract-unix scoping. Stdlib-only: it runs inside the jail.
"""

from __future__ import annotations

import ctypes
import os
import struct

_NR_CREATE_RULESET, _NR_ADD_RULE, _NR_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_BITS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_FS_ALL_ABI5 = (1 << 16) - 1
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2
READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is absent or disabled."""
    version = _libc.syscall(_NR_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def _fs_bits(version: int) -> int:
    return _FS_BITS_BY_ABI.get(version, _FS_ALL_ABI5)


def _create(fs: int, net: int, scoped: int, version: int) -> int:
    if version >= 6:
        attr = struct.pack("=QQQ", fs, net, scoped)
    elif version >= 4:
        attr = struct.pack("=QQ", fs, net)
    else:
        attr = struct.pack("=Q", fs)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _libc.syscall(_NR_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    return int(fd)


def _allow(ruleset_fd: int, path: str, access: int) -> None:
    dir_fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        attr = ctypes.create_string_buffer(struct.pack("=Qi", access, dir_fd), 12)
        if (
            _libc.syscall(
                _NR_ADD_RULE, ctypes.c_int(ruleset_fd), ctypes.c_int(_RULE_PATH_BENEATH), attr, ctypes.c_uint32(0)
            )
            != 0
        ):
            raise OSError(ctypes.get_errno(), f"landlock_add_rule({path!r}) failed")
    finally:
        os.close(dir_fd)


def restrict_self(ruleset_fd: int) -> None:
    """Enter the ruleset's domain (needs no_new_privs); nested calls stack domains."""
    # Plain ints (int-sized varargs, as c_int/c_uint32 would be): no ctypes objects to build in every spare.
    if _libc.syscall(_NR_RESTRICT_SELF, ruleset_fd, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")


def filesystem_ruleset(version: int, writable: list[str], readable: list[str]) -> int:
    """Everything read-only below `readable`, full access below `writable`; TCP denied (ABI >= 4) unless the
    zygote's environment says SANDBOX_NETWORK=loopback (a network namespace with only a loopback device)."""
    fs = _fs_bits(version)
    loopback = os.environ.get("SANDBOX_NETWORK") == "loopback"
    net = NET_BIND_TCP | NET_CONNECT_TCP if version >= 4 and not loopback else 0
    fd = _create(fs, net, 0, version)
    for path in readable:
        if os.path.exists(path):
            _allow(fd, path, READ_ONLY & fs)
    for path in writable:
        if os.path.exists(path):
            _allow(fd, path, fs)
    return fd


def scope_ruleset(version: int) -> int | None:
    """A rule set that only forbids signalling and abstract-unix connects outside the domain (ABI >= 6)."""
    if version < 6:
        return None
    return _create(0, 0, SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET, version)
