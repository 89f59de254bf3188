"""`trace-gym bench async`: the heavy-tailed latency wrapper, the rows and ratios, CLI errors."""

from __future__ import annotations

import json

import pytest
from trace_gym.bench.async_bench import AsyncBenchConfig, main, run_async_bench

from trace_gym.cli import main as cli_main
from trace_gym.distributed.engine import Latency
from trace_gym.distributed.testing import LatencyPolicy
from trace_gym.errors import ConfigError
from trace_gym.policy import Conversation
from trace_gym.sim import SimPolicy


class _Versioned(SimPolicy):
    version = 7


def test_a_heavy_tailed_call_waits_for_its_slowest_conversation():
    convs = [Conversation("trace/Sim-v0", "t", "x", (), seed=s) for s in range(8)]
    pol = LatencyPolicy(_Versioned("math"), 0.05, sigma=1.5)
    lat = Latency(0.05, 1.5)
    assert pol.wait_s(convs) == max(lat.of(c) for c in convs)
    assert len({lat.of(c) for c in convs}) == 8  # drawn per conversation, not fixed
    assert LatencyPolicy(SimPolicy("math"), 0.05).wait_s(convs) == 0.05  # sigma 0: fixed
    assert pol.version == 7  # the runner reads the generator's version through the wrapper
    with pytest.raises(ConfigError):
        LatencyPolicy(SimPolicy("math"), 0.05, sigma=-1.0)


def test_every_staleness_gets_a_row_and_a_ratio_to_the_synchronous_one(tmp_path):
    cfg = AsyncBenchConfig(
        backends=("sim",),
        staleness=(0, 1),
        steps=2,
        repeats=2,
        latency_s=0.002,
        latency_sigma=1.0,
        train_ratio=0.5,
        root_budget=4,
        replays_per_root=1.0,
        candidates=2,
    )
    rep = run_async_bench(cfg)
    sync, one = rep["rows"]
    assert (sync["staleness"], one["staleness"]) == (0, 1)
    assert sync["ratio_vs_sync"] == 1.0
    # each k against the synchronous run of its own round, the median over rounds
    assert one["repeats"] == 2 and len(one["walls_s"]) == 2
    want = sorted(s / o for s, o in zip(sync["walls_s"], one["walls_s"], strict=True))
    assert one["ratio_vs_sync"] == pytest.approx(sum(want) / 2)
    assert sync["wall_s"] == pytest.approx(sum(sync["walls_s"]) / 2)
    # the cost model: a train step sleeps R x its own step's generation wall
    assert sync["train_s_mean"] >= 0.5 * sync["gen_s_mean"]
    assert sync["episodes"] == one["episodes"] > 0  # the policy does not learn: paired work
    assert rep["bound_sim"] == pytest.approx(1.5)
    (goal,) = rep["goals"]
    assert goal["value"] == one["ratio_vs_sync"] and goal["met"] == (goal["value"] >= 1.5)


def test_the_cli_writes_json_and_refuses_bad_settings_in_one_line(tmp_path, capsys):
    out = tmp_path / "a.json"
    args = ["--backends", "sim", "--staleness", "0,2", "--steps", "1", "--roots", "4"]
    args += ["--candidates", "2", "--latency", "0", "--json", str(out)]
    assert main(args) == 0
    rep = json.loads(out.read_text())
    assert [r["staleness"] for r in rep["rows"]] == [0, 2] and rep["goals"] == []
    capsys.readouterr()
    assert cli_main(["bench", "async", "--staleness", "1,2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--staleness needs 0" in err
    assert main(["--backends", "gpu"]) == 2


@pytest.mark.slow
def test_the_tiny_ray_rows_generate_on_an_engine_actor():
    """``tiny-ray``: the real trainer, generation on one HF engine actor (weights pushed by
    version), the producer one update behind at k = 1."""
    pytest.importorskip("ray", reason='ray is not installed (pip install "trace-gym[ray]")')
    pytest.importorskip("torch")
    cfg = AsyncBenchConfig(backends=("tiny-ray",), staleness=(0, 1), tiny_steps=2, latency_s=0.001)
    sync, one = run_async_bench(cfg)["rows"]
    assert (sync["backend"], one["backend"]) == ("tiny-ray", "tiny-ray")
    assert sync["episodes"] > 0 and one["episodes"] > 0
    assert sync["staleness_mean"] == 0.0 and one["staleness_mean"] > 0.0
