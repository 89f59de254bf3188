"""Sandbox v2: what a cell or an answer can reach, in every isolation mode.

Every case ends with the same checks (`_contained`): the canary files outside the sandbox
are unchanged, the next cell answers, and (per fixture) no process is left after close().
Tests that need bubblewrap fail, never skip, where it cannot be used.
"""

from __future__ import annotations

import builtins
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from trace_gym.envs.math import isolation, seccomp
from trace_gym.envs.math._judge import canonical_equal
from trace_gym.envs.math.env import MathEnv
from trace_gym.envs.math.sandbox import Sandbox, SandboxConfig, SandboxError

from trace_gym.errors import ConfigError

ROOT = os.geteuid() == 0
CHECKOUT = Path(__file__).resolve().parents[2]
FAST = {"cell_timeout_s": 3.0, "cell_cpu_s": 2.0, "memory_mb": 768, "max_snapshots": 8}
LIMITED = {
    **FAST,
    "cell_timeout_s": 20.0,
    "cell_cpu_s": 1.0,
}  # CPU limit well below the wall limit, even under load
MODES = ["bwrap", *(["namespaces"] if ROOT else []), "none"]


@pytest.fixture(scope="module")
def canaries(tmp_path_factory):
    """Files outside the sandbox (host /tmp, the checkout) whose bytes must never change."""
    host_tmp = Path("/tmp") / f"trace-gym-canary-{os.getpid()}"
    host_tmp.write_text("canary")
    host_tmp.chmod(0o666)
    checkout = CHECKOUT / ".canary-sandbox-test"
    checkout.write_text("canary")
    checkout.chmod(0o666)
    files = [host_tmp, checkout]
    yield files
    for f in files:
        f.unlink(missing_ok=True)


def _contained(env: MathEnv, canaries: list[Path]) -> None:
    for f in canaries:
        assert f.read_text() == "canary", f"a cell changed {f}"
    assert not (CHECKOUT / "PWNED").exists()
    obs, *_ = env.step("```python\nprint(6 * 7)\n```")
    assert "42" in obs, obs


def _closed_clean(env: MathEnv) -> None:
    sb = env.sandbox
    members = sb._members  # noqa: SLF001 - the kernel's view of the sandbox's processes
    boot = sb._boot  # noqa: SLF001
    before = members.all()
    env.close()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(
        Path(f"/proc/{p}").exists() and not _zombie(p) for p in before
    ):
        time.sleep(0.05)
    assert not [p for p in before if Path(f"/proc/{p}").exists() and not _zombie(p)], (
        "processes survived close()"
    )
    assert boot is None or boot.poll() is not None


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_bwrap_is_usable_and_chosen_by_default():
    # CI installs bubblewrap in the set-up (scripts/setup_venv.sh): a missing or broken one fails here
    assert isolation.bwrap_problem() is None, isolation.bwrap_problem()
    assert isolation.choose_mode("auto") == "bwrap"
    sb = Sandbox(SandboxConfig(**FAST))
    try:
        sb.start()
        assert sb.isolation["mode"] == "bwrap"
        assert sb.isolation["readonly_root"] and sb.isolation["pidns"] and sb.isolation["netns"]
        assert sb.isolation["seccomp"] == (seccomp.program() is not None)
    finally:
        sb.close()


def test_auto_falls_back_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(isolation, "bwrap_problem", lambda: "bwrap is not installed")
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 0)
    assert isolation.choose_mode("auto") == "namespaces"
    assert "falling back to kernel namespaces" in caplog.text
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 1000)
    assert isolation.choose_mode("auto") == "none"
    assert "WITHOUT ISOLATION" in caplog.text


def test_no_isolation_needs_an_explicit_allow_unsafe_host(caplog):
    with pytest.raises(ConfigError, match="allow_unsafe_host=True"):
        SandboxConfig(isolation="none")
    with pytest.raises(ConfigError, match="allow_unsafe_host=True"):
        MathEnv(sandbox={"isolation": "none"})
    sb = Sandbox(SandboxConfig(**FAST, isolation="none", allow_unsafe_host=True))
    try:
        sb.start()
        assert sb.isolation["mode"] == "none"
        assert "WITHOUT ISOLATION" in caplog.text  # loud at every start, even when asked for
    finally:
        sb.close()


