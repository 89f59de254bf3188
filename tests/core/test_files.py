"""Every page the project writes has the same file mode (issue 27 item 11)."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
from trace_gym.bench.report_html import write_index
from trace_gym.bench.view import write_view
from trace_gym.bench.view_bench import synthetic_tree

from trace_gym.files import PAGE_MODE, write_page
from trace_gym.provenance import write_provenance
from trace_gym.tree import save_trees


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_view_page_index_and_provenance_share_one_mode(tmp_path, umask_022):
    trees = tmp_path / "trees.jsonl"
    save_trees([synthetic_tree("p", 0, 5, np.random.default_rng(0))], trees)
    pages = [
        write_view([trees], tmp_path / "out" / "view.html"),
        write_provenance(tmp_path / "out"),
        write_index(tmp_path / "out", "t", ["trace-gym", "x"]),
    ]
    assert {_mode(p) for p in pages} == {PAGE_MODE}


def test_write_page_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = write_page(tmp_path / "a" / "p.html", "one")
    write_page(path, b"two")
    assert path.read_text() == "two" and _mode(path) == PAGE_MODE
    assert [p.name for p in path.parent.iterdir()] == ["p.html"]
