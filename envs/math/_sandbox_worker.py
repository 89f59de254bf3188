"""The code that runs *inside* the math sandbox (bootstrap, init, zygote, interpreters).

Started by `trace_gym.envs.math.sandbox.Sandbox` as ``python -s _sandbox_worker.py CONFIG``;
it imports nothing from trace_gym (only the standard library, plus the configured
preloads), so the sandbox never loads the env's own code.

Process layout (under bwrap, the bootstrap already runs unprivileged inside bwrap's
namespaces; in 'namespaces' mode it is root and unshares them itself)::

    bootstrap (exits when the env closes its stdin)
      init    (pid 1 of the new PID namespace, unprivileged, reaps orphans)
        zygote        (the "pristine" parked process: preloads imported, nothing run)
        interpreter   (live; its own process group; runs cells)
        snapshot ...  (parked forks of an interpreter, one per live checkpoint)

Every long-lived process is a child of init (double fork), so nothing is left as a
zombie of a process that the env killed. Messages are JSON over SOCK_SEQPACKET unix
sockets; a new channel travels as an SCM_RIGHTS file descriptor with the ``fork`` /
``spawn`` request that creates the process which will own it. A process announces
itself with ``{"hello": true}``; the env learns its pid from the kernel (SO_PASSCRED),
never from a message, so nothing here reports pids.

Files are part of a snapshot: a parked snapshot reads every file a cell could have
written (the whole private /tmp under bwrap; every tmpfs it made in 'namespaces' mode; the
work dir without a mount namespace) into its own memory (regular files, directories and
symlinks as symlinks; FIFOs, sockets and devices skipped; hard links become copies;
sparse files count their full size; other mounts and files of other uids left alone) up
to ``snapshot_files_mb``. The copy is out of every cell's reach: the process is not
dumpable and no sandbox process can read or write another one's memory. An interpreter
forked from it makes those directories exactly that copy again before its first request,
and checks that its resource limits are still the ones the snapshot was parked with; if
either fails it refuses the request (``{"refused": why}``) and the env restores the
state by replay. The zygote's copy is the pristine /tmp, so every fresh interpreter (a
new episode, a replay) starts from an empty scratch space. A bigger copy makes the
snapshot report ``files: false`` and that checkpoint is restored by ledger replay.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import io
import json
import linecache
import os
import resource
import signal
import socket
import stat
import sys
import threading
import traceback

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_REC = 0x4000
MS_BIND = 4096
MS_PRIVATE = 1 << 18
MS_NOSUID = 2
MS_NODEV = 4
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_DUMPABLE = 4
ADDR_NO_RANDOMIZE = 0x0040000
MAX_MSG = 1 << 20
#: the world-writable directories 'namespaces' mode covers with fresh tmpfs mounts
COVERED = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")

_libc = ctypes.CDLL(None, use_errno=True)


def _log(*parts: object) -> None:
    if os.environ.get("TRACE_GYM_SANDBOX_DEBUG"):
        print("[sandbox]", os.getpid(), *parts, file=sys.__stderr__, flush=True)


# ---------------------------------------------------------------------- messaging
def send(chan: socket.socket, msg: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(msg).encode()
    if fds:
        socket.send_fds(chan, [data], fds)
    else:
        chan.send(data)


_RECV_BUF = bytearray(
    MAX_MSG
)  # allocated up front: a cell that used up the address space can still be served
_FD_SIZE = 4


def recv(chan: socket.socket) -> tuple[dict | None, list[int]]:
    """One request and any passed fds; (None, []) when the peer has gone."""
    try:
        size, anc, _flags, _addr = chan.recvmsg_into([_RECV_BUF], socket.CMSG_SPACE(4 * _FD_SIZE))
    except OSError:
        return None, []
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += [
                int.from_bytes(payload[i : i + 4], sys.byteorder)
                for i in range(0, len(payload) - len(payload) % 4, 4)
            ]
    if not size:
        return None, []
    return json.loads(bytes(_RECV_BUF[:size])), fds


# ---------------------------------------------------------------------- cells
class CappedWriter(io.TextIOBase):
    """A stdout that keeps the first `limit` characters and counts the rest."""

    def __init__(self, limit: int):
        self.limit = limit
        self.parts: list[str] = []
        self.kept = 0
        self.total = 0

    def writable(self) -> bool:
        return True

    def write(self, s) -> int:  # type: ignore[override]
        s = str(s)
        self.total += len(s)
        room = self.limit - self.kept
        if room > 0:
            piece = s[:room]
            self.parts.append(piece)
            self.kept += len(piece)
        return len(s)

    def text(self) -> str:
        return "".join(self.parts)


class NoInput(io.TextIOBase):
    """stdin for cells: always at end of file."""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> str:  # type: ignore[override]
        return ""

    def readline(self, size: int = -1) -> str:  # type: ignore[override]
        return ""


#: the limits in force (memory_mb, file_size_mb, ...), for the notes `limit_note` writes
LIMITS: dict = {}


def limit_note(e: BaseException) -> str | None:
    """A line that names the sandbox limit a cell's exception came from, if any."""
    if isinstance(e, MemoryError):
        return f"MemoryError: the cell exceeded the sandbox memory limit ({LIMITS.get('memory_mb')} MiB)"
    if isinstance(e, CpuLimit):
        return f"TimeoutError: the cell exceeded its CPU time limit ({LIMITS.get('cpu_s')} s)"
    if isinstance(e, OSError):
        code = e.errno
        if code == 27:  # EFBIG
            return f"OSError: a file exceeded the sandbox file size limit ({LIMITS.get('file_size_mb')} MiB)"
        if code == 24:  # EMFILE
            return (
                f"OSError: the cell exceeded the open files limit ({LIMITS.get('max_open_files')})"
            )
        if code == 11:  # EAGAIN from fork/thread start
            return f"OSError: the cell exceeded the process/thread limit ({LIMITS.get('max_processes')})"
        if code == 28:  # ENOSPC
            return f"OSError: the sandbox disk (/tmp, {LIMITS.get('tmpfs_mb')} MiB) is full"
    if isinstance(e, RuntimeError) and "can't start new thread" in str(e):
        return f"RuntimeError: the cell exceeded the process/thread limit ({LIMITS.get('max_processes')})"
    return None