def test_auto_never_falls_back_to_no_isolation_silently(monkeypatch):
    monkeypatch.setattr(isolation, "bwrap_problem", lambda: "bwrap is not installed")
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 1000)
    sb = Sandbox(SandboxConfig(**FAST))
    with pytest.raises(SandboxError) as e:
        sb.start()
    assert "bubblewrap" in str(e.value) and "none" not in str(e.value), e.value
    assert not sb.started
    sb.close()


def test_start_up_errors_never_suggest_no_isolation(monkeypatch):
    def launch_nothing(_spec, **popen):  # a sandbox that dies before it says anything
        return subprocess.Popen(["true"], **popen)

    monkeypatch.setattr(isolation, "launch", launch_nothing)
    sb = Sandbox(SandboxConfig(**FAST, start_timeout_s=10))
    with pytest.raises(SandboxError) as e:
        sb.start()
    assert "did not start" in str(e.value) and "none" not in str(e.value), e.value
    sb.close()


def test_env_info_says_which_isolation():
    env = MathEnv(sandbox=dict(FAST))
    try:
        _obs, info = env.reset(seed=0, options={"task": 0})
        assert info["isolation"] == "bwrap"
    finally:
        _closed_clean(env)


# ----------------------------------------------------------------------------- answers
ANSWERS = [
    "__import__('os').system('touch {marker}')",
    "().__class__.__bases__[0].__subclasses__()",
    "getattr(__builtins__, '__imp' + 'ort__')('os').system('touch {marker}')",
    'eval(\'__import__("os").system("touch {marker}")\')',
    "exec(chr(105)+chr(109)+'port os')",
    "lambda: __import__('os')",
    "x.__globals__['os']",
    "9^{9^{9^{9^{9}}}}",
    "10^{10^{10^{10}}}",
    "(10^{100})!",
    "\\frac{1}{0}",
    "{" * 500 + "1" + "}" * 500,
]


def test_the_judge_never_evaluates_text(monkeypatch, tmp_path):
    import sympy
    from sympy.parsing import sympy_parser

    def refuse(*_a, **_k):
        raise AssertionError("text reached an evaluator")

    real = sympy.sympify

    def sympify_no_text(a, *args, **kwargs):
        if isinstance(a, str):
            refuse()
        return real(a, *args, **kwargs)

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(sympy, "sympify", sympify_no_text)
    monkeypatch.setattr(sympy_parser, "parse_expr", refuse)
    marker = tmp_path / "ran"
    for text in ANSWERS:
        assert not canonical_equal(text.replace("{marker}", str(marker)), "1"), text
    assert not marker.exists()
    assert canonical_equal("\\frac{2}{4}", "0.5") and canonical_equal("033", "33")


@pytest.fixture(scope="module")
def answer_env():
    env = MathEnv(sandbox=dict(FAST), verifier_timeout_s=4.0)
    yield env
    _closed_clean(env)


@pytest.mark.parametrize("text", ANSWERS, ids=[f"answer{i}" for i in range(len(ANSWERS))])
def test_answers_that_try_to_run_code_score_zero(answer_env, text, tmp_path):
    marker = Path("/tmp") / f"trace-gym-answer-ran-{os.getpid()}"
    env = answer_env
    env.reset(seed=0, options={"task": 0})
    _obs, reward, term, _trunc, info = env.step(
        "The answer is \\boxed{" + text.replace("{marker}", str(marker)) + "}"
    )
    assert term and reward == 0.0 and not info["correct"]
    assert not marker.exists(), "an answer ran code on the host"


