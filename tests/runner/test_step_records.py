"""The step's shared records, the one policy-call path, the env protocol and resuming a runner."""

from __future__ import annotations

import ast
import inspect
import pickle
from concurrent.futures import Future

import gymnasium as gym
import pytest

import trace_gym.plan
import trace_gym.scheduling
import trace_gym.step
from trace_gym import plan
from trace_gym.alloc import make_allocator
from trace_gym.budget import StepReport, Stopwatch
from trace_gym.errors import ConfigError
from trace_gym.predict import make_predictor
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.step import EnvPool, EpisodeSpec
from trace_gym.testing import CountdownEnv, RandomCountdownPolicy

TASKS = [f"count-{i}" for i in range(10)]


def _runner(policy, allocator="trace", **kw) -> BranchingRunner:
    cfg = RunnerConfig(root_budget=20, replays_per_root=2.0, m_max=8, seed=3, **kw)
    return BranchingRunner(
        policy,
        lambda: CountdownEnv(num_tasks=10, max_turns=6),
        make_allocator(allocator, m_max=8),
        make_predictor("features"),
        cfg,
    )


def _counts(report: StepReport) -> dict:
    d = report.to_dict()
    for k in ("wall_s", "time_s", "time_share", "env_instances", "events"):
        d.pop(k)
    return d


class _FlakySeeds(RandomCountdownPolicy):
    """Raises on the first request of every conversation whose seed is a multiple of 3."""

    def __init__(self):
        super().__init__()
        self.seen: set[int] = set()
        self.requests = 0

    def generate(self, conversations):
        self.requests += 1
        if any(c.seed % 3 == 0 and c.seed not in self.seen for c in conversations):
            self.seen.update(c.seed for c in conversations)
            raise RuntimeError("flaky backend")
        return super().generate(conversations)


class _Async:
    """`inner` behind ``submit``: one future per conversation, answered at once."""

    def __init__(self, inner, drop: int = 0):
        self.inner, self.drop, self.submits = inner, drop, 0

    def generate(self, conversations):  # never called: submit wins
        raise AssertionError("the scheduler streams a policy that has submit")

    def submit(self, conversations):
        self.submits += 1
        out = []
        for conv in conversations[self.drop :]:
            fut: Future = Future()
            try:
                fut.set_result(self.inner.generate([conv])[0])
            except Exception as e:  # noqa: BLE001 - the future carries it
                fut.set_exception(e)
            out.append(fut)
        return out


@pytest.mark.parametrize("retries", [0, 1])
def test_rounds_and_streaming_count_retries_and_calls_the_same_way(retries):
    """The same failing requests, one conversation per call in rounds, streamed otherwise."""
    rounds_policy = _FlakySeeds()
    rounds = _runner(rounds_policy, max_batch=1, policy_retries=retries).run_step(0, TASKS)
    streamed_policy = _Async(_FlakySeeds())
    streamed = _runner(streamed_policy, policy_retries=retries).run_step(0, TASKS)
    a, b = rounds.report, streamed.report
    assert [t.to_dict() for t in rounds.trees] == [t.to_dict() for t in streamed.trees]
    for key in ("retried_turns", "measured_turns", "policy_errors", "failed_branches", "replays"):
        assert getattr(a, key) == getattr(b, key), key
    assert (a.retried_turns > 0) == (retries > 0) and (a.policy_errors > 0) == (retries == 0)
    # a call is a call: every generate (rounds) and every submit (streaming), re-sends included
    assert a.policy_calls == rounds_policy.requests and b.policy_calls == streamed_policy.submits
    if retries:
        clean = _runner(RandomCountdownPolicy()).run_step(0, TASKS)
        assert [t.to_dict() for t in clean.trees] == [t.to_dict() for t in streamed.trees]


def test_a_streamed_policy_that_answers_too_few_fails_its_branches_like_generate():
    """Wrong-length answers are branch failures on both paths (streaming used to raise)."""
    streamed = _runner(_Async(RandomCountdownPolicy(), drop=1)).run_step(0, TASKS).report

    class Short(RandomCountdownPolicy):
        def generate(self, conversations):
            return super().generate(conversations)[1:]

    rounds = _runner(Short()).run_step(0, TASKS).report
    for rep in (streamed, rounds):
        assert rep.failed_branches == rep.roots == rep.policy_errors and rep.replays == 0


