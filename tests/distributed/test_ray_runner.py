"""RayRunner on a local Ray instance: same trees as the local runner, faults, the bench."""

from __future__ import annotations

import gymnasium as gym
import pytest

from trace_gym.alloc import make_allocator
from trace_gym.distributed import RayConfig, RayRunner, WorkerLost, WorkerPolicy, make_runner
from trace_gym.distributed.testing import CrashOnCall
from trace_gym.errors import AllocationError, ConfigError
from trace_gym.predict import make_predictor
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.testing import CountdownEnv, RandomCountdownPolicy

pytestmark = pytest.mark.usefixtures("ray_local")

TASKS = [f"count-{i}" for i in range(12)]


def countdown_env():
    return CountdownEnv(num_tasks=12, max_turns=6)


def _config(**kw):
    return RunnerConfig(
        root_budget=kw.pop("roots", 24), replays_per_root=2.0, m_max=8, seed=5, **kw
    )


def _local(policy, allocator="trace", predictor="features", **kw):
    return BranchingRunner(
        policy,
        countdown_env,
        make_allocator(allocator, m_max=8),
        make_predictor(predictor) if predictor else None,
        _config(**kw),
    )


def _ray(policy, allocator="trace", predictor="features", workers=2, **kw):
    ray_kw = {k: kw.pop(k) for k in ("max_retries", "sync_policy") if k in kw}
    return RayRunner(
        policy,
        countdown_env,
        make_allocator(allocator, m_max=8),
        make_predictor(predictor) if predictor else None,
        _config(**kw),
        RayConfig(num_workers=workers, worker_cpus=0.5, **ray_kw),
    )


def _dicts(trees):
    return [t.to_dict() for t in trees]


def _assert_same_step(local_result, ray_result):
    (lt, lr), (rt, rr) = local_result, ray_result
    assert [t.prompt_id for t in rt] == [t.prompt_id for t in lt]
    assert _dicts(rt) == _dicts(lt)
    for key in (
        "selected",
        "roots",
        "replays",
        "replays_unspent",
        "measured_turns",
        "env_steps",
        "failed_branches",
        "generated_tokens",
        "replays_by_depth",
    ):
        assert getattr(rr, key) == getattr(lr, key), key
    assert rr.predictor_update == lr.predictor_update


def test_same_trees_as_the_local_runner_across_steps():
    """Root allocation, prefix scoring on snapshots, central updates, policy sync."""
    local, remote = _local(RandomCountdownPolicy()), _ray(RandomCountdownPolicy())
    try:
        for step in range(3):
            if step == 2:  # a "training update" of the driver's policy must reach the workers
                local.policy.answer_prob = remote.policy.answer_prob = 0.6
            a, b = local.run_step(step, TASKS), remote.run_step(step, TASKS)
            _assert_same_step(a, b)
            assert b.report.workers == 2 and not b.report.retried_prompts
            assert set(b.report.placement) == {t.prompt_id for t in b.trees}
            assert len(set(b.report.placement.values())) == 2  # both workers got prompts
            assert b.report.replays > 0
        assert remote.history == local.history
    finally:
        local.close()
        remote.close()


def test_a_worker_killed_mid_step_loses_no_tree_and_duplicates_none():
    local = _local(RandomCountdownPolicy())
    remote = _ray(CrashOnCall(RandomCountdownPolicy(), call=2, worker=1))
    try:
        for step in range(2):
            a, b = local.run_step(step, TASKS), remote.run_step(step, TASKS)
            ids = [t.prompt_id for t in b.trees]
            assert len(ids) == len(set(ids)) == b.report.selected
            _assert_same_step(a, b)
            if step == 0:
                (failure,) = b.report.worker_failures
                assert failure["worker"] == 1
                assert b.report.retried_prompts == failure["prompts"]
                assert set(failure["prompts"]) <= set(ids)
                assert all(b.report.placement[p] == 0 for p in failure["prompts"])
            else:  # the dead worker was replaced (index 2, which does not crash)
                assert remote.workers == [0, 2] and not b.report.worker_failures
    finally:
        local.close()
        remote.close()


def test_when_every_worker_died_fresh_ones_rerun_the_step():
    local = _local(RandomCountdownPolicy())
    remote = _ray(CrashOnCall(RandomCountdownPolicy(), call=1, worker=0), workers=1)
    try:
        a, b = local.run_step(0, TASKS), remote.run_step(0, TASKS)
        _assert_same_step(a, b)
        assert [f["worker"] for f in b.report.worker_failures] == [0]
        assert sorted(b.report.retried_prompts) == sorted(t.prompt_id for t in b.trees)
        assert set(b.report.placement.values()) == {1} and remote.workers == [1]
    finally:
        local.close()
        remote.close()


