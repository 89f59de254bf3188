"""`trace-gym view`: the page's data, every tree-file version, bad input, hostile text."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from trace_gym.bench.view import budget_by_depth, escape_json, page_data, read_trees, write_view
from trace_gym.bench.view_bench import HOSTILE, hostile_tree, synthetic_trees
from trace_gym.bench.view_bench import main as bench_main

from trace_gym.tree import save_trees

FIXTURES = Path(__file__).parent.parent / "fixtures" / "trees_v1"


def _page_json(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="trace-data">(.*?)</script>', html, re.S)
    assert m, "no inline data element"
    return json.loads(m.group(1))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_escape_json_leaves_nothing_that_ends_a_script_element():
    text = escape_json({"s": list(HOSTILE)})
    for bad in ("</script", "<!--", "<script", "\u2028", "\u2029", "<img", "&"):
        assert bad not in text
    assert json.loads(text) == {"s": list(HOSTILE)}
    lone = escape_json({"s": "a\ud800b"})  # a lone surrogate, as a JSON file may hold
    assert lone.encode("utf-8") and json.loads(lone) == {"s": "a\ud800b"}


def test_a_tree_file_with_a_lone_surrogate_gives_a_page(tmp_path):
    tree = hostile_tree()
    tree.nodes[1].turn.observation = "bad \ud800 half"
    src = save_trees([tree], tmp_path / "t.jsonl")  # json.dumps writes it as \ud800
    data = _page_json(write_view([src], tmp_path / "v.html").read_text())
    assert data["trees"][0]["nodes"][1]["ob"] == "bad \ud800 half"


def test_page_holds_every_tree_and_node_and_the_hostile_text_only_escaped(tmp_path):
    trees = [hostile_tree()] + synthetic_trees(3, 20)
    src = save_trees(trees, tmp_path / "t.jsonl")
    html = write_view([src], tmp_path / "v.html").read_text()
    data = _page_json(html)
    assert [len(t["nodes"]) for t in data["trees"]] == [len(t) for t in trees]
    assert data["trees"][0]["nodes"][1]["a"] == "assistant " + HOSTILE[0]
    assert data["trees"][0]["nodes"][1]["ob"] == "observation " + HOSTILE[1]
    # the only script elements are the page's own two; nothing is loaded from outside
    assert html.count("<script") == 2 and "</script><script>window" not in html
    assert not re.search(r"<(?:script|link|img|iframe)[^>]*\b(?:src|href)=", html)
    assert "onerror=" not in html.replace("\\u003cimg src=x onerror=", "")


def test_node_payload_marks_failures_replays_values_and_pairs():
    data = page_data([hostile_tree()], title="t")
    nodes = data["trees"][0]["nodes"]
    failed = nodes[3]
    assert (
        failed["f"] == ["policy", "policy.generate", "backend died " + HOSTILE[0]]
        and failed["end"] == "failed"
    )
    assert failed["o"] == 2  # replay
    assert nodes[1]["v"] == 0.7 and nodes[1]["t"] == 1.0
    assert nodes[0]["pairs"] == 1 and nodes[0]["nl"] == 2 and nodes[0]["ns"] == 1


def test_candidate_pool_lists_skipped_where_recorded_and_says_so_where_not():
    with_info = page_data([hostile_tree()], title="t")["steps"]["0"]
    assert with_info["selected"] == [[0, "hostile-task", 0.5, 2]]
    assert with_info["skipped"] == [["skipped-" + HOSTILE[1], 0.1]]
    bare = hostile_tree()
    del bare.info["skipped_candidates"]
    assert page_data([bare], title="t")["steps"]["0"]["skipped"] is None


def test_runner_records_skipped_candidates_for_the_viewer():
    import gymnasium as gym

    from trace_gym.alloc import make_allocator
    from trace_gym.runner import BranchingRunner, RunnerConfig
    from trace_gym.sim import SimPolicy

    def factory():
        return gym.make("trace/Sim-v0", preset="math", num_tasks=40, seed=0)

    env = factory()
    ids = list(env.unwrapped.task_ids)[:24]
    env.close()
    runner = BranchingRunner(
        SimPolicy("math"),
        factory,
        make_allocator("trace", m_max=8, group_size=4),
        None,
        RunnerConfig(root_budget=16, replays_per_root=1.0, m_max=8, seed=0),
    )
    try:
        trees, _ = runner.run_step(0, ids)
    finally:
        runner.close()
    skipped = trees[0].info["skipped_candidates"]
    assert len(skipped) == len(ids) - len(trees)
    assert {s[0] for s in skipped}.isdisjoint(t.prompt_id for t in trees)
    assert all("skipped_candidates" not in t.info for t in trees[1:])


@pytest.mark.parametrize(
    "name", ["math-trace.jsonl.gz", "bfcl-treepo.jsonl.gz", "hotpotqa-grpo.jsonl.gz"]
)
def test_format_1_fixture_files_open(tmp_path, name):
    trees = read_trees([FIXTURES / name])
    assert trees and trees[0].nodes[0].turn is None
    data = _page_json(write_view([FIXTURES / name], tmp_path / "v.html").read_text())
    assert sum(len(t["nodes"]) for t in data["trees"]) == sum(len(t) for t in trees)
    assert all(s["skipped"] is None for s in data["steps"].values())  # v1 files predate the record


def test_a_folder_of_step_files_opens_like_a_run_dir(tmp_path):
    save_trees(synthetic_trees(2, 10), tmp_path / "trees" / "step_000000.jsonl.gz")
    save_trees([hostile_tree(step=1)], tmp_path / "trees" / "step_000001.jsonl.gz")
    data = _page_json(write_view([tmp_path / "trees"], tmp_path / "v.html").read_text())
    assert [t["step"] for t in data["trees"]] == [0, 0, 1]


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    good = json.dumps(hostile_tree().to_dict())
    files = {
        "empty": tmp_path / "empty.jsonl",
        "version": tmp_path / "v9.jsonl",
        "truncated": tmp_path / "cut.jsonl",
        "truncated-gz": tmp_path / "cut.jsonl.gz",
        "missing": tmp_path / "nope.jsonl",
    }
    files["empty"].write_text("")
    files["version"].write_text(
        good.replace('"version":2', '"version":9').replace('"version": 2', '"version": 9') + "\n"
    )
    files["truncated"].write_text(good + "\n" + good[: len(good) // 2])
    blob = gzip.compress(((good + "\n") * 3).encode())
    files["truncated-gz"].write_bytes(blob[: len(blob) // 2])
    return files


@pytest.mark.parametrize("case", ["empty", "version", "truncated", "truncated-gz", "missing"])
def test_bad_tree_files_give_one_line_and_exit_2_and_no_page(tmp_path, case):
    path = _bad_files(tmp_path)[case]
    out = tmp_path / "view.html"
    res = _cli("view", str(path), "--out", str(out))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trace-gym view: "), res.stderr
    assert not out.exists() and not list(tmp_path.glob(".view-*"))


def test_a_bad_file_leaves_an_earlier_page_untouched(tmp_path):
    out = tmp_path / "view.html"
    out.write_text("earlier page")
    assert _cli("view", str(_bad_files(tmp_path)["version"]), "--out", str(out)).returncode == 2
    assert out.read_text() == "earlier page"


def test_cli_rejects_a_tiny_max_text(tmp_path):
    res = _cli("view", str(save_trees([hostile_tree()], tmp_path / "t.jsonl")), "--max-text", "0")
    assert (
        res.returncode == 2
        and res.stderr.strip() == "trace-gym view: --max-text must be >= 100, got 0"
    )


def test_cli_writes_the_page(tmp_path):
    src = save_trees([hostile_tree()], tmp_path / "t.jsonl.gz")
    res = _cli("view", str(src), "--out", str(tmp_path / "v.html"))
    assert res.returncode == 0, res.stderr
    assert "wrote" in res.stdout and (tmp_path / "v.html").stat().st_size > 1000


def test_long_text_is_cut_to_max_text_and_the_cut_counted(tmp_path):
    tree = hostile_tree()
    tree.nodes[1].turn.observation = "x" * 5000
    node = page_data([tree], title="t", max_text=1000)["trees"][0]["nodes"][1]
    assert node["ob"] == "x" * 1000 and node["cut"][1] == 4000


def test_bench_view_reports_figures_as_json(tmp_path, capsys):
    assert (
        bench_main(
            ["--trees", "12", "--nodes", "12", "--no-browser", "--json", str(tmp_path / "b.json")]
        )
        == 0
    )
    res = json.loads((tmp_path / "b.json").read_text())
    assert res["trees"] == 12 and res["write_s"] > 0 and res["page_mb"] > 0
    assert "page written <= 10 s" in capsys.readouterr().out


def test_texts_are_cut_to_keep_a_big_file_within_the_page_budget(tmp_path, monkeypatch):
    import trace_gym.bench.view as view

    trees = synthetic_trees(40, 20, chars=400)
    src = save_trees(trees, tmp_path / "t.jsonl")
    full = write_view([src], tmp_path / "full.html").stat().st_size
    monkeypatch.setattr(view, "PAGE_BUDGET_MB", full / 2e6)
    html = write_view([src], tmp_path / "cut.html").read_text()
    data = _page_json(html)
    assert len(html.encode()) < full * 0.6
    assert data["max_text"] < 400 and "texts cut to" in data["title"]
    node = data["trees"][0]["nodes"][1]
    assert len(node["a"]) == data["max_text"] and node["cut"][0] == 400 - data["max_text"]


def test_rollout_output_opens_with_its_skipped_candidates(tmp_path):
    trees = tmp_path / "rollout.jsonl.gz"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "trace_gym.cli",
            "rollout",
            "--env",
            "trace/Sim-v0",
            "--policy",
            "sim",
            "--allocator",
            "trace",
            "--steps",
            "2",
            "--tasks",
            "12",
            "--roots",
            "16",
            "--replays",
            "1",
            "--out",
            str(trees),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    data = _page_json(write_view([trees], tmp_path / "v.html", title="@JS@ <t>").read_text())
    assert data["title"] == "@JS@ <t>" and set(data["steps"]) == {"0", "1"}
    for step in data["steps"].values():
        assert step["skipped"] is not None and len(step["selected"]) + len(step["skipped"]) == 12


@pytest.mark.parametrize("require, outcome", [("", "skipped"), ("data,browser", "failed")])
def test_a_missing_browser_skips_with_its_line_unless_required(
    pytester, monkeypatch, tmp_path, require, outcome
):
    """No browser on PATH: the browser test skips with what to install, root or not;
    TRACE_GYM_REQUIRE=browser (as .ci/run sets it) turns that skip into a failure."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no chromium, no chromedriver
    monkeypatch.delenv("TRACE_GYM_CHROMIUM", raising=False)
    monkeypatch.setenv("TRACE_GYM_REQUIRE", require)
    monkeypatch.setattr("os.geteuid", lambda: 0)
    pytester.makeconftest((Path(__file__).parents[1] / "conftest.py").read_text())
    pytester.makepyfile(
        """
        import pytest
        from trace_gym.bench.browser import BrowserMissing, find_browser

        def test_view():
            try:
                find_browser()
            except BrowserMissing as e:
                pytest.skip(str(e))
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(**{outcome: 1})
    result.stdout.fnmatch_lines(["*browser missing: none of chromium*apt-get install*"])


def test_budget_by_depth_counts_roots_and_replays_at_their_prefix():
    assert budget_by_depth([hostile_tree()]) == {0: 2, 1: 1}
    nodes = page_data([hostile_tree()], title="t")["trees"][0]["nodes"]
    assert [i for i, n in enumerate(nodes) if n.get("br")] == [3]  # the replay from node 1


def test_the_cpu_training_configs_save_the_trees_the_viewer_reads():
    from trace_gym.trainers.config import load_config

    configs = sorted((Path(__file__).parents[2] / "configs").glob("cpu_*.toml"))
    assert len(configs) >= 4
    for path in configs:
        assert load_config(path).save_trees, f"{path.name}: set save_trees = true"


def test_view_on_a_run_dir_reads_its_trees_and_names_the_setting_without_them(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    out = tmp_path / "v.html"
    res = _cli("view", str(run), "--out", str(out))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and not out.exists(), res.stderr
    assert "saved no trees" in lines[0] and "save_trees = true" in lines[0]
    save_trees(synthetic_trees(2, 10), run / "trees" / "step_000000.jsonl.gz")
    data = _page_json(write_view([run], out).read_text())  # metrics.jsonl is not a tree file
    assert len(data["trees"]) == 2


def _uniform_step(value=0.5):
    """One step whose every candidate (selected or skipped) got `value`: the cold start."""
    trees = synthetic_trees(3, 12, per_step=3)
    for t in trees:
        t.info["candidate_value"] = value
    trees[0].info["skipped_candidates"] = [["skipped-a", value], ["skipped-b", value]]
    return trees


def test_a_step_where_every_candidate_has_one_value_is_marked_uniform():
    steps = page_data(_uniform_step(), title="t")["steps"]
    assert steps["0"]["uniform"] == 0.5
    varied = synthetic_trees(3, 12, per_step=3)  # random skipped values: a ranked step
    assert page_data(varied, title="t")["steps"]["0"]["uniform"] is None
