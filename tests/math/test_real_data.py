"""The real DeepScaleR-format files in ../shared/data/math: loaded unchanged, answers self-verify.

For every reference answer the verifier must accept the answer against itself in the form a
model writes it (inside ``\\boxed{}``, extracted by the env's own parser), and a bare number
with its ``\\text{...}`` unit stripped must be accepted for answers that carry one. The test
also reports how often our canonicaliser and math-verify disagree on those self-checks.
"""

from __future__ import annotations

import json
import re

import pytest
from trace_gym.envs.math.data import load_dataset
from trace_gym.envs.math.protocol import parse_action
from trace_gym.envs.math.verify import VerifierPool, verify_answer

FILES = {"test_math500.json": 500, "train_aime.json": 975, "train_math.json": 7474}
_UNIT = re.compile(r"^(-?\d+(?:\.\d+)?)\s*\\(?:text|mbox)\{\s*[a-zA-Z ]+\}$")


@pytest.fixture(scope="module")
def pool():
    p = VerifierPool(timeout_s=20.0, inner_timeout_s=5)
    yield p
    p.close()


def _self_check(tasks, pool):
    failures, disagree = [], []
    for t in tasks:
        if not t.answer:
            continue
        parsed = parse_action(f"Therefore the answer is $\\boxed{{{t.answer}}}$.")
        assert parsed.kind == "answer"
        verdict = verify_answer(parsed.answer, t.answer, pool)
        if not verdict.correct:
            failures.append((t.id, t.answer, verdict))
        # both judges, and the canonicaliser without its string shortcut: does it read the answer?
        both = pool.check(parsed.answer, t.answer, string_match=False)
        if (
            not both.get("timed_out")
            and both["math_verify"] is not None
            and both["math_verify"] != both["canonical"]
        ):
            disagree.append((t.id, t.answer, both))
        m = _UNIT.match(t.answer)
        if m and not verify_answer(m.group(1), t.answer, pool).correct:
            failures.append((t.id, f"unit-stripped {m.group(1)}", t.answer))
    return failures, disagree


@pytest.mark.parametrize("name", list(FILES))
def test_loader_reads_real_files_unchanged(math_data_dir, name):
    ts = load_dataset(math_data_dir / name)
    raw = json.loads((math_data_dir / name).read_text())
    assert len(ts.tasks) == len(raw) == FILES[name]
    assert [t.problem for t in ts.tasks] == [r["problem"] for r in raw]
    # MATH train has 4 records with a null or empty answer; they are kept, not invented
    assert sum(1 for t in ts.tasks if not t.answer) == (4 if name == "train_math.json" else 0)


@pytest.mark.parametrize("name", ["test_math500.json", "train_aime.json"])
def test_reference_answers_self_verify(math_data_dir, pool, name, record_property, capsys):
    tasks = load_dataset(math_data_dir / name).tasks
    failures, disagree = _self_check(tasks, pool)
    record_property("canonical_vs_math_verify_disagreements", len(disagree))
    with capsys.disabled():
        print(
            f"\n[{name}] {len(tasks)} answers, {len(failures)} self-check failures, "
            f"{len(disagree)} canonicaliser/math-verify disagreements"
        )
        for d in disagree[:30]:
            print("   ", d[0], d[1][:70], d[2])
    assert failures == []


@pytest.mark.slow
def test_reference_answers_self_verify_math_train(math_data_dir, pool, capsys):
    tasks = load_dataset(math_data_dir / "train_math.json").tasks
    failures, disagree = _self_check(tasks, pool)
    # cross pairs (each answer against the next problem's, mostly different answers):
    # how often the two judges reach different verdicts, and how often both accept
    cross = [
        (a.answer, b.answer)
        for a, b in zip(tasks, tasks[1:], strict=False)
        if a.answer and b.answer
    ]
    verdicts = [pool.check(p, r, string_match=False) for p, r in cross]
    split = [
        (p, r, v)
        for (p, r), v in zip(cross, verdicts, strict=True)
        if v.get("math_verify") is not None and v["math_verify"] != v["canonical"]
    ]
    both = sum(1 for v in verdicts if v.get("math_verify") and v.get("canonical"))
    with capsys.disabled():
        print(
            f"\n[train_math cross pairs] {len(cross)} pairs, {len(split)} disagreements, {both} accepted by both"
        )
        for d in split[:15]:
            print("   ", d)
        print(
            f"\n[train_math] {len(tasks)} answers, {len(failures)} failures, {len(disagree)} disagreements"
        )
        for d in disagree[:30]:
            print("   ", d[0], d[1][:70], d[2])
    assert failures == []
