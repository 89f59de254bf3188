"""The embedded default set (deterministic, verified) and the DeepScaleR-format loader."""

from __future__ import annotations

import collections
import json

import gymnasium as gym
import pytest
from trace_gym.corpora import build_math
from trace_gym.envs.math.data import load_dataset
from trace_gym.envs.math.verify import to_sympy

import trace_gym  # noqa: F401 - registers the ids

RECORDS = [
    {"problem": "What is $1+1$?", "answer": "2", "solution": "1+1=2"},
    {
        "problem": "Simplify $\\frac{2}{4}$.",
        "answer": "\\boxed{\\frac{1}{2}}",
        "solution": "",
        "level": 1,
    },
    {"problem": "Pick $x$.", "answer": "(1, 2]"},
]


def test_default_set_size_topics_and_ids():
    ts = load_dataset()
    assert len(ts.tasks) >= 500
    topics = collections.Counter(t.meta["topic"] for t in ts.tasks)
    assert set(topics) == {"number_theory", "combinatorics", "algebra", "calculus"}
    assert min(topics.values()) >= 100
    assert len(set(ts.ids)) == len(ts.ids)
    assert all(t.answer and t.solution for t in ts.tasks)


def test_default_set_is_rebuilt_deterministically():
    # the first rows of every generator, rebuilt from the script, match the shipped file
    shipped = {t.id: t for t in load_dataset().tasks}
    rebuilt = build_math.build(per_generator=2)
    assert len(rebuilt) == 2 * len(build_math.GENERATORS)
    for row in rebuilt:
        t = shipped[row["id"]]
        assert (t.problem, t.answer, t.solution) == (row["problem"], row["answer"], row["solution"])


def test_default_answers_parse_as_math():
    for t in load_dataset().tasks[::7]:
        value = to_sympy(t.answer)
        assert value.is_number, (t.id, t.answer)


@pytest.mark.parametrize("fmt", ["json", "jsonl", "parquet"])
def test_deepscaler_loader_formats(tmp_path, fmt):
    path = tmp_path / f"set.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps(RECORDS))
    elif fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n")
    else:
        pq = pytest.importorskip("pyarrow.parquet")
        import pyarrow as pa

        pq.write_table(
            pa.Table.from_pylist(
                [
                    {**r, "level": r.get("level", 0), "solution": r.get("solution", "")}
                    for r in RECORDS
                ]
            ),
            path,
        )
    ts = load_dataset(path)
    assert [t.answer for t in ts.tasks] == ["2", "\\frac{1}{2}", "(1, 2]"]
    assert ts.ids[0] == "set-00000" and ts.tasks[0].solution == "1+1=2"
    env = gym.make("trace/Math-v0", dataset=str(path), sandbox={"cell_timeout_s": 5.0})
    try:
        obs, info = env.reset(seed=0, options={"task": 1})
        assert "Simplify" in obs
        *_, r, term, _, _ = env.step("\\boxed{0.5}")
        assert term and r == 1.0
    finally:
        env.close()


def test_loader_rejects_bad_records(tmp_path):
    from trace_gym.errors import ConfigError

    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"question": "q", "answer": "1"}]))
    with pytest.raises(ConfigError, match="problem"):
        load_dataset(path)


def test_a_file_that_is_not_json_names_itself(tmp_path):
    import gymnasium as gym

    from trace_gym.errors import ConfigError

    path = tmp_path / "set.toml"
    path.write_text('[[task]]\nproblem = "1+1"\nanswer = "2"\n')
    with pytest.raises(ConfigError, match=r"math dataset '.*set\.toml' is not JSON, JSONL"):
        gym.make("trace/Math-v0", dataset=str(path))
    path = tmp_path / "set.jsonl"
    path.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": oops}\n')
    with pytest.raises(ConfigError, match=r"set\.jsonl' is not JSON.*line 2, column 13"):
        load_dataset(path)
