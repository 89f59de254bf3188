"""Process primitives of the math sandbox: channels, kernel-vouched pids, pidfds, membership.

The host never believes a pid that a sandbox process writes into a message. Every host
end of a channel sets ``SO_PASSCRED``, so the kernel attaches the sender's real pid
(translated into the host's PID namespace) to each message; that pid is turned into a
pidfd at once and accepted only if `Members` confirms the process belongs to this sandbox
(its own cgroup, or descent from the process the host itself spawned). Signals go through
that pidfd only, so a pid that is reused later, or one a cell made up, is never hit.

Nor does the host believe a message's bytes: a cell can find its interpreter's channel
(the socket is in its own process) and write anything into it. Every message is decoded
with a bounded size and nesting depth, without non-finite or float numbers, and checked
against the `Schema` the receiver expects (types, ranges, no unknown keys); anything else
raises `Malformed`, which the sandbox treats as a compromised interpreter.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_gym.errors import TraceGymError

_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33
BUF = 8 << 20
_UCRED = struct.Struct("iII")
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)
#: the largest message a sandbox process may send: a reply of 100,000 characters (the most
#: `max_output_chars` allows), every one escaped as a 12-byte surrogate pair, fits twice
MAX_MSG = 4 << 20
#: deepest nesting of any message (the isolation report is a dict inside a dict)
MAX_DEPTH = 2
#: characters of a cell's error (the worker cuts tracebacks to about 2,000)
ERROR_CHARS = 4000
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


class Malformed(TraceGymError, ValueError):
    """A message that breaks the protocol: its sender runs code the env did not ask for."""


class Schema:
    """What one kind of message may hold: a test per key, and which keys may be left out."""

    __slots__ = ("check", "fields", "keys", "required")

    def __init__(
        self,
        fields: dict[str, Callable[[Any], bool]],
        optional: frozenset[str] = frozenset(),
        check: Callable[[dict], bool] | None = None,
    ):
        self.fields, self.check = fields, check
        self.keys, self.required = frozenset(fields), frozenset(fields) - optional

    def matches(self, msg: dict) -> bool:
        keys = msg.keys()
        if not self.required <= keys or not keys <= self.keys:
            return False
        fields = self.fields
        if not all(fields[k](v) for k, v in msg.items()):
            return False
        # a test of the whole message (relations between fields), after the per-key ones
        return self.check is None or self.check(msg)


def integer(lo: int, hi: int) -> Callable[[Any], bool]:
    """A JSON integer in [lo, hi] (never a bool or a float)."""
    return lambda v: type(v) is int and lo <= v <= hi


def text(most: int, *, null: bool = False) -> Callable[[Any], bool]:
    """A string of at most `most` characters (or None when `null`)."""
    return lambda v: (null and v is None) or (type(v) is str and len(v) <= most)


def flag(v: Any) -> bool:
    return type(v) is bool


def _depth_over(data: bytes, most: int) -> bool:
    """Whether brackets outside strings nest deeper than `most` (a linear scan)."""
    depth = 0
    for m in _TOKENS.finditer(data):
        tok = m.group()
        if tok in (b"[", b"{"):
            depth += 1
            if depth > most:
                return True
        elif tok in (b"]", b"}"):
            depth -= 1
    return False


def _refuse_number(token: str) -> Any:
    raise Malformed(f"a number the protocol never sends: {token[:20]}")


_DECODER = json.JSONDecoder(parse_constant=_refuse_number, parse_float=_refuse_number)


def decode(data: bytes, schemas: tuple[Schema, ...]) -> dict:
    """The message in `data` if it fits one of `schemas`; else `Malformed`."""
    if len(data) > MAX_MSG:
        raise Malformed(f"a message of {len(data)} bytes")
    # fewer brackets than the depth allows cannot nest too deep: most replies skip the scan
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH and _depth_over(data, MAX_DEPTH):
        raise Malformed("a message nested too deep")
    try:
        msg = _DECODER.decode(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # Malformed is a ValueError too
        raise Malformed(f"not a protocol message: {str(e)[:100]}") from None
    if not isinstance(msg, dict) or not any(s.matches(msg) for s in schemas):
        raise Malformed(f"a message that fits no expected schema: {str(msg)[:200]}")
    return msg


#: the first message of every process: {"hello": true}, a snapshot adds whether it holds its files
HELLO = Schema({"hello": lambda v: v is True, "files": flag}, frozenset({"files"}))
#: the bootstrap's report of the namespaces it made
ISOLATION = Schema(
    {"isolation": lambda v: isinstance(v, dict) and len(v) <= 16 and all(map(flag, v.values()))}
)
#: a snapshot fork's acknowledgement
ACK = Schema({"ok": lambda v: v is True, "seq": integer(0, 1 << 62)})
#: an interpreter that found itself tampered with (its restored files, its limits) and will not run
REFUSED = Schema({"refused": text(500), "seq": integer(0, 1 << 62)})


@functools.lru_cache(maxsize=8)
def reply_schema(max_chars: int) -> Schema:
    """A cell's result: at most `max_chars` of output, the count of all of it, error, threads."""
    return Schema(
        {
            "output": text(max_chars),
            "total_chars": integer(0, 1 << 62),
            "error": text(ERROR_CHARS, null=True),
            "threads": integer(0, 1 << 20),
            "limit": lambda v: v is None or v == "cpu",
            "seq": integer(0, 1 << 62),
        },
        check=lambda m: m["total_chars"] >= len(m["output"]),
    )


