"""The corpus-size sweep of `bench retrieval --scale` on tiny sizes (figures are not asserted)."""

from __future__ import annotations

import pytest
from trace_gym.envs.hotpotqa.bench import main
from trace_gym.envs.hotpotqa.bench_scale import parse_sizes, scale_sweep, synthetic_passages


def test_sizes_parse_and_bad_sizes_are_refused():
    assert parse_sizes("10k, 100k,1M,500") == [10_000, 100_000, 1_000_000, 500]
    for bad in ("10x", "", "k", "-5", "0", "١٠k"):
        with pytest.raises(ValueError, match="corpus size"):
            parse_sizes(bad)
    assert main(["--scale", "10x"]) == 2


def test_sweep_reports_every_size_and_skips_dense_above_the_cap():
    pytest.importorskip("faiss")
    ps = synthetic_passages(50, seed=3)
    assert len(ps) == 50 and len(ps[0].text.split()) == 60 and ps == synthetic_passages(50, seed=3)
    out = scale_sweep([300, 600], queries=20, dense_max=300)
    small, big = out["scale"]["300"], out["scale"]["600"]
    assert {
        "bm25_build_s",
        "bm25_index_mb",
        "bm25_qps",
        "hnsw_build_s",
        "hnsw_index_mb",
        "hnsw_qps",
    } <= set(small)
    assert big["hnsw"].startswith("skipped") and big["bm25_index_mb"] >= small["bm25_index_mb"]
