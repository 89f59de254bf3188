"""The distributed package without a Ray instance: lazy import, switch, config, sharding."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trace_gym import plan
from trace_gym.alloc import make_allocator
from trace_gym.budget import Event, StepReport, Stopwatch
from trace_gym.distributed import (
    DistributedStepReport,
    RayConfig,
    RayRunner,
    WorkerPolicy,
    make_runner,
    shard_works,
)
from trace_gym.distributed.runner import _merge
from trace_gym.distributed.testing import CrashOnCall, LatencyPolicy
from trace_gym.errors import ConfigError, DependencyNotInstalled
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.testing import CountdownEnv, RandomCountdownPolicy


def _args(policy=None):
    return (
        policy or RandomCountdownPolicy(),
        lambda: CountdownEnv(num_tasks=8),
        make_allocator("trace", m_max=8),
        None,
        RunnerConfig(root_budget=8, replays_per_root=1.0),
    )


def test_importing_the_package_does_not_import_ray():
    code = "import sys, trace_gym.distributed; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_ray_raises_dependency_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` fail
    with pytest.raises(DependencyNotInstalled, match=r'pip install "trace-gym\[ray\]"'):
        RayRunner(*_args())
    with pytest.raises(DependencyNotInstalled):
        make_runner(*_args(), ray_address="local")


def test_make_runner_without_address_is_the_local_runner():
    runner = make_runner(
        *_args(WorkerPolicy(RandomCountdownPolicy, answer_prob=0.3)), num_workers=4
    )
    assert type(runner) is BranchingRunner
    assert isinstance(runner.policy, RandomCountdownPolicy)  # WorkerPolicy built locally
    assert runner.policy.answer_prob == 0.3
    trees, report = runner.run_step(0, [f"count-{i}" for i in range(8)])
    assert report.roots == 8 and trees


def test_worker_policy_refuses_to_generate_in_the_driver():
    wp = WorkerPolicy(RandomCountdownPolicy)
    with pytest.raises(ConfigError, match="only generates on the Ray workers"):
        wp.generate([])
    with pytest.raises(ConfigError, match="no generate"):
        WorkerPolicy(dict).build()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_workers=0),
        dict(max_retries=-1),
        dict(worker_cpus=-1),
        dict(address=""),
        dict(num_cpus=0),
    ],
)
def test_ray_config_rejects_bad_values(kwargs):
    with pytest.raises(ConfigError):
        RayConfig(**kwargs)


def test_shard_works_balances_cost_and_keeps_every_prompt_once():
    runner = BranchingRunner(*_args())
    ctx = runner.context(0, StepReport(step=0), Stopwatch())
    described = [runner._describe(f"count-{i}", ctx.stopwatch) for i in range(8)]
    works = plan.plan_roots(ctx, described, {})
    for w, b in zip(works, range(len(works)), strict=True):
        w.replay_budget = b
    shards = shard_works(works, 3)
    orders = [w.order for s in shards for w in s]
    assert sorted(orders) == [w.order for w in works]
    assert all([w.order for w in s] == sorted(w.order for w in s) for s in shards)
    assert shards == shard_works(works, 3)  # deterministic
    cost = [sum(len(w.roots) + 0.5 * w.replay_budget for w in s) for s in shards]
    biggest = max(len(w.roots) + 0.5 * w.replay_budget for w in works)
    assert max(cost) - min(cost) <= biggest


def test_merge_sums_worker_counters_and_keeps_driver_fields():
    report = DistributedStepReport(step=3, roots=10, selected=4)
    a = StepReport(step=3, replays=2, measured_turns=7, largest_batch=5, replays_by_depth={1: 2})
    a.events.append(Event(1, "closed", "p"))
    b = StepReport(
        step=3, replays=1, measured_turns=4, largest_batch=3, replays_by_depth={1: 1, 2: 0}
    )
    b.time_s["policy"] = 1.5
    _merge(report, a)
    _merge(report, b)
    assert (report.step, report.roots, report.selected) == (3, 10, 4)
    assert (report.replays, report.measured_turns, report.largest_batch) == (3, 11, 5)
    assert report.replays_by_depth == {1: 3, 2: 0}
    assert report.events == [Event(1, "closed", "p")]
    assert report.worker_time_s["policy"] == 1.5
    assert "retried_prompts" in report.to_dict()


def test_wrappers_keep_outputs_and_crash_only_raises_in_the_driver():
    from trace_gym.policy import Conversation

    conv = Conversation(
        "trace/Countdown-v0",
        "count-0",
        "Reach 3 with 'add N' actions, then 'answer N'.",
        (),
        seed=7,
    )
    base = RandomCountdownPolicy().generate([conv])[0].text
    assert LatencyPolicy(RandomCountdownPolicy(), 0.0).generate([conv])[0].text == base
    crash = CrashOnCall(RandomCountdownPolicy(), call=2)
    assert crash.generate([conv])[0].text == base
    with pytest.raises(RuntimeError, match="injected failure on call 2"):
        crash.generate([conv])
    # pinned to worker 1: never fires in the driver
    pinned = CrashOnCall(RandomCountdownPolicy(), call=1, worker=1)
    assert pinned.generate([conv])[0].text == base
