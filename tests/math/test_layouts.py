"""Reference answers in the DeepScaleR packagings of Minerva and OlympiadBench: normalised at load, scored right.

The files are written here into ``tmp_path`` with records modelled on those layouts (list-valued
answers with stray newlines, ``$...$`` delimiters, several parts, float values); each task's correct
``\\boxed{}`` answer must score 1 and wrong ones 0, through the verifier and through ``env.step``.
"""

from __future__ import annotations

import json
import logging
import pickle

import gymnasium as gym
import pytest
from trace_gym.envs.math.data import Reference, asks_for_set, load_dataset, normalize_answer
from trace_gym.envs.math.protocol import parse_action
from trace_gym.envs.math.verify import VerifierPool, verify_answer

import trace_gym  # noqa: F401 - registers the ids

# Minerva (DeepScaleR packaging): `answer` is a one-element list, often with a trailing newline
MINERVA = [
    {
        "problem": "Preamble: A star has a parallax of 0.1 arcsec. Compute its distance in parsecs.",
        "answer": ["10\n"],
        "solution": "$d = 1/p = \\boxed{10}$ parsecs.",
        "type": "Introduction to Astronomy",
    },
    {
        "problem": "What is the wavelength in micrometres of the peak of a 302 K black body? Give one decimal.",
        "answer": ["9.6\n"],
        "solution": "Wien's law gives \\boxed{9.6}.",
        "type": "Introduction to Astronomy",
    },
    {
        "problem": "Compute the energy in eV of a photon of wavelength 500 nm, to two decimal places.",
        "answer": ["2.48"],
        "solution": "",
        "type": "Physical Chemistry",
    },
    {
        "problem": "How many seconds are in one hour?",
        "answer": [3600.0],
        "solution": "",
        "type": "Units",
    },
    {
        "problem": "Give the speed of light in m/s to two significant figures.",
        "answer": ["3 \\times 10^{8}\n"],
        "solution": "",
        "type": "Relativity",
    },
    {
        "problem": "Find the ratio of the two masses as a fraction.",
        "answer": ["\\frac{1}{4}\n"],
        "solution": "",
        "type": "Dynamics",
    },
]
# OlympiadBench (DeepScaleR packaging): lists of $-delimited strings; several strings = several parts
OLYMPIAD = [
    {
        "problem": "Let $T=7$. Compute the number of positive divisors of $T^2$.",
        "answer": ["$3$"],
        "solution": ["$T^2=49$ has divisors 1, 7, 49."],
        "id": 2701,
        "subfield": "Number Theory",
        "answer_type": "Numerical",
        "is_multiple_answer": False,
    },
    {
        "problem": "Determine all real numbers $x$ such that $x^2 - x - 2 = 0$.",
        "answer": ["$2$", "$-1$"],
        "solution": ["Factor: $(x-2)(x+1)=0$."],
        "id": 2702,
        "subfield": "Algebra",
        "answer_type": "Numerical",
        "is_multiple_answer": True,
    },
    {
        "problem": "The line $y = ax + b$ passes through $(1, 8)$ and $(2, 11)$. Compute $a$ and $b$.",
        "answer": ["3", "5"],
        "solution": ["Slope 3, intercept 5."],
        "id": 2703,
        "subfield": "Algebra",
        "answer_type": "Numerical",
        "is_multiple_answer": True,
    },
    {
        "problem": "Compute $\\frac{7}{2}$ as a decimal.",
        "answer": [3.5],
        "solution": [],
        "id": 2704,
        "subfield": "Algebra",
        "answer_type": "Numerical",
        "is_multiple_answer": False,
    },
    {
        "problem": "Compute $\\sqrt{12}$ in simplest radical form.",
        "answer": ["$2 \\sqrt{3}$\n"],
        "solution": [],
        "id": 2705,
        "subfield": "Algebra",
        "answer_type": "Expression",
        "is_multiple_answer": False,
    },
    {
        "problem": "Compute $100 + 42$.",
        "answer": "142.0",
        "solution": "",
        "id": 2706,
        "subfield": "Algebra",
    },
]
# task index -> (correct boxed answers, wrong boxed answers)
MINERVA_CASES = {
    0: (["10"], ["11", "1"]),
    1: (["9.6", "9.60"], ["9.7", "96"]),
    2: (["2.48"], ["2.5", "24.8"]),
    3: (["3600", "3600.0"], ["360"]),
    4: (["3\\times10^8", "300000000"], ["3\\times10^{9}"]),
    5: (["\\frac14", "0.25"], ["\\frac{1}{3}", "4"]),
}
OLYMPIAD_CASES = {
    0: (["3"], ["4"]),
    1: (["2, -1", "-1, 2", "x=2, x=-1", "\\{-1, 2\\}"], ["2", "2, 1", "2, -1, 0"]),
    2: (["3, 5", "(3, 5)", "3 \\text{ and } 5"], ["5, 3", "3", "3, 5, 7", "3, 6"]),
    3: (["3.5", "\\frac{7}{2}"], ["3.6"]),
    4: (["2\\sqrt{3}", "\\sqrt{12}"], ["3\\sqrt{2}", "3.4641"]),
    5: (["142"], ["143"]),
}


