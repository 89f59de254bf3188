"""`trace-gym bench retrieval --scale 10k,100k,1M`: how retrieval cost grows with the corpus.

At each size: synthetic passages (60 words drawn Zipf-like from a 50,000-word made-up
vocabulary) for BM25, and random unit vectors (384-d, the MiniLM width) for dense HNSW,
so no encoder runs. Reported per size: build seconds, index memory (bm25s's sparse
arrays; faiss's serialised index) and batched top-10 queries/s. Dense builds above
``--scale-dense-max`` vectors are skipped with a note (HNSW M=32 builds at roughly
1-2k vectors/s on one loaded core: 1M takes tens of minutes).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

__all__ = ["parse_sizes", "scale_sweep", "synthetic_passages"]

_SUFFIX = {"k": 1_000, "m": 1_000_000}


def parse_sizes(text: str) -> list[int]:
    """'10k,100k,1M' -> [10000, 100000, 1000000] (ValueError on anything else)."""
    sizes = []
    for part in text.split(","):
        part = part.strip().lower()
        mult = _SUFFIX.get(part[-1:], 1)
        digits = part[:-1] if part[-1:] in _SUFFIX else part
        if not digits.isascii() or not digits.isdigit() or int(digits) * mult < 1:
            raise ValueError(f"bad corpus size {part!r}; write sizes like 10k,100k,1M")
        sizes.append(int(digits) * mult)
    return sizes


def _vocabulary(n: int, rng: np.random.Generator) -> np.ndarray:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return np.array(["".join(rng.choice(letters, size=int(rng.integers(3, 10)))) for _ in range(n)])


def synthetic_passages(n: int, seed: int = 0, words: int = 60) -> list[Any]:
    """`n` passages of `words` Zipf-distributed made-up words (titles: the first 3 words)."""
    from trace_gym.envs.hotpotqa.data import Passage

    rng = np.random.default_rng(seed)
    vocab = _vocabulary(50_000, rng)
    ranks = np.minimum(rng.zipf(1.2, size=(n, words)), len(vocab)) - 1  # (n, words)
    return [
        Passage(f"s{i}", " ".join(vocab[r[:3]]), " ".join(vocab[r])) for i, r in enumerate(ranks)
    ]


def _bm25_row(n: int, queries: int, seed: int) -> dict[str, Any]:
    from trace_gym.envs.hotpotqa.retrievers import BM25Retriever

    passages = synthetic_passages(n, seed)
    qs = [" ".join(p.text.split()[5:11]) for p in passages[:queries]]
    t = time.perf_counter()
    r = BM25Retriever(passages)
    build = time.perf_counter() - t
    r.warm_up()
    t = time.perf_counter()
    r.search(qs, 10)
    qps = len(qs) / (time.perf_counter() - t)
    mem = sum(a.nbytes for a in r._bm25.scores.values() if hasattr(a, "nbytes"))
    return {
        "bm25_build_s": round(build, 2),
        "bm25_index_mb": round(mem / 2**20, 1),
        "bm25_qps": round(qps, 1),
    }


def _dense_row(n: int, queries: int, seed: int, dim: int) -> dict[str, Any]:
    import faiss
    from trace_gym.envs.hotpotqa.dense import faiss_index

    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((n, dim), dtype=np.float32)  # (n, dim)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    t = time.perf_counter()
    index = faiss_index("hnsw", vecs)
    build = time.perf_counter() - t
    q = vecs[:queries] + 0.05 * rng.standard_normal((min(queries, n), dim), dtype=np.float32)
    t = time.perf_counter()
    index.search(q, 10)
    qps = len(q) / (time.perf_counter() - t)
    mem = faiss.serialize_index(index).nbytes
    return {
        "hnsw_build_s": round(build, 2),
        "hnsw_index_mb": round(mem / 2**20, 1),
        "hnsw_qps": round(qps, 1),
    }


def scale_sweep(
    sizes: list[int],
    *,
    queries: int = 1000,
    dense_max: int = 100_000,
    dim: int = 384,
    seed: int = 0,
    skip_dense: bool = False,
) -> dict[str, Any]:
    """One row per size: BM25 and (up to `dense_max` vectors) HNSW build time, memory, q/s."""
    rows: dict[str, Any] = {}
    for n in sizes:
        print(f"[scale] {n:,} passages: BM25...", file=sys.stderr)
        row = _bm25_row(n, queries, seed)
        if skip_dense:
            row["hnsw"] = "skipped (--skip-dense)"
        elif n > dense_max:
            row["hnsw"] = (
                f"skipped: over --scale-dense-max {dense_max:,} (an HNSW build this size takes too long here)"
            )
        else:
            print(f"[scale] {n:,} vectors: HNSW...", file=sys.stderr)
            row.update(_dense_row(n, queries, seed, dim))
        rows[str(n)] = row
        print(
            f"[scale] {n:,}: {row}", file=sys.stderr, flush=True
        )  # a long sweep shows each size as it ends
    return {"scale": rows, "scale_queries": queries, "scale_dense_dim": dim}
