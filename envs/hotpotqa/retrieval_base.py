"""The retriever interface every backend implements (`Hit`, `Retriever`) and its helpers.

Kept apart from `trace_gym.envs.hotpotqa.retrievers` (the registry and BM25) so that the
optional backends (dense, lucene, remote) import the interface without importing the
registry that loads them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from trace_gym.envs.hotpotqa.data import Passage, corpus_fingerprint

from trace_gym.errors import ConfigError

__all__ = ["INDEX_FORMAT", "Hit", "Retriever", "clamp_k", "to_hits"]

INDEX_FORMAT = 1


class Hit(NamedTuple):
    """One retrieved passage and its score (higher is better)."""

    passage: Passage
    score: float


class Retriever:
    """Base class: a searchable corpus that can be saved to a directory.

    Subclasses set ``kind`` and implement `search`, `_save_index` and `_load_index`.
    ``search`` must be safe to call from several threads at once (the server does).
    """

    kind: str = ""

    def __init__(self, passages: Sequence[Passage]):
        if not passages:
            raise ConfigError("a retriever needs at least one passage")
        self.passages = list(passages)

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        """Top-`k` passages for each query, best first (one batched call)."""
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        """Construction parameters stored in meta.json (JSON-friendly)."""
        return {}

    def describe(self) -> str:
        return f"{self.kind} over {len(self.passages):,} passages"

    def save(self, path: str | Path) -> Path:
        """Write the index, its passages and meta.json to `path` (a directory)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        with open(path / "passages.jsonl", "w", encoding="utf-8") as f:
            for p in self.passages:
                f.write(json.dumps(p.to_row(), ensure_ascii=False) + "\n")
        self._save_index(path)
        meta = {
            "format": INDEX_FORMAT,
            "kind": self.kind,
            "params": self.params(),
            "num_passages": len(self.passages),
            "fingerprint": corpus_fingerprint(self.passages),
        }
        (path / "meta.json").write_text(json.dumps(meta, indent=2))
        return path

    def _save_index(self, path: Path) -> None:
        raise NotImplementedError

    @classmethod
    def _load_index(
        cls, path: Path, passages: list[Passage], params: dict[str, Any], *, mmap: bool = False
    ) -> Retriever:
        """Reopen a saved index; `mmap` maps its arrays read-only instead of reading them in."""
        raise NotImplementedError

    def warm_up(self) -> None:
        """Pay one-time start-up costs (JIT compilation) now, before the first real query."""

    def close(self) -> None:
        """Release resources (threads, JVM handles); the default holds none."""

    #: whether a forked copy of this retriever can serve (a JVM or a started thread pool cannot)
    forkable: bool = True

    def after_fork(self) -> None:
        """Called in a forked server worker before it serves: renew per-process state (locks)."""


def clamp_k(k: int, n: int) -> int:
    """`k` (a search's topk) capped at the corpus size `n`; `ConfigError` when below 1."""
    if int(k) < 1:
        raise ConfigError(f"k (topk) must be >= 1, got {k}")
    return min(int(k), n)


def to_hits(passages: Sequence[Passage], docs: np.ndarray, scores: np.ndarray) -> list[list[Hit]]:
    """Each query's `Hit` list from a search's doc indices and scores (negative: no hit)."""
    # docs, scores: (n_queries, k). Ties are ordered by corpus position, so batched (numba)
    # and single (numpy) searches, and the server, return the same order.
    out = []
    for drow, srow in zip(docs, scores, strict=True):
        row = sorted(
            ((round(float(s), 5), int(d)) for d, s in zip(drow, srow, strict=True) if d >= 0),
            key=lambda x: (-x[0], x[1]),
        )
        out.append([Hit(passages[d], s) for s, d in row])
    return out