@pytest.fixture(scope="module")
def pool():
    p = VerifierPool(timeout_s=20.0, inner_timeout_s=5)
    yield p
    p.close()


def _write(tmp_path, name, records, jsonl=False):
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in records) if jsonl else json.dumps(records))
    return path


def test_normalize_answer_rule():
    assert normalize_answer(["9.6\n"]) == "9.6" and type(normalize_answer(["9.6\n"])) is str
    assert (
        normalize_answer(142.0) == "142"
        and normalize_answer(142) == "142"
        and normalize_answer("142.0") == "142"
    )
    assert normalize_answer([3600.0]) == "3600" and normalize_answer(0.25) == "0.25"
    assert normalize_answer("033") == "033"  # leading zeros are kept: the judge reads 033 as 33
    assert (
        normalize_answer("$\\frac{1}{2}$ \n") == "\\frac{1}{2}"
        and normalize_answer("\\boxed{7}\n") == "7"
    )
    assert (
        normalize_answer("\\, 5 \\quad") == "5" and normalize_answer("$5$ and $6$") == "$5$ and $6$"
    )
    assert (
        normalize_answer("\\begin{pmatrix} 1 & \\phantom -1 \\end{pmatrix}")
        == "\\begin{pmatrix} 1 & 1 \\end{pmatrix}"
    )
    assert (
        normalize_answer(None) == ""
        and normalize_answer([]) == ""
        and normalize_answer(["", None]) == ""
    )
    multi = normalize_answer(["$3$", " 5\n"], "Compute $a$ and $b$.")
    assert (
        isinstance(multi, Reference)
        and multi == "3, 5"
        and multi.parts == ("3", "5")
        and multi.ordered
    )
    unordered = normalize_answer(["2", "-1"], "Find all real $x$ with $x^2=x+2$.")
    assert not unordered.ordered
    assert (
        pickle.loads(pickle.dumps(unordered)) == unordered
        and not pickle.loads(pickle.dumps(unordered)).ordered
    )


@pytest.mark.parametrize(
    "problem,want",
    [
        ("Find all real numbers $x$ such that ...", True),
        ("Determine all pairs $(a, b)$ ...", True),
        ("What are all possible values of $n$?", True),
        ("Compute the set of all $x$ ...", True),
        ("Compute $a$ and $b$.", False),
        ("For all positive integers $n$, $f(n)=2n$. Find $f(1)$ and $f(2)$.", False),
        ("Find the two roots in increasing order.", False),
    ],
)
def test_asks_for_set_is_conservative(problem, want):
    assert asks_for_set(problem) is want


def test_loader_warns_with_file_and_count(tmp_path, caplog):
    path = _write(tmp_path, "minerva.json", MINERVA)
    with caplog.at_level(logging.WARNING, logger="trace_gym.envs.math.data"):
        ts = load_dataset(path)
    # every Minerva answer here is a list, so all six were coerced
    assert any(
        str(path) in r.getMessage() and " 6 of 6 records" in r.getMessage() for r in caplog.records
    )
    assert [t.answer for t in ts.tasks] == [
        "10",
        "9.6",
        "2.48",
        "3600",
        "3 \\times 10^{8}",
        "\\frac{1}{4}",
    ]
    caplog.clear()
    plain = _write(tmp_path, "plain.json", [{"problem": "p", "answer": "7"}])
    with caplog.at_level(logging.WARNING, logger="trace_gym.envs.math.data"):
        load_dataset(plain)
    assert not [r for r in caplog.records if "normalised" in r.getMessage()]


