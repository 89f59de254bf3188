"""`trace-gym bench retrieval`: retrieval speed and quality, measured side by side.

- BM25 (bm25s) on a 100k-passage corpus: the real HotpotQA sample's paragraphs plus
  generated fictional passages; index build seconds and batched queries/s.
- Dense (faiss Flat and HNSW) on 100k vectors: MiniLM embeddings of the real paragraphs,
  tiled with small Gaussian noise (re-normalised); build seconds, batched queries/s, and
  HNSW recall@10 measured against the exact Flat results.
- Embedding throughput (passages/s) of the encoder, reported separately.
- Quality on the real sample (4,920 paragraphs, questions as queries): recall@k
  (k = 1, 3, 10) of the gold paragraphs for BM25 and dense.
- Policies: scripted two-hop EM and no-search EM on the bundled set; oracle-reader EM on
  the real sample (see `trace_gym.envs.hotpotqa.scripted`).
- Where pyserini runs: recall@10 agreement between bm25s and Lucene BM25.

The real sample is read from ``<repo>/../shared/data/hotpotqa/`` (or ``--real``); without
it the real-data figures are skipped and the 100k corpus is all generated.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from trace_gym.envs.hotpotqa.data import (
    Passage,
    QATask,
    context_passages,
    load_hotpotqa,
    passage_from_contents,
)
from trace_gym.envs.hotpotqa.retrievers import BM25Retriever, Hit, Retriever

from trace_gym.cli import Parser
from trace_gym.realdata import path_of

__all__ = ["main", "pad_corpus", "recall_at_k", "run_policy"]

log = logging.getLogger(__name__)
REAL_SAMPLE = "hotpotqa/hotpot_distractor_sample_500.jsonl"


def default_real_path() -> Path:
    """The real HotpotQA sample under ``$TRACE_GYM_DATA`` (`trace_gym.realdata`)."""
    return path_of("hotpotqa")


def recall_at_k(
    results: Sequence[Sequence[Hit]],
    tasks: Sequence[QATask],
    ks: Sequence[int],
    corpus_titles: set[str] | None = None,
) -> dict[str, float]:
    """Mean fraction of each question's gold paragraphs found in its top-k, per k.

    With `corpus_titles`, also ``reachable_recall@k``: the same over the gold paragraphs
    that the corpus actually holds (the real sample lacks some of them).
    """
    out = {}
    for k in ks:
        vals, reach = [], []
        for hits, t in zip(results, tasks, strict=True):
            gold = set(t.supporting_titles)
            top = {h.passage.title for h in hits[:k]}
            if gold:
                vals.append(len(gold & top) / len(gold))
            present = gold & corpus_titles if corpus_titles is not None else set()
            if present:
                reach.append(len(present & top) / len(present))
        out[f"recall@{k}"] = round(float(np.mean(vals)), 4) if vals else float("nan")
        if corpus_titles is not None:
            out[f"reachable_recall@{k}"] = (
                round(float(np.mean(reach)), 4) if reach else float("nan")
            )
    return out


def run_policy(
    env: Any, act: Callable[[Any, list[str]], str], tasks: int | None = None
) -> dict[str, float]:
    """Play `act(env, observations) -> action` on every task of `env`; mean EM, F1, searches."""
    base = env.unwrapped
    n = len(base.task_ids) if tasks is None else min(tasks, len(base.task_ids))
    em, f1, searches = [], [], []
    for i in range(n):
        env.reset(options={"task": i})
        observations: list[str] = []
        while True:
            obs, reward, term, trunc, info = env.step(act(base, observations))
            observations.append(obs)
            if term or trunc:
                break
        em.append(reward)
        f1.append(info.get("f1", 0.0))
        searches.append(info.get("num_searches", 0))
    return {
        "em": round(float(np.mean(em)), 4),
        "f1": round(float(np.mean(f1)), 4),
        "searches": round(float(np.mean(searches)), 3),
        "tasks": n,
    }


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def pad_corpus(real: list[Passage], total: int, seed: int) -> list[Passage]:
    """`real` padded to `total` passages with generated ones (a corpus of benchmark size)."""
    from trace_gym.corpora import build_hotpotqa as gen

    need = max(0, total - len(real))
    world = gen.generate_world(seed + 7, scale=need / 3100 * 1.02 + 0.01)
    rows = gen.corpus_rows(world, seed, prefix="bench")[:need]
    return real + [passage_from_contents(r["id"], r["contents"]) for r in rows]


def _queries(tasks: Sequence[QATask], n: int, fallback: Sequence[Passage]) -> list[str]:
    base = [t.question for t in tasks] or [p.title for p in fallback[:500]]
    return [base[i % len(base)] for i in range(n)]


def bench_bm25(passages: list[Passage], queries: list[str], threads: int) -> dict[str, Any]:
    r, build_s = _timed(lambda: BM25Retriever(passages))
    _, warm = _timed(lambda: r.search(queries[:50], 10, n_threads=threads))
    _, t = _timed(lambda: r.search(queries, 10, n_threads=threads))
    _, t1 = _timed(lambda: [r.search([q], 10) for q in queries[:200]])
    return {
        "bm25_passages": len(passages),
        "build_s": round(build_s, 3),
        "bm25_qps": round(len(queries) / t, 1),
        "bm25_single_qps": round(200 / t1, 1),
        "bm25_queries": len(queries),
    }


def bench_dense(
    real_emb: np.ndarray, query_emb: np.ndarray, total: int, noise: float, seed: int
) -> dict[str, Any]:
    from trace_gym.envs.hotpotqa.dense import faiss_index

    rng = np.random.default_rng(seed)
    reps = int(np.ceil(total / len(real_emb)))
    vecs = np.tile(real_emb, (reps, 1))[:total]  # (total, dim)
    vecs = vecs + rng.normal(0.0, noise, size=vecs.shape).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    out: dict[str, Any] = {
        "dense_vectors": total,
        "dense_dim": int(vecs.shape[1]),
        "dense_queries": len(query_emb),
    }
    results = {}
    for kind in ("flat", "hnsw"):
        index, build = _timed(lambda kind=kind: faiss_index(kind, vecs))
        _, t = _timed(lambda index=index: index.search(query_emb, 10))
        results[kind] = index.search(query_emb, 10)[1]
        out[f"dense_{kind}_build_s"] = round(build, 3)
        out[f"dense_{kind}_qps"] = round(len(query_emb) / t, 1)
    overlap = [
        len(set(a) & set(b)) / 10 for a, b in zip(results["flat"], results["hnsw"], strict=True)
    ]
    out["hnsw_recall@10_vs_flat"] = round(float(np.mean(overlap)), 4)
    return out


def _cached_embeddings(
    enc: Any, passages: list[Passage], cache: Path | None
) -> tuple[np.ndarray, float | None]:
    from trace_gym.envs.hotpotqa.data import corpus_fingerprint

    path = cache / f"minilm-{corpus_fingerprint(passages)}.npy" if cache else None
    if path is not None and path.exists():
        return np.load(path), None
    emb, t = _timed(lambda: enc.encode_passages([p.contents for p in passages], show_progress=True))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, emb)
    return emb, len(passages) / t


def _parser() -> argparse.ArgumentParser:
    ap = Parser(prog="trace-gym bench retrieval", description=main.__doc__)
    ap.add_argument(
        "--json", type=Path, default=None, help="also write the results to this JSON file"
    )
    ap.add_argument(
        "--real",
        type=Path,
        default=None,
        help="HotpotQA sample (default: <repo>/../shared/data/...)",
    )
    ap.add_argument(
        "--passages", type=int, default=100_000, help="BM25 corpus size and dense vector count"
    )
    ap.add_argument(
        "--queries", type=int, default=2_000, help="batched queries per speed measurement"
    )
    ap.add_argument("--threads", type=int, default=1, help="threads for bm25s and faiss")
    ap.add_argument(
        "--noise", type=float, default=0.01, help="std of the noise added to tiled embeddings"
    )
    ap.add_argument(
        "--skip-dense", action="store_true", help="skip everything that needs the encoder/faiss"
    )
    ap.add_argument("--skip-pyserini", action="store_true")
    ap.add_argument(
        "--embedding-cache",
        type=Path,
        default=None,
        help="reuse real-paragraph embeddings from this directory (default: the index cache)",
    )
    ap.add_argument(
        "--policy-tasks",
        type=int,
        default=None,
        help="play the policies on the first N questions only",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--scale",
        default=None,
        metavar="SIZES",
        help="instead: the corpus-size sweep on synthetic data, e.g. 10k,100k,1M (see bench_scale)",
    )
    ap.add_argument(
        "--scale-dense-max",
        type=int,
        default=100_000,
        help="largest HNSW build in the sweep (default 100k; 1M takes tens of minutes here)",
    )
    return ap


def _sparse(
    report: dict[str, Any],
    args: argparse.Namespace,
    tasks: list[QATask],
    real: list[Passage],
    real_path: Path,
) -> None:
    """BM25 speed on the padded corpus; recall, policies and pyserini agreement on the real sample."""
    print(f"[bm25] corpus of {args.passages:,} passages ({len(real):,} real)...", file=sys.stderr)
    corpus = pad_corpus(real, args.passages, args.seed)
    queries = _queries(tasks, args.queries, corpus)
    report.update(bench_bm25(corpus, queries, args.threads))
    del corpus
    if not tasks:
        return
    bm25_real = BM25Retriever(real)
    titles = {p.title for p in real}
    gold = [g for t in tasks for g in t.supporting_titles]
    report["real_gold_in_corpus"] = round(sum(g in titles for g in gold) / len(gold), 4)
    report["bm25_real"] = recall_at_k(
        bm25_real.search([t.question for t in tasks], 10), tasks, (1, 3, 10), titles
    )
    report.update(_policies(tasks, real_path, args.policy_tasks))
    if not args.skip_pyserini:
        report.update(_pyserini_agreement(real, tasks, bm25_real))


def _dense_figures(
    report: dict[str, Any], args: argparse.Namespace, tasks: list[QATask], real: list[Passage]
) -> None:
    """Embedding throughput, dense recall on the real sample, Flat/HNSW speed on tiled vectors."""
    from trace_gym.envs.hotpotqa.dense import DenseRetriever, Encoder
    from trace_gym.envs.hotpotqa.retrievers import default_cache_dir

    print("[dense] embedding the real paragraphs...", file=sys.stderr)
    enc = Encoder()
    emb, pps = _cached_embeddings(
        enc, real, args.embedding_cache or default_cache_dir() / "embeddings"
    )
    if pps is None:  # cached: measure throughput on a slice
        _, t = _timed(lambda: enc.encode_passages([p.contents for p in real[:128]]))
        pps = 128 / t
    report["embed_passages_per_s"] = round(pps, 1)
    qemb, tq = _timed(lambda: enc.encode_queries([t.question for t in tasks]))
    report["embed_queries_per_s"] = round(len(tasks) / tq, 1)
    dense_real = DenseRetriever(real, embeddings=emb, index_type="flat")
    report["dense_real"] = recall_at_k(
        dense_real.search_vectors(qemb, 10), tasks, (1, 3, 10), {p.title for p in real}
    )
    reps = int(np.ceil(args.queries / len(qemb)))
    report.update(
        bench_dense(
            emb, np.tile(qemb, (reps, 1))[: args.queries], args.passages, args.noise, args.seed
        )
    )
    report["dense_qps"] = report["dense_flat_qps"]


def main(argv: list[str]) -> int:
    """BM25 and dense retrieval speed and recall (see the module docstring)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.scale is not None:
        return _scale_main(args)
    report: dict[str, Any] = {"threads": args.threads}
    real_path = args.real or default_real_path()
    tasks: list[QATask] = load_hotpotqa(real_path) if real_path.exists() else []
    real = context_passages(tasks)
    report["real_sample"] = str(real_path) if tasks else None
    report["real_paragraphs"] = len(real)
    if not tasks:
        print(
            f"real HotpotQA sample not found at {real_path}: real-data figures are skipped",
            file=sys.stderr,
        )
    try:
        import faiss

        faiss.omp_set_num_threads(args.threads)
    except ImportError:
        pass
    _sparse(report, args, tasks, real, real_path)
    if not args.skip_dense and tasks:
        _dense_figures(report, args, tasks, real)
    _emit(report, args.json)
    return 0


