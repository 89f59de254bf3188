"""Retrievers behind one interface: batched search, save to and load from a directory.

Every retriever is a `Retriever`: ``search(queries, k) -> list[list[Hit]]`` over a
list of `Passage`s, plus ``save(path)``; `load_retriever(path)` reopens any saved
index (its ``meta.json`` names the kind). The kinds, selected by name from `KINDS`:

- ``bm25``: bm25s (Lucene-style BM25, English stopwords, Snowball stemming when
  PyStemmer is installed). The default; needs only the core dependencies.
- ``dense-flat`` / ``dense-hnsw``: faiss inner-product search over normalised sentence
  embeddings (`trace_gym.envs.hotpotqa.dense`).
- ``pyserini``: Lucene BM25 through pyserini (`trace_gym.envs.hotpotqa.lucene`).

`open_retriever(spec, passages)` is what the env calls: a kind name (built once per
corpus and cached on disk), a saved index directory, or an ``http://`` URL of a
`trace-gym serve-retriever` / Search-R1 retrieval server.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from trace_gym.envs.hotpotqa.data import Passage, corpus_fingerprint, load_wiki18
from trace_gym.envs.hotpotqa.retrieval_base import INDEX_FORMAT, Hit, Retriever, clamp_k, to_hits

from trace_gym.errors import ConfigError, DependencyNotInstalled, unknown

__all__ = [
    "KINDS",
    "BM25Retriever",
    "Hit",
    "Retriever",
    "build_retriever",
    "default_cache_dir",
    "load_retriever",
    "open_retriever",
]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- BM25
class BM25Retriever(Retriever):
    """BM25 with bm25s: sparse index; numpy scoring, numba kernels for large batches."""

    kind = "bm25"

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        k1: float = 0.9,
        b: float = 0.4,
        stemmer: str | None = "english",
        show_progress: bool = False,
        _index: Any = None,
        _tokenizer: Any = None,
    ):
        super().__init__(passages)
        import bm25s
        from bm25s.tokenization import Tokenizer

        self.k1, self.b = float(k1), float(b)
        self.stemmer = stemmer if stemmer and _stemmer(stemmer) is not None else None
        # PyStemmer objects are not thread-safe; tokenising is cheap, so it is serialised
        self._lock = threading.Lock()
        self._warm = False  # after warm_up(), every batch size goes through numba
        if _index is not None:
            self._bm25, self._tok = _index, _tokenizer
            self._fast = _numba_view(self._bm25)
            return
        self._tok = Tokenizer(stemmer=_stemmer(self.stemmer), stopwords="en")
        ids = self._tok.tokenize(
            [p.contents for p in self.passages],
            update_vocab=True,
            return_as="ids",
            show_progress=show_progress,
        )
        # k1/b defaults follow pyserini's BM25 (0.9/0.4), so the two backends agree
        self._bm25 = bm25s.BM25(k1=self.k1, b=self.b, method="lucene")
        self._bm25.index(ids, show_progress=show_progress)
        self._fast = _numba_view(self._bm25)

    def params(self) -> dict[str, Any]:
        return {"k1": self.k1, "b": self.b, "stemmer": self.stemmer}

    def search(self, queries: Sequence[str], k: int = 3, n_threads: int = 0) -> list[list[Hit]]:
        """Top-k per query; batches of `NUMBA_MIN_BATCH`+ queries use bm25s's numba kernels when installed."""
        if not queries:
            return []
        k = clamp_k(k, len(self.passages))
        with self._lock:
            ids = self._tok.tokenize(
                list(queries), update_vocab=False, return_as="ids", show_progress=False
            )
        use_fast = self._fast is not None and (self._warm or len(queries) >= NUMBA_MIN_BATCH)
        engine = self._fast if use_fast else self._bm25
        # numpy and numba break ties differently, so ties are ordered by corpus position: fetch a
        # margin, and where the k-th score's tie group may run past it, rank that query exactly
        n = len(self.passages)
        wide = min(n, max(2 * k, k + 10))
        docs, scores = engine.retrieve(ids, k=wide, show_progress=False, n_threads=n_threads)
        out = to_hits(self.passages, docs, scores)
        for i, hits in enumerate(out):
            if wide < n and hits[-1].score >= hits[k - 1].score:
                full = np.round(
                    self._bm25.get_scores_from_ids(ids[i]).astype(np.float64), 5
                )  # (n,)
                top = np.lexsort((np.arange(n), -full))[:k]
                out[i] = [Hit(self.passages[int(d)], float(full[d])) for d in top]
            else:
                out[i] = hits[:k]
        return out

    def warm_up(self) -> None:
        """Compile the numba kernels (seconds, once per process); then single queries use them too."""
        if self._fast is not None and not self._warm:
            self.search([p.title for p in self.passages[:NUMBA_MIN_BATCH]] * 2, 10)
            self._warm = True

    def _save_index(self, path: Path) -> None:
        with _stdlib_json_in_bm25s():
            self._bm25.save(str(path / "bm25"), show_progress=False)
        self._tok.save_vocab(str(path / "bm25"))

    def after_fork(self) -> None:
        # another thread of the parent may have held the tokenizer lock at the fork
        self._lock = threading.Lock()

    @classmethod
    def _load_index(
        cls, path: Path, passages: list[Passage], params: dict[str, Any], *, mmap: bool = False
    ) -> BM25Retriever:
        import bm25s
        from bm25s.tokenization import Tokenizer

        stemmer = params.get("stemmer")
        if stemmer and _stemmer(stemmer) is None:
            raise DependencyNotInstalled(
                "PyStemmer (this BM25 index was built with stemming)", "pip install PyStemmer"
            )
        tok = Tokenizer(stemmer=_stemmer(stemmer), stopwords="en")
        tok.load_vocab(str(path / "bm25"))
        index = bm25s.BM25.load(str(path / "bm25"), mmap=mmap, show_progress=False)
        return cls(
            passages,
            k1=params.get("k1", 0.9),
            b=params.get("b", 0.4),
            stemmer=stemmer,
            _index=index,
            _tokenizer=tok,
        )


