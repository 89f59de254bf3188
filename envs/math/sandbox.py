"""A persistent, sandboxed, snapshottable Python interpreter (the env-side policy).

`Sandbox` starts ``_sandbox_worker.py`` isolated as `isolation` decides (bubblewrap by
default; see that module for what a cell can see) and in cgroups of its own. Cells run in
a live interpreter process; `snapshot()` forks it into a parked copy (with a copy of the
work dir, made inside the sandbox) and `restore_snapshot()` forks a new live interpreter
from that copy, so a restore costs one fork. `replay()` is the portable path: a fresh
interpreter from the pristine zygote re-runs a code ledger.

The host acts only on processes it can vouch for (`_proc`): pids come from the kernel
(``SO_PASSCRED``), are pinned as pidfds and checked against the sandbox's cgroup or
process tree; nothing a sandbox process says about itself is used as a host pid. Every
wait has a deadline; a cell that overruns is killed with every sandbox process that is
not a known interpreter or snapshot, and the caller decides how to recover.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import select
import shutil
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

from trace_gym.envs.math import _cgroup as _cg
from trace_gym.envs.math import isolation as iso
from trace_gym.envs.math import seccomp
from trace_gym.envs.math._proc import (
    ACK,
    HELLO,
    ISOLATION,
    REFUSED,
    Malformed,
    Members,
    Proc,
    await_reaped,
    exited,
    kill_members,
    pidfd_of,
    recv,
    reply_schema,
    send,
    socketpair,
    stop_spawned,
    stopped,
)

from trace_gym.errors import ConfigError, TraceGymError

__all__ = ["CellResult", "Sandbox", "SandboxConfig", "SandboxError", "SnapshotHandle"]

log = logging.getLogger(__name__)

_WORKER = Path(__file__).with_name("_sandbox_worker.py")
#: the OOM score of the live interpreter and its spares (the preferred victims; snapshots 0)
_LIVE_OOM = 1000
_CGROUP_V1, _CGROUP_V2 = "/sys/fs/cgroup/pids", ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")


class SandboxError(TraceGymError, RuntimeError):
    """The sandbox could not be started or stopped answering; the message says why."""


@dataclass
class SandboxConfig:
    """Limits and isolation of the interpreter (defaults like SandboxFusion's)."""

    #: wall-clock limit of one cell; the interpreter is killed after it and the state rolled back
    cell_timeout_s: float = 10.0
    #: CPU-time limit of one cell (RLIMIT_CPU soft limit, raised before each cell)
    cell_cpu_s: float = 10.0
    #: hard CPU limit of one interpreter process over its life
    total_cpu_s: float = 3600.0
    #: address-space limit (RLIMIT_AS) of every sandbox process
    memory_mb: int = 1024
    #: memory of the whole sandbox - interpreter, its processes, parked snapshots and spares,
    #: its /tmp - in a memory cgroup (v2 memory.max, or v1 memory.limit_in_bytes)
    memory_total_mb: int = 4096
    #: parked snapshots may hold the sandbox above this (default: the total less `memory_mb`, so
    #: the live interpreter can always grow by its own limit); past it the oldest are dropped
    #: and restore by ledger replay. Without a memory cgroup, parked snapshots are capped by
    #: count instead: this budget over `memory_mb`, the most one snapshot can hold privately
    snapshot_memory_mb: int | None = None
    #: largest file a cell may write (RLIMIT_FSIZE)
    file_size_mb: int = 16
    #: size of the private /tmp that holds the work dir and the snapshots' copies of it
    tmpfs_mb: int = 64
    #: work-dir bytes a snapshot copies; a bigger work dir makes that checkpoint replay instead
    snapshot_files_mb: int = 16
    #: RLIMIT_NOFILE
    max_open_files: int = 64
    #: parked fork snapshots kept per sandbox (least recently used are evicted)
    max_snapshots: int = 32
    #: keep one pre-forked interpreter ready per snapshot (and for the zygote), so a restore or a
    #: fresh interpreter needs no fork on its critical path
    spares: bool = True
    #: processes/threads a cell may add beyond the interpreter and snapshots (NPROC, pids cgroup)
    extra_processes: int = 24
    #: characters of a cell's output kept; the rest is counted and cut
    max_output_chars: int = 4000
    #: seed of `random` (and `numpy.random` if imported) in every new interpreter
    seed: int = 0
    #: modules imported once in the zygote, so cells and replays import them for free
    preload: tuple[str, ...] = ("math", "fractions", "itertools", "sympy", "numpy")
    #: 'auto' (bwrap, else namespaces with a warning), or one of 'bwrap', 'namespaces', 'none'
    #: explicitly; 'none' (and an 'auto' that finds no isolation) needs `allow_unsafe_host`
    isolation: str = "auto"
    #: accept running cells with no isolation at all (as this user, with its file access): the
    #: only way to get isolation 'none', which then still logs a loud warning at every start
    allow_unsafe_host: bool = False
    #: load the seccomp filter of `trace_gym.envs.math.seccomp` (bwrap mode)
    seccomp: bool = True
    #: unprivileged uid to run as when started by root (default: a free one per sandbox)
    uid: int | None = None
    #: how long starting the zygote (with its preloads) may take
    start_timeout_s: float = 60.0
    #: deadline of a snapshot or restore fork
    fork_timeout_s: float = 10.0
    #: extra environment variables for the interpreter
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in (
            "cell_timeout_s",
            "cell_cpu_s",
            "total_cpu_s",
            "start_timeout_s",
            "fork_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)!r}")
        for name in (
            "memory_mb",
            "file_size_mb",
            "tmpfs_mb",
            "snapshot_files_mb",
            "max_open_files",
            "max_snapshots",
            "extra_processes",
        ):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"SandboxConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if not 1 <= self.max_output_chars <= 100_000:
            raise ConfigError(
                f"SandboxConfig.max_output_chars must be in [1, 100000], got {self.max_output_chars}"
            )
        if self.memory_mb < 256:
            raise ConfigError(
                "SandboxConfig.memory_mb below 256 cannot hold the interpreter; use >= 256"
            )
        if self.memory_total_mb < self.memory_mb + 256:
            raise ConfigError(
                "SandboxConfig.memory_total_mb must leave 256 MiB above memory_mb, got "
                f"{self.memory_total_mb} with memory_mb={self.memory_mb}"
            )
        if self.snapshot_memory_mb is not None and not (
            0 < self.snapshot_memory_mb <= self.memory_total_mb
        ):
            raise ConfigError(
                "SandboxConfig.snapshot_memory_mb must be in (0, memory_total_mb], got "
                f"{self.snapshot_memory_mb!r}"
            )
        if self.isolation not in iso.MODES:
            raise ConfigError(
                f"SandboxConfig.isolation must be one of {iso.MODES}, got {self.isolation!r}"
            )
        if self.isolation == "none" and not self.allow_unsafe_host:
            raise ConfigError(
                "SandboxConfig.isolation='none' runs cells with this user's rights and no "
                "isolation; it needs allow_unsafe_host=True to say that is intended"
            )
        self.preload = tuple(self.preload)

    @property
    def snapshot_budget_mb(self) -> int:
        """What parked snapshots may hold the sandbox at (see `snapshot_memory_mb`)."""
        if self.snapshot_memory_mb is not None:
            return self.snapshot_memory_mb
        return self.memory_total_mb - self.memory_mb

    @property
    def uncounted_max_snapshots(self) -> int:
        """Parked snapshots kept when no memory cgroup counts them (each may own `memory_mb`)."""
        return max(1, min(self.max_snapshots, self.snapshot_budget_mb // self.memory_mb))


class CellResult(NamedTuple):
    """What running one cell produced."""

    #: 'ok', 'error' (the cell raised), 'timeout', 'crashed' (the interpreter died),
    #: 'compromised' (the interpreter sent a message outside the protocol: the sandbox was
    #: restarted), 'refused' (the interpreter found its restored files or limits tampered with
    #: and did not run the cell: restore the state another way and run it again)
    status: str
    output: str
    total_chars: int
    error: str | None
    elapsed_s: float
    #: threads the cell left running (a snapshot of this state would lose them)
    threads: int = 0


@dataclass(frozen=True)
class SnapshotHandle:
    """A process-local reference to a parked snapshot in one particular sandbox."""

    sandbox: str
    sid: int


class Sandbox:
    """One sandbox: a zygote, a live interpreter, and parked snapshots (LRU-bounded)."""

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        self.token = secrets.token_hex(8)
        self.isolation: dict[str, Any] = {}
        self.mode: str | None = None
        self._boot: subprocess.Popen | None = None
        self._members = Members([], None)
        self._infra: dict[int, int] = {}
        self._zygote: Proc | None = None
        self._live: Proc | None = None
        #: the interpreter a restore replaced: stopped at the handover, killed once the new one
        #: has answered (its teardown, milliseconds of unmapping, then runs off the restore's path)
        self._retired: Proc | None = None
        #: spares requested whose hello is not read yet (`_adopt_spares` reads it after a cell)
        self._unadopted: list[Proc] = []
        self._live_threads = 0
        self._snaps: OrderedDict[int, Proc] = OrderedDict()
        self._spares: dict[int | str, Proc] = {}
        self._pending_spare: tuple[Proc, int | str, int | None] | None = None
        self._next_sid = 0
        self._seq = 0
        self._cgroup: str | None = None
        self._cgroups: list[str] = []
        self._memcg: str | None = None
        #: parked snapshots dropped because the sandbox was over `snapshot_budget_mb`
        self.evicted_for_memory = 0
        self._evicted: set[int] = set()
        self._oom_seen = 0
        self._tmpdir: str | None = None
        self._uid: int | None = None
        self._lock = threading.RLock()
        #: profiling (`bench math-env --profile`): when a list, each phase of a restore and a
        #: cell appends (name, time.monotonic()) at its end
        self.marks: list[tuple[str, float]] | None = None

    def _mark(self, phase: str) -> None:
        if self.marks is not None:
            self.marks.append((phase, time.monotonic()))

    # ------------------------------------------------------------------ lifecycle
    @property
    def process_limit(self) -> int:
        """Processes and threads the sandbox may hold (RLIMIT_NPROC, pids.max)."""
        cfg = self.config
        return cfg.max_snapshots * (2 if cfg.spares else 1) + cfg.extra_processes + 8

    @property
    def started(self) -> bool:
        return self._zygote is not None

    def start(self) -> None:
        """Start the sandbox and its zygote (idempotent); see the named steps below."""
        with self._lock:
            if self.started:
                return
            self._choose_identity()
            mine, theirs = socketpair()
            try:
                self._spawn_boot(theirs)
            finally:
                theirs.close()
            self._await_zygote(mine)
            log.debug("math sandbox %s started: %s", self.token, self.isolation)

    def _choose_identity(self) -> None:
        """Step 1: isolation mode, uid, cgroups and the host-side scratch directory."""
        cfg = self.config
        self.mode = iso.choose_mode(cfg.isolation)
        if self.mode == "none" and not cfg.allow_unsafe_host:
            raise SandboxError(
                f"the math sandbox found no isolation it can use ({iso.bwrap_problem()}); install "
                "bubblewrap (apt-get install bubblewrap) and let it create user namespaces, or "
                "run as root for the kernel-namespace isolation"
            )
        if self.mode == "none":
            log.warning(
                "math sandbox: isolation 'none' (allow_unsafe_host=True): CELLS RUN WITHOUT "
                "ISOLATION as uid %d and can read and write whatever it can",
                os.geteuid(),
            )
        root = os.geteuid() == 0
        self._uid = None
        if root and self.mode in ("bwrap", "namespaces"):
            self._uid = cfg.uid if cfg.uid is not None else iso.free_uid()
        self._memcg, self._oom_seen = None, 0
        self._cgroups = self._make_cgroups() if root and self.mode != "none" else []
        self._cgroup = next((c for c in self._cgroups if c.startswith(_CGROUP_V1)), None)
        if self._memcg is None:
            log.warning(
                "math sandbox: NO MEMORY CGROUP could be made (%s), so nothing caps the sandbox's "
                "total memory at %d MiB; parked snapshots are capped by count instead (%d)",
                "not root"
                if not root
                else "isolation 'none'"
                if self.mode == "none"
                else "no writable v2 memory controller or v1 memory hierarchy",
                cfg.memory_total_mb,
                cfg.uncounted_max_snapshots,
            )
        self._tmpdir = tempfile.mkdtemp(prefix="trace-gym-math-")
        if self._uid is not None:
            os.chown(self._tmpdir, self._uid, self._uid)

    def _worker_config(self, fd: int) -> dict[str, Any]:
        cfg, mode = self.config, self.mode
        workdir = "/tmp/work" if mode == "bwrap" else os.path.join(self._tmpdir, "work")  # type: ignore[arg-type]
        return {
            "fd": fd,
            "namespaces": mode == "namespaces",
            "drop_privileges": mode == "namespaces" and self._uid is not None,
            "own_uid": self._uid is not None,
            "uid": self._uid,
            "gid": self._uid,
            "workdir": workdir,
            # where a cell can write: snapshotted and restored whole (bwrap: its private /tmp;
            # the worker decides in the other modes, after it made its mounts)
            "scratch": ["/tmp"] if mode == "bwrap" else None,
            "netns": mode == "bwrap",
            "tmpfs_mb": cfg.tmpfs_mb,
            "snapshot_files_mb": cfg.snapshot_files_mb,
            "memory_mb": cfg.memory_mb,
            "file_size_mb": cfg.file_size_mb,
            "max_open_files": cfg.max_open_files,
            "max_processes": self.process_limit,
            "total_cpu_s": cfg.total_cpu_s,
            "preload": list(cfg.preload),
            "no_aslr": True,
        }

    def _spawn_boot(self, theirs: socket.socket) -> None:
        """Step 2: launch the worker's bootstrap (through bwrap in bwrap mode)."""
        cfg = self.config
        inside = iso.exposed_path(_WORKER) if self.mode == "bwrap" else str(_WORKER)
        python = iso.python_executable() if self.mode == "bwrap" else sys.executable
        env = {
            "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "MALLOC_ARENA_MAX": "2",  # a thread would otherwise reserve a 64 MiB arena of the address-space limit
            "LANG": "C.UTF-8",
            **({"PYTHONPATH": iso.sandbox_pythonpath()} if self.mode == "bwrap" else {}),
            **{k: v for k, v in os.environ.items() if k == "TRACE_GYM_SANDBOX_DEBUG"},
            **cfg.env,
        }
        spec = iso.Launch(
            [python, "-s", inside, json.dumps(self._worker_config(theirs.fileno()))],
            self.mode or "none",
            uid=self._uid,
            cgroups=self._cgroups,
            expose={str(_WORKER): inside},
            tmpfs_mb=cfg.tmpfs_mb,
            env=env,
            pass_fds=(theirs.fileno(),),
            seccomp=cfg.seccomp,
        )
        try:
            self._boot = iso.launch(
                spec,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=None if "TRACE_GYM_SANDBOX_DEBUG" in env else subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError) as e:
            self.close()
            raise SandboxError(f"the math sandbox could not be launched ({self.mode}): {e}") from e
        self._members = Members(self._cgroups, self._boot.pid)

    def _await_zygote(self, mine: socket.socket) -> None:
        """Step 3: read the isolation report and adopt the zygote (a kernel-vouched pid)."""
        deadline = time.monotonic() + self.config.start_timeout_s
        zygote = Proc(mine, self._members)
        report: dict | None = None
        while report is None or zygote.pid is None:
            try:
                msg, pid = recv(mine, deadline, schemas=(ISOLATION, HELLO))
            except Malformed as e:
                msg, pid = None, None
                log.warning("math sandbox: a malformed start-up message (%s)", e)
            if msg is not None and "isolation" in msg and report is None:
                report = msg["isolation"] if isinstance(msg["isolation"], dict) else {}
            elif msg is not None and "hello" in msg and zygote.adopt(msg, pid):
                continue
            elif msg is None:
                mine.close()
                self.close()
                raise SandboxError(
                    f"the math sandbox did not start (mode {self.mode}); set TRACE_GYM_SANDBOX_DEBUG=1 to "
                    "see its stderr"
                )
        self._zygote = zygote
        self._pin_infrastructure(zygote.pid)  # type: ignore[arg-type]
        self._describe(report)

    def _pin_infrastructure(self, zygote_pid: int) -> None:
        """Step 4: the zygote's ancestors (init, bootstrap, bwrap) are kept by every sweep."""
        self._infra = {}
        pid = zygote_pid
        for _ in range(16):
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
                if pid <= 1 or (self._boot is not None and pid == self._boot.pid):
                    break
                fd = pidfd_of(pid, self._members)
                if fd is not None:
                    self._infra[pid] = fd
                continue
            break

    def _describe(self, report: dict) -> None:
        """Step 5: the `isolation` report (what `info` shows)."""
        mode = self.mode
        bwrap = mode == "bwrap"
        self.isolation = {
            "mode": mode,
            "netns": bool(report.get("netns")) or bwrap,
            "pidns": bool(report.get("pidns")) or bwrap,
            "mountns": bool(report.get("mountns")) or bwrap,
            "readonly_root": bwrap,
            "seccomp": bwrap and self.config.seccomp and seccomp.program() is not None,
            "uid_dropped": bwrap and self._uid is not None or bool(report.get("uid_dropped")),
            "uid": self._uid,
            "cgroup": bool(self._cgroups),
            "memory_cgroup": _cg.version_of(self._memcg) if self._memcg else None,
        }
        if mode == "namespaces" and self._uid is not None and not report.get("uid_dropped"):
            log.warning(
                "math sandbox: the Python installation is not readable by an unprivileged uid "
                "and there is no mount namespace; cells run as root (namespaces and limits still apply)"
            )
            self._uid = None
            self.isolation["uid"] = None

    def close(self) -> None:
        """Kill every process of the sandbox and remove its files (idempotent)."""
        with self._lock:
            procs = [self._live, self._retired, self._zygote, *self._snaps.values()]
            for proc in [*procs, *self._spares.values()]:
                if proc is not None:
                    proc.kill()
            self._live = self._retired = self._zygote = None
            self._snaps.clear()
            self._spares.clear()
            self._unadopted = []
            self._pending_spare = None
            # inside-out, so each process is reaped by its own parent and none is left to the
            # host's init: every cell and interpreter process first (the sandbox's init reaps
            # them), then init and the bootstrap (the bootstrap reaps init), then bwrap
            outer = set(self._infra) | ({self._boot.pid} if self._boot is not None else set())
            kill_members(self._members, keep=outer)
            await_reaped(self._members, outer)
            self._stop_boot()
            for fd in self._infra.values():
                os.close(fd)
            self._infra = {}
            self._cgroup_kill()  # nothing should be left; a last resort
            self._remove_cgroups()
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)  # rmtree never follows symlinks
                self._tmpdir = None

    def _stop_boot(self) -> None:
        if self._boot is None:
            return
        with contextlib.suppress(OSError):
            self._boot.stdin.close()  # the bootstrap kills and reaps init, then exits
        try:
            self._boot.wait(timeout=5)
        except subprocess.TimeoutExpired:
            stop_spawned(self._boot, self._members, wrapper=self.mode == "bwrap")
        self._boot = None
        self._members = Members([], None)

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
            self._live_threads = 0

    def discard_live(self) -> None:
        """Drop the live interpreter; the next `run` starts a pristine one."""
        with self._lock:
            if self._live is not None:
                self._kill_live()

    def run(self, code: str) -> CellResult:
        """Run one cell in the live interpreter (starting a pristine one if needed)."""
        with self._lock:
            if self._live is None:
                self.fresh()
            live = self._live
            cfg = self.config
            t0 = time.monotonic()
            self._seq += 1
            request = {
                "op": "exec",
                "code": code,
                "max_chars": cfg.max_output_chars,
                "cpu_s": cfg.cell_cpu_s,
                "seq": self._seq,
            }
            schemas = (reply_schema(cfg.max_output_chars), REFUSED)
            try:
                send(live.chan, request)  # type: ignore[union-attr]
                self._mark("request")
                reply, _pid = recv(live.chan, t0 + cfg.cell_timeout_s, self._seq, schemas=schemas)  # type: ignore[union-attr]
                self._mark("reply")
            except Malformed as e:
                return self._compromised(e, t0)
            except OSError:
                reply = None
            elapsed = time.monotonic() - t0
            self._retire()
            self._flush_spare()
            if self._unadopted:
                self._adopt_spares()
            self._mark("after")
            return self._result(reply, elapsed, live)

    def _result(self, reply: dict | None, elapsed: float, live: Any) -> CellResult:
        """The cell's `CellResult` from its reply (None: no reply came); kills what it must."""
        cfg = self.config
        if reply is not None and "refused" in reply:
            self._refused(reply["refused"])
            return CellResult("refused", "", 0, reply["refused"], elapsed)
        if reply is not None and reply["limit"] == "cpu":
            # the CPU limit stopped the cell mid-way: the same stop as the wall limit (which of
            # the two fires first depends on the machine's load), so its state is not kept
            self._kill_live()
            return CellResult(
                "timeout",
                reply["output"],
                reply["total_chars"],
                reply["error"] or "CpuLimit",
                elapsed,
            )
        if reply is not None:
            self._live_threads = reply["threads"]
            status = "error" if reply["error"] is not None else "ok"
            return CellResult(
                status,
                reply["output"],
                reply["total_chars"],
                reply["error"],
                elapsed,
                self._live_threads,
            )
        timed_out = elapsed >= cfg.cell_timeout_s and live.alive()
        self._kill_live()
        error = None
        if not timed_out and self._oom_killed():
            error = (
                "MemoryError: the sandbox exceeded its memory total "
                f"({cfg.memory_total_mb} MiB: the interpreter, its processes and parked snapshots)"
            )
        return CellResult("timeout" if timed_out else "crashed", "", 0, error, elapsed)

    def _oom_killed(self) -> bool:
        """Whether the memory cgroup's OOM killer struck since the last call."""
        if self._memcg is None:
            return False
        kills = _cg.oom_kills(self._memcg)
        new, self._oom_seen = kills > self._oom_seen, kills
        return new

    def memory(self) -> _cg.MemoryUse | None:
        """The sandbox's memory now, at most so far and its limit (None without a memory cgroup)."""
        return _cg.usage(self._memcg) if self._memcg else None

    def _refused(self, reason: str) -> None:
        """A restored interpreter found its files or limits tampered with and did not serve."""
        log.warning(
            "math sandbox: a restored interpreter refused to serve (%s); the state is rebuilt "
            "by replay after every process the cells left is gone",
            reason,
        )
        self._kill_live()
        self._await_strays(time.monotonic() + 2.0)  # e.g. one holding the disk full

    def _compromised(self, error: Malformed, t0: float) -> CellResult:
        """The live interpreter broke the protocol: nothing of this sandbox is trusted any more."""
        log.warning(
            "math sandbox: the interpreter sent a message outside the protocol (%s); a cell reached "
            "the env's channel, so the whole sandbox is restarted",
            error,
        )
        self.close()
        return CellResult("compromised", "", 0, None, time.monotonic() - t0)

    def replay(self, ledger: list[str] | tuple[str, ...]) -> bool:
        """A fresh interpreter that has re-run `ledger`; False if a cell failed to finish."""
        with self._lock:
            for attempt in range(2):
                if attempt:
                    # every ledger cell finished once, so a cell dying in the replay means the
                    # sandbox itself is broken (e.g. a cell killed its processes): replay once
                    # more in a whole new sandbox rather than give back a half-built state
                    log.warning(
                        "math sandbox: a ledger cell died during replay; restarting the sandbox"
                    )
                    self.close()
                self.fresh()
                if all(self.run(code).status in ("ok", "error") for code in ledger):
                    return True
            return False

    def _retire(self) -> None:
        """Kill the interpreter the last restore replaced (stopped since; see `_install`)."""
        if self._retired is not None:
            self._retired.kill()
            self._retired = None

    def _adopt_spares(self) -> None:
        """Adopt the spares whose hello has arrived, so a restore finds them known already."""
        waiting = [p for p in self._unadopted if p.pidfd is None and not p.killed]
        ready = select.select([p.chan for p in waiting], [], [], 0)[0] if waiting else []
        soon = time.monotonic() + 0.05  # a readable channel: its hello (or end) is there
        for proc in waiting:
            if proc.chan in ready and proc.ready(soon) and self._memcg is not None:
                _cg.set_oom_score(proc.pid, proc.pidfd, _LIVE_OOM)  # type: ignore[arg-type]
                proc.victim = True
        self._unadopted = [p for p in waiting if p.pidfd is None and not p.killed]

    def _kill_live(self) -> None:
        """Kill the live interpreter and everything it started (all non-known members)."""
        self._retire()
        if self._live is not None:
            self._live.kill()
            self._live = None
        deadline = time.monotonic() + 0.5
        for spare in self._spares.values():  # know the spares, or the sweep kills them
            spare.ready(deadline)
        kill_members(self._members, keep=self._known_pids())

    def _await_strays(self, deadline: float) -> None:
        """Wait until the processes a sweep killed are gone (their files and memory freed)."""
        while time.monotonic() < deadline:
            known = self._known_pids()
            if not [p for p in self._members.all() if p not in known and not exited(p)]:
                return
            time.sleep(0.01)

    def _install(self, parent: Proc, key: int | str, seed: int | None) -> None:
        """Make a fork of `parent` the live interpreter: its ready spare, else a new fork."""
        spare = self._spares.pop(key, None)
        self._mark("start")
        # a cell may have stopped the parked process or its spare (SIGSTOP to every pid it
        # sees): continue them first, or a restored cell would report a timeout it did not
        # cause. Reading /proc's state instead races the signal on a loaded machine (a stop
        # sent but not yet acted on reads as sleeping); SIGCONT also discards that pending stop.
        parent.resume()
        if parent.pid is not None and stopped(parent.pid):  # a tracer's stop: not ours to lift
            if spare is not None:
                spare.kill()
            raise SandboxError("a parked sandbox process was stopped and could not be continued")
        if spare is not None and spare.ready(time.monotonic() + self.config.fork_timeout_s):
            spare.resume()
        self._mark("spare")
        if spare is not None and spare.alive() and not stopped(spare.pid):  # type: ignore[arg-type]
            new = spare
        else:
            if spare is not None:
                spare.kill()
            new = self._fork_from(parent, seed)
        self._retire()  # a second restore before any cell
        if self._live is not None:
            # only the old interpreter itself: a full sweep here would wait for every pending
            # spare; processes its cells left behind are swept at the next reset, timeout or
            # close. It is stopped now (SIGSTOP: not one more instruction of it runs) and killed
            # after the new interpreter's first reply: a kill here put its teardown (unmapping
            # a forked interpreter) on the first cell's path, 2-3 ms of the 5 a restore took
            self._live.stop()
            self._live.lower_priority()  # see there: the kill after the reply must not block
            self._retired = self._live
        self._live = new
        self._mark("handover")
        if self._memcg is not None and new.pid is not None and not new.victim:
            # over the sandbox's total, the OOM killer takes the live interpreter (or what its
            # cell started: children inherit this), which the env rolls back, not a snapshot;
            # an adopted spare was made one already, off the restore's path
            _cg.set_oom_score(new.pid, new.pidfd, _LIVE_OOM)
            new.victim = True
        if self.config.spares:
            # the next spare is forked after the first cell has answered, so that fork does
            # not compete with the restored interpreter's first (copy-on-write heavy) cell
            self._flush_spare()
            self._pending_spare = (parent, key, seed)
        self._mark("bookkeeping")

    def _flush_spare(self) -> None:
        if self._pending_spare is not None:
            parent, key, seed = self._pending_spare
            self._pending_spare = None
            if parent.alive():
                self._request_spare(parent, key, seed)

    def _request_spare(self, parent: Proc, key: int | str, seed: int | None) -> None:
        """Ask `parent` to fork the next spare; it is adopted when it is needed."""
        mine, theirs = socketpair()
        try:
            send(parent.chan, {"op": "spawn", "seed": seed}, [theirs.fileno()])
            self._spares[key] = spare = Proc(mine, self._members)
            self._unadopted.append(spare)
        except OSError:
            mine.close()
        finally:
            theirs.close()

    def _fork_from(self, parent: Proc, seed: int | None) -> Proc:
        if not parent.alive():  # fail now, not after waiting for a killed parent's channel to close
            raise SandboxError("the sandbox process to fork from is gone")
        mine, theirs = socketpair()
        try:
            send(parent.chan, {"op": "spawn", "seed": seed}, [theirs.fileno()])
        finally:
            theirs.close()
        proc = Proc(mine, self._members)
        if not proc.ready(time.monotonic() + self.config.fork_timeout_s):
            proc.kill()
            raise SandboxError("a sandbox snapshot did not fork a new interpreter in time")
        return proc

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> SnapshotHandle | None:
        """Fork the live interpreter into a parked snapshot; None if that failed.

        None too when the last cell left threads running (a fork keeps only the calling
        thread, so the restored state would differ): such checkpoints replay the ledger.
        """
        with self._lock:
            if self._live is None or self._live_threads:
                return None
            self._retire()  # its memory would count against the snapshots' budget below
            snap, spare = self._fork_snapshot()
            if snap is None:
                return None
            sid = self._next_sid
            self._next_sid += 1
            self._snaps[sid] = snap
            if spare is not None:
                self._spares[sid] = spare
                self._unadopted.append(spare)
            if self._memcg is not None:
                _cg.set_oom_score(
                    snap.pid, snap.pidfd, 0
                )  # forked from the live one: not the first victim
            cap = self.config.max_snapshots if self._memcg else self.config.uncounted_max_snapshots
            while len(self._snaps) > cap:
                self._drop(next(iter(self._snaps)))
            self._evict_for_memory()
            return SnapshotHandle(self.token, sid)

    def _evict_for_memory(self) -> None:
        """Drop the oldest parked snapshots while the sandbox is over `snapshot_budget_mb`.

        Copy-on-write makes a parked snapshot cost what the live interpreter rewrites after
        it, which only the cgroup's charge shows. The newest snapshot is kept: what it holds
        privately is still shared with the live interpreter. A dropped one restores by replay.
        """
        budget = self.config.snapshot_budget_mb
        while len(self._snaps) > 1:
            use = _cg.usage(self._memcg) if self._memcg else None
            if use is None or use.current_mb <= budget:
                return
            sid = next(iter(self._snaps))
            self._drop(sid, wait_s=1.0)  # its pages are freed as it exits
            self._evicted.add(sid)
            self.evicted_for_memory += 1

    def was_evicted(self, handle: Any) -> bool:
        """Whether `handle`'s snapshot was dropped to keep the sandbox under its memory budget."""
        return (
            isinstance(handle, SnapshotHandle)
            and handle.sandbox == self.token
            and handle.sid in self._evicted
        )

    def _fork_snapshot(self) -> tuple[Proc | None, Proc | None]:
        mine, theirs = socketpair()
        spare_mine, spare_theirs = socketpair()
        fds = [theirs.fileno(), spare_theirs.fileno()] if self.config.spares else [theirs.fileno()]
        deadline = time.monotonic() + self.config.fork_timeout_s
        self._seq += 1
        try:
            send(self._live.chan, {"op": "fork", "seq": self._seq}, fds)  # type: ignore[union-attr]
        except OSError:
            mine.close()
            spare_mine.close()
            return None, None
        finally:
            theirs.close()
            spare_theirs.close()
        snap = Proc(mine, self._members)
        try:
            ack, _pid = recv(self._live.chan, deadline, self._seq, schemas=(ACK, REFUSED))  # type: ignore[union-attr]
        except Malformed as e:
            snap.kill()
            spare_mine.close()
            self._compromised(e, time.monotonic())
            return None, None
        if ack is not None and "refused" in ack:
            snap.kill()
            spare_mine.close()
            self._refused(ack["refused"])
            return None, None
        try:
            msg, pid = recv(mine, deadline) if ack is not None else (None, None)
        except Malformed:
            msg, pid = None, None
        if not snap.adopt(msg, pid) or not msg.get("files", True):  # type: ignore[union-attr]
            snap.kill()
            spare_mine.close()
            log.warning(
                "math sandbox: snapshot fork failed or its work dir is over %d MiB; restore will replay "
                "the ledger",
                self.config.snapshot_files_mb,
            )
            if ack is None:
                self._kill_live()
            return None, None
        if not self.config.spares:
            spare_mine.close()
            return snap, None
        return snap, Proc(spare_mine, self._members)

    def _drop(self, sid: int, wait_s: float = 0.0) -> None:
        if self._pending_spare is not None and self._pending_spare[1] == sid:
            self._pending_spare = None
        for proc in (self._snaps.pop(sid, None), self._spares.pop(sid, None)):
            if proc is not None:
                proc.kill(wait_s)

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
            self._live_threads = 0
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
        """Host pids of every live process of this sandbox (for tests and diagnostics)."""
        return sorted(self._members.all())

    # ------------------------------------------------------------------ cleanup
    def _known_pids(self) -> set[int]:
        procs = [self._live, self._zygote, *self._snaps.values(), *self._spares.values()]
        known = {p.pid for p in procs if p is not None and p.pid is not None}
        known |= set(self._infra)
        if self._boot is not None:
            known.add(self._boot.pid)
        return known

    def _make_cgroups(self) -> list[str]:
        """Cgroups of the sandbox: see `make_cgroups`; sets `_memcg` to the memory-limited one."""
        made, self._memcg = make_cgroups(
            f"trace_gym_math_{os.getpid()}_{self.token}",  # the owner's pid: see _stale_cgroups
            self.config.memory_total_mb,
            self.process_limit,
        )
        return made

    def _cgroup_kill(self) -> None:
        for cg in self._cgroups:
            with contextlib.suppress(OSError):
                Path(cg, "cgroup.kill").write_text("1")

    def _remove_cgroups(self) -> None:
        for cg in self._cgroups:
            for _ in range(100):
                try:
                    os.rmdir(cg)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    self._cgroup_kill()
                    kill_members(Members([cg], None), keep=set(), rounds=1)
                    time.sleep(0.02)
        self._cgroups = []
        self._cgroup = None
        self._memcg = None


def make_cgroups(name: str, memory_mb: int, pids_max: int | None) -> tuple[list[str], str | None]:
    """A v2 cgroup (membership, cgroup.kill), a v1 pids cgroup (pids.max) and a memory limit.

    The memory limit goes on the v2 cgroup where its hierarchy has the memory controller,
    else on a v1 memory cgroup. Returns the cgroups made and the memory-limited one (None
    if the kernel offers neither). Only what is writable is made.
    """
    made: list[str] = []
    memcg = None
    for base in (*_CGROUP_V2, _CGROUP_V1, _cg.V1_MEMORY):
        if not os.path.exists(os.path.join(base, "cgroup.procs")) or any(
            m.startswith(base + "/") for m in made
        ):
            continue
        v2 = base in _CGROUP_V2
        if v2 and not os.path.exists(os.path.join(base, "cgroup.controllers")):
            continue
        if (base == _cg.V1_MEMORY and memcg is not None) or (base == _CGROUP_V1 and not pids_max):
            continue
        for stale in _stale_cgroups(base):
            with contextlib.suppress(OSError):
                stale.rmdir()  # only succeeds when the cgroup holds no process
        memory = base == _cg.V1_MEMORY or (v2 and _cg.v2_memory_ready(base))
        path = os.path.join(base, name)
        try:
            os.mkdir(path)
        except OSError:
            continue
        try:
            if base == _CGROUP_V1:
                Path(path, "pids.max").write_text(str(pids_max))
            if memory:
                _cg.apply_limit(path, "v2" if v2 else "v1", memory_mb)
                memcg = path
            made.append(path)
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(path)
    return made, memcg


def _stale_cgroups(base: str) -> list[Path]:
    """Our cgroups under `base` left by env processes that are gone.

    A cgroup is named after the pid of the process that made it, and only those of dead
    processes count as stale: a live process's cgroup is empty for a moment between its
    mkdir and its sandbox joining it, and removing it then (another env process doing its
    own clean-up, say a Ray worker or a parallel test run) made that launch fail.
    """
    stale = []
    for path in Path(base).glob("trace_gym_math_*"):
        owner = path.name.split("_")[3]
        if owner.isdigit():
            try:
                os.kill(int(owner), 0)
                continue  # the owner lives: its cgroup is its own business
            except (ProcessLookupError, OverflowError):
                pass
            except PermissionError:
                continue
        stale.append(path)  # a dead owner, or a name from before owners were recorded
    return stale
