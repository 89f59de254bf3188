"""BranchingRunner on CountdownEnv: scheduling, budget, reproducibility, failures, tokens."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import numpy as np
import pytest

from trace_gym import sim
from trace_gym.alloc import make_allocator
from trace_gym.alloc.base import Candidate, PrefixCandidate
from trace_gym.budget import Budget
from trace_gym.errors import AllocationError, BranchFailures, ConfigError
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.seeding import branch_seed
from trace_gym.testing import CountdownEnv, RandomCountdownPolicy


class StubAllocator:
    """Uneven root groups (so prompts finish at different rounds) and random prefixes."""

    name = "stub"
    branching = True
    cost_aware = False

    def __init__(self, groups: Sequence[int] = (2, 6, 3, 5)):
        self.groups = list(groups)

    def allocate_roots(
        self, candidates: Sequence[Candidate], budget: int, rng: np.random.Generator
    ) -> np.ndarray:
        out = np.zeros(len(candidates), dtype=int)
        left = budget
        for i in range(len(candidates)):
            g = min(self.groups[i % len(self.groups)], left)
            if g < 2:
                break
            out[i], left = g, left - g
        if left and out.any():
            out[np.flatnonzero(out)[0]] += left
        return out

    def allocate_prefixes(
        self, prefixes: Sequence[PrefixCandidate], budget: int, rng: np.random.Generator
    ) -> np.ndarray:
        out = np.zeros(len(prefixes), dtype=int)
        if prefixes:
            np.add.at(out, rng.integers(0, len(prefixes), size=budget), 1)
        return out


def make_runner(
    policy=None, *, roots=16, replays=2.0, max_batch=None, allocator=None, env_factory=None, **kw
):
    cfg = RunnerConfig(
        root_budget=roots,
        replays_per_root=replays,
        max_batch=max_batch,
        update_predictor=False,
        **kw,
    )
    return BranchingRunner(
        policy or RandomCountdownPolicy(),
        env_factory or (lambda: CountdownEnv(num_tasks=8, max_turns=6)),
        allocator or StubAllocator(),
        None,
        cfg,
    )


TASKS = [f"count-{i}" for i in range(8)]


def test_branch_seed_is_stable_and_distinct():
    a = branch_seed(3, "count-1", 5, 2)
    assert a == branch_seed(3, "count-1", 5, 2)
    assert (
        len(
            {
                a,
                branch_seed(3, "count-1", 5, 3),
                branch_seed(4, "count-1", 5, 2),
                branch_seed(3, "count-2", 5, 2),
            }
        )
        == 4
    )
    assert 0 <= a < 2**63


def test_expansion_starts_before_other_prompts_finish():
    result = make_runner(roots=16).run_step(0, TASKS)
    rep = result.report
    roots_done = rep.event_rounds("roots_done")
    expand = rep.event_rounds("expand")
    last_roots_done = max(roots_done.values())
    # some prompt queued its replays before the slowest prompt finished its roots
    assert expand and min(expand.values()) < last_roots_done
    # every prompt expands the round its roots finish: nobody waits for the batch
    for pid, r in expand.items():
        assert r == roots_done[pid]
    # and the replays of an early prompt ran while roots of others were live
    closed = rep.event_rounds("closed")
    assert min(closed.values()) < last_roots_done


def test_budget_accounting_adds_up():
    cfg_roots, n = 16, 2.0
    result = make_runner(roots=cfg_roots, replays=n).run_step(0, TASKS)
    rep, trees = result.report, result.trees
    assert rep.roots == cfg_roots == sum(len(t.root.children) for t in trees)
    assert rep.replay_budget == round(n * cfg_roots)
    replay_branches = sum(
        1
        for t in trees
        for node in t.nodes
        if node.origin == "replay" and t.nodes[node.parent].origin != "replay"
    )
    assert rep.replays == replay_branches == sum(rep.replays_by_depth.values())
    assert rep.replays + rep.replays_unspent == rep.replay_budget
    assert rep.accounted_cost == rep.roots + 0.5 * rep.replays
    if rep.replays_unspent == 0:
        assert rep.accounted_cost == cfg_roots * (1 + n / 2)
    # per prompt: replay budget proportional to root count, spent on its own tree
    assert sum(t.info["replay_budget"] for t in trees) == rep.replay_budget
    # measured work equals the turns in the trees
    assert rep.measured_turns == sum(len(t.nodes) - 1 for t in trees)
    assert rep.generated_tokens == sum(n.turn.num_tokens for t in trees for n in t.nodes if n.turn)
    assert set(rep.time_s) == {"policy", "env", "predictor", "allocator", "bookkeeping"}
    assert abs(sum(rep.time_s.values()) - rep.wall_s) < 1e-6 + 1e-3 * rep.wall_s
    assert rep.largest_batch <= rep.roots + rep.replays


@pytest.mark.parametrize("max_batch", [1, 3, 7])
def test_same_seeds_same_trees_for_any_batch_size(max_batch):
    ref = make_runner(max_batch=None, seed=5).run_step(2, TASKS)
    got = make_runner(max_batch=max_batch, seed=5).run_step(2, TASKS)
    assert [t.to_dict() for t in got.trees] == [t.to_dict() for t in ref.trees]
    assert got.report.largest_batch <= max_batch
    assert got.report.env_instances <= max_batch + 1
    other = make_runner(max_batch=max_batch, seed=6).run_step(2, TASKS)
    assert [t.to_dict() for t in other.trees] != [t.to_dict() for t in ref.trees]


def test_trees_are_well_formed_and_json_roundtrip():
    result = make_runner().run_step(1, TASKS)
    for t in result.trees:
        d = json.loads(json.dumps(t.to_dict()))
        assert type(t).from_dict(d) == t
        for leaf in t.leaves():
            assert leaf.terminal and (leaf.reward is not None or leaf.error is not None)
        for node in t.nodes[1:]:
            assert node.seed is not None and node.origin in ("rollout", "replay")
        # replays hang from prefixes strictly inside a rollout
        for node in t.nodes[1:]:
            if node.origin == "replay" and t.nodes[node.parent].origin == "rollout":
                parent = t.nodes[node.parent]
                assert parent.depth >= 1 and parent.value == 0.5
        assert t.root.target is not None


def test_policy_failure_on_kth_call_leaves_other_branches_intact():
    k, cap = 4, 5
    ref = make_runner(max_batch=cap).run_step(0, TASKS)
    got = make_runner(RandomCountdownPolicy(fail_on_call=k), max_batch=cap).run_step(0, TASKS)
    rep = got.report
    assert rep.policy_errors == cap and rep.failed_branches == cap
    failed = [(t.prompt_id, n.id) for t in got.trees for n in t.nodes if n.error]
    assert len(failed) == cap
    hit = {pid for pid, _ in failed}
    assert len(got.trees) == len(ref.trees)
    for a, b in zip(ref.trees, got.trees, strict=True):
        if a.prompt_id not in hit:
            assert a.to_dict() == b.to_dict()
        else:
            errors = [n.error for n in b.nodes if n.error]
            assert errors and all(
                e.startswith("policy.generate: RuntimeError: injected") for e in errors
            )
            assert b.metrics().leaves + b.metrics().failed_branches == len(b.leaves())


def test_policy_retry_recovers_identically():
    ref = make_runner(max_batch=5).run_step(0, TASKS)
    got = make_runner(
        RandomCountdownPolicy(fail_on_call=4), max_batch=5, policy_retries=1
    ).run_step(0, TASKS)
    assert [t.to_dict() for t in got.trees] == [t.to_dict() for t in ref.trees]
    assert got.report.retried_turns == 5 and got.report.policy_errors == 0


class FlakyEnv(CountdownEnv):
    """Raises on `add 2` in task count-1 (an env bug, not bad agent input)."""

    def _step(self, action):
        if self.task_id == "count-1" and action.strip() == "add 2":
            raise OSError("backend crashed")
        return super()._step(action)


def test_env_exception_is_recorded_and_siblings_go_on():
    got = make_runner(env_factory=lambda: FlakyEnv(num_tasks=8)).run_step(0, TASKS)
    ref = make_runner().run_step(0, TASKS)
    assert got.report.env_errors > 0
    for a, b in zip(ref.trees, got.trees, strict=True):
        if a.prompt_id != "count-1":
            assert a.to_dict() == b.to_dict()
        else:
            errs = [n for n in b.nodes if n.error]
            assert errs and all(n.error.startswith("env.step: OSError") for n in errs)
            assert all(n.turn.action == "add 2" for n in errs)


class HandleEnv(CountdownEnv):
    """Counts the local checkpoint handles it hands out and the ones released."""

    made: list[int] = []
    released: list[int] = []

    def _local_handle(self):
        HandleEnv.made.append(len(HandleEnv.made))
        return HandleEnv.made[-1]

    def release(self, checkpoint):
        HandleEnv.released.append(checkpoint.local)


def test_every_checkpoint_is_released_when_its_tree_closes():
    HandleEnv.made, HandleEnv.released = [], []
    res = make_runner(env_factory=lambda: HandleEnv(num_tasks=8)).run_step(0, TASKS)
    inner = sum(
        1 for t in res.trees for n in t.nodes[1:] if n.origin == "rollout" and not n.terminal
    )
    assert len(HandleEnv.made) == inner > 0  # one checkpoint per inner root-rollout node
    assert sorted(HandleEnv.released) == HandleEnv.made  # each released exactly once


class OutputErrorPolicy(RandomCountdownPolicy):
    """Returns an error output for one task, and overflows another."""

    def generate(self, conversations):
        outs = super().generate(conversations)
        for conv, out in zip(conversations, outs, strict=True):
            if conv.task_id == "count-0":
                out.error = "backend refused"
            if conv.task_id == "count-2" and len(conv.turns) == 1:
                out.finish_reason = "overflow"
        return outs


def test_output_error_and_overflow():
    got = make_runner(OutputErrorPolicy()).run_step(0, TASKS)
    trees = {t.prompt_id: t for t in got.trees}
    t0 = trees["count-0"]
    assert all(leaf.error == "policy: backend refused" for leaf in t0.leaves())
    t2 = trees["count-2"]
    over = [leaf for leaf in t2.leaves() if leaf.info.get("overflow")]
    assert over and all(leaf.truncated and leaf.reward == 0.0 and leaf.depth == 2 for leaf in over)
    assert got.report.overflows >= len(over)


class TokenPolicy(RandomCountdownPolicy):
    """Reports context tokens: the prompt on the first turn, then each observation."""

    def generate(self, conversations):
        outs = super().generate(conversations)
        for conv, out in zip(conversations, outs, strict=True):
            if conv.turns:
                assert conv.prompt_token_ids is not None
                out.context_token_ids = [ord(c) for c in conv.turns[-1].observation]
            else:
                out.context_token_ids = [ord(c) for c in conv.prompt]
        return outs


def test_token_contract():
    got = make_runner(TokenPolicy()).run_step(0, TASKS)
    for t in got.trees:
        assert t.prompt_token_ids == [ord(c) for c in t.prompt]
        for node in t.nodes[1:]:
            assert node.turn.token_ids == [ord(c) for c in node.turn.action]
            assert node.turn.logprobs == [-1.0] * len(node.turn.token_ids)
            if node.children:  # the observation was sent back as context
                assert node.turn.obs_token_ids == [ord(c) for c in node.turn.observation]
    assert got.report.context_tokens > 0


def test_config_validation():
    with pytest.raises(ConfigError):
        RunnerConfig(root_budget=0)
    with pytest.raises(ConfigError):
        RunnerConfig(root_budget=8, m_max=1)
    with pytest.raises(ConfigError):
        RunnerConfig(root_budget=8, max_batch=0)
    with pytest.raises(ConfigError):
        make_runner().run_step(0, ["count-1", "count-1"])


def test_history_and_flat_allocator():
    class Flat(StubAllocator):
        branching = False

    r = make_runner(allocator=Flat())
    res = r.run_step(0, TASKS)
    assert res.report.replays == 0 and res.report.replay_budget == 0
    assert all(n.origin == "rollout" for t in res.trees for n in t.nodes[1:])
    r.run_step(1, TASKS)
    visited = [t.prompt_id for t in res.trees]
    assert all(r.history[p].visits == 2 for p in visited)


# ---------------------------------------------------------------------- with the real parts


def sim_runner(allocator="trace", predictor="features", max_batch=None, seed=0, roots=24):
    import gymnasium as gym

    from trace_gym.predict import make_predictor

    return BranchingRunner(
        sim.SimPolicy("hotpotqa-luck"),
        lambda: gym.make("trace/Sim-v0", preset="hotpotqa-luck", num_tasks=64),
        make_allocator(allocator, m_max=8, group_size=4),
        make_predictor(predictor),
        RunnerConfig(root_budget=roots, replays_per_root=2, max_batch=max_batch, seed=seed),
    )


SIM_TASKS = [f"sim-hotpotqa-0-{i}" for i in range(0, 64, 2)]


@pytest.mark.parametrize("allocator", ["trace", "oracle", "treepo"])
def test_sim_trees_identical_under_batching_and_budget_exact(allocator):
    a = sim_runner(allocator, max_batch=None)
    b = sim_runner(allocator, max_batch=5)
    for step in range(2):  # the predictor learns between steps; both runners alike
        ra, rb = a.run_step(step, SIM_TASKS), b.run_step(step, SIM_TASKS)
        assert [t.to_dict() for t in ra.trees] == [t.to_dict() for t in rb.trees]
        rep = ra.report
        assert rep.roots == 24 and rep.replays + rep.replays_unspent == 48
        assert rep.accounted_cost == 24 + 0.5 * rep.replays
        assert rep.predictor_update  # the predictor took its update
    # exact values are recorded on every node the env could value
    tree = ra.trees[0]
    assert all(n.true_value is not None for n in tree.nodes)
    assert all(n.true_value in (0.0, 1.0) for n in tree.leaves())
    assert sum(rb.report.replays_by_depth.values()) == rb.report.replays


def test_sim_expansion_is_local_and_failures_stay_local():
    class Failing(sim.SimPolicy):
        def generate(self, conversations):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("injected")
            return [self._turn(c) for c in conversations]

    r = sim_runner("trace", max_batch=6)
    res = r.run_step(0, SIM_TASKS)
    ev = res.report
    assert min(ev.event_rounds("expand").values()) < max(ev.event_rounds("roots_done").values())
    r2 = sim_runner("trace", max_batch=6)
    r2.policy = Failing("hotpotqa-luck")
    res2 = r2.run_step(0, SIM_TASKS)
    assert res2.report.policy_errors == 6
    intact = [
        (x, y)
        for x, y in zip(res.trees, res2.trees, strict=True)
        if not any(n.error for n in y.nodes)
    ]
    assert intact and all(x.to_dict() == y.to_dict() for x, y in intact)


def test_step_is_told_to_drifting_policy_and_every_env():
    import gymnasium as gym

    policy = sim.SimPolicy("math-luck", drift=True)
    r = BranchingRunner(
        policy,
        lambda: gym.make("trace/Sim-v0", preset="math-luck", num_tasks=32, drift=True),
        make_allocator("trace", m_max=8),
        None,
        RunnerConfig(root_budget=16, replays_per_root=1),
    )
    ids = [f"sim-math-0-{i}" for i in range(32)]
    r.run_step(0, ids)
    z0 = {t.prompt_id: t.root.true_value for t in r.run_step(0, ids).trees}
    res = r.run_step(6, ids)
    want = sim.skill_at(sim.get_preset("math-luck"), 6, True)
    assert policy.step == 6 and want > sim.get_preset("math-luck").skill
    assert r.pool.made > 1 and all(env.unwrapped.skill == want for env in r.pool.free)
    z6 = {t.prompt_id: t.root.true_value for t in res.trees}
    common = set(z0) & set(z6)
    assert common and any(abs(z0[p] - z6[p]) > 1e-6 for p in common)


# ---------------------------------------------------------------------- typed failures
class BrokenEnv(CountdownEnv):
    """Every step raises: an env bug that fails every branch."""

    def _step(self, action):
        raise OSError("backend down")


def test_failures_are_typed_records_on_the_leaf():
    got = make_runner(env_factory=lambda: FlakyEnv(num_tasks=8)).run_step(0, TASKS)
    failed = [n for t in got.trees for n in t.nodes if n.failed]
    assert failed and all(
        n.failure.where == "env.step" and n.failure.kind == "env" and str(n.failure) == n.error
        for n in failed
    )
    d = next(t for t in got.trees if t.prompt_id == "count-1").to_dict()
    assert {n["failure"]["kind"] for n in d["nodes"] if n["failure"]} == {"env"}
    got = make_runner(RandomCountdownPolicy(fail_on_call=2), max_batch=4).run_step(0, TASKS)
    kinds = {(n.failure.where, n.failure.kind) for t in got.trees for n in t.nodes if n.failed}
    assert kinds == {("policy.generate", "policy")}


def test_most_branches_failing_warns_or_raises(caplog):
    with caplog.at_level("WARNING", logger="trace_gym.runner"):
        rep = make_runner(env_factory=lambda: BrokenEnv(num_tasks=8)).run_step(0, TASKS).report
    assert rep.failed_branches == rep.roots + rep.replays > 0
    assert any("branches failed" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="trace_gym.runner"):
        make_runner(env_factory=lambda: FlakyEnv(num_tasks=8)).run_step(0, TASKS)
    assert not any("branches failed" in r.getMessage() for r in caplog.records)  # a minority
    with pytest.raises(BranchFailures, match=r"16 of 16 branches failed"):
        make_runner(env_factory=lambda: BrokenEnv(num_tasks=8), raise_on_failures=True).run_step(
            0, TASKS
        )


class VersionedPolicy(RandomCountdownPolicy):
    version = 3


def test_policy_version_is_recorded_on_every_generated_node():
    trees = make_runner(VersionedPolicy()).run_step(0, TASKS).trees
    assert {n.policy_version for t in trees for n in t.nodes[1:]} == {3}
    assert all(t.root.policy_version is None for t in trees)
    trees = make_runner().run_step(0, TASKS).trees
    assert {n.policy_version for t in trees for n in t.nodes} == {None}


def test_history_passed_to_run_step_is_the_one_updated():
    r = make_runner()
    mine: dict = {}
    r.run_step(0, TASKS, history=mine)
    assert mine and not r.history
    assert all(h.visits == 1 for h in mine.values())
    r.run_step(1, TASKS, history=mine)
    assert all(h.visits == 2 for p, h in mine.items() if p in {t for t in TASKS})
    r.run_step(2, TASKS)
    assert r.history and all(h.visits == 1 for h in r.history.values())


class BadCountsAllocator(StubAllocator):
    def allocate_prefixes(self, prefixes, budget, rng):
        return -np.ones(len(prefixes), dtype=int)


def test_bad_allocator_output_mid_step_is_an_allocation_error():
    with pytest.raises(AllocationError, match="prefix counts"):
        make_runner(allocator=BadCountsAllocator()).run_step(0, TASKS)


def test_one_step_reads_top_down_with_no_import_back_up():
    """runner -> plan -> alloc -> scheduling: scheduling imports none of the layers above it."""
    import ast
    import importlib

    def imports(mod):
        src = importlib.import_module(mod).__file__
        tree = ast.parse(open(src, encoding="utf-8").read())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        return names

    below = {m for m in imports("trace_gym.scheduling") if m.startswith("trace_gym.")}
    assert not {m for m in below if m.split(".")[1] in ("runner", "plan", "alloc")}
    assert "trace_gym.runner" not in imports("trace_gym.plan")
    assert not {"trace_gym.runner", "trace_gym.plan", "trace_gym.scheduling"} & imports(
        "trace_gym.budget"
    )


# ---------------------------------------------------------------------- cost-aware budget
class OverspendingAllocator(StubAllocator):
    cost_aware = True

    def allocate_prefixes(self, prefixes, budget, rng):
        return np.full(len(prefixes), 100, dtype=int)


def test_a_cost_aware_allocator_cannot_overspend():
    with pytest.raises(AllocationError, match="over its budget"):
        make_runner(allocator=OverspendingAllocator()).run_step(0, TASKS)


def test_cost_aware_trace_changes_counts_but_not_the_accounted_budget():
    flat = make_runner(allocator=make_allocator("trace", m_max=8), roots=16).run_step(0, TASKS)
    aware = make_runner(
        allocator=make_allocator("trace", m_max=8, cost_aware=True), roots=16
    ).run_step(0, TASKS)
    nominal = RunnerConfig(root_budget=16, replays_per_root=2.0).accounted_budget  # 32
    fr, ar = flat.report, aware.report
    # the flat run charges every replay 0.5; the cost-aware one each its (T - d) / T
    assert fr.replay_charge == 0.5 * fr.replays and fr.accounted_cost <= nominal
    assert ar.accounted_cost == ar.roots + ar.replay_charge <= nominal + 1e-9
    assert ar.replays_by_depth != fr.replays_by_depth  # it buys other (cheaper) replays
    assert ar.replays > fr.replays  # more of them ...
    assert ar.replay_charge <= fr.replay_charge + 1e-9  # ... for no more accounted cost
    # the charge is exactly the remaining-turn share of every replay
    charge = 0.0
    for t in aware.trees:
        for n in t.nodes[1:]:
            if n.origin == "replay" and t.nodes[n.parent].origin == "rollout":
                leaf = t.nodes[n.parent]
                while leaf.children and t.nodes[leaf.children[0]].origin == "rollout":
                    leaf = t.nodes[leaf.children[0]]
                charge += (leaf.depth - t.nodes[n.parent].depth) / leaf.depth
    assert charge == pytest.approx(ar.replay_charge)


def test_default_trees_do_not_depend_on_the_cost_function(monkeypatch):
    """Charging each replay its own cost leaves non-cost-aware plans alone."""
    ref = make_runner(allocator=make_allocator("trace", m_max=8)).run_step(0, TASKS)
    flat = RunnerConfig.budget.fget

    def odd_costs(cfg):
        return dataclasses.replace(flat(cfg), cost=lambda depth, turns: 0.01)

    monkeypatch.setattr(RunnerConfig, "budget", property(odd_costs))
    got = make_runner(allocator=make_allocator("trace", m_max=8)).run_step(0, TASKS)
    assert [t.to_dict() for t in got.trees] == [t.to_dict() for t in ref.trees]
    assert got.report.accounted_cost == ref.report.accounted_cost
    aware = make_runner(allocator=make_allocator("trace", m_max=8, cost_aware=True)).run_step(
        0, TASKS
    )
    assert aware.report.replay_charge == pytest.approx(0.01 * aware.report.replays)  # it is used


def test_budget_is_the_one_place_of_the_arithmetic():
    b = Budget.per_root(16, 2.5, 0.5)
    assert (b.roots, b.replays, b.replay_cost) == (16, 40, 0.5)
    assert b.accounted() == 16 + 40 * 0.5 == RunnerConfig(16, 2.5).accounted_budget
    assert b.accounted(10, [0.25, 0.75]) == b.accounted(10, 1.0) == 11.0
    assert b.prefix_cost(False) == 0.5 and b.prefix_cost(True)(1, 4) == 0.75
    assert b.prefix_budget(6, False) == 6 and b.prefix_budget(6, True) == 3.0
    with pytest.raises(ConfigError, match="replay_cost"):
        Budget(4, 2, replay_cost=-1.0)