#: batches at least this large go through numba (single queries stay on numpy: no JIT delay)
NUMBA_MIN_BATCH = 32


def _numba_view(index: Any) -> Any:
    """The same bm25s index (shared arrays) with the numba backend, or None without numba.

    ``TRACE_GYM_BM25_BACKEND=numpy`` turns numba off (its first call JIT-compiles for seconds).
    """
    if os.environ.get("TRACE_GYM_BM25_BACKEND", "auto") == "numpy":
        return None
    try:
        import numba  # noqa: F401
    except ImportError:
        return None
    fast = copy.copy(index)
    fast.backend = "numba"
    return fast


def _stemmer(name: str | None) -> Callable[[str], str] | None:
    if not name:
        return None
    try:
        import Stemmer
    except ImportError:
        log.warning(
            "PyStemmer is not installed: BM25 runs without stemming (pip install PyStemmer)"
        )
        return None
    return Stemmer.Stemmer(name).stemWord


# --------------------------------------------------------------------------- registry
def _dense(index_type: str) -> Callable[..., Retriever]:
    def make(passages: Sequence[Passage], **kw: Any) -> Retriever:
        from trace_gym.envs.hotpotqa.dense import DenseRetriever

        return DenseRetriever(passages, index_type=index_type, **kw)

    return make


def _pyserini(passages: Sequence[Passage], **kw: Any) -> Retriever:
    from trace_gym.envs.hotpotqa.lucene import PyseriniRetriever

    return PyseriniRetriever(passages, **kw)


#: retriever kind -> builder(passages, **options)
KINDS: dict[str, Callable[..., Retriever]] = {
    "bm25": BM25Retriever,
    "dense-flat": _dense("flat"),
    "dense-hnsw": _dense("hnsw"),
    "pyserini": _pyserini,
}


def _loader(kind: str) -> Callable[..., Retriever]:
    if kind == "bm25":
        return BM25Retriever._load_index
    if kind in ("dense-flat", "dense-hnsw"):
        from trace_gym.envs.hotpotqa.dense import DenseRetriever

        return DenseRetriever._load_index
    if kind == "pyserini":
        from trace_gym.envs.hotpotqa.lucene import PyseriniRetriever

        return PyseriniRetriever._load_index
    raise unknown("retriever kind", kind, KINDS)