def socketpair() -> tuple[socket.socket, socket.socket]:
    """A SOCK_SEQPACKET pair; the first (host) end receives the sender's credentials."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    for s in (a, b):
        for force, plain in (
            (_SO_SNDBUFFORCE, socket.SO_SNDBUF),
            (_SO_RCVBUFFORCE, socket.SO_RCVBUF),
        ):
            try:
                s.setsockopt(socket.SOL_SOCKET, force, BUF)
            except OSError:
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.SOL_SOCKET, plain, BUF)
    return a, b


def send(chan: socket.socket, msg: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(msg, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if fds:
        socket.send_fds(chan, [data], fds)
    else:
        chan.sendall(data)


_ANCILLARY = socket.CMSG_SPACE(_UCRED.size) + socket.CMSG_SPACE(64)
#: a receive buffer per thread for the usual (small) message; a bigger one gets its own
_SMALL = 64 << 10
_local = threading.local()
_PEEK_SIZE = int(socket.MSG_PEEK | socket.MSG_TRUNC)  # an int: or-ing the flags costs 5 us a call


def _receive(chan: socket.socket) -> tuple[bytes, list]:
    """One whole message and its ancillary data (the size peeked first: no 8 MiB buffer)."""
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = bytearray(_SMALL)
    size = chan.recv_into(buf, 1, _PEEK_SIZE)
    if size > _SMALL:
        data, anc, _flags, _addr = chan.recvmsg(min(size, BUF), _ANCILLARY)
        return data, anc
    size, anc, _flags, _addr = chan.recvmsg_into([buf], _ANCILLARY)
    return bytes(buf[:size]), anc


def recv(
    chan: socket.socket,
    deadline: float,
    seq: int | None = None,
    *,
    schemas: tuple[Schema, ...] = (HELLO,),
) -> tuple[dict | None, int | None]:
    """The next message (with sequence number `seq` if given) and the kernel's sender pid.

    (None, None) on timeout or end of file. A message that fits none of `schemas` raises
    `Malformed` (a cell can write into any descriptor it finds, its own channel included);
    a well-formed one with another sequence number (a stale reply) is skipped.
    """
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, None
        try:
            if not select.select([chan], [], [], left)[0]:
                return None, None
            data, anc = _receive(chan)
        except (OSError, ValueError):
            return None, None
        if not data:
            return None, None
        pid = None
        for level, kind, payload in anc:
            if (
                level == socket.SOL_SOCKET
                and kind == socket.SCM_CREDENTIALS
                and len(payload) >= _UCRED.size
            ):
                pid = _UCRED.unpack_from(payload)[0] or None
            elif level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                for i in range(
                    0, len(payload) - len(payload) % 4, 4
                ):  # never keep fds a cell sent us
                    with contextlib.suppress(OSError):
                        os.close(int.from_bytes(payload[i : i + 4], "little"))
        msg = decode(data, schemas)
        if seq is not None and msg.get("seq") != seq:
            continue
        return msg, pid


class Members:
    """Which host processes belong to one sandbox, decided from kernel data only.

    With a cgroup: the pids in its ``cgroup.procs`` (a process cannot leave a cgroup it
    has no write access to). Without: descendants of `root_pid`, the process the host
    spawned (its children re-parent to the sandbox's own subreaper, never outside it).
    """

    def __init__(self, cgroups: list[str], root_pid: int | None):
        self.cgroups, self.root_pid = cgroups, root_pid

    def all(self) -> set[int]:
        for cg in self.cgroups:
            with contextlib.suppress(OSError, ValueError):
                return {int(p) for p in Path(cg, "cgroup.procs").read_text().split()}
        return self._descendants()

    def contains(self, pid: int) -> bool:
        if self.cgroups:
            return pid in self.all()
        return pid != self.root_pid and self._descends(pid)

    def _descends(self, pid: int) -> bool:
        for _ in range(256):
            ppid = _ppid(pid)
            if ppid is None or ppid <= 1:
                return False
            if ppid == self.root_pid:
                return True
            pid = ppid
        return False

    def _descendants(self) -> set[int]:
        if self.root_pid is None:
            return set()
        parents: dict[int, int] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                ppid = _ppid(int(entry.name))
                if ppid is not None:
                    parents[int(entry.name)] = ppid
        out, frontier = set(), {self.root_pid}
        while frontier:
            frontier = {p for p, pp in parents.items() if pp in frontier and p not in out}
            out |= frontier
        return out


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def pidfd_of(pid: int, members: Members) -> int | None:
    """A pidfd for `pid` if it is a live member of the sandbox, else None.

    The pidfd is opened first and the process checked while the pidfd pins it: if it
    is still alive after the check, the pid was not reused in between.
    """
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
    if members.contains(pid) and not select.select([fd], [], [], 0)[0]:
        return fd
    os.close(fd)
    return None


def kill_members(members: Members, keep: set[int], rounds: int = 20) -> None:
    """SIGKILL every member of the sandbox not in `keep`, each through its own pidfd."""
    for _ in range(rounds):
        stray = {p for p in members.all() if p not in keep and not dying(p)}
        if not stray:
            return
        for pid in stray:
            fd = pidfd_of(pid, members)
            if fd is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                os.close(fd)
        time.sleep(0.01)


def dying(pid: int) -> bool:
    """Whether `pid` is killed but not gone yet (a SIGKILL queued, or a zombie).

    A cell's ``os.kill(-1, SIGKILL)`` queues SIGKILL on every other sandbox process before
    the cell answers, but each one only disappears once the scheduler lets it tear down
    its memory (up to hundreds of milliseconds on a loaded machine), while its pidfd is
    not yet readable. The queued SIGKILL stays in ``ShdPnd``/``SigPnd`` until the process
    is reaped, so this answer does not depend on timing.
    """
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY)  # raw read: this is on the restore path
        try:
            text = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        fields = dict(
            line.split(b":", 1)
            for line in text.splitlines()
            if line.startswith((b"State", b"SigPnd", b"ShdPnd"))
        )
        pending = int(fields.get(b"SigPnd", b"0"), 16) | int(fields.get(b"ShdPnd", b"0"), 16)
        return fields.get(b"State", b"R").strip()[:1] in (b"Z", b"X") or bool(
            pending & _SIGKILL_BIT
        )
    except (FileNotFoundError, ProcessLookupError):
        return True
    except (OSError, ValueError):
        return False


def _state(pid: int) -> bytes | None:
    """The one-letter state of `pid` from /proc (None when it is gone)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            return os.read(fd, 4096).rsplit(b")", 1)[1].split()[0]
        finally:
            os.close(fd)
    except (OSError, IndexError):
        return None


def stopped(pid: int) -> bool:
    """Whether `pid` is stopped by a signal (SIGSTOP and the like) or a tracer."""
    return _state(pid) in (b"T", b"t")


def exited(pid: int) -> bool:
    """Whether `pid` has exited (gone, or a zombie: its files and memory are released)."""
    return _state(pid) in (None, b"Z", b"X")


class Proc:
    """One sandbox process the env talks to: its channel and a pidfd the host checked.

    `pid` is the kernel's word for the sender of the process's first message (never the
    message's content). A spare is created before that message arrives; `ready` waits.
    """

    def __init__(self, chan: socket.socket, members: Members):
        self.chan, self.members = chan, members
        self.pid: int | None = None
        self.pidfd: int | None = None
        self.killed = False
        #: its OOM score makes it the OOM killer's preferred victim (see `Sandbox._install`)
        self.victim = False

    def adopt(self, msg: dict | None, pid: int | None) -> bool:
        """Take the process's hello message; False (and dead) unless its sender is a member."""
        if msg is None or "hello" not in msg or pid is None:
            return False
        self.pidfd = pidfd_of(pid, self.members)
        if self.pidfd is None:
            return False
        self.pid = pid
        return True

    def ready(self, deadline: float) -> bool:
        """Know the process (waiting for its hello until `deadline` if needed) and be alive."""
        if self.pidfd is None and not self.killed:
            try:
                adopted = self.adopt(*recv(self.chan, deadline))
            except Malformed:
                adopted = False
            if not adopted:
                self.killed = True
        return self.alive()

    def alive(self) -> bool:
        """Running and not already killed (a process with a SIGKILL queued counts as dead)."""
        if self.pidfd is None or self.killed or self.pid is None:
            return False
        if select.select([self.pidfd], [], [], 0)[0]:
            return False
        return not dying(self.pid)

    def resume(self) -> None:
        """SIGCONT through the pidfd: continue the process if a cell stopped it.

        The kernel also discards a SIGSTOP still pending (sent but not yet acted on, as on a
        loaded machine), so the process cannot stop after this; its memory is untouched.
        """
        if self.pidfd is not None and not self.killed:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGCONT)

    def stop(self) -> None:
        """SIGSTOP through the pidfd: the process runs no further instruction until continued."""
        if self.pidfd is not None and not self.killed:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGSTOP)

    def lower_priority(self) -> None:
        """Nice 19, for a process that will be killed: its teardown then does not preempt us.

        A SIGKILL wakes the process on the sender's CPU, where it preempted the host for
        its whole teardown (unmapping a forked interpreter: 1-3.5 ms, the other core idle).
        No pidfd variant of setpriority exists: the call is made only while the pidfd shows
        the process alive, so a reuse of its pid in between would need the kernel to wrap
        its pid space within microseconds (and would only lower that process's priority).
        """
        if self.pidfd is not None and self.pid is not None and not self.killed:
            if not select.select([self.pidfd], [], [], 0)[0]:
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, self.pid, 19)

    def kill(self, wait_s: float = 0.0) -> None:
        """SIGKILL through the pidfd; with `wait_s`, wait up to that long for the exit."""
        self.killed = True
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                if wait_s > 0:
                    select.select([self.pidfd], [], [], wait_s)
            os.close(self.pidfd)
            self.pidfd = None
        self.chan.close()


def await_reaped(members: Members, keep: set[int], timeout_s: float = 2.0) -> bool:
    """Wait until no member outside `keep` is left, zombies included; True if none is.

    Killing an outer process while its children still exist would hand them to the host's
    init (or the nearest subreaper), which is the env's own process in a container whose
    pid 1 is the training script: they would stay zombies there. Teardown waits for the
    sandbox's own init to reap each layer before it stops the next one out.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not members.all() - keep:
            return True
        time.sleep(0.005)
    return not members.all() - keep


def stop_spawned(proc: subprocess.Popen, members: Members, *, wrapper: bool) -> None:
    """Stop a process the host spawned and everything under it, inside-out, reaping each.

    With ``wrapper`` (bwrap) the spawned process exits by itself once its child, the
    sandbox's pid 1, is gone, and reaps it; killing the wrapper first would leave that child
    to the host's init. Otherwise the spawned process is the worker itself.
    """
    if proc.poll() is None:
        kill_members(members, keep={proc.pid})
        await_reaped(members, {proc.pid})
        if wrapper:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(2)
        if proc.poll() is None:
            proc.kill()  # a Popen the host spawned: its own pidfd-safe handle
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
