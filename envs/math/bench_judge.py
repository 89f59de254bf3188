"""Agreement of our judge with math-verify on answer pairs built from real data (`trace-gym bench judge`).

Each reference answer of the DeepScaleR-format files is paired with (1) itself, (2) an
equivalent rewrite made by text rules below (integer -> ``n.0`` / ``\\frac{2n}{2}`` /
thousands separators, fraction -> ``a/b`` / exact decimal / scaled fraction, decimal ->
fraction, ``\\dfrac``/``\\frac``, ``k\\sqrt{n}`` -> ``\\sqrt{k^2 n}``, ...) and (3) a wrong answer
(a perturbed number where the reference is one: ``n+1``, ``(a+1)/b``, the last decimal digit
changed) and (4) the next problem's answer. The rewrites are made from the text, never by our parser, so they test
it. Every pair runs through the sandboxed verifier worker (``VerifierPool.check`` with the
string shortcut off, so our reader must read both sides); a judge is *confident* on a pair
when it gave a verdict (math-verify: not ``None``; ours: both sides parsed). The report
counts agreement where both are confident, lists the disagreements, and scores each judge
against the pair's label (self and rewrite: equal; perturbed: different; another
problem's answer: assumed different).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

from trace_gym.envs.math.data import load_dataset

from trace_gym.cli import Parser
from trace_gym.realdata import path_of

__all__ = ["Pair", "build_pairs", "equivalent_rewrite", "main", "perturb", "run"]

DATA_DIR = path_of("math")
FILES = ("train_aime.json", "test_math500.json", "train_math.json")

_INT = re.compile(r"-?\d+")
_DEC = re.compile(r"-?\d+\.\d+")
_FRAC = re.compile(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}")
_ROOT = re.compile(r"(\d+)\\sqrt\{(\d+)\}")


class Pair(NamedTuple):
    """One judged pair: a predicted answer, the reference, how it was made and whether they are equal."""

    pred: str
    ref: str
    #: 'self', 'rewrite', 'perturbed' or 'other' (another problem's answer)
    kind: str
    equal: bool
    source: str


def _int_rewrites(s: str) -> list[str]:
    n = int(s)
    out = [f"{n}.0", f"\\frac{{{2 * n}}}{{2}}"]
    if abs(n) >= 1000:
        out.append(f"{n:,}")
    return out


def _frac_rewrites(m: re.Match) -> list[str]:
    sign, a, b = m.group(1), int(m.group(2)), int(m.group(3))
    value = Fraction(a, b) * (-1 if sign else 1)
    out = [
        f"{sign}{a}/{b}",
        f"{sign}\\frac{{{2 * a}}}{{{2 * b}}}",
        f"\\frac{{{value.numerator}}}{{{value.denominator}}}",
    ]
    den = value.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den == 1:  # an exact decimal
        out.append(f"{float(value)!r}")
    return out


def equivalent_rewrite(ref: str, rng: random.Random) -> str | None:
    """An answer equal to `ref` written differently (chosen by `rng`), or None if no rule applies."""
    s = ref.strip()
    options: list[str] = []
    if _INT.fullmatch(s):
        options = _int_rewrites(s)
    elif _DEC.fullmatch(s):
        f = Fraction(s)
        options = [f"\\frac{{{f.numerator}}}{{{f.denominator}}}", f"{s}0"]
    elif (m := _FRAC.fullmatch(s)) is not None:
        options = _frac_rewrites(m)
    elif (m := _ROOT.fullmatch(s)) is not None:
        options = [f"\\sqrt{{{int(m.group(1)) ** 2 * int(m.group(2))}}}"]
    elif "\\dfrac" in s or "\\frac" in s:
        options = [
            s.replace("\\dfrac", "\\frac") if "\\dfrac" in s else s.replace("\\frac", "\\dfrac")
        ]
    elif "\\pi" in s and "\\pi" == s[-3:] and _INT.fullmatch(s[:-3] or "x"):
        options = [f"{s[:-3]} \\cdot \\pi"]
    options = [o for o in options if o != s]
    return rng.choice(options) if options else None


def perturb(ref: str) -> str | None:
    """A number near `ref` that is certainly different, or None if `ref` is not a plain number."""
    s = ref.strip()
    if _INT.fullmatch(s):
        return str(int(s) + 1)
    if _DEC.fullmatch(s):
        last = s[-1]
        return s[:-1] + str((int(last) + 1) % 10) if last != "9" else s + "1"
    m = _FRAC.fullmatch(s)
    if m:
        return f"{m.group(1)}\\frac{{{int(m.group(2)) + 1}}}{{{m.group(3)}}}"
    return None


def build_pairs(
    data_dir: Path = DATA_DIR, per_file: int | None = None, seed: int = 0
) -> list[Pair]:
    """Three or four pairs per reference answer of each file (the first `per_file` answers of each)."""
    rng = random.Random(seed)
    pairs: list[Pair] = []
    for name in FILES:
        tasks = [t for t in load_dataset(Path(data_dir) / name).tasks if t.answer][:per_file]
        answers = [str(t.answer) for t in tasks]
        for k, t in enumerate(tasks):
            ref = str(t.answer)
            pairs.append(Pair(ref, ref, "self", True, t.id))
            rewrite = equivalent_rewrite(ref, rng)
            if rewrite is not None:
                pairs.append(Pair(rewrite, ref, "rewrite", True, t.id))
            wrong = perturb(ref)
            if wrong is not None:
                pairs.append(Pair(wrong, ref, "perturbed", False, t.id))
            other = next(
                a
                for a in answers[k + 1 :] + answers[:k]
                if a.replace(" ", "") != ref.replace(" ", "")
            )
            pairs.append(Pair(other, ref, "other", False, t.id))
    return pairs


def _judge_all(pairs: list[Pair], timeout_s: float) -> list[dict[str, Any]]:
    from trace_gym.envs.math.verify import VerifierPool

    pool = VerifierPool(timeout_s=timeout_s, inner_timeout_s=max(1, int(timeout_s / 3)))
    try:
        return [pool.check(p.pred, p.ref, string_match=False) for p in pairs]
    finally:
        pool.close()


def _summary(pairs: list[Pair], verdicts: list[dict[str, Any]], examples: int) -> dict[str, Any]:
    both, split, by_kind, unsure, off_label, ours_off = 0, [], Counter(), [], [], Counter()
    wrong = {"math_verify": 0, "ours": 0}
    for p, v in zip(pairs, verdicts, strict=True):
        mv, ours, sure = (
            v.get("math_verify"),
            v.get("canonical"),
            v.get("canonical_confident", False),
        )
        row = {
            "pred": p.pred,
            "ref": p.ref,
            "kind": p.kind,
            "label_equal": p.equal,
            "math_verify": mv,
            "ours": ours,
            "source": p.source,
        }
        if v.get("timed_out") or mv is None or not sure:
            by_kind[f"{p.kind}_unconfident"] += 1
            unsure.append(row)
            continue
        both += 1
        by_kind[p.kind] += 1
        wrong["math_verify"] += bool(mv) != p.equal
        wrong["ours"] += bool(ours) != p.equal
        if bool(mv) != p.equal or bool(ours) != p.equal:
            off_label.append(row)
            ours_off[p.kind] += bool(ours) != p.equal
        if bool(mv) != bool(ours):
            split.append(row)
    return {
        "pairs": len(pairs),
        "both_confident": both,
        "agree": both - len(split),
        "disagree": len(split),
        "agreement": round((both - len(split)) / both, 5) if both else None,
        "confident_by_kind": dict(sorted(by_kind.items())),
        "math_verify_unconfident": sum(1 for v in verdicts if v.get("math_verify") is None),
        "ours_unconfident": sum(1 for v in verdicts if not v.get("canonical_confident")),
        "timed_out": sum(1 for v in verdicts if v.get("timed_out")),
        "label_errors_when_both_confident": wrong,
        "our_label_errors_by_kind": dict(ours_off),
        "disagreements": split[:examples],
        "label_error_examples": off_label[:examples],
        "unconfident_examples": unsure[:examples],
    }


def _rewards(pairs: list[Pair], verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """The reward `verify_answer` gives each pair (ours when confident, else math-verify) vs its label."""
    errors, rules, examples = Counter(), Counter(), []
    for p, v in zip(pairs, verdicts, strict=True):
        if v.get("timed_out"):
            reward, rule = False, "timeout"
        elif v.get("canonical_confident"):
            reward, rule = bool(v.get("canonical")), str(v.get("rule"))
        else:
            reward, rule = bool(v.get("math_verify")), "math-verify"
        rules[rule] += 1
        if reward != p.equal:
            errors[p.kind] += 1
            examples.append({"pred": p.pred, "ref": p.ref, "kind": p.kind, "rule": rule})
    return {
        "reward_rules": dict(rules),
        "reward_label_errors_by_kind": dict(errors),
        "reward_error_examples": examples[:25],
    }


def run(
    data_dir: Path = DATA_DIR,
    per_file: int | None = None,
    seed: int = 0,
    timeout_s: float = 20.0,
    examples: int = 25,
) -> dict[str, Any]:
    """Build the pairs, judge them all, and summarise the agreement."""
    t0 = time.monotonic()
    pairs = build_pairs(data_dir, per_file, seed)
    verdicts = _judge_all(pairs, timeout_s)
    report = _summary(pairs, verdicts, examples) | _rewards(pairs, verdicts)
    report["kinds"] = dict(Counter(p.kind for p in pairs))
    report["seconds"] = round(time.monotonic() - t0, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    """`trace-gym bench judge`: our judge vs math-verify on pairs from ../shared/data/math."""
    ap = Parser(prog="trace-gym bench judge", description=main.__doc__)
    ap.add_argument(
        "--data", type=Path, default=DATA_DIR, help="folder with the DeepScaleR-format files"
    )
    ap.add_argument(
        "--per-file", type=int, default=None, help="only the first N answers of each file"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=20.0, help="hard deadline of one pair (s)")
    ap.add_argument("--examples", type=int, default=25, help="disagreements to list")
    ap.add_argument("--json", type=Path, default=None, help="write the full report here")
    args = ap.parse_args(argv)
    if not all((args.data / f).is_file() for f in FILES):
        ap.error(f"{args.data} lacks one of {', '.join(FILES)}")
    report = run(args.data, args.per_file, args.seed, args.timeout, args.examples)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(
        f"pairs {report['pairs']} ({report['kinds']}); both judges confident on {report['both_confident']}; "
        f"agree {report['agree']}, disagree {report['disagree']} (agreement {report['agreement']})"
    )
    print(
        f"unconfident: math-verify {report['math_verify_unconfident']}, ours {report['ours_unconfident']}, "
        f"timed out {report['timed_out']}; label errors {report['label_errors_when_both_confident']}"
    )
    print(
        f"reward (ours when confident, else math-verify): rules {report['reward_rules']}; "
        f"label errors {report['reward_label_errors_by_kind']}"
    )
    for d in report["disagreements"]:
        print(
            f"  {d['kind']:<9} pred={d['pred'][:50]!r} ref={d['ref'][:50]!r} math_verify={d['math_verify']} "
            f"ours={d['ours']} ({d['source']})"
        )
    return 0