def _scale_main(args: argparse.Namespace) -> int:
    from trace_gym.envs.hotpotqa.bench_scale import parse_sizes, scale_sweep

    try:
        sizes = parse_sizes(args.scale)
    except ValueError as e:
        print(f"trace-gym bench retrieval: {e}", file=sys.stderr)
        return 2
    _emit(
        scale_sweep(
            sizes,
            queries=args.queries,
            dense_max=args.scale_dense_max,
            seed=args.seed,
            skip_dense=args.skip_dense,
        ),
        args.json,
    )
    return 0


def _emit(report: dict[str, Any], path: Path | None) -> None:
    _print(report)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
        print(f"wrote {path}", file=sys.stderr)


def _policies(tasks: list[QATask], real_path: Path, limit: int | None) -> dict[str, Any]:
    import gymnasium as gym
    from trace_gym.envs.hotpotqa import scripted

    out: dict[str, Any] = {}
    env = gym.make("trace/HotpotQA-v0")
    out["scripted_em_bundled"] = run_policy(
        env, lambda e, obs: scripted.next_action(e.current_task.question, obs), limit
    )
    out["no_search_em_bundled"] = run_policy(
        env, lambda e, obs: scripted.no_search_action(e.current_task.question), limit
    )
    real_env = gym.make("trace/HotpotQA-v0", dataset=str(real_path))
    out["oracle_reader_em_real_bm25"] = run_policy(
        real_env, lambda e, obs: scripted.oracle_next_action(e.current_task, obs), limit
    )
    return out


