"""Client for a Search-R1-style retrieval server (``POST /retrieve``).

Works with `trace-gym serve-retriever` and with Search-R1's own ``retrieval_server.py``:
the request is ``{"queries": [...], "topk": k, "return_scores": true}`` and the response
``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_gym.envs.hotpotqa.data import passage_from_contents
from trace_gym.envs.hotpotqa.retrieval_base import Hit, Retriever

from trace_gym.errors import ConfigError, TraceGymError

__all__ = ["RemoteRetriever", "RetrievalServerError"]


class RetrievalServerError(TraceGymError, RuntimeError):
    """The retrieval server could not be reached or answered with an error."""


class RemoteRetriever(Retriever):
    """A `Retriever` whose index lives behind an HTTP `/retrieve` endpoint."""

    kind = "remote"

    def __init__(self, url: str, *, timeout: float = 30.0, **_: Any):
        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        self.timeout = float(timeout)
        self.passages = []  # the corpus lives on the server

    def describe(self) -> str:
        return f"remote retriever at {self.url}"

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Hit]]:
        if not queries:
            return []
        body = json.dumps(
            {"queries": list(queries), "topk": int(k), "return_scores": True}
        ).encode()
        req = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                payload = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300]
            raise RetrievalServerError(
                f"retrieval server {self.url} answered {e.code}: {detail}"
            ) from e
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            raise RetrievalServerError(
                f"cannot reach the retrieval server at {self.url} ({e}); start one with "
                "`trace-gym serve-retriever --index DIR` or pass a local retriever"
            ) from e
        results = payload.get("result")
        if not isinstance(results, list) or len(results) != len(queries):
            raise RetrievalServerError(
                f"malformed response from {self.url}: expected {len(queries)} result lists"
            )
        return [[_hit(item) for item in row] for row in results]

    def save(self, path: str | Path) -> Path:
        raise ConfigError(
            "a remote retriever has no local index to save; save it on the server side"
        )


def _hit(item: dict[str, Any]) -> Hit:
    doc, score = (item["document"], item.get("score", 0.0)) if "document" in item else (item, 0.0)
    return Hit(
        passage_from_contents(str(doc.get("id", "")), str(doc.get("contents", ""))),
        round(float(score), 6),
    )
