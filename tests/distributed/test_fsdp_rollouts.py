"""Every FSDP rank grows its share of the trees (`trace_gym.trainers.rank_rollouts`).

Fast: W `RankRunner`s in threads of this process, their all-gather a barrier - the
union of their shards is the local runner's step (trees and report), over several
steps (so the predictor updates on the gathered trees keep the ranks' plans equal), and
ranks whose state differs fail loudly. Slow: the trainer under torchrun (2 gloo ranks,
tiny Qwen3) against one process - the same trees written (generator logprobs to
`LOGPROB_TOL`), the same samples, weights within `trace_gym.bench.train.TOLERANCE` -
with every rank generating (both really did), and with rank 0 driving Ray rollouts.
"""

from __future__ import annotations

import gzip
import json
import threading

import pytest

from trace_gym.alloc import make_allocator
from trace_gym.errors import TraceGymError
from trace_gym.predict import make_predictor
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.testing import CountdownEnv, RandomCountdownPolicy

pytest.importorskip("torch")

from trace_gym.trainers.rank_rollouts import RankRunner  # noqa: E402

TASKS = [f"count-{i}" for i in range(12)]


def countdown_env():
    return CountdownEnv(num_tasks=12, max_turns=6)


def _args():
    config = RunnerConfig(root_budget=24, replays_per_root=2.0, m_max=8, seed=5)
    return (
        RandomCountdownPolicy(),
        countdown_env,
        make_allocator("trace", m_max=8),
        make_predictor("features"),
        config,
    )


class ThreadGroup:
    """`world` threads' all_gather_object: each call returns every thread's object, by rank."""

    def __init__(self, world: int):
        self.world = world
        self.box: list[object] = [None] * world
        self.barrier = threading.Barrier(world)

    def gather(self, rank: int):
        def gather(obj):
            self.barrier.wait()
            self.box[rank] = obj
            self.barrier.wait()
            out = list(self.box)
            self.barrier.wait()
            return out

        return gather


def _run_ranks_errors(runners, steps, candidates):
    """Run `steps` on every runner at once (one thread per rank): results[rank][step], and
    what the threads raised."""
    results = [[] for _ in runners]
    errors = []

    def body(rank):
        try:
            for s in range(steps):
                results[rank].append(runners[rank].run_step(s, candidates[s]))
        except BaseException as e:  # noqa: BLE001 - returned to the test
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(len(runners))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a rank is stuck in a gather"
    return results, errors


def _run_ranks(runners, steps, candidates):
    """`_run_ranks_errors`, raising the first error; results[rank][step]."""
    results, errors = _run_ranks_errors(runners, steps, candidates)
    if errors:
        raise errors[0]
    return results


def _candidates(steps):
    return [[TASKS[(s * 5 + i) % len(TASKS)] for i in range(8)] for s in range(steps)]


@pytest.mark.parametrize("world", [2, 3])
def test_rank_shards_union_is_the_local_step(world):
    steps, cands = 3, _candidates(3)
    local = BranchingRunner(*_args())
    want = [local.run_step(s, cands[s]) for s in range(steps)]
    group = ThreadGroup(world)
    ranks = [
        RankRunner(*_args(), rank=r, world_size=world, gather=group.gather(r)) for r in range(world)
    ]
    got = _run_ranks(ranks, steps, cands)
    for s in range(steps):
        lt, lr = want[s]
        for r in range(world):
            rt, rr = got[r][s]
            assert [t.to_dict() for t in rt] == [t.to_dict() for t in lt], (s, r)
            for key in ("roots", "replays", "measured_turns", "env_steps", "generated_tokens"):
                assert getattr(rr, key) == getattr(lr, key), (s, r, key)
            assert rr.replays_by_depth == lr.replays_by_depth
            assert rr.predictor_update == lr.predictor_update
            assert rr.workers == world
        # every rank grew some of the step's trees, none grew one twice
        placement = got[0][s].report.placement
        assert sorted(placement) == sorted(t.prompt_id for t in lt)
        assert set(placement.values()) == set(range(world))
    assert ranks[0].predictor.state_dict().keys() == local.predictor.state_dict().keys()


def test_ranks_with_different_state_refuse_to_roll_out():
    group = ThreadGroup(2)
    ranks = [RankRunner(*_args(), rank=r, world_size=2, gather=group.gather(r)) for r in range(2)]
    # rank 1 remembers a visit rank 0 never saw: its root allocation differs
    warm = BranchingRunner(*_args())
    warm.run_step(0, _candidates(1)[0])
    ranks[1].load_state_dict(warm.state_dict())
    with pytest.raises(TraceGymError, match="planned other trees"):
        _run_ranks(ranks, 1, _candidates(2)[1:])


# ---------------------------------------------------------------------- 2 gloo ranks (torchrun)
#: the generator's recorded logprobs of a token: the ranks batch other conversations together
#: than the one process does, so the same fp32 forward sums in another order (measured: 1.4e-6)
LOGPROB_TOL = 1e-5


def _trees(run_dir):
    out = {}
    for f in sorted((run_dir / "trees").glob("step_*.jsonl.gz")):
        out[f.name] = [json.loads(line) for line in gzip.open(f, "rt")]
    return out


