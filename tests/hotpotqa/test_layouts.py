"""Every HotpotQA layout users have loads (written here as small local files), and bad
records are reported with the file, the record number and the field."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import types

import gymnasium as gym
import pytest
from trace_gym.envs.hotpotqa import datacli
from trace_gym.envs.hotpotqa.data import load_hotpotqa, load_wiki18

from trace_gym.errors import ConfigError

CONTEXT = [
    ["Ostra", ["Ostra is a town.", " It lies on the Vell."]],
    ["The Five(ish) Doctors Reboot", ["It is a 2013 film.", " It was shot in Ostra."]],
]
ORIGINAL = {
    "_id": "q1",
    "question": "Where was The Five(ish) Doctors Reboot shot?",
    "answer": "Ostra",
    "type": "bridge",
    "level": "easy",
    "supporting_facts": [["The Five(ish) Doctors Reboot", 1], ["Ostra", 0]],
    "context": CONTEXT,
}


def _hf(rec: dict) -> dict:
    """The Hugging Face `hotpot_qa` layout of an original record."""
    return {
        "id": rec["_id"],
        "question": rec["question"],
        "answer": rec["answer"],
        "type": rec["type"],
        "level": rec["level"],
        "supporting_facts": {
            "title": [t for t, _ in rec["supporting_facts"]],
            "sent_id": [i for _, i in rec["supporting_facts"]],
        },
        "context": {
            "title": [t for t, _ in rec["context"]],
            "sentences": [s for _, s in rec["context"]],
        },
    }


def _variant(rec: dict) -> dict:
    """supporting_facts rows as [title, [sent_ids], [sentences], doc]."""
    ctx = dict(rec["context"])
    rows = [[t, [i], [ctx[t][i]], "".join(ctx[t])] for t, i in rec["supporting_facts"]]
    return {**rec, "supporting_facts": rows}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture()
def expected(tmp_path):
    return load_hotpotqa(_jsonl(tmp_path / "orig.jsonl", [ORIGINAL]))[0]


def test_original_layout_in_every_container(tmp_path, expected):
    assert expected.supporting_facts == (("The Five(ish) Doctors Reboot", 1), ("Ostra", 0))
    assert expected.supporting_sentences() == ["It was shot in Ostra.", "Ostra is a town."]
    (tmp_path / "list.json").write_text(json.dumps([ORIGINAL]))
    with gzip.open(tmp_path / "x.jsonl.gz", "wt") as f:
        f.write(json.dumps(ORIGINAL) + "\n")
    assert load_hotpotqa(tmp_path / "list.json") == [expected]
    assert load_hotpotqa(tmp_path / "x.jsonl.gz") == [expected]


def test_supporting_facts_variant_with_several_sentence_ids(tmp_path, expected):
    assert load_hotpotqa(_jsonl(tmp_path / "v.jsonl", [_variant(ORIGINAL)])) == [expected]
    rec = {**ORIGINAL, "supporting_facts": [["Ostra", [0, 1], ["a", "b"], "ab"]]}
    (task,) = load_hotpotqa(_jsonl(tmp_path / "v2.jsonl", [rec]))
    assert task.supporting_facts == (("Ostra", 0), ("Ostra", 1))


def test_hugging_face_layout_json_and_parquet(tmp_path, expected):
    assert load_hotpotqa(_jsonl(tmp_path / "hf.jsonl", [_hf(ORIGINAL)])) == [expected]
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(
        pa.Table.from_pylist([_hf(ORIGINAL), _hf({**ORIGINAL, "_id": "q2"})]),
        tmp_path / "hf.parquet",
    )
    tasks = load_hotpotqa(tmp_path / "hf.parquet")
    assert tasks[0] == expected and tasks[1].id == "q2"
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ConfigError, match="bad.parquet"):
        load_hotpotqa(tmp_path / "bad.parquet")


def test_flashrag_layout_needs_a_corpus_and_scores_every_golden_answer(tmp_path):
    rows = [
        {
            "id": "test_0",
            "question": ORIGINAL["question"],
            "golden_answers": ["Ostra", "Ostra town"],
            "metadata": {"type": "bridge", "level": "hard"},
        }
    ]
    path = _jsonl(tmp_path / "flashrag.jsonl", rows)
    (task,) = load_hotpotqa(path)
    assert (task.answer, task.aliases, task.type, task.context) == (
        "Ostra",
        ("Ostra town",),
        "bridge",
        (),
    )
    with pytest.raises(ConfigError, match="corpus="):
        gym.make("trace/HotpotQA-v0", dataset=str(path))
    corpus = _jsonl(
        tmp_path / "wiki.jsonl",
        [{"id": str(i), "contents": f'"{t}"\n{"".join(s)}'} for i, (t, s) in enumerate(CONTEXT)],
    )
    env = gym.make(
        "trace/HotpotQA-v0", dataset=str(path), corpus=str(corpus), cache_dir=str(tmp_path / "c")
    )
    env.reset(options={"task": 0})
    assert "Title: Ostra" in env.step("<search>Ostra town</search>")[0]
    assert env.step("<answer>Ostra town</answer>")[1] == 1.0  # the second golden answer counts
    assert len(load_wiki18(corpus)) == 2


@pytest.mark.parametrize(
    ("record", "field", "where"),
    [
        ({**ORIGINAL, "supporting_facts": [["Ostra", "one"]]}, "supporting_facts", "record 2"),
        ({**ORIGINAL, "context": [["Ostra"]]}, "context", "record 2"),
        ({**ORIGINAL, "answer": ["Ostra"]}, "answer", "record 2"),
        ({k: v for k, v in ORIGINAL.items() if k != "question"}, "question", "record 2"),
        ({"question": "q?", "answer": "a"}, "_id", "record 2"),
        ({**_hf(ORIGINAL), "context": {"title": ["a"]}}, "context", "record 2"),
        ({"id": "1", "question": "q?", "golden_answers": []}, "golden_answers", "record 2"),
    ],
)
def test_bad_records_name_the_file_the_record_and_the_field(tmp_path, record, field, where):
    (tmp_path / "bad.json").write_text(json.dumps([ORIGINAL, record]))
    with pytest.raises(ConfigError) as e:
        load_hotpotqa(tmp_path / "bad.json")
    msg = str(e.value)
    assert "bad.json" in msg and where in msg and f"field {field!r}" in msg
    assert "keys present: " + ", ".join(sorted(record)) in msg


def test_bad_jsonl_line_and_non_utf8_file(tmp_path):
    (tmp_path / "x.jsonl").write_text(
        json.dumps(ORIGINAL) + "\n\n" + json.dumps({"question": "q"}) + "\n"
    )
    with pytest.raises(
        ConfigError, match=r"x\.jsonl: line 3 \(record 2\): not a HotpotQA record: field '_id'"
    ):
        load_hotpotqa(tmp_path / "x.jsonl")
    (tmp_path / "latin.jsonl").write_bytes(b'{"_id": "\xff"}\n')
    with pytest.raises(ConfigError, match="UTF-8"):
        load_hotpotqa(tmp_path / "latin.jsonl")
    (tmp_path / "deep.json").write_text("[" * 100_000)
    with pytest.raises(ConfigError, match="deep.json"):
        load_hotpotqa(tmp_path / "deep.json")


def test_data_convert_writes_the_env_format_from_every_layout(tmp_path, expected):
    sources = {
        "variant": _jsonl(tmp_path / "v.jsonl", [_variant(ORIGINAL)]),
        "hf": _jsonl(tmp_path / "hf.jsonl", [_hf(ORIGINAL)]),
    }
    for name, src in sources.items():
        out = tmp_path / f"{name}.out.jsonl.gz"
        assert datacli.main(["convert", str(src), str(out)]) == 0
        assert load_hotpotqa(out) == [expected]
        with gzip.open(out, "rt") as f:
            assert set(json.loads(f.readline())) == {
                "_id",
                "question",
                "answer",
                "type",
                "level",
                "supporting_facts",
                "context",
            }


def test_data_cli_errors_are_one_line_and_exit_2(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"question": "no id"}\n')
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trace_gym.cli",
            "data",
            "convert",
            str(tmp_path / "bad.jsonl"),
            str(tmp_path / "o.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        out.returncode == 2
        and len(out.stderr.strip().splitlines()) == 1
        and "Traceback" not in out.stderr
    )
    assert "bad.jsonl: line 1 (record 1): not a HotpotQA record: field '_id'" in out.stderr


class _FakeDataset(list):
    """Stands in for `datasets.Dataset`: `select` and `to_json` as the library has them."""

    def select(self, idx):
        return _FakeDataset(self[i] for i in idx)

    def to_json(self, path, lines=True, force_ascii=False):
        _jsonl(__import__("pathlib").Path(path), list(self))


def test_data_fetch_goes_through_datasets_and_reports_failures(
    tmp_path, monkeypatch, expected, capsys
):
    calls = []

    def load_dataset(repo, config, split):
        calls.append((repo, config, split))
        if config == "fullwiki":
            raise ConnectionError("no network")
        return _FakeDataset([_hf(ORIGINAL), _hf({**ORIGINAL, "_id": "q2"})])

    monkeypatch.setattr(
        datacli, "require", lambda *a, **k: types.SimpleNamespace(load_dataset=load_dataset)
    )
    out = tmp_path / "dev.jsonl"
    assert datacli.main(["fetch", "hotpot_qa-distractor", str(out), "--limit", "1"]) == 0
    assert calls == [("hotpotqa/hotpot_qa", "distractor", "validation")] and load_hotpotqa(out) == [
        expected
    ]
    assert datacli.main(["fetch", "hotpot_qa-fullwiki", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "network" in err