def test_verifier_runs_in_the_sandbox():
    from trace_gym.envs.math.verify import VerifierPool

    pool = VerifierPool(timeout_s=20.0)
    try:
        assert pool.check("1", "1")["canonical"] is True
        worker = pool._idle[0]  # noqa: SLF001 - the worker that answered
        assert worker.mode == "bwrap"
        # a probe through the same launcher: no network, no checkout, unprivileged
        probe = (
            f"import os, socket\nprint(os.getuid(), os.path.exists({str(CHECKOUT / 'pyproject.toml')!r}))\n"
            "try:\n    socket.create_connection(('1.1.1.1', 80), 1)\nexcept OSError as e:\n    print('net', e.errno)"
        )
        spec = isolation.Launch(
            [isolation.python_executable(), "-S", "-c", probe],
            "bwrap",
            uid=231_000 if ROOT else None,
        )
        out = (
            isolation.launch(spec, stdout=subprocess.PIPE)
            .communicate(timeout=30)[0]
            .decode()
            .split()
        )
        assert out[0] != "0" and out[1] == "False" and out[2] == "net"
    finally:
        pool.close()


# ----------------------------------------------------------------------------- forged pids
FORGE = """
import os, socket, struct, sys
w = sys.modules['__main__']
victim = {victim}
def forged(chan, msg, fds=None):
    # the message itself keeps the protocol: a pid in it would be an unknown key, which the
    # host treats as a compromise (test_hostile's forgeries); only the credentials lie
    data = w.json.dumps(msg).encode()
    anc = [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack('iII', victim, os.getuid(), os.getgid()))]
    if fds:
        anc.append((socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack('%di' % len(fds), *fds)))
    try:
        chan.sendmsg([data], anc)
    except OSError:
        chan.sendmsg([data], anc[1:])
w.send = forged
w.outer_pid = lambda: victim
print('patched')
"""


@pytest.mark.parametrize("mode", MODES)
def test_forged_pids_never_reach_a_host_process(mode, canaries):
    victims = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    env = MathEnv(sandbox={**FAST, "isolation": mode, "allow_unsafe_host": mode == "none"})
    try:
        env.reset(seed=0, options={"task": 0})
        for victim in victims:
            obs, *_ = env.step("```python\n" + FORGE.replace("{victim}", str(victim.pid)) + "\n```")
            assert "patched" in obs, obs
            ck = env.checkpoint()  # the snapshot's hello carries the forged pid
            env.step("```python\nx = 1\n```")
            env.restore(ck)
            env.step("```python\nwhile True:\n    pass\n```")  # a timeout after a restore
            env.release(ck)
            env.reset(seed=0, options={"task": 0})
        _contained(env, canaries)
    finally:
        _closed_clean(env)
        alive = [v.poll() is None for v in victims]
        for v in victims:
            v.kill()
            v.wait()
    assert alive == [True, True], "the env killed a host process named by the sandbox"


