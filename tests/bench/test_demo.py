"""The demo's allocation section says what its short run can and cannot show."""

from __future__ import annotations

import argparse

from trace_gym.bench import demo


def test_the_allocation_section_says_what_a_short_run_cannot_show(monkeypatch, capsys):
    monkeypatch.setattr(
        demo,
        "DEMO_BENCH",
        dict(preset="math", steps=2, root_budget=16, replays_per_root=2.0, seeds=1),
    )
    demo.allocation(argparse.Namespace())
    out = capsys.readouterr().out
    goals, caveat = out.split("goals (reported, not asserted):", 1)
    assert "trace" in goals and "grpo" in goals
    assert "1 seed(s) x 2 steps" in caveat
    assert "cannot show whether a goal is met" in caveat and "uniform cold start" in caveat
    assert "python -m trace_gym.bench.sim_goals" in caveat
