"""A seccomp-BPF deny-list filter built with ctypes, no libseccomp needed.

Default-allow; denies (EPERM) the syscalls a jailed snippet never needs and that widen the kernel
attack surface: ptrace, mount family, namespaces, bpf, perf, keyrings, io_uring, module/kexec, SysV IPC
(its objects would outlive the execution in the worker's IPC namespace, and their memory stays charged to it),
non-AF_UNIX sockets (AF_INET/AF_INET6 too when the zygote's environment says SANDBOX_NETWORK=loopback: the
jail then has a network namespace of its own with only a loopback device), and the TIOCSTI/TIOCLINUX terminal-injection ioctls (the ioctl command is
compared on its low 32 bits, which is what the kernel uses, so the CVE-2019-10063 high-bit trick
does not pass). clone3 answers ENOSYS so libc falls back to clone, whose flags we can inspect.
x86_64 only; `supported()` says so elsewhere. Stdlib-only: it is loaded inside the jail.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000

# x86_64 syscall numbers
_DENY_X86_64 = {
    "shmget": 29,
    "semget": 64,
    "msgget": 68,
    "ptrace": 101,
    "syslog": 103,
    "personality": 135,
    "vhangup": 153,
    "modify_ldt": 154,
    "pivot_root": 155,
    "adjtimex": 159,
    "chroot": 161,
    "acct": 163,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "lookup_dcookie": 212,
    "clock_settime": 227,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "clock_adjtime": 305,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
}
_NR_IOCTL, _NR_SOCKET, _NR_CLONE, _NR_CLONE3 = 16, 41, 56, 435
_AF_UNIX, _AF_INET, _AF_INET6 = 1, 2, 10
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_CLONE_NAMESPACE_FLAGS = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_OFF_NR, _OFF_ARCH = 0, 4


def _arg_low(i: int) -> int:
    return 16 + 8 * i  # low 32 bits of args[i] on little-endian


def supported() -> bool:
    return platform.machine() == "x86_64"


def _program(loopback: bool = False) -> list[tuple[int, int, int, int]]:
    """Assemble the filter; jumps name labels that are resolved to offsets at the end."""
    code: list[tuple] = []

    def op(c, k, jt=None, jf=None):
        code.append((c, k, jt, jf))

    op(_LD_W_ABS, _OFF_ARCH)
    op(_JEQ_K, AUDIT_ARCH_X86_64, None, "kill")
    op(_LD_W_ABS, _OFF_NR)
    op(_JGE_K, _X32_SYSCALL_BIT, "deny", None)
    for nr in sorted(_DENY_X86_64.values()):
        op(_JEQ_K, nr, "deny", None)
    op(_JEQ_K, _NR_CLONE3, "enosys", None)
    op(_JEQ_K, _NR_SOCKET, "socket", None)
    op(_JEQ_K, _NR_IOCTL, "ioctl", None)
    op(_JEQ_K, _NR_CLONE, "clone", None)
    op(_RET_K, _RET_ALLOW)
    labels = {"socket": len(code)}
    op(_LD_W_ABS, _arg_low(0))
    if loopback:
        op(_JEQ_K, _AF_INET, "allow", None)
        op(_JEQ_K, _AF_INET6, "allow", None)
    op(_JEQ_K, _AF_UNIX, "allow", "deny")
    labels["ioctl"] = len(code)
    op(_LD_W_ABS, _arg_low(1))
    op(_JEQ_K, _TIOCSTI, "deny", None)
    op(_JEQ_K, _TIOCLINUX, "deny", "allow")
    labels["clone"] = len(code)
    op(_LD_W_ABS, _arg_low(0))
    op(_JSET_K, _CLONE_NAMESPACE_FLAGS, "deny", "allow")
    labels["allow"] = len(code)
    op(_RET_K, _RET_ALLOW)
    labels["deny"] = len(code)
    op(_RET_K, _RET_ERRNO | errno.EPERM)
    labels["enosys"] = len(code)
    op(_RET_K, _RET_ERRNO | errno.ENOSYS)
    labels["kill"] = len(code)
    op(_RET_K, _RET_KILL_PROCESS)

    resolved = []
    for i, (c, k, jt, jf) in enumerate(code):
        offsets = [0 if j is None else labels[j] - (i + 1) for j in (jt, jf)]
        if any(not 0 <= o < 256 for o in offsets):
            raise AssertionError(f"seccomp jump out of range at instruction {i}")
        resolved.append((c, offsets[0], offsets[1], k))
    return resolved


def install() -> None:
    """Load the filter into the calling process (inherited by every later child). Needs no_new_privs."""
    if not supported():
        raise OSError(f"seccomp filter is only built for x86_64, not {platform.machine()}")
    prog = _program(loopback=os.environ.get("SANDBOX_NETWORK") == "loopback")
    raw = b"".join(struct.pack("=HBBI", c, jt, jf, k) for c, jt, jf, k in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