def _split_logprobs(x, found):
    """`x` with every turn's logprobs taken out (appended to `found`)."""
    if isinstance(x, dict):
        if x.get("logprobs") is not None:
            found.extend(x["logprobs"])
        return {k: None if k == "logprobs" else _split_logprobs(v, found) for k, v in x.items()}
    if isinstance(x, list):
        return [_split_logprobs(v, found) for v in x]
    return x


def _assert_one_process_run(tmp_path, **rollout):
    """2 gloo ranks (with `rollout` settings) against one process: trees, samples, weights;
    returns both runs' per-rank results."""
    pytest.importorskip("transformers")
    from trace_gym.bench.train import DEFAULT_CONFIG, TOLERANCE, compare, run_launch

    cfg = json.loads(json.dumps(DEFAULT_CONFIG))
    cfg["save_trees"] = True
    cfg["algo"]["kl_coef"] = 0.05  # the reference model is sharded too
    ref = run_launch(cfg, tmp_path / "ref", None)
    cfg["rollout"].update(rollout)
    two = run_launch(cfg, tmp_path / "two", 2)
    want, got = _trees(tmp_path / "ref" / "run"), _trees(tmp_path / "two" / "run")
    assert list(want) == ["step_000000.jsonl.gz", "step_000001.jsonl.gz"]
    want_lp, got_lp = [], []
    # token ids, actions, observations, rewards, node ids, policy versions: identical
    assert _split_logprobs(got, got_lp) == _split_logprobs(want, want_lp)
    assert len(got_lp) == len(want_lp) > 0
    assert max(abs(a - b) for a, b in zip(got_lp, want_lp, strict=True)) <= LOGPROB_TOL
    d = compare(tmp_path / "ref", tmp_path / "two", ref, two)
    assert d["same_samples"], d
    for key, tol in TOLERANCE.items():
        assert d[key] is not None and d[key] <= tol, (key, d[key])
    return ref, two


@pytest.mark.slow
def test_two_ranks_grow_the_one_process_trees(tmp_path):
    ref, two = _assert_one_process_run(tmp_path)
    # both ranks generated, and between them exactly the one process's conversations
    convs = [r["policy_conversations"] for r in two]
    assert min(convs) > 0 and sum(convs) == ref[0]["policy_conversations"], convs


@pytest.mark.slow
def test_two_ranks_with_ray_rollouts_train_the_one_process_run(tmp_path):
    """Rank 0 drives a local Ray instance's rollout worker; the ranks never generate."""
    pytest.importorskip("ray")
    ref, two = _assert_one_process_run(tmp_path, ray_address="local", ray_workers=1)
    # the trees grew on the Ray worker (its copy of the policy counted there, not here)
    assert [r["policy_conversations"] for r in two] == [0, 0]
    assert ref[0]["policy_conversations"] > 0


def test_an_exception_on_one_rank_stops_every_rank(monkeypatch):
    from trace_gym.distributed import ranks as ranks_module

    real = ranks_module.grow_shard

    def grow(index, *args):
        if index == 1:
            raise ValueError("bad allocator on rank 1")
        return real(index, *args)

    monkeypatch.setattr(ranks_module, "grow_shard", grow)
    group = ThreadGroup(2)
    ranks = [RankRunner(*_args(), rank=r, world_size=2, gather=group.gather(r)) for r in range(2)]
    _, errors = _run_ranks_errors(ranks, 1, _candidates(1))
    assert sorted(type(e).__name__ for e in errors) == ["TraceGymError", "ValueError"]
    assert "rank 1 failed growing its trees (ValueError: bad allocator on rank 1)" in str(
        next(e for e in errors if isinstance(e, TraceGymError))
    )


def test_dist_rollouts_is_checked_at_start_up():
    from trace_gym.trainers.config import DistConfig

    from trace_gym.errors import ConfigError

    assert DistConfig().rollouts == "all" and DistConfig(rollouts="rank0").rollouts == "rank0"
    with pytest.raises(ConfigError, match=r"dist\.rollouts"):
        DistConfig(rollouts="rank1")


def test_the_bench_policy_waits_per_call_and_per_conversation(monkeypatch):
    """`MeteredPolicy`: a fixed wait per call plus one per conversation (the throughput-bound
    engine model of ``bench train --latency-per-conversation``); counts calls and conversations."""
    from types import SimpleNamespace

    from trace_gym.bench import train

    waits: list[float] = []
    monkeypatch.setattr(train.time, "sleep", waits.append)
    inner = SimpleNamespace(generate=lambda convs: [c.upper() for c in convs], name="inner")
    pol = train.MeteredPolicy(inner, 0.05, 0.01)
    assert pol.generate(["a", "b", "c"]) == ["A", "B", "C"] and pol.generate(["d"]) == ["D"]
    assert waits == pytest.approx([0.08, 0.06])
    assert (pol.calls, pol.conversations, pol.name) == (2, 4, "inner")
    train.MeteredPolicy(inner).generate(["x"])
    assert len(waits) == 2  # no latency: no sleep at all
