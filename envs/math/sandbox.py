"""A persistent, sandboxed, snapshottable Python interpreter (the env-side handle).

`Sandbox` starts ``_sandbox_worker.py`` in a separate process tree that, where the
machine allows, lives in its own network, PID and mount namespaces, runs as an
unprivileged uid with ``no_new_privs`` and resource limits, and sits in its own pids
cgroup. Cells run in a live interpreter process; `snapshot()` forks it into a parked
copy and `restore_snapshot()` forks a new live interpreter from that copy, so a restore
costs one fork. `replay()` is the portable path: a fresh interpreter from the pristine
zygote re-runs a code ledger.

Every wait on the sandbox has a deadline; a cell that overruns is stopped by killing
its whole process group (plus anything else of the sandbox that is not a known
interpreter or snapshot), and the caller decides how to recover.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from trace_gym.errors import ConfigError, TraceGymError

__all__ = ["CellResult", "Sandbox", "SandboxConfig", "SandboxError", "SnapshotHandle"]

log = logging.getLogger(__name__)

_WORKER = Path(__file__).with_name("_sandbox_worker.py")
_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33
_BUF = 8 << 20
_UID_RANGE = (200_000, 260_000)


class SandboxError(TraceGymError, RuntimeError):
    """The sandbox could not be started or stopped answering; the message says why."""


@dataclass
class SandboxConfig:
    """Limits and isolation of the interpreter process (defaults suit math tool use)."""

    cell_timeout_s: float = 10.0
    """wall-clock limit of one cell; the interpreter's process group is killed after it"""
    cell_cpu_s: float = 10.0
    """CPU-time limit of one cell (RLIMIT_CPU soft limit, raised before each cell)"""
    total_cpu_s: float = 3600.0
    """hard CPU limit of one interpreter process over its life"""
    memory_mb: int = 2048
    """address-space limit (RLIMIT_AS) of every sandbox process"""
    file_size_mb: int = 16
    """largest file a cell may write (RLIMIT_FSIZE)"""
    tmpfs_mb: int = 64
    """size of the private /tmp (and working directory) when a mount namespace is available"""
    max_open_files: int = 64
    """RLIMIT_NOFILE"""
    max_snapshots: int = 32
    """parked fork snapshots kept per sandbox (least recently used are evicted)"""
    spares: bool = True
    """keep one pre-forked interpreter ready per snapshot (and for the zygote), so a restore
    or a fresh interpreter needs no fork on its critical path"""
    extra_processes: int = 24
    """processes/threads a cell may add beyond the interpreter and snapshots (NPROC, pids cgroup)"""
    max_output_chars: int = 4000
    """characters of a cell's output kept; the rest is counted and cut"""
    seed: int = 0
    """seed of `random` (and `numpy.random` if imported) in every new interpreter"""
    preload: tuple[str, ...] = ("math", "fractions", "itertools", "sympy", "numpy")
    """modules imported once in the zygote, so cells and replays import them for free"""
    isolation: str = "auto"
    """'auto' (namespaces + unprivileged uid where possible) or 'none' (limits only)"""
    uid: int | None = None
    """unprivileged uid to run as when started by root (default: a free one per sandbox)"""
    start_timeout_s: float = 60.0
    """how long starting the zygote (with its preloads) may take"""
    fork_timeout_s: float = 10.0
    """deadline of a snapshot or restore fork"""
    env: dict[str, str] = field(default_factory=dict)
    """extra environment variables for the interpreter"""

    def __post_init__(self) -> None:
        for name in ("cell_timeout_s", "cell_cpu_s", "total_cpu_s", "start_timeout_s", "fork_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("memory_mb", "file_size_mb", "tmpfs_mb", "max_open_files", "max_snapshots", "extra_processes"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"SandboxConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if not 1 <= self.max_output_chars <= 100_000:
            raise ConfigError(f"SandboxConfig.max_output_chars must be in [1, 100000], got {self.max_output_chars}")
        if self.memory_mb < 256:
            raise ConfigError("SandboxConfig.memory_mb below 256 cannot hold the interpreter; use >= 256")
        if self.isolation not in ("auto", "none"):
            raise ConfigError(f"SandboxConfig.isolation must be 'auto' or 'none', got {self.isolation!r}")
        self.preload = tuple(self.preload)


class CellResult(NamedTuple):
    """What running one cell produced."""

    status: str
    """'ok', 'error' (the cell raised), 'timeout', 'crashed' (the interpreter died)"""
    output: str
    total_chars: int
    error: str | None
    elapsed_s: float


@dataclass(frozen=True)
class SnapshotHandle:
    """A process-local reference to a parked snapshot in one particular sandbox."""

    sandbox: str
    sid: int


class _Proc:
    """One sandbox process the env talks to: its channel, outer pid and pidfd.

    A spare is created before its pid is known (``pid=None``); `ready` reads the pid
    message the process sends when it starts.
    """

    def __init__(self, chan: socket.socket, pid: int | None):
        self.chan, self.pid = chan, pid
        self.pidfd: int | None = None
        self.killed = False
        if pid is not None:
            self._open_pidfd()

    def _open_pidfd(self) -> None:
        try:
            self.pidfd = os.pidfd_open(self.pid)  # type: ignore[arg-type]
        except (OSError, AttributeError):
            self.pidfd = None

    def ready(self, deadline: float) -> bool:
        """Know the pid (waiting for it until `deadline` if needed) and be alive."""
        if self.pid is None:
            msg = _recv(self.chan, deadline)
            if msg is None or "pid" not in msg:
                return False
            self.pid = int(msg["pid"])
            self._open_pidfd()
        return self.alive()

    def alive(self) -> bool:
        """Running and not already killed (a process with a SIGKILL queued counts as dead)."""
        if self.pid is None or self.killed:
            return False
        if self.pidfd is not None:
            if select.select([self.pidfd], [], [], 0)[0]:
                return False
        else:
            try:
                os.kill(self.pid, 0)
            except OSError:
                return False
        return not _dying(self.pid)

    def kill(self, group: bool = False) -> None:
        self.killed = True
        if group and self.pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            os.close(self.pidfd)
            self.pidfd = None
        self.chan.close()


def _socketpair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        for force, plain in ((_SO_SNDBUFFORCE, socket.SO_SNDBUF), (_SO_RCVBUFFORCE, socket.SO_RCVBUF)):
            try:
                s.setsockopt(socket.SOL_SOCKET, force, _BUF)
            except OSError:
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.SOL_SOCKET, plain, _BUF)
    return a, b