class CpuLimit(BaseException):
    """Raised in a cell by SIGXCPU (the per-cell RLIMIT_CPU soft limit)."""


def _on_xcpu(_signum, _frame) -> None:
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))  # no second SIGXCPU while it unwinds
    raise CpuLimit("CPU time limit exceeded")


class Interpreter:
    """A notebook-like namespace that runs cells and reports their output."""

    def __init__(self) -> None:
        import builtins

        self.ns: dict = {"__name__": "__main__", "__builtins__": builtins}
        self.count = 0

    def run(self, code: str, max_chars: int, cpu_s: float) -> dict:
        self.count += 1
        LIMITS["cpu_s"] = cpu_s
        name = f"<cell {self.count}>"
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        want = int(used + cpu_s) + 1
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        if soft != want:  # read just now: unchanged since the last cell is the usual case
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_CPU, (want, hard))
        out = CappedWriter(max_chars)
        error = None
        limit = None
        old = sys.stdout, sys.stderr, sys.stdin
        sys.stdout = sys.stderr = out
        sys.stdin = NoInput()
        try:
            tree = ast.parse(code, name, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            linecache.cache[name] = (len(code), None, code.splitlines(True), name)
            exec(compile(tree, name, "exec"), self.ns)
            if last is not None:
                value = eval(compile(last, name, "eval"), self.ns)
                if value is not None:
                    print(repr(value), file=out)
        except BaseException as e:  # noqa: BLE001 - any failure of the cell is data
            error = short_traceback(e)
            if isinstance(e, CpuLimit):
                limit = "cpu"
            note = limit_note(e)
            if note:
                error = error.rstrip("\n") + "\n" + note + "\n"
        finally:
            sys.stdout, sys.stderr, sys.stdin = old
        threads = sum(
            1 for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()
        )
        return {
            "output": out.text(),
            "total_chars": out.total,
            "error": error,
            "threads": threads,
            "limit": limit,
        }


def short_traceback(e: BaseException, limit: int = 2000) -> str:
    """The traceback of a failing cell: its own frames, the innermost frame, the error."""
    tb = traceback.TracebackException.from_exception(e, capture_locals=False)
    frames = [f for f in tb.stack if f.filename.startswith("<cell")]
    if isinstance(e, SyntaxError) and not frames:  # the cell did not compile: no stack to show
        lines = list(tb.format_exception_only())
    else:
        if tb.stack and tb.stack[-1] not in frames:
            frames.append(tb.stack[-1])
        lines = ["Traceback (most recent call last):\n"]
        if frames:
            lines += traceback.StackSummary.from_list(frames).format()
        lines += list(tb.format_exception_only())
    text = "".join(lines)
    if len(text) > limit:
        text = text[: limit // 2] + "\n...\n" + text[-limit // 2 :]
    return text


def seed_rngs(seed: int) -> None:
    import random

    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed)


# ---------------------------------------------------------------------- processes
def fork_keeping_rng() -> int:
    """os.fork, but the child keeps `random`'s state (the module reseeds itself at fork)."""
    rnd = sys.modules.get("random")
    state = rnd.getstate() if rnd is not None else None
    pid = os.fork()
    if pid == 0 and state is not None:
        rnd.setstate(state)
    return pid


def double_fork() -> bool:
    """Fork a grandchild that is reparented to init; True in the grandchild.

    Raises OSError (in the caller only) when the first fork fails; when the second one
    fails the child just exits, so no copy of the caller goes on serving its channel.
    """
    pid = fork_keeping_rng()
    if pid == 0:
        try:
            if fork_keeping_rng() == 0:
                return True
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)
    return False