def build_retriever(kind: str, passages: Sequence[Passage], **options: Any) -> Retriever:
    """Build a retriever of `kind` (one of `KINDS`) over `passages`."""
    if kind not in KINDS:
        raise unknown("retriever kind", kind, KINDS)
    return KINDS[kind](passages, **options)


def load_retriever(path: str | Path, *, mmap: bool = False) -> Retriever:
    """Reopen an index directory written by `Retriever.save` or `trace-gym corpus build`.

    With `mmap`, the index arrays (bm25s's sparse matrix, a faiss index) are memory-mapped
    read-only, so server workers forked from one process share one copy in the page cache.
    """
    path = Path(path)
    meta_path = path / "meta.json"
    if not meta_path.exists():
        raise ConfigError(
            f"{path} is not a trace-gym index (no meta.json); build one with `trace-gym corpus build`"
        )
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != INDEX_FORMAT:
        raise ConfigError(
            f"{path}: index format {meta.get('format')} is not supported (expected {INDEX_FORMAT}); rebuild it"
        )
    passages = load_wiki18(path / "passages.jsonl")
    return _loader(meta["kind"])(path, passages, meta.get("params", {}), mmap=mmap)


def default_cache_dir() -> Path:
    """Where lazily built indexes are cached: $TRACE_GYM_CACHE or ~/.cache/trace-gym."""
    root = os.environ.get("TRACE_GYM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "trace-gym",
    )
    return Path(root) / "hotpotqa"


def _cached(
    kind: str, passages: Sequence[Passage], cache_dir: Path | None, options: dict[str, Any]
) -> Retriever:
    tag = "-".join(
        f"{k}={v}" for k, v in sorted(options.items()) if isinstance(v, (str, int, float))
    )
    key = f"{kind}-{corpus_fingerprint(passages)}"
    if tag:
        key += "-" + hashlib.sha1(tag.encode()).hexdigest()[:8]
    target = (cache_dir or default_cache_dir()) / key
    if (target / "meta.json").exists():
        try:
            return load_retriever(target)
        except Exception as e:  # a corrupt or stale cache entry is rebuilt, never fatal
            log.warning("ignoring unreadable cached index %s (%s); rebuilding", target, e)
    retriever = build_retriever(kind, passages, **options)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent))
        retriever.save(tmp)
        if (target / "meta.json").exists():  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
    except OSError as e:
        log.warning(
            "could not cache the %s index under %s (%s); it will be rebuilt next time",
            kind,
            target,
            e,
        )
    return retriever


def open_retriever(
    spec: str | Retriever,
    passages: Sequence[Passage] | None = None,
    *,
    cache_dir: str | Path | None = None,
    cache: bool = True,
    **options: Any,
) -> Retriever:
    """The env's retriever from `spec`: a kind name, an index directory, a URL, or an instance."""
    if isinstance(spec, Retriever):
        return spec
    if not isinstance(spec, str):
        raise ConfigError(
            f"retriever must be a kind name, index path or URL, got {type(spec).__name__}"
        )
    if spec.startswith(("http://", "https://")):
        from trace_gym.envs.hotpotqa.remote import RemoteRetriever

        return RemoteRetriever(spec, **options)
    if spec in KINDS:
        if passages is None:
            raise ConfigError(f"retriever {spec!r} needs a corpus to index")
        if not cache:
            return build_retriever(spec, passages, **options)
        return _cached(spec, passages, Path(cache_dir) if cache_dir else None, options)
    if Path(spec).is_dir():
        return load_retriever(spec)
    raise ConfigError(
        f"retriever {spec!r} is neither a kind ({', '.join(KINDS)}), an index directory, nor an http(s) URL"
    )


@contextlib.contextmanager
def _stdlib_json_in_bm25s():
    """bm25s writes its vocabulary with orjson whenever orjson is installed (tensordict, a
    dependency of the verl extra, installs it), and orjson refuses the int keys of a
    vocabulary built from token ids ("Dict key must be str"). The standard library writes
    them as strings, the form bm25s has always read back."""
    from bm25s.utils import json_functions

    saved = json_functions.dumps
    json_functions.dumps = json_functions.dumps_with_builtin
    try:
        yield
    finally:
        json_functions.dumps = saved
