"""examples/trace_step.py is the library's TRACE step: same allocation, trees and advantages."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from trace_gym.trainers.advantages import compute_advantages

from trace_gym.alloc import make_allocator
from trace_gym.predict import FeaturePredictor, make_predictor
from trace_gym.runner import BranchingRunner, RunnerConfig
from trace_gym.sim import SimPolicy

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trace_step.py"


def _example():
    spec = importlib.util.spec_from_file_location("trace_step_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


def _make_env():
    return gym.make("trace/Sim-v0", preset="math", num_tasks=40)


def _library(predictor, steps, ids, args, **config):
    cfg = RunnerConfig(
        root_budget=args.roots,
        replays_per_root=args.replays,
        replay_cost=args.replay_cost,
        seed=args.seed,
        prefix_share=args.prefix_share,
        **config,
    )
    allocator = make_allocator("trace", m_max=args.m_max)
    runner = BranchingRunner(SimPolicy("math"), _make_env, allocator, predictor, cfg)
    return [runner.run_step(step, ids).trees for step in steps]


def _as_json(trees):
    return [json.dumps(t.to_dict(), sort_keys=False) for t in trees]


def _check_same(out, trees, ids):
    root_counts = {t.prompt_id: t.info["root_count"] for t in trees}
    assert {k: v for k, v in out.root_counts.items() if v} == root_counts
    assert sum(out.root_counts.values()) == sum(root_counts.values())
    assert _as_json(out.trees) == _as_json(trees)
    units = compute_advantages("treerpo", trees)
    assert [(u.tree, u.nodes) for u in units] == [(t, n) for t, n, _, _ in out.units]
    assert [u.advantage for u in units] == pytest.approx([a for _, _, a, _ in out.units], abs=1e-12)
    assert [u.weight for u in units] == pytest.approx([w for _, _, _, w in out.units], abs=1e-12)


@pytest.mark.parametrize("expansion", ["per-prompt", "global"])
def test_example_step_matches_the_runner_with_a_noisy_oracle(expansion):
    ex = _example()
    args = ex.Args(roots=24, replays=2.0, seed=7)
    ids = list(_make_env().unwrapped.task_ids)
    out = ex.trace_step(
        0, ids, _make_env, SimPolicy("math"), make_predictor("noisy", rho=0.9), args
    )
    (trees,) = _library(make_predictor("noisy", rho=0.9), [0], ids, args, expansion=expansion)
    assert len(trees) >= 3 and any(t.info["replays"] for t in trees)  # a real allocation
    assert len({m for m in out.root_counts.values() if m}) > 1  # uneven groups
    assert any(n.origin == "replay" for t in trees for n in t.nodes)
    _check_same(out, trees, ids)


def test_example_steps_match_the_runner_with_a_learning_predictor():
    """Two steps with the text predictor: the update in between must match too."""
    ex = _example()
    args = ex.Args(roots=20, replays=1.5, seed=3)
    ids = list(_make_env().unwrapped.task_ids)[:24]
    mine, theirs = FeaturePredictor(dim=1 << 12), FeaturePredictor(dim=1 << 12)
    library = _library(theirs, [0, 1], ids, args)
    for step, trees in zip([0, 1], library, strict=True):
        out = ex.trace_step(step, ids, _make_env, SimPolicy("math"), mine, args)
        _check_same(out, trees, ids)
    assert (mine.w == theirs.w).all() and mine.updates == theirs.updates == 2
    assert mine.w.any()  # it learned something, so step 1 was scored by a trained model


def test_example_main_runs(capsys):
    out = _example().main(["--roots", "16", "--candidates", "24"])
    assert sum(out.root_counts.values()) == 16 and out.units
    assert "prompts selected" in capsys.readouterr().out