def serve_live(chan: socket.socket, interp: Interpreter, saved: tuple | None = None) -> None:
    """The live interpreter's loop: run cells, fork snapshots (`saved`: what to restore first)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGXCPU, _on_xcpu)
    me = os.getpid()
    send(chan, {"hello": True})
    # after the hello, so a restore that comes at once can hand this spare over meanwhile
    # (its first request waits in the channel until the warm-up is done)
    warm_up()
    while True:
        msg, fds = recv(chan)
        if msg is None:
            os._exit(0)
        op = msg.get("op")
        if saved is not None:  # the first request: this interpreter is now the live one
            problem = restore_saved(saved)
            saved = None
            if problem is not None:
                _log("refusing to serve", problem)
                send(chan, {"refused": problem[:500], "seq": msg.get("seq")})
                os._exit(0)
        if op == "exec":
            reply = interp.run(msg["code"], int(msg["max_chars"]), float(msg["cpu_s"]))
            if os.getpid() != me:
                os._exit(0)  # a process the cell forked came back here: it must not answer
            send(chan, {**reply, "seq": msg.get("seq")})
        elif op == "fork" and fds:
            try:
                parked = double_fork()
            except OSError as e:
                # no process left under the limits (e.g. a fork bomb's children are still
                # exiting): no snapshot this time, but the live interpreter and its state
                # must survive; the env sees the snapshot channel close and replays on restore
                _log("snapshot fork failed", e)
                parked = False
            if parked:
                chan.close()
                os.setpgid(0, 0)
                park(socket.socket(fileno=fds[0]), interp, fds[1] if len(fds) > 1 else None)
            send(chan, {"ok": True, "seq": msg.get("seq")})
        else:
            send(chan, {"error": f"unknown request {op!r}"})
        for fd in fds:
            os.close(fd)


def park(chan: socket.socket, interp: Interpreter, spare_fd: int | None = None) -> None:
    """A parked snapshot: each `spawn` request forks a new live interpreter from it.

    With `spare_fd`, the first such interpreter is forked at once, so the env finds a
    ready "spare" waiting when it restores this snapshot.
    """
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # our dead children are reaped by the kernel
    files = capture(LIMITS.get("scratch") or [], LIMITS.get("snapshot_files_mb", 0) << 20)
    saved = (files, rlimits())
    send(chan, {"hello": True, "files": files is not None})
    if spare_fd is not None:
        spawn(chan, interp, spare_fd, None, saved)
    while True:
        msg, fds = recv(chan)
        if msg is None or msg.get("op") == "exit":
            os._exit(0)
        if msg.get("op") == "spawn" and fds:
            spawn(chan, interp, fds[0], msg.get("seed"), saved)
            fds = fds[1:]
        for fd in fds:
            os.close(fd)


# ---------------------------------------------------------------------- scratch files
_WATCHED = (
    resource.RLIMIT_AS,
    resource.RLIMIT_FSIZE,
    resource.RLIMIT_NOFILE,
    resource.RLIMIT_CORE,
    resource.RLIMIT_NPROC,
)


def rlimits() -> tuple:
    """This process's limits as a cell could change them from outside (prlimit, same uid).

    The CPU soft limit is left out: every cell sets it afresh.
    """
    return (*map(resource.getrlimit, _WATCHED), resource.getrlimit(resource.RLIMIT_CPU)[1])


def capture(roots: list[str], budget: int) -> list[tuple] | None:
    """Every file of ours under `roots`, read into memory as (path, kind, mode, data) in order.

    None when over `budget` bytes or unreadable (that checkpoint then replays).
    """
    nodes: list[tuple] = []
    left = [budget]
    try:
        for root in roots:
            _capture_dir(root, os.lstat(root).st_dev, nodes, left)
    except OSError as e:
        _log("snapshot copy failed", e)
        return None
    return nodes


def _capture_dir(path: str, dev: int, nodes: list[tuple], left: list[int]) -> None:
    uid = os.getuid()
    for entry in os.scandir(path):
        st = entry.stat(follow_symlinks=False)
        if st.st_dev != dev or st.st_uid != uid:
            continue  # another mount (a bound venv) or the infrastructure's (root-owned) files
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            nodes.append((entry.path, "link", 0, os.readlink(entry.path)))
        elif stat.S_ISDIR(st.st_mode):
            nodes.append((entry.path, "dir", mode, None))
            _capture_dir(entry.path, dev, nodes, left)
        elif stat.S_ISREG(st.st_mode):
            left[0] -= st.st_size  # a sparse file counts its full size
            if left[0] < 0:
                raise OSError(f"more than the snapshot keeps, at {path}")
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                nodes.append((entry.path, "file", mode, f.read()))


def _clear_dir(path: str, dev: int, kept: dict[str, int]) -> bool:
    """Remove everything of ours under `path`; False when something else had to stay.

    `kept` gets the mode of each directory of ours that stays.
    """
    uid, empty = os.getuid(), True
    for entry in os.scandir(path):
        st = entry.stat(follow_symlinks=False)
        if st.st_dev != dev or st.st_uid != uid:
            empty = False
        elif stat.S_ISDIR(st.st_mode):
            mode = stat.S_IMODE(st.st_mode)
            if mode & 0o700 != 0o700:
                os.chmod(entry.path, mode := 0o700)  # ours: a cell may have made it read-only
            # the work dir stays (it is every interpreter's cwd), emptied
            if _clear_dir(entry.path, dev, kept) and entry.path != LIMITS.get("workdir"):
                os.rmdir(entry.path)
            else:
                kept[entry.path] = mode
                empty = False
        else:
            os.unlink(entry.path)
    return empty


def restore_saved(saved: tuple) -> str | None:
    """Make the scratch space what `saved` holds and check the limits; why not, on failure."""
    files, limits = saved
    if rlimits() != limits:
        return "its resource limits were changed from outside"
    if files is None:
        return None
    umask = os.umask(0)  # modes exactly as saved; the cell's own umask is put back below
    try:
        cwd, kept = os.getcwd(), {}
        for root, dev in zip(LIMITS["scratch"], LIMITS["scratch_devs"], strict=True):
            _clear_dir(root, dev, kept)
        _write_nodes(files, kept)
        if cwd != LIMITS.get("workdir"):
            os.chdir(cwd)  # the same path, now a directory made again
    except OSError as e:
        return f"restoring its files failed: {e}"
    finally:
        os.umask(umask)
    return None


def _write_nodes(files: list[tuple], kept: dict[str, int]) -> None:
    late = []  # directories whose saved mode would stop us filling them: set last
    for path, kind, mode, data in files:
        if kind == "link":
            os.symlink(data, path)
        elif kind == "file":
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        elif path in kept:  # the work dir, or one that holds a mount point
            if kept[path] != mode:
                late.append((path, mode))
        else:
            os.mkdir(path, mode | 0o700)
            if mode & 0o700 != 0o700:
                late.append((path, mode))
    for path, mode in reversed(late):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


def spawn(
    chan: socket.socket, interp: Interpreter, fd: int, seed: int | None, saved: tuple | None = None
) -> None:
    """Fork a live interpreter that serves requests on `fd` (the parent closes `fd`)."""
    try:
        pid = fork_keeping_rng()
    except OSError as e:  # at the process limit: keep this snapshot; the env sees `fd` close
        _log("spawn failed", e)
        pid = -1
    if pid == 0:
        chan.close()
        os.setpgid(0, 0)
        if seed is not None:
            seed_rngs(int(seed))
        serve_live(socket.socket(fileno=fd), interp, saved)
    os.close(fd)


def warm_up() -> None:
    """Walk a cell's code path once in a throwaway namespace, while this fork is still a spare.

    A fork shares its parent's pages copy-on-write, and the first cell after a restore
    would otherwise pay those page faults (the parser, compiler, allocator and JSON
    pages) on the restore's critical path.
    """
    scratch = Interpreter()
    scratch.run("_ = [str(i) for i in range(64)]\n_", 100, 1.0)
    json.loads(json.dumps({"output": "x" * 100, "total_chars": 100, "error": None, "threads": 0}))


def set_limits(cfg: dict) -> None:
    mb = 1024 * 1024
    limits = {
        resource.RLIMIT_AS: cfg["memory_mb"] * mb,
        resource.RLIMIT_FSIZE: cfg["file_size_mb"] * mb,
        resource.RLIMIT_NOFILE: cfg["max_open_files"],
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_CPU: int(cfg["total_cpu_s"]),
    }
    if cfg["own_uid"]:
        # RLIMIT_NPROC counts every process of the uid: only set it on the sandbox's own uid
        # (on a user's uid it would count their desktop too and stop every fork)
        limits[resource.RLIMIT_NPROC] = cfg["max_processes"]
    for what, value in limits.items():
        try:
            resource.setrlimit(what, (value, value))
        except (ValueError, OSError) as e:
            _log("setrlimit failed", what, e)


def drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("privilege drop failed")


def install_network_guard() -> None:
    """Fallback without a network namespace: refuse sockets other than AF_UNIX."""

    def hook(event: str, args: tuple) -> None:
        if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo"):
            sock = args[0] if args else None
            if event == "socket.getaddrinfo" or getattr(sock, "family", None) != socket.AF_UNIX:
                raise PermissionError("network access is disabled in this sandbox")

    sys.addaudithook(hook)


def zygote(cfg: dict, chan: socket.socket) -> None:
    os.chdir(cfg["workdir"])
    os.environ["HOME"] = cfg["workdir"]
    os.environ["TMPDIR"] = cfg["workdir"]
    LIMITS.update(
        {
            k: cfg[k]
            for k in (
                "memory_mb",
                "file_size_mb",
                "max_open_files",
                "max_processes",
                "tmpfs_mb",
                "snapshot_files_mb",
                "workdir",
                "scratch",
            )
        }
    )
    LIMITS["scratch_devs"] = [os.lstat(p).st_dev for p in cfg["scratch"]]
    if not cfg["netns"]:
        install_network_guard()
    for name in cfg["preload"]:
        try:
            __import__(name)
        except Exception as e:  # noqa: BLE001 - a missing optional preload is fine
            _log("preload failed", name, e)
    import gc

    gc.collect()
    if hasattr(gc, "freeze"):
        gc.freeze()  # keep preloaded objects out of GC passes, so forks share their pages
    set_limits(cfg)
    park(chan, Interpreter())


def init(cfg: dict, chan: socket.socket) -> None:
    """The namespace's init: drop privileges, start the zygote, reap orphans forever."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1) if os.environ.get("TRACE_GYM_SANDBOX_DEBUG") else (0, 1, 2):
        os.dup2(devnull, fd)
    if cfg["drop_privileges"]:
        drop_privileges(cfg["uid"], cfg["gid"])
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    # not dumpable (inherited by forks): no sandbox process can ptrace or write /proc/<pid>/mem
    # of another one, e.g. to poison a parked snapshot
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if os.fork() == 0:
        zygote(cfg, chan)
        os._exit(0)
    chan.close()

    def reap(_signum, _frame) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    signal.signal(signal.SIGCHLD, reap)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        signal.pause()
        reap(0, None)


