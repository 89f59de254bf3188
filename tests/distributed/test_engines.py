"""Engine pools on a local Ray instance: the local trees, versions, engines dying mid-step."""

from __future__ import annotations

import pytest

from trace_gym.alloc import make_allocator
from trace_gym.distributed import RayConfig, RayRunner, WorkerPolicy
from trace_gym.distributed.testing import CrashOnCall, crash_on_call
from trace_gym.errors import ConfigError
from trace_gym.predict import make_predictor
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.testing import CountdownEnv, RandomCountdownPolicy, VersionedCountdownPolicy

pytestmark = pytest.mark.usefixtures("ray_local")

TASKS = [f"count-{i}" for i in range(12)]


def countdown_env():
    return CountdownEnv(num_tasks=12, max_turns=6)


def _args(policy, **kw):
    cfg = RunnerConfig(root_budget=24, replays_per_root=2.0, m_max=8, seed=5, **kw)
    return policy, countdown_env, make_allocator("trace", m_max=8), make_predictor("features"), cfg


def _ray(policy, workers=2, engines=2, **kw):
    ray_kw = {k: kw.pop(k) for k in list(kw) if k.startswith("engine_") or k == "max_retries"}
    rc = RayConfig(
        num_workers=workers, worker_cpus=0.25, num_engines=engines, engine_cpus=0.25, **ray_kw
    )
    return RayRunner(*_args(policy, **kw), rc)


def _same(a, b):
    assert [t.to_dict() for t in a.trees] == [t.to_dict() for t in b.trees]
    for key in ("selected", "roots", "replays", "measured_turns", "env_steps", "failed_branches"):
        assert getattr(a.report, key) == getattr(b.report, key), key


class Versioned(RandomCountdownPolicy):
    """A policy whose weights carry a version (as a trainer's synced backend does)."""

    version = 0


def test_engine_pool_gives_the_local_trees_and_pushes_weights_by_version():
    local = BranchingRunner(*_args(Versioned()))
    remote = _ray(Versioned(), engine_latency_s=0.002, engine_latency_sigma=1.0, expansion="global")
    try:
        for step in range(3):
            if step == 2:  # an optimiser step: new weights, new version
                for r in (local, remote):
                    r.policy.answer_prob, r.policy.version = 0.6, 1
            a, b = local.run_step(step, TASKS), remote.run_step(step, TASKS)
            _same(a, b)
            assert b.report.engines == 2 and b.report.replays > 0
            versions = {n.policy_version for t in b.trees for n in t.nodes if n.parent is not None}
            assert versions == {1 if step == 2 else 0}
        stats = remote._engines.stats()
        assert all(s["requests"] > 0 and s["version"] == 1 for s in stats)
        assert remote._engines.pushes == 2  # version 0 once (steps 0-1), version 1 once
    finally:
        local.close()
        remote.close()


def test_an_engine_killed_mid_step_is_replaced_and_its_requests_rerun():
    local = BranchingRunner(*_args(RandomCountdownPolicy()))
    remote = _ray(CrashOnCall(RandomCountdownPolicy(), call=3, engine=0), workers=1)
    try:
        for step in range(2):
            a, b = local.run_step(step, TASKS), remote.run_step(step, TASKS)
            _same(a, b)
            ids = [t.prompt_id for t in b.trees]
            assert len(ids) == len(set(ids)) == b.report.selected
            if step == 0:
                assert b.report.engine_rerouted >= 1 and not b.report.worker_failures
        assert remote._engines.replaced == 1
        assert sorted(h.index for h in remote._engines.handles) == [1, 2]
    finally:
        local.close()
        remote.close()


def test_when_every_engine_died_the_prompts_rerun_on_fresh_engines():
    local = BranchingRunner(*_args(RandomCountdownPolicy()))
    remote = _ray(CrashOnCall(RandomCountdownPolicy(), call=2, engine=0), workers=1, engines=1)
    try:
        a, b = local.run_step(0, TASKS), remote.run_step(0, TASKS)
        _same(a, b)
        assert sorted(b.report.engine_reruns) == sorted(t.prompt_id for t in b.trees)
        assert [h.index for h in remote._engines.handles] == [1]
    finally:
        local.close()
        remote.close()


_PUSH_ANSWER_PROB = dict(
    engine_export="trace_gym.distributed.testing:export_answer_prob",
    engine_apply="trace_gym.distributed.testing:load_answer_prob",
)