def _pyserini_agreement(
    real: list[Passage], tasks: list[QATask], bm25: Retriever
) -> dict[str, Any]:
    from trace_gym.envs.hotpotqa.lucene import PyseriniRetriever, pyserini_available

    if not pyserini_available():
        return {"pyserini": "not installed"}
    lucene, build = _timed(lambda: PyseriniRetriever(real))
    qs = [t.question for t in tasks]
    ours = bm25.search(qs, 10)
    theirs, t = _timed(lambda: lucene.search(qs, 10))
    agree = [
        len({h.passage.id for h in a} & {h.passage.id for h in b}) / 10
        for a, b in zip(ours, theirs, strict=True)
    ]
    top1 = [
        bool(a) and bool(b) and a[0].passage.id == b[0].passage.id
        for a, b in zip(ours, theirs, strict=True)
    ]
    out = {
        "pyserini_build_s": round(build, 3),
        "pyserini_qps": round(len(qs) / t, 1),
        "pyserini_agreement@10": round(float(np.mean(agree)), 4),
        "pyserini_top1_agreement": round(float(np.mean(top1)), 4),
        "pyserini_real": recall_at_k(theirs, tasks, (1, 3, 10), {p.title for p in real}),
    }
    lucene.close()
    return out


def _print(report: dict[str, Any]) -> None:
    width = max(len(k) for k in report)
    for k, v in report.items():
        print(f"{k:<{width}}  {json.dumps(v)}")
