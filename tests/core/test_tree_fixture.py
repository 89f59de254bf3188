"""Today's code grows the same trees as the frozen pre-refactor fixture, by content.

``tests/fixtures/trees_v1/`` was written (format version 1) by the code as it stood before
the architecture refactor, with ``tests/fixtures/make_tree_fixture.py``: a few
`bench alloc` steps of every allocation policy on each simulator preset. It must never be
regenerated in place. The comparison is by content: every field the fixture has must be
present with the same value (floats to 1e-9 relative); fields added by later format
versions are ignored, and the top-level ``version`` is not compared.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from trace_gym.tree import load_trees

FIXTURE = Path(__file__).parent.parent / "fixtures"


def _maker():
    spec = importlib.util.spec_from_file_location(
        "make_tree_fixture", FIXTURE / "make_tree_fixture.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _diff(old, new, where: str) -> str | None:
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return f"{where}: {type(new).__name__} instead of a dict"
        for k, v in old.items():
            if where == "" and k == "version":
                continue
            if k not in new:
                return f"{where}.{k}: missing"
            d = _diff(v, new[k], f"{where}.{k}")
            if d:
                return d
        return None
    if isinstance(old, list):
        if not isinstance(new, list) or len(new) != len(old):
            return f"{where}: length {len(old)} vs {len(new) if isinstance(new, list) else new!r}"
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            d = _diff(a, b, f"{where}[{i}]")
            if d:
                return d
        return None
    if isinstance(old, float) and isinstance(new, (int, float)) and not isinstance(new, bool):
        return (
            None
            if math.isclose(old, new, rel_tol=1e-9, abs_tol=1e-12)
            else f"{where}: {old} vs {new}"
        )
    return None if old == new and type(old) is type(new) else f"{where}: {old!r} vs {new!r}"


@pytest.mark.parametrize("preset", _maker().PRESETS)
def test_trees_match_frozen_fixture(preset):
    mod = _maker()
    grown = {}
    for name, _step, trees in mod.grow(preset):
        grown.setdefault(name, []).extend(trees)
    files = sorted((FIXTURE / "trees_v1").glob(f"{preset}-*.jsonl.gz"))
    assert files, "the frozen fixture is missing"
    assert {f.name[len(preset) + 1 : -len(".jsonl.gz")] for f in files} <= set(grown)
    for f in files:
        name = f.name[len(preset) + 1 : -len(".jsonl.gz")]
        old = load_trees(f)
        new = grown[name]
        assert len(new) == len(old), f"{f.name}: {len(new)} trees instead of {len(old)}"
        for a, b in zip(old, new, strict=True):
            d = _diff(a.to_dict(), b.to_dict(), "")
            assert d is None, f"{f.name} prompt {a.prompt_id} step {a.step}: {d}"