def test_olympiad_layout_loads(tmp_path):
    ts = load_dataset(_write(tmp_path, "olympiad.jsonl", OLYMPIAD, jsonl=True))
    answers = [t.answer for t in ts.tasks]
    assert answers == ["3", "2, -1", "3, 5", "3.5", "2 \\sqrt{3}", "142"]
    assert not ts.tasks[1].answer.ordered and ts.tasks[2].answer.ordered
    assert ts.tasks[0].solution.startswith("$T^2=49$") and ts.ids[0] == "2701"


@pytest.mark.parametrize(
    "name,records,cases",
    [("minerva.json", MINERVA, MINERVA_CASES), ("olympiad.json", OLYMPIAD, OLYMPIAD_CASES)],
)
def test_layout_answers_score_right(tmp_path, pool, name, records, cases):
    tasks = load_dataset(_write(tmp_path, name, records)).tasks
    wrong_accepted, right_rejected = [], []
    for i, (right, wrong) in cases.items():
        for text, want, bucket in [(r, True, right_rejected) for r in right] + [
            (w, False, wrong_accepted) for w in wrong
        ]:
            parsed = parse_action(f"So the answer is $\\boxed{{{text}}}$.")
            verdict = verify_answer(parsed.answer, tasks[i].answer, pool)
            if verdict.correct is not want:
                bucket.append((i, text, tasks[i].answer, verdict))
    assert right_rejected == [] and wrong_accepted == []


def test_layouts_through_env_step(tmp_path, fast_sandbox):
    path = _write(tmp_path, "olympiad.json", OLYMPIAD + MINERVA)
    env = gym.make("trace/Math-v0", dataset=str(path), sandbox=fast_sandbox)
    try:
        for task, text, want in [
            (2, "3, 5", 1.0),
            (2, "5, 3", 0.0),
            (1, "-1, 2", 1.0),
            (6 + 1, "9.6", 1.0),
            (6 + 1, "['9.6\\n']", 0.0),
            (5, "142", 1.0),
            (6 + 3, "3600", 1.0),
        ]:
            env.reset(seed=0, options={"task": task})
            *_, reward, term, _, info = env.step(f"The answer is \\boxed{{{text}}}.")
            assert term and reward == want, (task, text, info)
    finally:
        env.close()


def test_scripted_answer_of_a_multipart_task_scores(tmp_path, pool):
    # what a scripted policy boxes (task.answer as text) is accepted for every task
    for records in (MINERVA, OLYMPIAD):
        for t in load_dataset(_write(tmp_path, "s.json", records)).tasks:
            assert verify_answer(
                parse_action(f"\\boxed{{{t.answer}}}").answer, t.answer, pool
            ).correct, t


def test_multipart_judging_never_evaluates_text(monkeypatch, tmp_path):
    """Our side of `judge_parts` (split, then each part parsed) hands no text to an evaluator."""
    import builtins

    import sympy
    from sympy.parsing import sympy_parser
    from trace_gym.envs.math import _judge

    def refuse(*_a, **_k):
        raise AssertionError("text reached an evaluator")

    real = sympy.sympify
    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(
        sympy, "sympify", lambda a, *r, **k: refuse() if isinstance(a, str) else real(a, *r, **k)
    )
    monkeypatch.setattr(sympy_parser, "parse_expr", refuse)
    monkeypatch.setattr(
        _judge, "_math_verify", lambda *_a: None
    )  # math-verify runs only in the sandboxed worker
    marker = tmp_path / "ran"
    attack = f"__import__('os').system('touch {marker}'), eval('1')"
    assert _judge.judge_parts(attack, ["3", "5"], True)["canonical"] is False
    assert _judge.judge_parts("5, 3", ["3", "5"], False)["canonical"] is True
    assert _judge.judge_parts("5, 3", ["3", "5"], True)["canonical"] is False
    assert not marker.exists()