def _blocked_ancestor(path: str) -> str | None:
    """The outermost directory above `path` that other users cannot traverse."""
    parts = os.path.abspath(path).split(os.sep)[1:]
    cur = ""
    for part in parts[:-1] if os.path.isfile(path) else parts:
        cur += os.sep + part
        try:
            if not os.stat(cur).st_mode & 0o001:
                return cur
        except OSError:
            return None
    return None


def _python_paths() -> list[str]:
    """The directories the interpreter imports from (outermost ones only)."""
    needed = sorted(
        {
            os.path.realpath(p)
            for p in (sys.base_prefix, sys.prefix, *sys.path)
            if p and os.path.isdir(p)
        }
    )
    return [
        p for i, p in enumerate(needed) if not any(p.startswith(q + os.sep) for q in needed[:i])
    ]


def expose_python(staging: str) -> list[str]:
    """Make the Python installation readable by the unprivileged uid.

    When it lives under a directory others cannot enter (``/root`` is 0700 on many CI
    machines), cover that directory with an empty tmpfs and bind-mount only the needed
    trees back at their own paths; everything else under it stays hidden.
    """
    needed = _python_paths()
    by_blocker: dict[str, list[str]] = {}
    for path in needed:
        blocker = _blocked_ancestor(path)
        if blocker is not None:
            by_blocker.setdefault(blocker, []).append(path)
    exposed = []
    for blocker, paths in by_blocker.items():
        staged = []
        for i, path in enumerate(paths):
            stage = os.path.join(staging, f"{len(exposed)}-{i}")
            os.makedirs(stage, exist_ok=True)
            if _libc.mount(path.encode(), stage.encode(), None, MS_BIND | MS_REC, None) == 0:
                staged.append((path, stage))
        if (
            _libc.mount(
                b"tmpfs", blocker.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=755"
            )
            != 0
        ):
            continue
        for path, stage in staged:
            os.makedirs(path, mode=0o755, exist_ok=True)
            if _libc.mount(stage.encode(), path.encode(), None, MS_BIND | MS_REC, None) == 0:
                exposed.append(path)
    return exposed


