"""The official HotpotQA answer normalisation, EM and F1."""

from __future__ import annotations

import pytest
from trace_gym.envs.hotpotqa.metrics import exact_match, f1_score, normalize_answer, score_answer


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("The Beatles", "beatles"),
        ("  an   Apple, pie! ", "apple pie"),
        ("U.S.A.", "usa"),
        ("Theatre", "theatre"),  # 'the' inside a word stays
        ("1,234", "1234"),
    ],
)
def test_normalize_answer_matches_the_official_script(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_match_ignores_case_articles_and_punctuation():
    assert exact_match("the Ostra River.", "Ostra River")
    assert not exact_match("Ostra", "Ostra River")


def test_f1_partial_credit_and_yes_no_rule():
    s = f1_score("Ostra", "Ostra River")
    assert s.precision == 1.0 and s.recall == 0.5 and s.f1 == pytest.approx(2 / 3)
    assert f1_score("yes", "no").f1 == 0.0
    assert f1_score("yes it is", "yes").f1 == 0.0  # official: yes/no must match exactly
    assert f1_score("nothing shared", "Ostra River").f1 == 0.0


def test_score_answer_is_json_friendly():
    s = score_answer("Ostra River", "the ostra river")
    assert s == {"em": 1.0, "f1": 1.0, "precision": 1.0, "recall": 1.0}
