"""The real data sets tests and benchmarks read by path (never shipped with the project).

They live in one folder, ``$TRACE_GYM_DATA`` (default: ``shared/data`` beside the
repository root, i.e. ``<repo>/../shared/data``), laid out as:

- ``math/``: DeepScaleR-format JSON lists (``train_aime.json``, ``train_math.json``,
  ``test_math500.json``), as the DeepScaleR project packages AIME and MATH;
- ``hotpotqa/hotpot_distractor_sample_500.jsonl``: original HotpotQA records
  (distractor setting), one per line.

`SETS` says, for each set, what it is and how to get it; `trace-gym data sets` prints
that with where each was looked for. Tests that need a set are a declared category: they
skip with `missing` 's message (the ``data`` entry of the skip allow-list) where the
folder is absent, and cannot skip where ``TRACE_GYM_REQUIRE=data`` is set, as in CI.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ENV_VAR", "MISSING", "SETS", "DataSet", "data_root", "missing", "path_of"]

ENV_VAR = "TRACE_GYM_DATA"
#: every skip message for an absent set starts so (the skip allow-list matches it)
MISSING = "real data set missing"


@dataclass(frozen=True)
class DataSet:
    """One real data set: where it sits under the data root and how a user gets it."""

    name: str
    #: path under the data root (a file or a folder)
    relpath: str
    what: str
    how: str


SETS: dict[str, DataSet] = {
    s.name: s
    for s in (
        DataSet(
            "math",
            "math",
            "AIME 1983-2023, MATH train and MATH-500 in the DeepScaleR packaging (JSON lists "
            "of problem/answer/...)",
            "copy train_aime.json, train_math.json and test_math500.json from the DeepScaleR "
            "repository's deepscaler/data (train/aime.json, train/math.json, test/math500.json) "
            "into $TRACE_GYM_DATA/math/",
        ),
        DataSet(
            "hotpotqa",
            "hotpotqa/hotpot_distractor_sample_500.jsonl",
            "500 HotpotQA distractor-setting questions with their 10 context paragraphs",
            "trace-gym data fetch hotpot_qa-distractor "
            "$TRACE_GYM_DATA/hotpotqa/hotpot_distractor_sample_500.jsonl --limit 500 "
            "(needs network and `pip install datasets`)",
        ),
    )
}


def data_root() -> Path:
    """``$TRACE_GYM_DATA``, or ``<repo>/../shared/data`` when it is unset."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[2] / "shared" / "data"


def path_of(name: str) -> Path:
    """Where set `name` (a key of `SETS`) is looked for."""
    return data_root() / SETS[name].relpath


def missing(name: str) -> str:
    """The one-line message for an absent set: what, where it was looked for, how to get it."""
    s = SETS[name]
    return (
        f"{MISSING}: {s.name} ({s.what}) not found at {path_of(name)}; set {ENV_VAR} to the "
        f"folder that holds it, or get it: {s.how}"
    )