def test_engines_that_build_their_own_policy_take_the_drivers_weights_by_version():
    """``engine_policy``: each engine builds its policy (as a vLLM engine would be); the
    driver's policy is only the source of versions and of the pushed weights."""
    local = BranchingRunner(*_args(Versioned()))
    remote = _ray(Versioned(), engine_policy=WorkerPolicy(Versioned), **_PUSH_ANSWER_PROB)
    try:
        for step in range(3):
            if step == 2:
                for r in (local, remote):
                    r.policy.answer_prob, r.policy.version = 0.6, 1
            _same(local.run_step(step, TASKS), remote.run_step(step, TASKS))
        assert remote._engines.pushes == 2 and remote._engines.own_policy
        assert all(s["version"] == 1 for s in remote._engines.stats())
    finally:
        local.close()
        remote.close()


def test_self_built_engines_without_an_export_are_told_the_step_only():
    """Without ``engine_export`` a new driver version pushes nothing: the engines keep the
    policy they built (the pickled driver policy never replaces it)."""
    local = BranchingRunner(*_args(RandomCountdownPolicy()))
    remote = _ray(Versioned(), engine_policy=WorkerPolicy(RandomCountdownPolicy))
    try:
        remote.policy.answer_prob, remote.policy.version = 0.9, 1  # not seen by the engines
        _same(local.run_step(0, TASKS), remote.run_step(0, TASKS))
        assert remote._engines.pushes == 0
    finally:
        local.close()
        remote.close()


def test_a_self_built_engine_killed_mid_step_loses_no_tree():
    local = BranchingRunner(*_args(RandomCountdownPolicy()))
    crashing = WorkerPolicy(crash_on_call, WorkerPolicy(RandomCountdownPolicy), call=3, engine=0)
    remote = _ray(RandomCountdownPolicy(), workers=1, engine_policy=crashing)
    try:
        for step in range(2):
            a, b = local.run_step(step, TASKS), remote.run_step(step, TASKS)
            _same(a, b)
            assert len({t.prompt_id for t in b.trees}) == len(b.trees) == b.report.selected
        assert remote._engines.replaced == 1
    finally:
        local.close()
        remote.close()


def test_engine_policy_must_be_a_worker_policy():
    with pytest.raises(ConfigError, match="engine_policy must be a WorkerPolicy"):
        RayConfig(num_engines=1, engine_policy=RandomCountdownPolicy())
    with pytest.raises(ConfigError, match="needs num_engines"):
        RayConfig(engine_policy=WorkerPolicy(RandomCountdownPolicy))


@pytest.fixture(scope="module")
def tiny_dir():
    pytest.importorskip("torch")
    from trace_gym.agents.tiny import default_test_config, tiny_model_dir

    return str(tiny_model_dir(default_test_config(envs=("trace/Countdown-v0",), sft_steps=60)))


def _weight_synced_pool(ray_local, driver, engines):
    """HF engines fed the driver's weights by the trainer's export / load functions."""
    from trace_gym.distributed.engine import EnginePool

    return EnginePool(
        ray_local,
        driver,
        engines,
        cpus=0.25,
        batching="batch",
        export="trace_gym.trainers.sync:engine_weights",
        apply="trace_gym.trainers.sync:load_engine_weights",
    )


def _countdown_conv(seed):
    from trace_gym.policy import Conversation

    env = countdown_env()
    prompt, info = env.reset(seed=seed, options={"task": TASKS[seed]})
    return Conversation(env.env_id, TASKS[seed], prompt, (), seed=seed, reset_info=info)