def private_mounts(cfg: dict) -> bool:
    """In a new mount namespace: fresh tmpfs over the world-writable directories."""
    if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    opts = f"size={cfg['tmpfs_mb']}m,mode=1777".encode()
    covered = COVERED
    # a virtual environment (or checkout) under /tmp would vanish under the fresh tmpfs:
    # hold each such Python directory open and bind it back at its own path afterwards
    held = [
        (p, os.open(p, os.O_PATH | os.O_DIRECTORY))
        for p in _python_paths()
        if any(p == c or p.startswith(c + os.sep) for c in covered)
    ]
    ok = True
    for path in covered:
        if os.path.isdir(path):
            if _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
                ok = ok and path != "/tmp"
    for path, fd in held:
        os.makedirs(path, mode=0o755, exist_ok=True)
        if (
            _libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, MS_BIND | MS_REC, None)
            != 0
        ):
            _log("could not re-expose", path)
        os.close(fd)
    if ok and cfg["drop_privileges"]:
        staging = "/tmp/.python"
        os.makedirs(staging, mode=0o700, exist_ok=True)
        expose_python(staging)
    return ok


def bootstrap(cfg: dict) -> None:
    """Enter the namespaces, fork init, and wait for the env to close our stdin."""
    # not dumpable: no cell can open this process's /proc/<pid>/mem (under bwrap it is pid 1
    # of the sandbox and runs as the same uid as the cells)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    report: dict = {"netns": False, "pidns": False, "mountns": False}
    if cfg.get("cgroup"):
        try:
            with open(os.path.join(cfg["cgroup"], "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            _log("cgroup join failed", e)
    if cfg["namespaces"]:
        report["netns"] = _libc.unshare(CLONE_NEWNET) == 0
        if _libc.unshare(CLONE_NEWNS) == 0:
            report["mountns"] = private_mounts(cfg)
        report["pidns"] = _libc.unshare(CLONE_NEWPID) == 0
    if (
        cfg["drop_privileges"]
        and not report["mountns"]
        and any(_blocked_ancestor(p) for p in _python_paths())
    ):
        # the unprivileged uid could not even import the standard library: keep the uid
        # (namespaces and limits still apply) and say so in the isolation report
        cfg = {**cfg, "drop_privileges": False}
    report["uid_dropped"] = cfg["drop_privileges"]
    workdir = cfg["workdir"]
    if report["mountns"]:
        workdir = "/tmp/work"
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    if cfg["drop_privileges"]:
        os.chown(workdir, cfg["uid"], cfg["gid"])
    scratch = cfg.get("scratch") or (
        [p for p in COVERED if os.path.isdir(p)] if report["mountns"] else [workdir]
    )
    cfg = {
        **cfg,
        "workdir": workdir,
        "scratch": scratch,
        "netns": report["netns"] or cfg.get("netns", False),
    }
    chan = socket.socket(fileno=cfg["fd"])
    pid = os.fork()
    if pid == 0:
        init(cfg, chan)
        os._exit(0)
    send(chan, {"isolation": report})
    chan.close()
    try:
        while sys.stdin.buffer.read(1):
            pass
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # cells must not import the env's own modules by accident
    persona = _libc.personality(0xFFFFFFFF)
    if cfg.get("no_aslr") and persona >= 0 and not persona & ADDR_NO_RANDOMIZE:
        # fixed addresses make reprs like <function f at 0x...> reproducible across envs
        if _libc.personality(persona | ADDR_NO_RANDOMIZE) >= 0:
            os.execv(sys.executable, [sys.executable, "-s", os.path.abspath(__file__), sys.argv[1]])
    bootstrap(cfg)


if __name__ == "__main__":
    main()
