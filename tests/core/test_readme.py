"""The README's code examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from trace_gym.alloc import ALLOCATORS, Candidate
from trace_gym.alloc.base import Allocator

README = Path(__file__).resolve().parents[2] / "README.md"


def _block_after(heading: str) -> str:
    text = README.read_text()
    section = text.split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_add_a_policy_example_works():
    ns: dict = {}
    try:
        exec(_block_after("## Adding an allocation policy"), ns)
        policy = ALLOCATORS["half_sure"](m_max=8)
        assert isinstance(policy, Allocator)  # every declared member, cost_aware included
        values = [0.05, 0.5, 0.7, 0.95, 0.3]
        cands = [Candidate(id=str(i), value=v) for i, v in enumerate(values)]
        counts = policy.allocate_roots(cands, 12, np.random.default_rng(0))
        assert counts.sum() == 12
        assert counts[0] == counts[3] == 0 and all(counts[i] >= 2 for i in (1, 2, 4))
        assert counts[1] >= counts[2]  # the prompt nearest 0.5 gets the most
    finally:
        ALLOCATORS.pop("half_sure", None)


def test_quick_start_runs():
    code = _block_after("## Quick start").replace(
        "<search>who founded ...</search>", "<search>founder</search>"
    )
    exec(code, {})


def test_one_step_example_runs():
    ns: dict = {}
    exec(_block_after("## One TRACE step, in one file"), ns)
    report = ns["report"]
    assert report.roots == 64 and report.replays > 0 and ns["trees"]
    assert sum(t.info["root_count"] for t in ns["trees"]) == 64
