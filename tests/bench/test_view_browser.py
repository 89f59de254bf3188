"""The viewer page in headless chromium: loads clean, draws every node, opens turns, searches, runs no model text."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from trace_gym.bench.browser import BrowserMissing, find_browser, open_page
from trace_gym.bench.view import budget_by_depth, write_view
from trace_gym.bench.view_bench import HOSTILE, hostile_tree, synthetic_trees

from trace_gym.tree import save_trees

pytestmark = pytest.mark.browser


@contextmanager
def _opened(html):
    """`open_page`; without a browser the test skips with `MISSING` 's line (what to install),
    which the skip guard allows unless TRACE_GYM_REQUIRE=browser (CI) says it must run."""
    try:
        with open_page(html) as p:
            yield p
    except BrowserMissing as e:
        pytest.skip(str(e))


@pytest.fixture
def page(tmp_path):
    trees = [hostile_tree()] + synthetic_trees(6, 30, per_step=3, chars=400)
    src = save_trees(trees, tmp_path / "trees.jsonl.gz")
    with _opened(write_view([src], tmp_path / "view.html")) as p:
        yield p, trees


def _by(css):
    from selenium.webdriver.common.by import By

    return By.CSS_SELECTOR, css


def _click(node):
    node.find_element(*_by("circle.dot")).click()  # a real click, where a user would aim


def _nodes(driver):
    return driver.find_elements(*_by("#tree .node"))


def test_page_loads_draws_every_node_and_runs_no_model_text(page):
    p, trees = page
    d = p.driver
    assert p.console_errors() == []
    assert len(_nodes(d)) == len(trees[0])
    assert d.find_element(*_by("#position")).text == f"prompt 1 of {len(trees)}"
    # the hostile tree is shown first: open every node's turns, then check nothing ran
    for i in range(len(trees[0])):
        _click(_nodes(d)[i])
        box = d.find_element(*_by("#detail"))
        for det in box.find_elements(*_by("details")):
            d.execute_script("arguments[0].open = true", det)
    assert d.execute_script("return window.__pwned === undefined")
    detail = d.find_element(*_by("#detail"))
    assert not detail.find_elements(*_by("img, svg, b, a, script"))
    assert p.console_errors() == []


def test_clicking_a_node_shows_its_turn_text(page):
    p, trees = page
    d = p.driver
    _click(_nodes(d)[3])  # the failed replay: assistant HOSTILE[4], observation HOSTILE[2]
    here = d.find_element(*_by("#detail .turn.here"))
    text = here.text
    assert "assistant " + HOSTILE[4] in text and "observation " + HOSTILE[2] in text
    assert "policy at policy.generate" in d.find_element(*_by("#detail")).text
    assert "selected" in _nodes(d)[3].get_attribute("class")


def test_long_text_is_folded_and_expands(page, tmp_path):
    p, trees = page
    d = p.driver
    d.find_element(*_by("#next")).click()  # a synthetic tree
    _click(_nodes(d)[1])
    prompt = d.find_element(*_by("#prompt-turn"))
    d.execute_script("arguments[0].open = true", prompt)
    full = trees[1].prompt
    pre = prompt.find_element(*_by("pre"))
    assert len(full) > 600 and pre.text.endswith("…") and len(pre.text) < len(full)
    prompt.find_element(*_by("button.more")).click()
    assert pre.text == full


def test_search_and_keys_move_between_prompts_and_a_screenshot_is_written(page, tmp_path):
    from selenium.webdriver.common.keys import Keys

    p, trees = page
    d = p.driver
    box = d.find_element(*_by("#search"))
    box.send_keys(trees[5].prompt_id)
    summary = d.find_element(*_by("#summary")).text
    assert f"task: {trees[5].prompt_id}" in summary
    assert len(_nodes(d)) == len(trees[5])
    box.send_keys(Keys.ESCAPE)
    d.find_element(*_by("body")).send_keys("j")
    assert f"task: {trees[6].prompt_id}" in d.find_element(*_by("#summary")).text
    d.find_element(*_by("body")).send_keys(Keys.ARROW_LEFT)
    assert f"task: {trees[5].prompt_id}" in d.find_element(*_by("#summary")).text
    box.clear()
    box.send_keys("no-such-task")
    assert d.find_element(*_by("#search-status")).text == "no task id matches"
    bars = d.find_elements(*_by("#histogram svg:last-child rect"))
    shown = {int(b.get_attribute("data-depth")): int(b.get_attribute("data-count")) for b in bars}
    assert shown == budget_by_depth(trees)  # "all steps"
    shot = p.screenshot(tmp_path / "view.png")
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert p.console_errors() == []


def test_view_cli_screenshot_opens_the_prompt_with_most_pairs(tmp_path):
    from trace_gym.bench.view import main

    trees = synthetic_trees(3, 20) + [hostile_tree()]
    src = save_trees(trees, tmp_path / "t.jsonl")
    png = tmp_path / "shot.png"
    try:
        find_browser()
    except BrowserMissing as e:
        pytest.skip(str(e))
    code = main([str(src), "--out", str(tmp_path / "v.html"), "--screenshot", str(png)])
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_format_1_file_from_bench_alloc_draws_clean(tmp_path):
    from pathlib import Path

    from trace_gym.tree import load_trees

    src = Path(__file__).parents[1] / "fixtures" / "trees_v1" / "bfcl-trace.jsonl.gz"
    trees = load_trees(src)
    with _opened(write_view([src], tmp_path / "v1.html")) as p:
        assert p.console_errors() == []
        assert len(_nodes(p.driver)) == len(trees[0])
        assert (
            "does not record the step's skipped candidates"
            in p.driver.find_element(*_by("#pool")).text
        )


def test_a_step_with_one_value_for_every_candidate_says_it_fell_back_to_uniform(tmp_path):
    from tests.bench.test_view import _uniform_step

    trees = _uniform_step() + synthetic_trees(2, 12, seed=1, per_step=2)
    for t in trees[3:]:
        t.step = 1
    src = save_trees(trees, tmp_path / "t.jsonl")
    with _opened(write_view([src], tmp_path / "v.html")) as p:
        pool = p.driver.find_element(*_by("#pool")).text
        assert "same predicted value (0.50)" in pool and "fell back to uniform" in pool
        p.driver.find_element(*_by("body")).send_keys("k")  # the last prompt: step 1
        assert "fell back to uniform" not in p.driver.find_element(*_by("#pool")).text


def _boxes(driver, css):
    """Page rectangles (left, top, right, bottom) and node id of each element matching css."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => {"
        " const r = e.getBoundingClientRect();"
        " return [r.left, r.top, r.right, r.bottom, e.closest('.node').dataset.id]; })",
        css,
    )


def _overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_the_tree_fills_its_panel_and_no_label_covers_a_node_or_another_label(page):
    p, trees = page
    d = p.driver
    for _ in range(len(trees)):  # every prompt of the page, the hostile one first
        dots = _boxes(d, "#tree .node circle.dot")
        labels = [b for b in _boxes(d, "#tree .node text") if b[2] > b[0]]
        assert labels, "the tree shows its value labels"
        for lab in labels:
            hit = [b for b in dots if _overlap(lab, b)]
            hit += [b for b in labels if b[4] != lab[4] and _overlap(lab, b)]
            assert not hit, f"label of node {lab[4]} covers {hit}"
        wrap = d.execute_script(
            "return document.getElementById('tree-wrap').getBoundingClientRect().width"
        )
        nodes = int(d.execute_script("return document.querySelectorAll('#tree .node').length"))
        span = max(b[2] for b in dots) - min(b[0] for b in dots)
        if nodes >= 12:  # a tree with room to spread: it uses most of the panel's width
            assert span >= 0.75 * wrap, (span, wrap)
        d.find_element(*_by("body")).send_keys("j")
