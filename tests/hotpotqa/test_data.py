"""Loaders for real HotpotQA / wiki-18 files and the bundled HotpotQA-format set."""

from __future__ import annotations

import gzip
import json

import pytest
from trace_gym.corpora import build_hotpotqa
from trace_gym.envs.hotpotqa.data import (
    context_passages,
    load_hotpotqa,
    load_wiki18,
    passage_from_contents,
)

from trace_gym.errors import ConfigError


def test_real_sample_loads_through_the_real_loader(real_sample, tmp_path):
    tasks = load_hotpotqa(real_sample)
    assert len(tasks) == 500
    assert {t.type for t in tasks} == {"bridge", "comparison"}
    assert len(context_passages(tasks)) == 4920
    # this sample keeps the gold paragraphs of only some questions in their context
    complete = [t for t in tasks if all(title in dict(t.context) for title in t.supporting_titles)]
    assert len(complete) >= 100 and all(t.supporting_titles for t in tasks)
    assert len(complete[0].supporting_sentences()) == len(complete[0].supporting_facts)
    # the original train/dev files are one JSON list: same records, same tasks
    rows = [json.loads(line) for line in real_sample.read_text().splitlines()[:5]]
    (tmp_path / "dev.json").write_text(json.dumps(rows))
    assert load_hotpotqa(tmp_path / "dev.json") == tasks[:5]
    # a fullwiki test-style record (no answer, no supporting facts) still loads
    (tmp_path / "test.json").write_text(
        json.dumps([{"_id": "x", "question": "q?", "context": rows[0]["context"]}])
    )
    assert load_hotpotqa(tmp_path / "test.json")[0].answer == ""


def test_wiki18_jsonl_loader(tmp_path):
    path = tmp_path / "wiki.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(
            json.dumps({"id": "7", "contents": '"Ostra River"\nA river.\nSecond line.'}) + "\n\n"
        )
    (p,) = load_wiki18(path)
    assert (p.id, p.title, p.text) == ("7", "Ostra River", "A river.\nSecond line.")
    assert passage_from_contents(p.id, p.contents) == p
    (tmp_path / "bad.jsonl").write_text('{"id": 1, "text": "no contents"}\n')
    with pytest.raises(ConfigError, match="contents"):
        load_wiki18(tmp_path / "bad.jsonl")


def test_bad_files_raise_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_hotpotqa(tmp_path / "missing.json")
    (tmp_path / "x.jsonl").write_text('{"question": "no id"}\n')
    with pytest.raises(ConfigError, match="HotpotQA record"):
        load_hotpotqa(tmp_path / "x.jsonl")


def test_bundled_set_is_hotpotqa_format_and_big_enough(bundled):
    tasks, passages = bundled
    assert len(tasks) >= 300 and len(passages) >= 3000
    types = [t.type for t in tasks]
    assert types.count("bridge") >= 200 and types.count("comparison") >= 40
    titles = {p.title for p in passages}
    for t in tasks:
        assert len(t.context) == 10 and len(t.supporting_titles) == 2
        assert set(t.supporting_titles) <= titles  # gold paragraphs are in the corpus
        assert len(t.supporting_sentences()) == len(t.supporting_facts)
        if t.type == "bridge":  # the answer is not given away by the question
            assert t.answer.lower() not in t.question.lower()


def test_bundled_files_are_reproduced_exactly_by_the_builder(tmp_path):
    q, c = build_hotpotqa.build(tmp_path)
    assert q.read_bytes() == build_hotpotqa.QUESTIONS_FILE.read_bytes()
    assert c.read_bytes() == build_hotpotqa.CORPUS_FILE.read_bytes()
    assert (
        build_hotpotqa.QUESTIONS_FILE.stat().st_size + build_hotpotqa.CORPUS_FILE.stat().st_size
        < 2_000_000
    )
