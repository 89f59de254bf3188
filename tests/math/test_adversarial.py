"""Issue 26: the reward is right and says why. Adversarial answers never score 1; right ones do.

The cases live in ``adversarial_answers.toml`` (reference, answer, optional problem text),
grouped by class; each runs through `verify_answer`, the path `MathEnv.step` takes, with
the problem text the env passes, and a few run through `env.step` itself.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from trace_gym.envs.math import _judge
from trace_gym.envs.math.env import MathEnv
from trace_gym.envs.math.verify import VerifierPool, normalize, verify_answer

SUITE = tomllib.loads((Path(__file__).with_name("adversarial_answers.toml")).read_text())
WRONG = [(cls, *case) for cls, cases in SUITE["wrong"].items() for case in cases]
RIGHT = [tuple(case) for case in SUITE["right"]["forms"]]
RULES = {"exact", "symbolic", "numeric", "math-verify", "refused"}


def _case(ref: str, answer: str, problem: str | None = None) -> tuple[str, str, str | None]:
    return ref, answer, problem


@pytest.fixture(scope="module")
def pool():
    p = VerifierPool(timeout_s=15.0, inner_timeout_s=3)
    yield p
    p.close()


def test_the_suite_is_large_and_covers_every_class():
    assert len(WRONG) >= 200 and len(RIGHT) >= 40
    assert set(SUITE["wrong"]) >= {
        "trailing_text",
        "equations",
        "approximations",
        "structure",
        "hedges",
        "changed_bounds",
        "near_numbers",
    }


def _scored(cases, pool, want: bool) -> list[tuple]:
    """The cases whose reward through `verify_answer` (the env's path) is not `want`."""
    off = []
    for cls, *case in cases:
        ref, answer, problem = _case(*case)
        verdict = verify_answer(answer, ref, pool, problem=problem)
        assert verdict.judge in RULES | {"timeout"}, verdict
        if verdict.correct is not want:
            off.append((cls, ref, answer, verdict.judge, verdict.why))
    return off


def test_our_rules_never_accept_an_adversarial_answer(pool):
    """Every case through our judge alone; those it cannot read go through the full path."""
    unread = []
    for cls, *case in WRONG:
        ref, answer, problem = _case(*case)
        d = _judge.decide(answer, ref, places=_judge.stated_precision(problem))
        assert not d.correct, (cls, ref, answer, d)
        unread += [] if d.confident else [(cls, *case)]
    assert len(unread) < 10, (
        unread
    )  # our reader reads nearly all of them: math-verify is not the judge
    assert _scored(unread + WRONG[::10], pool, False) == []


def test_right_answers_in_other_forms_score_one(pool):
    assert _scored([("right", *case) for case in RIGHT], pool, True) == []


@pytest.mark.slow
def test_no_adversarial_answer_scores_one_through_the_env_path(pool):
    assert _scored(WRONG, pool, False) == []


@pytest.mark.parametrize(
    "answer,ref,problem,judge",
    [
        ("5", "5", None, "exact"),
        ("7 = 5", "5", None, "refused"),
        ("5 or 7", "5", None, "refused"),
        ("\\{1,2\\}", "(1,2)", None, "refused"),
        ("x = 5", "5", None, "symbolic"),
        ("0.5", "\\frac{1}{2}", None, "numeric"),
        ("0.333333", "\\frac{1}{3}", None, "numeric"),
        ("1.41", "\\sqrt{2}", "Round to the nearest hundredth.", "numeric"),
    ],
)
def test_the_verdict_names_its_rule(pool, answer, ref, problem, judge):
    verdict = verify_answer(answer, ref, pool, problem=problem)
    assert verdict.judge == judge and verdict.why, verdict


def test_math_verify_decides_only_what_our_reader_cannot_read(pool):
    # our reader does not read "\overline": math-verify's verdict is the reward there
    verdict = verify_answer("0.\\overline{3}", "\\frac{1}{3}", pool)
    assert verdict.judge in ("math-verify", "refused")
    assert not verify_answer("7 = 5", "5", pool).correct  # math-verify alone accepts it


@pytest.mark.parametrize(
    "problem,places",
    [
        ("Express your answer as a decimal to the nearest hundredth.", 2),
        ("Round to the nearest tenth.", 1),
        ("Give your answer to 3 decimal places.", 3),
        ("Express your answer as a decimal.", 0),
        ("What is $\\frac{1}{3}$ of 9?", None),
        ("In each round, approximately 5 players leave. How many remain?", None),
        ("Round your answer to 2 decimal places.", 2),
        (None, None),
    ],
)
def test_stated_precision(problem, places):
    assert _judge.stated_precision(problem) == places


def test_env_step_reports_the_rule(tmp_path, fast_sandbox):
    """Through `env.step`: the problem text reaches the judge, `info["judge"]` names the rule."""
    rows = [
        {"problem": "Compute $2+3$.", "answer": "5"},
        {"problem": "Compute $\\sqrt{2}$ to the nearest hundredth.", "answer": "\\sqrt{2}"},
        {"problem": "Compute $\\sqrt{2}$.", "answer": "\\sqrt{2}"},
    ]
    data = tmp_path / "tasks.json"
    data.write_text(json.dumps(rows))
    env = MathEnv(dataset=data, sandbox=fast_sandbox)
    try:
        for task, action, reward, judge in [
            (0, "So \\boxed{7 = 5}.", 0.0, "refused"),
            (0, "So \\boxed{5 \\text{ times } 2}.", 0.0, "symbolic"),
            (0, "So \\boxed{x = 5}.", 1.0, "symbolic"),
            (1, "So \\boxed{1.41}.", 1.0, "numeric"),
            (2, "So \\boxed{1.41}.", 0.0, "numeric"),
        ]:
            env.reset(seed=0, options={"task": task})
            _, r, term, _, info = env.step(action)
            assert term and r == reward and info["judge"] == judge, (action, info)
            assert info["verifier"]["why"]
    finally:
        env.close()


# --------------------------------------------------------------------------- every reference
_COMMAND = re.compile(r"\\([a-zA-Z]+)")
_RELATIONS = re.compile(r"\\(?:leq?|geq?|neq?|in)(?![a-zA-Z])|[=<>]")
# commands that carry no mathematics of their own (their arguments stay)
_QUIET = ("left", "right", "dfrac", "tfrac", "frac", "displaystyle", "textbf", "textrm", "text")
_QUIET += ("mbox", "mathrm", "mathbf", "boldsymbol", "textnormal")
_KNOWN = sorted((*_judge._COMMANDS, *_QUIET, "leq", "le", "geq", "ge", "neq", "ne", "in"), key=len)


def _command(m: re.Match) -> str:
    """A command as the reader splits it: ``\\cotx`` is the command cot, then the letter x."""
    name = m.group(1)
    known = next((c for c in reversed(_KNOWN) if name.startswith(c)), None)
    if known is None:
        return f" \\{name} "
    return ("" if known in _QUIET else f" \\{known} ") + name[len(known) :]


def _mathematics(s: str) -> tuple[str, list[str]]:
    """Digits, letters, operators and commands of `s` in order, and its relations."""
    body = _COMMAND.sub(_command, s)
    relations = _RELATIONS.findall(body)
    body = re.sub(
        r"\\(?![a-zA-Z])", "", _RELATIONS.sub("", body)
    )  # \\! \\, \\{ \\%: no mathematics
    return re.sub(r"[^0-9A-Za-z+\-*/^\\]", "", body), relations


def _references(data_dir: Path) -> list[str]:
    refs = []
    for name in ("train_aime.json", "test_math500.json", "train_math.json"):
        from trace_gym.envs.math.data import load_dataset

        refs += [str(t.answer) for t in load_dataset(data_dir / name).tasks if t.answer]
    return refs


def test_normalising_never_changes_a_references_mathematics(math_data_dir):
    """Issue 26: no digit, variable, operator or relation is dropped, except a unit after a number."""
    changed = []
    for ref in _references(math_data_dir):
        before, after = _mathematics(ref), _mathematics(normalize(ref))
        if before == after:
            continue
        bare = ref.strip().strip("$").strip().rstrip(".").replace("\\textnormal", "\\text")
        unit = _judge._UNIT_TAIL.match(bare)  # noqa: SLF001 - the rule under test
        if unit and normalize(unit.group(1)) == normalize(ref):
            continue  # "5 \text{ cm}^2" -> "5": a unit after a bare number went, nothing else
        changed.append((ref, normalize(ref)))
    assert changed == [], (len(changed), changed[:40])


@pytest.mark.parametrize(
    "pred,ref,want",
    [
        # found by `trace-gym bench judge`: a decimal endpoint read exactly must still meet
        # the reference's own (float) endpoint
        ("(0.5,0.6)", "(0.5,0.6)", True),
        ("[5.8,6)", "[5.8,6)", True),
        ("[5.8,6)", "[5.8,6]", False),
        ("\\{0.5, 1\\}", "\\{1, \\frac12\\}", True),
        ("\\{0.5, 1\\}", "\\{1, 0.6\\}", False),
    ],
)
def test_sets_compare_their_elements_as_numbers(pred, ref, want):
    assert _judge.decide(pred, ref, string_match=False).correct is want
