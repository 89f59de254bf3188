"""Shared fixtures for the HotpotQA env tests: paths, the bundled data, a private index cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from trace_gym.realdata import missing, path_of

REPO = Path(__file__).resolve().parents[2]
REAL_SAMPLE = path_of("hotpotqa")


@pytest.fixture(scope="session")
def real_sample() -> Path:
    if not REAL_SAMPLE.exists():
        pytest.skip(missing("hotpotqa"))
    return REAL_SAMPLE


@pytest.fixture(scope="session")
def bundled():
    from trace_gym.envs.hotpotqa.data import load_bundled

    return load_bundled()


@pytest.fixture(scope="session")
def small_passages(bundled):
    """A few hundred bundled passages plus every gold passage of the first 20 questions."""
    tasks, passages = bundled
    gold = {t for task in tasks[:20] for t in task.supporting_titles}
    keep = [p for p in passages if p.title in gold]
    keep += [p for p in passages[:300] if p.title not in gold]
    return tasks[:20], keep


@pytest.fixture(scope="session")
def dense_passages(small_passages):
    """A smaller slice for the embedding tests (CPU encoding is the slow part)."""
    tasks, passages = small_passages
    tasks = tasks[:10]
    gold = {t for task in tasks for t in task.supporting_titles}
    return tasks, [p for p in passages if p.title in gold] + [
        p for p in passages if p.title not in gold
    ][:40]