def _send(chan: socket.socket, msg: dict, fd: int | None = None) -> None:
    data = json.dumps(msg, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if fd is None:
        chan.sendall(data)
    else:
        socket.send_fds(chan, [data], [fd])


def _recv(chan: socket.socket, deadline: float, seq: int | None = None) -> dict | None:
    """The next message (with sequence number `seq` if given), or None on timeout / EOF."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            ready = select.select([chan], [], [], left)[0]
        except (OSError, ValueError):
            return None
        if not ready:
            return None
        try:
            data = chan.recv(_BUF)
        except OSError:
            return None
        if not data:
            return None
        try:
            msg = json.loads(data.decode("utf-8", "replace"))
        except ValueError:
            continue  # a cell wrote garbage into the channel; wait for the real reply
        if not isinstance(msg, dict) or (seq is not None and msg.get("seq") != seq):
            continue  # a stale or forged message
        return msg


_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def _dying(pid: int) -> bool:
    """Whether `pid` is killed but not gone yet (a SIGKILL queued, or a zombie).

    A cell's ``os.kill(-1, SIGKILL)`` queues SIGKILL on every other sandbox process (zygote,
    snapshots, spares) before the cell answers, but each one only disappears once the
    scheduler lets it tear down its memory, which on a loaded machine takes up to hundreds
    of milliseconds. All that time its pidfd is not readable and ``kill(pid, 0)`` succeeds,
    so without this check a restore picked the dying snapshot or spare (the next cell then
    "crashed") and a replay forked from the dying zygote (the replay stopped half way and
    the checkpoint's names were missing). The queued SIGKILL stays in ``ShdPnd`` (group
    signals) or ``SigPnd`` until the process is reaped, so the answer does not depend on
    timing.
    """
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY)  # raw read: this is on the restore path
        try:
            text = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        fields = dict(line.split(b":", 1) for line in text.splitlines() if line.startswith((b"State", b"SigPnd", b"ShdPnd")))
        pending = int(fields.get(b"SigPnd", b"0"), 16) | int(fields.get(b"ShdPnd", b"0"), 16)
        return fields.get(b"State", b"R").strip()[:1] in (b"Z", b"X") or bool(pending & _SIGKILL_BIT)
    except (FileNotFoundError, ProcessLookupError):
        return True
    except (OSError, ValueError):
        return False  # no readable /proc: trust the pidfd / kill(pid, 0) answer


def _is_zombie(proc_path: str) -> bool:
    with open(os.path.join(proc_path, "stat")) as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _uids_in_use() -> set[int]:
    used = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                used.add(os.stat(entry.path).st_uid)
    return used


class Sandbox:
    """One sandbox: a zygote, a live interpreter, and parked snapshots (LRU-bounded)."""

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        self.token = secrets.token_hex(8)
        self.isolation: dict[str, Any] = {}
        self._boot: subprocess.Popen | None = None
        self._init_pid: int | None = None
        self._zygote: _Proc | None = None
        self._live: _Proc | None = None
        self._snaps: OrderedDict[int, _Proc] = OrderedDict()
        self._spares: dict[int | str, _Proc] = {}
        self._pending_spare: tuple[_Proc, int | str, int | None] | None = None
        self._next_sid = 0
        self._seq = 0
        self._cgroup: str | None = None
        self._tmpdir: str | None = None
        self._uid: int | None = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ lifecycle
    @property
    def process_limit(self) -> int:
        """Processes and threads the sandbox uid may hold (RLIMIT_NPROC, pids.max)."""
        cfg = self.config
        return cfg.max_snapshots * (2 if cfg.spares else 1) + cfg.extra_processes + 8

    @property
    def started(self) -> bool:
        return self._zygote is not None

    def start(self) -> None:
        """Start the bootstrap, namespaces and zygote (idempotent)."""
        with self._lock:
            if self.started:
                return
            cfg = self.config
            root = os.geteuid() == 0
            drop = root and cfg.isolation == "auto"
            if drop:
                self._uid = cfg.uid if cfg.uid is not None else self._free_uid()
            nproc = self.process_limit
            self._cgroup = self._make_cgroup(nproc) if drop else None
            self._tmpdir = tempfile.mkdtemp(prefix="trace-gym-math-")
            if drop:
                os.chown(self._tmpdir, self._uid, self._uid)  # type: ignore[arg-type]
            mine, theirs = _socketpair()
            worker_cfg = {
                "fd": theirs.fileno(),
                "namespaces": drop,
                "drop_privileges": drop,
                "uid": self._uid,
                "gid": self._uid,
                "cgroup": self._cgroup,
                "workdir": os.path.join(self._tmpdir, "work"),
                "tmpfs_mb": cfg.tmpfs_mb,
                "memory_mb": cfg.memory_mb,
                "file_size_mb": cfg.file_size_mb,
                "max_open_files": cfg.max_open_files,
                "max_processes": nproc,
                "total_cpu_s": cfg.total_cpu_s,
                "preload": list(cfg.preload),
                "no_aslr": True,
            }
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "PYTHONHASHSEED": "0",
                "PYTHONDONTWRITEBYTECODE": "1",
                "OPENBLAS_NUM_THREADS": "1",
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "LANG": "C.UTF-8",
                **{k: v for k, v in os.environ.items() if k == "TRACE_GYM_SANDBOX_DEBUG"},
                **cfg.env,
            }
            try:
                self._boot = subprocess.Popen(
                    [sys.executable, "-s", str(_WORKER), json.dumps(worker_cfg)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=None if "TRACE_GYM_SANDBOX_DEBUG" in env else subprocess.DEVNULL,
                    pass_fds=[theirs.fileno()],
                    env=env,
                    cwd=self._tmpdir,
                    start_new_session=True,
                )
            finally:
                theirs.close()
            deadline = time.monotonic() + cfg.start_timeout_s
            zygote_pid = None
            while zygote_pid is None or not self.isolation:
                msg = _recv(mine, deadline)
                if msg is None:
                    mine.close()
                    self.close()
                    raise SandboxError(
                        "the math sandbox did not start (set TRACE_GYM_SANDBOX_DEBUG=1 to see its "
                        "stderr; SandboxConfig(isolation='none') skips namespaces and uid changes)"
                    )
                if "isolation" in msg:
                    iso = msg["isolation"]
                    if drop and not iso.get("uid_dropped"):
                        log.warning("math sandbox: the Python installation is not readable by an "
                                    "unprivileged uid and there is no mount namespace; cells run as root "
                                    "(namespaces and limits still apply)")
                        self._uid = None
                    self.isolation = {**iso, "uid": self._uid, "cgroup": bool(self._cgroup)}
                    self._init_pid = int(msg["init_pid"])
                elif "pid" in msg:
                    zygote_pid = int(msg["pid"])
            self._zygote = _Proc(mine, zygote_pid)
            log.debug("math sandbox %s started: %s", self.token, self.isolation)

    def close(self) -> None:
        """Kill every process of the sandbox and remove its files (idempotent)."""
        with self._lock:
            for proc in [self._live, self._zygote, *self._snaps.values(), *self._spares.values()]:
                if proc is not None:
                    proc.kill(group=proc is self._live)
            self._live = self._zygote = None
            self._snaps.clear()
            self._spares.clear()
            self._pending_spare = None
            if self._init_pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(self._init_pid, signal.SIGKILL)  # ends the whole PID namespace
            self._sweep(keep=set())
            if self._boot is not None:
                with contextlib.suppress(OSError):
                    self._boot.stdin.close()  # type: ignore[union-attr]
                try:
                    self._boot.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._boot.kill()
                    self._boot.wait(timeout=5)
                self._boot = None
            self._init_pid = None
            if self._cgroup is not None:
                self._remove_cgroup()
            if self._tmpdir is not None:
                import shutil

                shutil.rmtree(self._tmpdir, ignore_errors=True)
                self._tmpdir = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # ------------------------------------------------------------------ interpreters
    @property
    def has_live(self) -> bool:
        return self._live is not None and self._live.alive()

    def fresh(self) -> None:
        """Replace the live interpreter with a pristine one (seeded RNGs, empty namespace)."""
        with self._lock:
            self.start()
            try:
                self._install(self._zygote, "zygote", self.config.seed)  # type: ignore[arg-type]
            except (SandboxError, OSError):
                # a cell killed the zygote (e.g. kill(-1, SIGKILL)): start the sandbox again
                log.warning("math sandbox: the zygote is gone; restarting the sandbox")
                self.close()
                self.start()
                self._install(self._zygote, "zygote", self.config.seed)  # type: ignore[arg-type]

    def discard_live(self) -> None:
        """Drop the live interpreter; the next `run` starts a pristine one."""
        with self._lock:
            if self._live is not None:
                self._live.kill(group=True)
                self._live = None

    def run(self, code: str) -> CellResult:
        """Run one cell in the live interpreter (starting a pristine one if needed)."""
        with self._lock:
            if self._live is None:
                self.fresh()
            live = self._live
            cfg = self.config
            t0 = time.monotonic()
            self._seq += 1
            request = {"op": "exec", "code": code, "max_chars": cfg.max_output_chars, "cpu_s": cfg.cell_cpu_s, "seq": self._seq}
            try:
                _send(live.chan, request)  # type: ignore[union-attr]
                reply = _recv(live.chan, t0 + cfg.cell_timeout_s, self._seq)  # type: ignore[union-attr]
            except OSError:
                reply = None
            elapsed = time.monotonic() - t0
            self._flush_spare()
            if reply is not None and "output" in reply:
                return CellResult(
                    "error" if reply.get("error") else "ok",
                    str(reply.get("output", "")),
                    int(reply.get("total_chars", 0)),
                    None if reply.get("error") is None else str(reply["error"]),
                    elapsed,
                )
            timed_out = elapsed >= cfg.cell_timeout_s and live.alive()  # type: ignore[union-attr]
            self._kill_live()
            return CellResult("timeout" if timed_out else "crashed", "", 0, None, elapsed)

    def replay(self, ledger: list[str] | tuple[str, ...]) -> bool:
        """A fresh interpreter that has re-run `ledger`; False if a cell failed to finish."""
        with self._lock:
            for attempt in range(2):
                if attempt:
                    # every ledger cell finished once, so a cell dying in the replay means the
                    # sandbox itself is broken (e.g. a cell killed its processes): replay once
                    # more in a whole new sandbox rather than give back a half-built state
                    log.warning("math sandbox: a ledger cell died during replay; restarting the sandbox")
                    self.close()
                self.fresh()
                if all(self.run(code).status not in ("timeout", "crashed") for code in ledger):
                    return True
            return False

    def _kill_live(self) -> None:
        if self._live is not None:
            self._live.kill(group=True)
            self._live = None
        deadline = time.monotonic() + 0.5
        for spare in self._spares.values():  # learn the pids of spares, or the sweep kills them
            spare.ready(deadline)
        self._sweep(keep=self._known_pids())

    def _install(self, parent: _Proc, key: int | str, seed: int | None) -> None:
        """Make a fork of `parent` the live interpreter: its ready spare, else a new fork."""
        spare = self._spares.pop(key, None)
        if spare is not None and spare.ready(time.monotonic() + self.config.fork_timeout_s):
            new = spare
        else:
            if spare is not None:
                spare.kill()
            new = self._fork_from(parent, seed)
        if self._live is not None:
            self._live.kill(group=True)
        self._live = new
        if self.config.spares:
            # the next spare is forked after the first cell has answered, so that fork does
            # not compete with the restored interpreter's first (copy-on-write heavy) cell
            self._flush_spare()
            self._pending_spare = (parent, key, seed)

    def _flush_spare(self) -> None:
        if self._pending_spare is not None:
            parent, key, seed = self._pending_spare
            self._pending_spare = None
            if parent.alive():
                self._request_spare(parent, key, seed)

    def _request_spare(self, parent: _Proc, key: int | str, seed: int | None) -> None:
        """Ask `parent` to fork the next spare; its pid is read when it is needed."""
        mine, theirs = _socketpair()
        try:
            _send(parent.chan, {"op": "spawn", "seed": seed}, theirs.fileno())
            self._spares[key] = _Proc(mine, None)
        except OSError:
            mine.close()
        finally:
            theirs.close()

    def _fork_from(self, parent: _Proc, seed: int | None) -> _Proc:
        if not parent.alive():  # fail now, not after waiting for a killed parent's channel to close
            raise SandboxError("the sandbox process to fork from is gone")
        mine, theirs = _socketpair()
        try:
            _send(parent.chan, {"op": "spawn", "seed": seed}, theirs.fileno())
        finally:
            theirs.close()
        msg = _recv(mine, time.monotonic() + self.config.fork_timeout_s)
        if msg is None or "pid" not in msg:
            mine.close()
            raise SandboxError("a sandbox snapshot did not fork a new interpreter in time")
        return _Proc(mine, int(msg["pid"]))

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> SnapshotHandle | None:
        """Fork the live interpreter into a parked snapshot; None if that failed."""
        with self._lock:
            if self._live is None:
                return None
            mine, theirs = _socketpair()
            spare_mine, spare_theirs = _socketpair()
            fds = [theirs.fileno(), spare_theirs.fileno()] if self.config.spares else [theirs.fileno()]
            deadline = time.monotonic() + self.config.fork_timeout_s
            self._seq += 1
            try:
                socket.send_fds(self._live.chan, [json.dumps({"op": "fork", "seq": self._seq}).encode()], fds)
            except OSError:
                mine.close()
                spare_mine.close()
                return None
            finally:
                theirs.close()
                spare_theirs.close()
            ack = _recv(self._live.chan, deadline, self._seq)
            msg = _recv(mine, deadline) if ack is not None else None
            if msg is None or "pid" not in msg:
                mine.close()
                spare_mine.close()
                log.warning("math sandbox: snapshot fork failed; restore will replay the ledger")
                if ack is None:
                    self._kill_live()
                return None
            sid = self._next_sid
            self._next_sid += 1
            self._snaps[sid] = _Proc(mine, int(msg["pid"]))
            if self.config.spares:
                self._spares[sid] = _Proc(spare_mine, None)
            else:
                spare_mine.close()
            while len(self._snaps) > self.config.max_snapshots:
                self._drop(next(iter(self._snaps)))
            return SnapshotHandle(self.token, sid)

    def _drop(self, sid: int) -> None:
        if self._pending_spare is not None and self._pending_spare[1] == sid:
            self._pending_spare = None
        for proc in (self._snaps.pop(sid, None), self._spares.pop(sid, None)):
            if proc is not None:
                proc.kill()

    def restore_snapshot(self, handle: Any) -> bool:
        """Make a fork of the snapshot the live interpreter; False if it is gone."""
        with self._lock:
            if not isinstance(handle, SnapshotHandle) or handle.sandbox != self.token:
                return False
            proc = self._snaps.get(handle.sid)
            if proc is None or not proc.alive():
                self.release(handle)
                return False
            try:
                self._install(proc, handle.sid, None)
            except (SandboxError, OSError):
                self.release(handle)
                return False
            self._snaps.move_to_end(handle.sid)
            return True

    def release(self, handle: Any) -> None:
        """Kill a parked snapshot (no-op for handles of other sandboxes)."""
        with self._lock:
            if isinstance(handle, SnapshotHandle) and handle.sandbox == self.token:
                self._drop(handle.sid)

    @property
    def num_snapshots(self) -> int:
        return len(self._snaps)

    def pids(self) -> list[int]:
        """Outer pids of every live process of this sandbox (for tests and diagnostics)."""
        if self._cgroup is not None:
            with contextlib.suppress(OSError):
                return [int(p) for p in Path(self._cgroup, "cgroup.procs").read_text().split()]
        known = self._known_pids() | {p for p in (self._init_pid,) if p}
        if self._uid is not None:
            known |= self._uid_pids()
        return sorted(p for p in known if Path(f"/proc/{p}").exists())

    # ------------------------------------------------------------------ cleanup
    def _known_pids(self) -> set[int]:
        procs = [self._live, self._zygote, *self._snaps.values(), *self._spares.values()]
        known = {p.pid for p in procs if p is not None and p.pid is not None}
        if self._init_pid:
            known.add(self._init_pid)
        if self._boot is not None:
            known.add(self._boot.pid)
        return known

    def _uid_pids(self) -> set[int]:
        """Processes running as the sandbox uid (zombies excluded: they are already dead)."""
        out = set()
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError):
                    if os.stat(entry.path).st_uid == self._uid and not _is_zombie(entry.path):
                        out.add(int(entry.name))
        return out

    def _sweep(self, keep: set[int]) -> None:
        """Kill every sandbox process not in `keep` (escaped children of killed cells)."""
        if self._uid is None and self._cgroup is None:
            return
        for _ in range(20):
            stray = set()
            if self._uid is not None:
                stray |= self._uid_pids()
            if self._cgroup is not None:
                with contextlib.suppress(OSError):
                    stray |= {int(p) for p in Path(self._cgroup, "cgroup.procs").read_text().split()}
            stray -= keep
            if self._boot is not None:
                stray.discard(self._boot.pid)
            if not stray:
                return
            for pid in stray:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def _free_uid(self) -> int:
        used = _uids_in_use()
        while True:
            uid = _UID_RANGE[0] + secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0])
            if uid not in used:
                return uid

    def _make_cgroup(self, limit: int) -> str | None:
        for base in ("/sys/fs/cgroup/pids",):
            with contextlib.suppress(OSError):
                for stale in Path(base).glob("trace_gym_math_*"):  # left by a killed env process
                    with contextlib.suppress(OSError):
                        stale.rmdir()  # only succeeds when the cgroup holds no process
            path = os.path.join(base, f"trace_gym_math_{self._uid}_{self.token}")
            try:
                os.mkdir(path)
                Path(path, "pids.max").write_text(str(limit))
                return path
            except OSError:
                with contextlib.suppress(OSError):
                    os.rmdir(path)
        return None

    def _remove_cgroup(self) -> None:
        for _ in range(100):
            try:
                os.rmdir(self._cgroup)  # type: ignore[arg-type]
                break
            except FileNotFoundError:
                break
            except OSError:
                self._sweep(keep=set())
                time.sleep(0.02)
        self._cgroup = None
