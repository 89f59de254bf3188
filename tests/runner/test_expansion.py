"""Per-prompt expansion vs a global barrier, and the streaming scheduler (engines in process)."""

from __future__ import annotations

import numpy as np
import pytest

from trace_gym.alloc import make_allocator
from trace_gym.distributed.engine import Engine, Latency, LocalEngines
from trace_gym.errors import ConfigError
from trace_gym.policy import Conversation
from trace_gym.predict import make_predictor
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.testing import CountdownEnv, RandomCountdownPolicy

TASKS = [f"count-{i}" for i in range(10)]


def _runner(policy, allocator=None, **kw):
    cfg = RunnerConfig(root_budget=20, replays_per_root=2.0, m_max=8, seed=3, **kw)
    return BranchingRunner(
        policy,
        lambda: CountdownEnv(num_tasks=10, max_turns=6),
        allocator or make_allocator("trace", m_max=8),
        make_predictor("features"),
        cfg,
    )


def _steps(policy, steps=2, allocator=None, **kw):
    runner = _runner(policy, allocator, **kw)
    try:
        out = [runner.run_step(s, TASKS) for s in range(steps)]
    finally:
        runner.close()
    return [[t.to_dict() for t in trees] for trees, _ in out], [rep for _, rep in out]


def test_global_barrier_makes_the_same_trees_and_expands_after_every_root():
    ref, _ = _steps(RandomCountdownPolicy(), max_batch=7)
    trees, reports = _steps(RandomCountdownPolicy(), max_batch=7, expansion="global")
    assert trees == ref
    for rep in reports:
        kinds = [e.kind for e in rep.events]
        last_root = max(i for i, k in enumerate(kinds) if k == "roots_done")
        first_expand = min(i for i, k in enumerate(kinds) if k == "expand")
        assert first_expand > last_root
        assert rep.replays > 0
    # per-prompt expansion expands some prompt before the last one's roots are done
    _, per_prompt = _steps(RandomCountdownPolicy(), max_batch=7)
    kinds = [e.kind for e in per_prompt[0].events]
    assert kinds.index("expand") < max(i for i, k in enumerate(kinds) if k == "roots_done")


@pytest.mark.parametrize(
    "name,kw",
    [("trace", {"cost_aware": True}), ("trace", {"objective": "posterior"}), ("treepo", {})],
)
def test_global_columns_make_the_per_prompt_trees_for_every_kind_of_split(name, kw):
    """The global expansion hands the allocator `PrefixColumns`: the same trees as the
    per-prompt records, cost-aware (per-prefix costs), posterior and a per-prompt rule."""
    ref, _ = _steps(RandomCountdownPolicy(), allocator=make_allocator(name, m_max=8, **kw))
    got, reports = _steps(
        RandomCountdownPolicy(), allocator=make_allocator(name, m_max=8, **kw), expansion="global"
    )
    assert got == ref
    assert sum(r.replays for r in reports) > 0


@pytest.mark.parametrize("expansion", ["per-prompt", "global"])
@pytest.mark.parametrize("batching", ["continuous", "batch"])
def test_streaming_through_engines_makes_the_local_trees(expansion, batching):
    ref, ref_reports = _steps(RandomCountdownPolicy())
    engines = LocalEngines(
        RandomCountdownPolicy(), 2, slots=3, batching=batching, latency=Latency(0.001, 1.5)
    )
    try:
        trees, reports = _steps(engines, expansion=expansion)
    finally:
        engines.close()
    assert trees == ref
    for a, b in zip(ref_reports, reports, strict=True):
        assert (a.roots, a.replays, a.measured_turns, a.env_steps) == (
            b.roots,
            b.replays,
            b.measured_turns,
            b.env_steps,
        )
    stats = engines.stats()
    assert all(s["requests"] > 0 for s in stats)  # both engines served
    assert sum(s["conversations"] for s in stats) == sum(r.measured_turns for r in reports)


class _Flaky(RandomCountdownPolicy):
    """Raises on the first request for a conversation whose seed is a multiple of `every`."""

    def __init__(self, every: int):
        super().__init__()
        self.every, self.seen = every, set()

    def generate(self, conversations):
        (conv,) = conversations  # the engines send one conversation per request
        if conv.seed % self.every == 0 and conv.seed not in self.seen:
            self.seen.add(conv.seed)
            raise RuntimeError("flaky backend")
        if self.every == 1:
            raise RuntimeError("broken backend")
        return super().generate(conversations)


def test_streaming_retries_a_failed_request_then_fails_only_that_branch():
    ref, _ = _steps(RandomCountdownPolicy(), steps=1)
    engines = LocalEngines(_Flaky(every=3), 1, slots=1)
    trees, (rep,) = _steps(engines, steps=1, policy_retries=1)
    assert trees == ref and rep.retried_turns > 0 and rep.failed_branches == 0
    always = LocalEngines(_Flaky(every=1), 1, slots=1)
    _, (rep,) = _steps(always, steps=1)
    assert rep.failed_branches == rep.roots and rep.policy_errors == rep.roots and rep.replays == 0


def test_latency_is_a_function_of_the_seed_with_the_given_mean():
    conv = lambda s: Conversation("e", "t", "p", (), seed=s)  # noqa: E731
    lat = Latency(0.02, 1.0)
    assert lat.of(conv(7)) == lat.of(conv(7)) != lat.of(conv(8))
    draws = np.array([lat.of(conv(s)) for s in range(4000)])
    assert abs(draws.mean() - 0.02) < 0.002 and draws.max() > 5 * 0.02  # heavy tail
    assert Latency(0.02).of(conv(1)) == 0.02 and Latency().of(conv(1)) == 0.0


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="expansion"):
        RunnerConfig(root_budget=4, expansion="sometimes")
    with pytest.raises(ConfigError):
        Latency(-1.0)
    with pytest.raises(ConfigError, match="batching"):
        Engine(0, RandomCountdownPolicy(), batching="static")
    with pytest.raises(ConfigError):
        LocalEngines(RandomCountdownPolicy(), 0)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--engines", "1,x"], "--engines takes comma-separated integers"),
        (["--engines", "2", "--barrier", "sometimes"], "--barrier takes"),
        (["--engines", "0"], "engine counts must be >= 1"),
    ],
)
def test_engine_bench_bad_flags_are_one_line_errors(flags, message, capsys):
    from trace_gym.bench.alloc import main

    assert main(["--ray", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
