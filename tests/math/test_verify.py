"""Answer checking: equivalent forms accepted, wrong ones rejected, adversarial ones time out."""

from __future__ import annotations

import time

import pytest
from trace_gym.envs.math.verify import VerifierPool, canonical_equal, normalize, verify_answer

EQUIVALENT = [
    ("0.5", "\\frac{1}{2}"),
    ("1/2", "\\dfrac{1}{2}"),
    ("\\frac{3}{4}", "0.75"),
    ("[1, 2)", "[1,2)"),
    ("(-\\infty, 3]", "(-\\infty,3]"),
    ("x^2+2x+1", "(x+1)^2"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}"),
    ("10\\text{ inches}", "10"),
    ("1,000", "1000"),
    ("x = 5", "5"),
    ("\\pi/2", "\\frac{\\pi}{2}"),
    ("3, 1, 2", "1, 2, 3"),
    ("9 e^{3}", "9e^3"),
    ("50\\%", "50"),
    ("21\\text{ dogs}", "21"),
]
WRONG = [
    ("3", "4"),
    ("(1,2]", "[1,2)"),
    ("\\frac{1}{3}", "0.33"),
    ("x^2", "2x"),
    ("\\sqrt{2}", "2"),
    ("1, 2", "1, 2, 3"),
    # found by the MATH-train cross-pair report: a reversed "interval" and an overflowing power
    ("(1,-2)", "(2,-3)"),
    ("11", "2^{4950}"),
]


@pytest.fixture(scope="module")
def pool():
    p = VerifierPool(timeout_s=6.0, inner_timeout_s=2)
    yield p
    p.close()


@pytest.mark.parametrize("pred,ref", EQUIVALENT)
def test_equivalent_forms_accepted(pool, pred, ref):
    verdict = verify_answer(pred, ref, pool)
    assert verdict.correct, verdict


@pytest.mark.parametrize("pred,ref", WRONG)
def test_wrong_answers_rejected(pool, pred, ref):
    verdict = verify_answer(pred, ref, pool)
    assert not verdict.correct, verdict
    assert not canonical_equal(pred, ref)


@pytest.mark.parametrize(
    "pred,ref", [p for p in EQUIVALENT if "inches" not in p[0] and "%" not in p[0]]
)
def test_canonicaliser_alone_accepts_equivalents(pred, ref):
    assert canonical_equal(pred, ref)


def test_adversarial_answer_times_out_cleanly():
    pool = VerifierPool(timeout_s=2.0, inner_timeout_s=1)
    try:
        t0 = time.monotonic()
        verdict = verify_answer("9^{9^{9^{9^{9}}}}", "1", pool)
        assert not verdict.correct
        assert time.monotonic() - t0 < 30  # bounded (the worker is killed), not a timing claim
        assert verdict.timed_out or verdict.math_verify is False
        # the pool recovers: a new worker answers the next question
        assert verify_answer("2/4", "\\frac{1}{2}", pool).correct
    finally:
        pool.close()


def test_normalize():
    assert normalize("$\\boxed{\\dfrac{1}{2}}$") == "\\frac{1}{2}"
    assert normalize("5\\text{ cm}") == "5"
    assert normalize("90^\\circ") == "90"


# our own judge (the fallback), issue 17's rules: exact integers without leading-zero bugs,
# a relative tolerance for decimals at every magnitude, no decimal for an exact irrational
JUDGE_RULES = [
    ("33", "033", True),
    ("000", "033", False),
    ("7", "007", True),
    ("7.4\\times10^{-12}", "3.61\\times10^{-10}", False),
    ("3.61\\times10^{-10}", "3.610000\\times10^{-10}", True),
    ("3.6100001\\times10^{-10}", "3.61\\times10^{-10}", True),
    ("1.0001\\times10^{6}", "1000000", False),
    ("3.14159", "\\pi", False),
    ("1.41421356", "\\sqrt{2}", False),
    ("355/113", "\\pi", False),
    ("1,000,000", "1000000", True),
    ("1000001", "1000000", False),
    ("142.0", "142", True),
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt2}{2}", True),
    ("\\log_{2}8", "3", True),
    ("2^{10}", "1024", True),
]


@pytest.mark.parametrize("pred,ref,want", JUDGE_RULES)
def test_our_judge_rules(pred, ref, want):
    assert canonical_equal(pred, ref) is want


def test_verifier_unavailable_is_reward_zero_not_an_exception(monkeypatch, tmp_path, fast_sandbox):
    """Issue 17: a verifier worker that dies at start-up ends the episode with reward 0 from `step`."""
    from trace_gym.envs.math import verify
    from trace_gym.envs.math.env import MathEnv

    env = MathEnv(sandbox=fast_sandbox)
    try:
        env.reset(seed=0, options={"task": 0})
        monkeypatch.setattr(
            verify, "_JUDGE", tmp_path / "missing_judge.py"
        )  # the worker exits at once
        env._pool = VerifierPool(timeout_s=5.0, start_timeout_s=10.0)  # noqa: SLF001 - a fresh pool, no warm worker
        _, reward, term, _, info = env.step("The answer is \\boxed{-12345.5}.")
        assert term and reward == 0.0
        assert (
            info["verifier"]["method"] == "unavailable"
            and "verifier worker" in info["verifier"]["error"]
        )
        obs, _ = env.reset(seed=0, options={"task": 1})  # the env stays usable
        assert obs
    finally:
        env._pool.close()  # noqa: SLF001
        env.close()


# the reader, with the string shortcut off: tuples in order, bare lists in any order, and the
# answers the agreement bench (`trace-gym bench judge`) found it could not read
PM = "\\begin{pmatrix} 1 & -1 \\\\ 1 & \\phantom -1 \\end{pmatrix}"
READER_RULES = [
    ("(1,2,3)", "(3,2,1)", False),
    ("(1,2,3)", "(1,2,3)", True),
    ("3, 1, 2", "1, 2, 3", True),
    ("\\sin^2 t", "1-\\cos^2 t", True),
    ("\\sin^2 t", "\\sin t^2", False),
    ("\\cos^2\\alpha", "\\cos^2\\alpha", True),
    ("\\mathbf{2340}", "2340", True),
    ("\\mathbf{2340}", "2341", False),
    (PM, "\\begin{pmatrix} 1 & -1 \\\\ 1 & 1 \\end{pmatrix}", True),
    (PM, "\\begin{pmatrix} 1 & -1 \\\\ 1 & -1 \\end{pmatrix}", False),
    ("2\\theta", "\\theta+\\theta", True),
    ("\\alpha", "\\beta", False),
    ("\\epsilon", "e", False),
    ("\\eta", "\\eta", True),
    ("\\sin^{-1} x", "\\arcsin x", False),  # refused as ambiguous, never guessed
]


@pytest.mark.parametrize("pred,ref,want", READER_RULES)
def test_reader_rules(pred, ref, want):
    assert canonical_equal(pred, ref, string_match=False) is want
