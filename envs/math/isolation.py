"""How a sandbox process is isolated: bubblewrap, kernel namespaces, or nothing.

`choose_mode("auto")` picks, in order: ``"bwrap"`` (bubblewrap is installed and can
start a sandbox here), ``"namespaces"`` (the worker unshares network, PID and mount
namespaces itself and drops to an unprivileged uid; needs root; logged as a warning), and
``"none"`` (resource limits only; logged loudly). `launch` starts a command in the chosen
mode; both the interpreter sandbox and the answer verifier start through it.

Under bwrap the process sees a minimal read-only root: /usr (and the /bin, /lib
symlinks), the Python runtime and the site-packages it imports from, the files named in
``expose``, a fresh /proc of its own PID namespace, /dev with only null, zero and urandom,
and a size-capped tmpfs /tmp that holds the private work dir. No host home, checkout,
/etc, /run, /sys or socket is mounted. It runs as an unprivileged uid (a free one per
sandbox when the host is root), in new user, PID, network, IPC, UTS, mount and cgroup
namespaces, with no capabilities, ``no_new_privs`` and the seccomp filter of `seccomp`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import secrets
import shutil
import site
import stat
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from trace_gym.envs.math import seccomp

log = logging.getLogger(__name__)

_CLONE_NEWNS, _CLONE_NEWNET = 0x00020000, 0x40000000
_PR_SET_NO_NEW_PRIVS = 38
_MS_REC, _MS_BIND, _MS_PRIVATE, _MS_NOSUID, _MS_NODEV = 0x4000, 4096, 1 << 18, 2, 4
MODES = ("auto", "bwrap", "namespaces", "none")
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")


@dataclass
class Launch:
    """What to start and under which limits (see `launch`)."""

    #: the command as seen inside the sandbox
    argv: list[str]
    mode: str
    #: uid to switch to before starting (root hosts only)
    uid: int | None = None
    #: cgroups (cgroup.procs directories) the process joins before it starts
    cgroups: list[str] = field(default_factory=list)
    #: host file -> path inside the sandbox, bound read-only
    expose: dict[str, str] = field(default_factory=dict)
    tmpfs_mb: int = 64
    env: dict[str, str] = field(default_factory=dict)
    pass_fds: tuple[int, ...] = ()
    seccomp: bool = True
    #: 'namespaces' mode: the command unshares and drops privileges itself (the math worker does);
    #: False makes the launcher do it (new mount and network namespaces, uid, no_new_privs)
    self_isolating: bool = True


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


UID_RANGE = (200_000, 260_000)


def free_uid() -> int:
    """An unprivileged uid no running process uses (for one sandbox or verifier worker)."""
    used = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                used.add(os.stat(entry.path).st_uid)
    while True:
        uid = UID_RANGE[0] + secrets.randbelow(UID_RANGE[1] - UID_RANGE[0])
        if uid not in used:
            return uid


def python_paths() -> list[str]:
    """The directories the interpreter imports from (outermost ones only, no checkout)."""
    wanted = {sys.base_prefix, *site.getsitepackages(), sysconfig.get_paths()["stdlib"]}
    wanted |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages", "lib-dynload"))}
    real = sorted({os.path.realpath(p) for p in wanted if p and os.path.isdir(p)})
    return [p for i, p in enumerate(real) if not any(p.startswith(q + os.sep) for q in real[:i])]


def python_executable() -> str:
    """The real interpreter binary (a virtual environment's python is a symlink to it)."""
    return os.path.realpath(sys.executable)


def sandbox_pythonpath() -> str:
    """PYTHONPATH inside the sandbox: the site-packages the host interpreter uses."""
    paths = [os.path.realpath(p) for p in site.getsitepackages() if os.path.isdir(p)]
    return os.pathsep.join(dict.fromkeys(paths))


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot be used here (None when it can): probed once per process."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bwrap is not installed (apt-get install bubblewrap)"
    probe = Launch(
        [python_executable(), "-S", "-c", "print('ok')"], "bwrap", uid=_probe_uid(), seccomp=False
    )
    try:
        proc = launch(
            probe, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        out, err = proc.communicate(timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"bwrap failed to start: {e}"
    if proc.returncode != 0 or out.strip() != b"ok":
        return f"bwrap cannot create a sandbox here: {err.decode(errors='replace').strip()[:300]}"
    return None


def _probe_uid() -> int | None:
    return 65534 if os.geteuid() == 0 else None


def choose_mode(requested: str) -> str:
    """The isolation mode to use for `requested` ('auto' falls back with a warning)."""
    if requested != "auto":
        return requested
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    if os.geteuid() == 0 and sys.platform.startswith("linux"):
        log.warning(
            "math sandbox: %s; falling back to kernel namespaces and an unprivileged uid "
            "(no read-only root, no seccomp)",
            problem,
        )
        return "namespaces"
    log.warning(
        "math sandbox: %s and this process is not root: CELLS RUN WITHOUT ISOLATION "
        "(resource limits only); they can read and write whatever this user can",
        problem,
    )
    return "none"


def _bwrap_argv(spec: Launch, fds: list[int]) -> list[str]:
    """The bwrap command line; `fds` collects the descriptors it needs passed."""
    argv = [
        "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--disable-userns",
        "--cap-drop",
        "ALL",
        "--clearenv",
    ]
    # /tmp first: a checkout (and its virtual environment) under /tmp is bound on top of it
    argv += ["--size", str(spec.tmpfs_mb << 20), "--tmpfs", "/tmp", "--dir", "/tmp/work"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = f"/{link}"
        if os.path.islink(target):
            argv += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            argv += ["--ro-bind", target, target]
    for path in python_paths():
        if not path.startswith("/usr/"):
            argv += ["--ro-bind", path, path]
    for host, inside in spec.expose.items():
        argv += ["--ro-bind", host, inside]
    argv += ["--proc", "/proc", "--tmpfs", "/dev"]
    for dev in DEVICES:
        argv += ["--dev-bind", dev, dev]
    argv += ["--symlink", "/proc/self/fd", "/dev/fd"]
    argv += ["--chdir", "/tmp/work"]
    # /dev is a tmpfs too: read-only, so /tmp (snapshotted whole) is the only place to write
    argv += ["--remount-ro", "/", "--remount-ro", "/dev"]
    for key, value in {**spec.env, "HOME": "/tmp/work", "TMPDIR": "/tmp"}.items():
        argv += ["--setenv", key, value]
    if spec.seccomp:
        fd = seccomp.filter_fd()
        if fd is not None:
            fds.append(fd)
            argv += ["--seccomp", str(fd)]
    return [*argv, "--", *spec.argv]


def _blocked_ancestor(path: str) -> str | None:
    """The outermost directory above `path` that other users cannot traverse (/root)."""
    cur = ""
    for part in os.path.abspath(path).split(os.sep)[1:]:
        cur += os.sep + part
        try:
            st = os.stat(cur)
            if stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o001:
                return cur
        except OSError:
            return None
    return None


def _unblock_plan(spec: Launch) -> list[tuple[str, list[str]]]:
    """Directories to cover, and the paths (held open) to show again under each.

    bwrap started as an unprivileged uid cannot read a Python installation under a 0700
    directory such as /root; the child, still root, covers that directory with an empty
    tmpfs in a mount namespace of its own and binds back only the needed trees. The host's
    own mounts are untouched.
    """
    if spec.uid is None or not (
        spec.mode == "bwrap" or (spec.mode == "namespaces" and not spec.self_isolating)
    ):
        return []
    plan: dict[str, list[str]] = {}
    for path in [*python_paths(), *spec.expose]:
        blocker = _blocked_ancestor(path)
        if blocker is not None:
            plan.setdefault(blocker, []).append(path)
    return list(plan.items())


def _unblock(plan: list[tuple[str, list[str]]]) -> None:
    libc = _libc()
    if (
        libc.unshare(_CLONE_NEWNS) != 0
        or libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0
    ):
        raise OSError("cannot make a private mount namespace to expose Python")
    for blocker, paths in plan:
        held = [(path, os.open(path, os.O_PATH)) for path in paths]  # opened in the new namespace
        if (
            libc.mount(
                b"tmpfs", blocker.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1m,mode=755"
            )
            != 0
        ):
            raise OSError(f"cannot cover {blocker}")
        for path, fd in held:
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, mode=0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                open(path, "a").close()
            if (
                libc.mount(
                    f"/proc/self/fd/{fd}".encode(), path.encode(), None, _MS_BIND | _MS_REC, None
                )
                != 0
            ):
                raise OSError(f"cannot expose {path}")


def _preexec(spec: Launch, plan: list[tuple[str, list[str]]]):
    """Runs in the child before exec: join the cgroups, expose Python, drop to the sandbox uid."""
    cgroups, uid = list(spec.cgroups), spec.uid
    netns = spec.mode == "namespaces" and not spec.self_isolating

    def run() -> None:
        for cg in cgroups:
            with open(os.path.join(cg, "cgroup.procs"), "w") as f:
                f.write("0")
        if plan:
            _unblock(plan)
        if netns and _libc().unshare(_CLONE_NEWNET) != 0:
            raise OSError("cannot make a network namespace")
        if netns:
            _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)

    return run


def launch(spec: Launch, **popen: object) -> subprocess.Popen:
    """Start `spec.argv` isolated as `spec.mode` says ('bwrap', 'namespaces' or 'none').

    In 'namespaces' mode the command does its own unsharing (the math worker does), so
    here it only joins the cgroups; the uid is dropped inside, after the mounts. With
    ``self_isolating=False`` (the verifier) this launcher gives it new mount and network
    namespaces, the uid and ``no_new_privs`` itself.
    """
    fds: list[int] = []
    plan = _unblock_plan(spec)
    try:
        if spec.mode == "bwrap":
            argv = _bwrap_argv(spec, fds)
            preexec = _preexec(spec, plan)
            env = {"PATH": "/usr/bin:/bin"}
        elif spec.mode == "namespaces" and not spec.self_isolating:
            argv = spec.argv
            preexec = _preexec(spec, plan)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **spec.env}
        else:
            argv = spec.argv
            preexec = _preexec(Launch(spec.argv, spec.mode, None, spec.cgroups), [])
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **spec.env}
        return subprocess.Popen(
            argv,
            pass_fds=(*spec.pass_fds, *fds),
            env=env,
            preexec_fn=preexec,  # noqa: PLW1509
            start_new_session=True,
            cwd="/",
            **popen,
        )  # type: ignore[arg-type]
    finally:
        for fd in fds:
            os.close(fd)


def exposed_path(host: str | Path) -> str:
    """Where a host file of the env's own code is bound inside a bwrap sandbox."""
    return f"/sandbox/{Path(host).name}"
