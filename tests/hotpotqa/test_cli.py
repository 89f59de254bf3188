"""`trace-gym corpus build` on the real sample and on a wiki-18 JSONL, used by the env."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import gymnasium as gym
from trace_gym.corpora.build_hotpotqa import CORPUS_FILE
from trace_gym.envs.hotpotqa.retrievers import load_retriever


def _cli(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "%" in out.stderr or "--no-progress" in args  # the progress bar went to stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_corpus_build_from_real_hotpotqa_feeds_the_env(real_sample, tmp_path):
    report = _cli("corpus", "build", "--input", str(real_sample), "--out", str(tmp_path / "idx"))
    assert report["format"] == "hotpotqa" and report["passages"] == 4920
    env = gym.make(
        "trace/HotpotQA-v0", dataset=str(real_sample), retriever=str(tmp_path / "idx"), limit=5
    )
    env.reset(options={"task": 0})
    obs, *_ = env.step("<search>University of Kansas fight song</search>")
    assert "Doc 1(Title: " in obs


def test_corpus_build_from_wiki18_jsonl_with_limit(tmp_path):
    src = tmp_path / "wiki.jsonl"
    with gzip.open(CORPUS_FILE, "rt") as f, open(src, "w") as out:
        for _, line in zip(range(500), f, strict=False):
            out.write(line)
    report = _cli(
        "corpus",
        "build",
        "--input",
        str(src),
        "--out",
        str(tmp_path / "w"),
        "--limit",
        "400",
        "--no-progress",
    )
    assert report["format"] == "wiki18" and report["passages"] == 400
    r = load_retriever(tmp_path / "w")
    first = json.loads(src.read_text().splitlines()[0])
    assert (
        r.search([first["contents"].splitlines()[0].strip('"')], 1)[0][0].passage.id == first["id"]
    )


def test_corpus_cli_errors_are_clear(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", "corpus", "nope"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "build" in out.stderr
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trace_gym.cli",
            "corpus",
            "build",
            "--input",
            str(tmp_path / "x"),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "does not exist" in out.stderr


def test_serve_retriever_cli_serves_until_stopped(tmp_path):
    import os
    import urllib.request

    env = {**os.environ, "TRACE_GYM_CACHE": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trace_gym.cli", "serve-retriever", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert "serving bm25 over 3,100 passages" in line
        url = line.split(" at ")[1].split("/retrieve")[0]
        req = urllib.request.Request(
            url + "/retrieve", data=json.dumps({"queries": ["town"], "topk": 2}).encode()
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert len(json.loads(r.read())["result"][0]) == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_bench_retrieval_smoke(real_sample, tmp_path):
    import os

    env = {
        **os.environ,
        "TRACE_GYM_BM25_BACKEND": "numpy",
    }  # skip numba's JIT warm-up in a smoke run
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trace_gym.cli",
            "bench",
            "retrieval",
            "--passages",
            "6000",
            "--queries",
            "64",
            "--skip-dense",
            "--skip-pyserini",
            "--policy-tasks",
            "20",
            "--json",
            str(tmp_path / "r.json"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["bm25_passages"] == 6000 and report["bm25_qps"] > 0 and report["build_s"] > 0
    assert report["scripted_em_bundled"]["em"] >= 0.9 and "recall@10" in report["bm25_real"]
    assert "bm25_qps" in out.stdout


def test_data_sets_says_where_each_real_set_is_and_how_to_get_it(tmp_path, monkeypatch, capsys):
    from trace_gym.cli import main

    (tmp_path / "math").mkdir()
    monkeypatch.setenv("TRACE_GYM_DATA", str(tmp_path))
    assert main(["data", "sets"]) == 0
    out = capsys.readouterr().out
    assert f"math: found at {tmp_path / 'math'}" in out
    assert "hotpotqa: MISSING at" in out and "trace-gym data fetch hotpot_qa-distractor" in out