def test_worker_built_policy_and_flat_allocator():
    local = _local(RandomCountdownPolicy(answer_prob=0.3), allocator="grpo", predictor=None)
    remote = make_runner(
        WorkerPolicy(RandomCountdownPolicy, answer_prob=0.3),
        countdown_env,
        make_allocator("grpo", m_max=8),
        None,
        _config(),
        ray_address="local",
        num_workers=2,
        worker_cpus=0.5,
    )
    assert isinstance(remote, RayRunner)
    try:
        _assert_same_step(local.run_step(0, TASKS), remote.run_step(0, TASKS))
    finally:
        local.close()
        remote.close()


class _BadPrefixAllocator:
    name, branching, cost_aware = "bad", True, False

    def __init__(self):
        self.inner = make_allocator("trace", m_max=8)

    def allocate_roots(self, candidates, budget, rng):
        return self.inner.allocate_roots(candidates, budget, rng)

    def allocate_prefixes(self, prefixes, budget, rng):
        return [-1] * len(prefixes)


def test_an_error_raised_on_a_worker_is_raised_in_the_driver_not_retried():
    remote = RayRunner(
        RandomCountdownPolicy(),
        countdown_env,
        _BadPrefixAllocator(),
        None,
        _config(),
        RayConfig(num_workers=1, worker_cpus=0.5),
    )
    try:
        with pytest.raises(AllocationError, match="prefix counts"):  # mid-step: not a ConfigError
            remote.run_step(0, TASKS)
    finally:
        remote.close()


def test_a_prompt_whose_worker_keeps_dying_raises_worker_lost():
    remote = _ray(CrashOnCall(RandomCountdownPolicy(), call=1), workers=1, max_retries=0)
    try:
        with pytest.raises(WorkerLost, match="max_retries"):
            remote.run_step(0, TASKS)
    finally:
        remote.close()


def test_unpicklable_policy_is_a_config_error():
    import threading

    class Locked(RandomCountdownPolicy):
        def __init__(self):
            super().__init__()
            self.lock = threading.Lock()

    with pytest.raises(ConfigError, match="WorkerPolicy"):
        _ray(Locked())


@pytest.mark.slow
def test_simulator_with_drift_matches_the_local_runner():
    from trace_gym.sim import SimPolicy

    def factory():
        return gym.make("trace/Sim-v0", preset="hotpotqa", num_tasks=64, drift=True)

    env = factory()
    tasks = list(env.unwrapped.task_ids[0:64:2])
    env.close()
    cfg = RunnerConfig(root_budget=32, replays_per_root=2.0, seed=1, max_batch=7)

    def args():  # each runner its own allocator and predictor (both learn)
        return (factory, make_allocator("trace"), make_predictor("features"), cfg)

    local = BranchingRunner(SimPolicy("hotpotqa", drift=True), *args())
    remote = RayRunner(
        SimPolicy("hotpotqa", drift=True), *args(), RayConfig(num_workers=2, worker_cpus=0.5)
    )
    try:
        for step in range(3):
            _assert_same_step(local.run_step(step, tasks), remote.run_step(step, tasks))
    finally:
        local.close()
        remote.close()


def test_ray_bench_reports_every_setting_with_identical_trees():
    from trace_gym.bench.distributed import RayBenchConfig, format_ray_bench, run_ray_bench

    result = run_ray_bench(
        RayBenchConfig(steps=1, roots=8, candidates=12, latency_s=0.0, max_batch=4)
    )
    rows = result["rows"]
    assert [r["workers"] for r in rows] == [None, 1, 2]
    assert all(r["same_trees"] for r in rows)
    assert all(r["episodes"] == rows[0]["episodes"] > 0 for r in rows)
    assert "ray, 2 worker(s)" in format_ray_bench(result)


@pytest.mark.slow
def test_bench_alloc_ray_cli(tmp_path):
    import json
    import subprocess
    import sys

    out = tmp_path / "ray.json"
    cmd = [
        sys.executable,
        "-m",
        "trace_gym.cli",
        "bench",
        "alloc",
        "--ray",
        "--roots",
        "8",
        "--ray-steps",
        "1",
        "--latency",
        "0.01",
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ray, 2 worker(s)" in proc.stdout and " NO" not in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["workers"] for r in rows] == [None, 1, 2] and all(r["same_trees"] for r in rows)


def test_workers_that_cannot_be_placed_fail_at_construction():
    with pytest.raises(ConfigError, match="did not start within"):
        RayRunner(
            RandomCountdownPolicy(),
            countdown_env,
            make_allocator("trace", m_max=8),
            None,
            _config(),
            RayConfig(num_workers=1, worker_cpus=64, start_timeout_s=1.0),
        )


def test_rollout_cli_with_ray_writes_the_local_trees(tmp_path, capsys):
    from trace_gym.agents.rollout import main

    common = [
        "--env",
        "trace/Sim-v0",
        "--policy",
        "sim",
        "--steps",
        "2",
        "--tasks",
        "12",
        "--roots",
        "12",
        "--no-progress",
    ]
    assert main([*common, "--out", str(tmp_path / "local.jsonl")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray.jsonl"), "--ray", "--ray-workers", "2"]) == 0
    local, remote = (tmp_path / "local.jsonl").read_bytes(), (tmp_path / "ray.jsonl").read_bytes()
    assert local and remote == local