def test_the_step_layers_never_name_the_simulator_or_the_mixture():
    for module in (trace_gym.scheduling, trace_gym.step, trace_gym.plan):
        tree = ast.parse(inspect.getsource(module))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m and m.startswith("trace_gym.sim") for m in imported), module.__name__
        source = inspect.getsource(module)
        assert "MEMBER_KEY" not in source and "member_task_id" not in source, module.__name__
    scheduling = ast.parse(inspect.getsource(trace_gym.scheduling))
    assert "trace_gym.mixture" not in {
        n.module for n in ast.walk(scheduling) if isinstance(n, ast.ImportFrom)
    }


def test_the_env_pool_asks_the_env_what_it_is():
    sim = EnvPool(lambda: gym.make("trace/Sim-v0", drift=True))
    assert sim.has_true_value and sim.env_id == "trace/Sim-v0"
    assert sim.task_env_id({}) == "trace/Sim-v0" and sim.policy_task_id("t", {}) == "t"
    assert sim.rollout_cost_priors is None
    sim.set_step(40)
    late = sim.acquire(), sim.acquire()  # the probe instance, then one made after set_step
    assert all(e.unwrapped.skill == sim.probe.skill for e in late) and sim.probe.skill > 0
    mix = EnvPool(
        lambda: gym.make(
            "trace/Mixture-v0",
            members={"trace/Sim-v0": {"num_tasks": 4}},
            costs={"trace/Sim-v0": 3.0},
        )
    )
    env = mix.acquire()
    task = env.unwrapped.task_ids[0]
    _, info = env.reset(seed=0, options={"task": task})
    assert not mix.has_true_value and mix.env_id == "trace/Mixture-v0"
    assert mix.task_env_id(info) == "trace/Sim-v0"
    assert mix.policy_task_id(task, info) == task.partition("::")[2]
    assert dict(mix.rollout_cost_priors) == {"trace/Sim-v0": 3.0}


def test_an_episode_is_a_frozen_spec_plus_run_state():
    runner = _runner(RandomCountdownPolicy())
    ctx = runner.context(0, StepReport(step=0), Stopwatch())
    described = [runner._describe(t, ctx.stopwatch) for t in TASKS]
    works = plan.plan_roots(ctx, described, {})
    ep = works[0].roots[0]
    assert isinstance(ep.spec, EpisodeSpec) and (ep.kind, ep.anchor, ep.child) == ("rollout", 0, 0)
    with pytest.raises(AttributeError):
        ep.spec.env_seed = 1  # type: ignore[misc]
    assert ep.prompt == ep.spec.prompt and not ep.turns and not ep.done
    clone = pickle.loads(pickle.dumps(works))  # what a Ray worker gets
    assert clone[0].roots[0].spec == ep.spec and clone[0].roots[0].work is clone[0]
    runner.close()


def test_the_planner_returns_decisions_and_changes_nothing():
    runner = _runner(RandomCountdownPolicy())
    report = StepReport(step=0)
    ctx = runner.context(0, report, Stopwatch())
    described = [runner._describe(t, ctx.stopwatch) for t in TASKS]
    allocation = plan.allocate_roots(ctx, described, {})
    works = plan.root_works(ctx, described, allocation)
    assert all("skipped_candidates" not in w.tree.info for w in works)
    assert len(allocation.skipped) == len(TASKS) - len(works)
    total, shares = plan.replay_shares(ctx, works)
    assert total == ctx.budget.replays == sum(shares) and all(w.replay_budget == 0 for w in works)
    assert report == StepReport(step=0)  # planning wrote nothing into the step's report
    runner.close()


def _next_step(runner: BranchingRunner, step: int):
    result = runner.run_step(step, TASKS)
    return [t.to_dict() for t in result.trees], _counts(result.report)


@pytest.mark.parametrize("allocator", ["trace", "greso"])
def test_runner_state_round_trip_gives_the_same_next_step(allocator):
    first = _runner(RandomCountdownPolicy(), allocator)
    for s in range(3):
        first.run_step(s, TASKS)
    state = pickle.loads(pickle.dumps(first.state_dict()))
    assert state["next_step"] == 3 and state["history"]
    expected = _next_step(first, 3)
    resumed = _runner(RandomCountdownPolicy(), allocator)
    resumed.load_state_dict(state)
    assert resumed.next_step == 3
    assert _next_step(resumed, 3) == expected
    cold = _runner(RandomCountdownPolicy(), allocator)  # the same step without the state differs
    assert _next_step(cold, 3) != expected


def test_runner_state_refuses_another_setup():
    state = _runner(RandomCountdownPolicy()).state_dict()
    with pytest.raises(ConfigError, match="version"):
        _runner(RandomCountdownPolicy()).load_state_dict({**state, "version": 99})
    with pytest.raises(ConfigError, match="rollout_cost"):
        _runner(RandomCountdownPolicy(), rollout_cost="turns").load_state_dict(state)
