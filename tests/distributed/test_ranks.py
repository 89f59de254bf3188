"""RankShardedRunner over 2 gloo ranks: the same global trees as one BranchingRunner."""

from __future__ import annotations

import json
import os
import socket

import pytest

torch = pytest.importorskip("torch")

from trace_gym.alloc import make_allocator  # noqa: E402
from trace_gym.distributed import RankShardedRunner  # noqa: E402
from trace_gym.predict import make_predictor  # noqa: E402
from trace_gym.runner import BranchingRunner, RunnerConfig  # noqa: E402
from trace_gym.testing import CountdownEnv, RandomCountdownPolicy  # noqa: E402

TASKS = [f"count-{i}" for i in range(12)]
STEPS = 3


def countdown_env():
    return CountdownEnv(num_tasks=12, max_turns=6)


def _build(cls):
    return cls(
        RandomCountdownPolicy(),
        countdown_env,
        make_allocator("trace", m_max=8),
        make_predictor("features"),
        RunnerConfig(root_budget=24, replays_per_root=2.0, m_max=8, seed=5),
    )


def _summary(result):
    r = result.report
    return {
        "trees": [t.to_dict() for t in result.trees],
        "counts": [r.selected, r.roots, r.replays, r.measured_turns, r.env_steps],
        "predictor_update": r.predictor_update,
    }


def _rank(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        runner = _build(RankShardedRunner)
        steps = []
        for step in range(STEPS):
            result = runner.run_step(step, TASKS)
            steps.append(
                {**_summary(result), "placement": result.report.placement, "world": runner.world}
            )
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(steps, f)
        runner.close()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_grow_the_global_trees_of_one_process(tmp_path):
    torch.multiprocessing.spawn(_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    local = _build(BranchingRunner)
    try:
        reference = [_summary(local.run_step(step, TASKS)) for step in range(STEPS)]
    finally:
        local.close()
    for rank in ranks:
        for got, want in zip(rank, reference, strict=True):
            assert got["world"] == 2
            assert got["trees"] == want["trees"]  # every rank holds the global trees
            assert got["counts"] == want["counts"]
            assert got["predictor_update"] == pytest.approx(want["predictor_update"])
            # both ranks grew trees, and each prompt on exactly one of them
            assert set(got["placement"]) == {t["prompt_id"] for t in want["trees"]}
            assert set(got["placement"].values()) == {0, 1}
    assert ranks[0] == ranks[1]
