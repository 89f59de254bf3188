"""The custom-policy example of docs/alloc.md runs and behaves as the docs say."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from trace_gym.alloc import ALLOCATORS, Allocator, Candidate

DOC = Path(__file__).resolve().parents[2] / "docs" / "alloc.md"


def _example() -> str:
    if not DOC.exists():
        pytest.skip(f"{DOC} is not in this checkout")
    match = re.search(
        r"<!-- example: custom-policy -->\s*```python\n(.*?)```", DOC.read_text(), re.S
    )
    assert match, "docs/alloc.md lost its custom-policy example"
    return match.group(1)


def test_custom_policy_example_registers_and_allocates():
    namespace: dict = {}
    try:
        exec(compile(_example(), str(DOC), "exec"), namespace)
        allocator = namespace["allocator"]
        assert isinstance(allocator, Allocator) and "most_uncertain" in ALLOCATORS
        cands = [Candidate(id=str(i), value=v) for i, v in enumerate([0.05, 0.5, 0.45, 0.99, 0.6])]
        counts = allocator.allocate_roots(cands, 9, np.random.default_rng(0))
        assert counts.tolist() == [0, 4, 4, 0, 0]
        assert allocator.allocate_prefixes([], 3, np.random.default_rng(0)).shape == (0,)
    finally:
        ALLOCATORS.pop("most_uncertain", None)
