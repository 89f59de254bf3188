"""The seccomp filter every bwrap sandbox process runs under (built with libseccomp).

The filter allows by default and makes the calls in `DENIED` fail with EPERM: the
system calls a sandboxed Python interpreter never needs and that widen the kernel's
attack surface or reach outside the sandbox (tracing other processes, mounting, new
namespaces, BPF programs, the kernel keyring, perf counters, kernel modules, io_uring,
userfaultfd, reading other processes' memory, handle-based opens that bypass paths,
TIOCSTI keystroke injection). ``clone`` with any namespace flag is denied too, and
``clone3`` answers ENOSYS so that libc falls back to the filtered ``clone``. Calls made
through another architecture's ABI (``int 0x80``) kill the process (libseccomp's
default for a foreign architecture).

libseccomp is reached through ctypes (``libseccomp.so.2``, in Debian's ``libseccomp2``,
installed wherever systemd is), so no Python package is needed; without it
`filter_fd` returns None and the isolation report says ``seccomp: false``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import logging
import os

log = logging.getLogger(__name__)

#: system calls that fail with EPERM (names this kernel's libseccomp does not know are skipped)
DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "perf_event_open",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "vhangup",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "name_to_handle_at",
    "lookup_dcookie",
    "fanotify_init",
    "uselib",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "nfsservctl",
)

_ALLOW = 0x7FFF0000
_CLONE_NS = (
    0x00020000
    | 0x02000000
    | 0x04000000
    | 0x08000000
    | 0x10000000
    | 0x20000000
    | 0x40000000
    | 0x00000080
)
_TIOCSTI = 0x5412
_SCMP_CMP_MASKED_EQ = 7
_SCMP_FLTATR_CTL_OPTIMIZE = 8


class _Cmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_Cmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    return lib


def _rule(lib: ctypes.CDLL, ctx: int, action: int, name: str, *cmps: _Cmp) -> bool:
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    if nr < 0:
        return False
    arr = (_Cmp * len(cmps))(*cmps) if cmps else None
    return lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr) == 0


@functools.lru_cache(maxsize=1)
def program() -> bytes | None:
    """The compiled BPF program (what bwrap --seccomp reads), or None without libseccomp."""
    lib = _lib()
    if lib is None:
        return None
    ctx = lib.seccomp_init(_ALLOW)
    if not ctx:
        return None
    try:
        # a binary tree of syscall numbers instead of a linear list: every allowed call (the
        # interpreter's hot path) pays log(rules) comparisons (libseccomp >= 2.5; else linear)
        lib.seccomp_attr_set(ctx, _SCMP_FLTATR_CTL_OPTIMIZE, 2)
        denied = [n for n in DENIED if _rule(lib, ctx, _errno(errno.EPERM), n)]
        for bit in range(32):  # any single namespace bit set is enough to refuse
            if _CLONE_NS & (1 << bit):
                _rule(
                    lib,
                    ctx,
                    _errno(errno.EPERM),
                    "clone",
                    _Cmp(0, _SCMP_CMP_MASKED_EQ, 1 << bit, 1 << bit),
                )
        _rule(lib, ctx, _errno(errno.ENOSYS), "clone3")
        _rule(
            lib,
            ctx,
            _errno(errno.EPERM),
            "ioctl",
            _Cmp(1, _SCMP_CMP_MASKED_EQ, 0xFFFFFFFF, _TIOCSTI),
        )
        read, write = os.pipe()
        try:
            if lib.seccomp_export_bpf(ctx, write) != 0:
                return None
            os.close(write)
            write = -1
            chunks = []
            while chunk := os.read(read, 1 << 16):
                chunks.append(chunk)
        finally:
            os.close(read)
            if write >= 0:
                os.close(write)
        log.debug("seccomp filter denies %d system calls", len(denied))
        return b"".join(chunks)
    finally:
        lib.seccomp_release(ctx)


def filter_fd() -> int | None:
    """A fresh readable descriptor holding the program (bwrap reads it to the end)."""
    prog = program()
    if prog is None:
        return None
    fd = os.memfd_create("trace-gym-seccomp", 0)
    os.write(fd, prog)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