@pytest.mark.slow
def test_hf_engines_take_the_trainers_weights_by_version(ray_local, tiny_dir):
    import torch
    from trace_gym.agents.hf import HFPolicy

    torch.manual_seed(0)
    driver = HFPolicy.from_pretrained(tiny_dir, max_new_tokens=24)
    pool = _weight_synced_pool(ray_local, driver, 2)
    try:
        convs = [_countdown_conv(s) for s in (1, 2)]
        pool.begin_step(0, driver)
        before = pool.client().generate(convs)
        assert [o.token_ids for o in before] == [o.token_ids for o in driver.generate(convs)]
        with torch.no_grad():  # an optimiser step, then the trainer's version bump
            for p in driver.model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        driver.version += 1
        assert pool.begin_step(1, driver) == 1 and pool.pushes == 2
        after, local = pool.client().generate(convs), driver.generate(convs)
        for a, b in zip(after, local, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert [o.logprobs for o in after] != [o.logprobs for o in before]
        assert {s["version"] for s in pool.stats()} == {1}
    finally:
        pool.close()


@pytest.mark.slow
def test_hf_engines_take_a_lora_policys_merged_weights(ray_local, tiny_dir):
    """A LoRA-wrapped driver (``policy.lora`` with ``rollout.ray_engines``): the engines get
    the adapters merged into the base weights and sample what the driver samples."""
    import torch
    from trace_gym.agents.hf import HFPolicy
    from trace_gym.trainers.builders import apply_lora
    from trace_gym.trainers.config import PolicyConfig

    torch.manual_seed(0)
    driver = HFPolicy.from_pretrained(tiny_dir, max_new_tokens=24)
    driver.model = apply_lora(
        driver.model, PolicyConfig(kind="hf", path=tiny_dir, lora=True, lora_r=4)
    )
    pool = _weight_synced_pool(ray_local, driver, 1)
    try:
        convs = [_countdown_conv(s) for s in (1, 2)]
        pool.begin_step(0, driver)
        before = pool.client().generate(convs)
        assert [o.token_ids for o in before] == [o.token_ids for o in driver.generate(convs)]
        with torch.no_grad():  # train the adapters (lora_B starts at zero: a no-op adapter)
            for name, p in driver.model.named_parameters():
                if "lora_" in name:
                    p.add_(0.5 * torch.randn_like(p))
        driver.version += 1
        assert pool.begin_step(1, driver) == 1 and pool.pushes == 2
        after, local = pool.client().generate(convs), driver.generate(convs)
        for a, b in zip(after, local, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert [o.logprobs for o in after] != [o.logprobs for o in before]  # the adapters count
        assert hasattr(driver.model, "peft_config")  # the driver's own model stays wrapped
    finally:
        pool.close()


@pytest.mark.slow
def test_hf_engines_give_the_local_allocations_and_tree_shapes(tiny_dir):
    from trace_gym.agents.hf import HFPolicy
    from trace_gym.bench.engines import tree_shape

    from trace_gym.distributed import WorkerPolicy

    make = WorkerPolicy(HFPolicy.from_pretrained, tiny_dir, max_new_tokens=24)
    local = BranchingRunner(*_args(make.build(), max_batch=8))
    remote = _ray(make, workers=2, engines=2, engine_batching="batch", engine_max_batch=8)
    try:
        a, b = local.run_step(0, TASKS), remote.run_step(0, TASKS)
        assert [tree_shape(t) for t in b.trees] == [tree_shape(t) for t in a.trees]
        assert b.report.replays == a.report.replays > 0
    finally:
        local.close()
        remote.close()


@pytest.mark.slow
def test_engine_bench_reports_speedup_barrier_ratio_and_identical_trees(tmp_path):
    import json

    from trace_gym.bench.alloc import main

    out = tmp_path / "engines.json"
    argv = [
        "--ray",
        "--engines",
        "1,2",
        "--env-workers",
        "1",
        "--roots",
        "8",
        "--ray-steps",
        "1",
        "--latency",
        "0.002",
        "--latency-sigma",
        "1.0",
        "--barrier",
        "global,per-prompt",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["trees_identical"] is True and result["ray_speedup"] > 0
    assert set(result["barrier"]) == {"1", "2"}
    rows = [r for r in result["rows"] if r["kind"] == "sim"]
    assert [(r["barrier"], r["engines"], r["workers"]) for r in rows] == [
        ("global", 1, 1),
        ("global", 2, 1),
        ("per-prompt", 1, 1),
        ("per-prompt", 2, 1),
    ]
    assert all(0.0 <= r["idle_share"] <= 1.0 and r["episodes"] == rows[0]["episodes"] for r in rows)


Weights = VersionedCountdownPolicy


@pytest.mark.parametrize("k", [0, 1])
def test_async_rollouts_on_the_ray_engine_pool_follow_the_fixed_lag(k):
    """`AsyncRollouts` around the Ray runner (the producer thread drives the workers and
    pushes each frozen copy to the engines): step s comes from the weights after s - k
    updates, exactly the local runner's trees for those weights."""
    from trace_gym.async_rollouts import AsyncRollouts

    def cands(step):
        return TASKS[step % 3 :: 2]

    live, steps = Weights(), 3
    remote = _ray(live, workers=1, engines=1)
    local = BranchingRunner(*_args(Weights()))
    try:
        with AsyncRollouts(remote, cands, max_staleness=k, stop=steps) as pipe:
            got = []
            for step in range(steps):
                got.append(pipe.get(step))
                live.set(live.version + 1)  # the update
                pipe.publish()
        assert remote.policy is live
        for step in range(steps):
            local.policy = Weights(max(0, step - k))
            ref = local.run_step(step, cands(step))
            assert got[step].version == max(0, step - k)
            assert [t.to_dict() for t in got[step].trees] == [t.to_dict() for t in ref.trees]
    finally:
        local.close()
        remote.close()