# ----------------------------------------------------------------------------- host probes
def _host_socket() -> tuple[socket.socket, str]:
    path = f"/tmp/trace-gym-host-sock-{os.getpid()}"
    with pytest.raises(FileNotFoundError):
        os.unlink(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.chmod(path, 0o777)
    s.listen()
    s.setblocking(False)
    return s, path


#: the checkout lies under /tmp (a private tmpfs inside the sandbox): writes to its path may
#: succeed there, so the probes judge by the host file alone (`_contained`)
UNDER_TMP = CHECKOUT.is_relative_to("/tmp")

PROBES = [
    ("read_checkout", f"print(open({str(CHECKOUT / 'pyproject.toml')!r}).read()[:20])", "Error"),
    ("read_host_etc", "print(open('/etc/passwd').read()[:20])", "Error"),
    ("read_host_home", "import os\nprint(os.listdir('/root'), os.listdir('/home'))", "Error"),
    (
        "write_host_tmp_canary",
        "open({canary!r}, 'w').write('pwned')",
        "",
    ),  # the sandbox's own /tmp: allowed
    # under /tmp the checkout's path is inside the sandbox's private tmpfs: the write may
    # succeed there, and `_contained` checks that the host file kept its bytes
    (
        "write_checkout_canary",
        "open({checkout!r}, 'w').write('pwned')",
        "" if UNDER_TMP else "Error",
    ),
    ("write_usr", "open('/usr/pwned', 'w').write('x')", "Error"),
    (
        "connect_host_socket",
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({sock!r})",
        "Error",
    ),
    (
        "list_host_processes",
        "import os\nps = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "cmds = [open(f'/proc/{{p}}/cmdline', 'rb').read() for p in ps]\n"
        "print('seen', len(ps), any(b'pytest' in c for c in cmds))",
        "seen",
    ),
    (
        "escape_workdir_symlink",
        "import os\nos.symlink({checkout!r}, 'link')\nopen('link', 'w').write('pwned')",
        "" if UNDER_TMP else "Error",
    ),
    ("devices", "import os\nprint(sorted(os.listdir('/dev')))\nopen('/dev/sda', 'rb')", "Error"),
    ("proc_mem_of_init", "open('/proc/1/mem', 'r+b')", "Error"),
]


@pytest.fixture(scope="module")
def probe_env():
    env = MathEnv(sandbox=dict(FAST))
    env.reset(seed=0, options={"task": 0})
    yield env
    _closed_clean(env)


@pytest.mark.parametrize("name,code,expect", PROBES, ids=[p[0] for p in PROBES])
def test_host_probe_fails(probe_env, canaries, name, code, expect):
    env = probe_env
    server, path = _host_socket()
    try:
        code = code.format(canary=str(canaries[0]), checkout=str(canaries[1]), sock=path)
        obs, reward, term, _t, info = env.step(f"```python\n{code}\n```")
        assert expect in obs, (name, obs)
        if name == "list_host_processes":
            assert "True" not in obs, obs  # the test runner's own command line is not visible
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected to the host socket
        _contained(env, canaries)
    finally:
        server.close()
        os.unlink(path)
    if env.turn >= env.max_turns - 3:
        env.reset(seed=0, options={"task": 0})


# ----------------------------------------------------------------------------- seccomp
def test_seccomp_denies_what_it_documents():
    assert seccomp.program() is not None, "libseccomp (libseccomp2) is missing"
    sb = Sandbox(SandboxConfig(**FAST))
    try:
        code = (
            "import ctypes, ctypes.util, os\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "def errno_of(rc):\n    return ctypes.get_errno() if rc == -1 else 0\n"
            "print(errno_of(libc.unshare(0x10000000)), errno_of(libc.ptrace(16, 1, 0, 0)),"
            " errno_of(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)), errno_of(libc.syscall(321, 0, 0, 0)),"
            " errno_of(libc.syscall(250, 0, 0, 0, 0, 0)), errno_of(libc.syscall(298, 0, 0, 0, 0, 0)),"
            " errno_of(libc.setns(0, 0)))"
        )
        r = sb.run(code)
        # unshare, ptrace, mount, bpf, keyctl, perf_event_open, setns: EPERM (1) each
        assert r.output.split() == ["1"] * 7, (r.output, r.error)
        assert (
            "Seccomp:\t2" in sb.run("print(open('/proc/self/status').read())").output
        )  # 2: a filter is loaded
        assert sb.run("print(1)").output == "1\n"
    finally:
        sb.close()


# ----------------------------------------------------------------------------- state across restore
def test_files_are_part_of_a_snapshot(canaries):
    env = MathEnv(sandbox=dict(FAST))
    try:
        env.reset(seed=0, options={"task": 0})
        env.step(
            "```python\nimport os\nopen('a.txt', 'w').write('before')\nos.mkdir('d')\n"
            "open('d/b.txt', 'w').write('nested')\nos.symlink('/etc/hostname', 'link')\nos.mkfifo('fifo')\n```"
        )
        ck = env.checkpoint()
        assert ck.local is not None
        env.step(
            "```python\nopen('a.txt', 'w').write('after')\nos.remove('d/b.txt')\nopen('new.txt', 'w')\n```"
        )
        env.restore(ck)
        obs, *_ = env.step(
            "```python\nprint(open('a.txt').read(), open('d/b.txt').read(), sorted(os.listdir('.')),"
            " os.readlink('link'))\n```"
        )
        assert "before nested ['a.txt', 'd', 'link'] /etc/hostname" in obs, (
            obs
        )  # the FIFO is not copied
        # a work dir over the cap: that checkpoint replays the ledger, and still gives the right files
        env.step(
            "```python\nwith open('sparse.bin', 'wb') as f:\n    f.truncate(15 << 20)\n"
            "with open('big.bin', 'wb') as f:\n    f.write(b'1' * (2 << 20))\n```"
        )
        big = env.checkpoint()
        assert big.local is None
        env.step("```python\nos.remove('big.bin')\n```")
        env.restore(big)
        obs, *_ = env.step("```python\nprint(os.path.getsize('big.bin'))\n```")
        assert str(2 << 20) in obs, obs
        _contained(env, canaries)
    finally:
        _closed_clean(env)


def test_live_threads_make_the_checkpoint_replay_and_say_so(canaries):
    env = MathEnv(sandbox=dict(FAST))
    try:
        env.reset(seed=0, options={"task": 0})
        obs, *_ = env.step(
            "```python\nimport threading, time\nticks = []\n"
            "threading.Thread(target=lambda: [ticks.append(1) or time.sleep(0.01) for _ in range(10**6)],"
            " daemon=True).start()\nprint('started')\n```"
        )
        assert "thread(s) started by your code are still running" in obs, obs
        ck = env.checkpoint()
        assert ck.local is None  # a fork would keep only the main thread
        env.step("```python\nticks = None\n```")
        env.restore(ck)
        obs, *_ = env.step(
            "```python\ntime.sleep(0.2)\nprint(len(ticks) > 0, threading.active_count())\n```"
        )
        assert "True 2" in obs, obs
        _contained(env, canaries)
    finally:
        _closed_clean(env)


# ----------------------------------------------------------------------------- limits
LIMITS = [
    ("memory", "x = bytearray(3 << 30)", "cell exceeded the sandbox memory limit (768 MiB)"),
    ("cpu", "import time\nt = time.process_time()\nwhile True:\n    pass", "CPU time limit"),
    ("wall", "import time\ntime.sleep(30)", "longer than 20 s"),
    ("file_size", "open('f.bin', 'wb').write(b'0' * (17 << 20))", "file size limit (16 MiB)"),
    ("open_files", "fs = [open('f%d' % i, 'w') for i in range(1000)]", "open files limit (64)"),
    (
        "processes",
        "import threading, time\nts = []\nwhile True:\n    t = threading.Thread(target=time.sleep, args=(5,))\n"
        "    t.start()\n    ts.append(t)",
        "process/thread limit",
    ),
    ("output", "print('x' * 10**6)", "output truncated"),
    (
        "disk",
        "for i in range(100):\n    open('part%d' % i, 'wb').write(b'0' * (15 << 20))",
        "is full",
    ),
]


@pytest.fixture(scope="module")
def limits_env():
    env = MathEnv(sandbox=dict(LIMITED))
    yield env
    _closed_clean(env)


@pytest.mark.parametrize("name,code,expect", LIMITS, ids=[limit[0] for limit in LIMITS])
def test_a_hit_limit_is_a_readable_observation(limits_env, canaries, name, code, expect):
    env = limits_env
    env.reset(seed=0, options={"task": 0})
    obs, reward, term, _t, info = env.step(f"```python\n{code}\n```")
    assert expect in obs and not term and reward == 0.0, (name, obs)
    _contained(env, canaries)


def test_verifier_fallback_isolation_drops_uid_and_network(monkeypatch):
    if not ROOT:
        pytest.skip("the namespaces fallback needs root")
    from trace_gym.envs.math import verify

    monkeypatch.setattr(verify.iso, "choose_mode", lambda _requested: "namespaces")
    pool = verify.VerifierPool(timeout_s=20.0)
    try:
        assert pool.check("1/2", "0.5")["canonical"] is True
        worker = pool._idle[0]  # noqa: SLF001 - the worker that answered
        assert worker.mode == "namespaces"
        pid = worker.proc.pid
        uid = int(Path(f"/proc/{pid}/status").read_text().split("Uid:")[1].split()[0])
        assert uid != 0
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    finally:
        pool.close()
