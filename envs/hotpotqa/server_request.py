"""What a /retrieve request may be: `ServerLimits`, `parse_request` and its `BadRequest`.

Kept apart from the server (`trace_gym.envs.hotpotqa.server`) and its ASGI app
(`trace_gym.envs.hotpotqa.server_app`), which both use them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from trace_gym.envs.hotpotqa.retrievers import Hit

from trace_gym.errors import ConfigError, TraceGymError

__all__ = ["USAGE", "BadRequest", "ServerLimits", "parse_request", "payload"]


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for, and how long the server waits."""

    #: largest request body in bytes (413 above)
    max_body_bytes: int = 1 << 20
    #: queries per request (413 above)
    max_queries: int = 512
    #: largest topk (422 above)
    max_topk: int = 100
    #: characters per query (422 above)
    max_query_chars: int = 4096
    #: JSON nesting depth; a valid request needs 2 (400 above, checked before parsing)
    max_depth: int = 8
    #: seconds to receive the whole body (408 after)
    read_timeout_s: float = 10.0
    #: seconds a search may take, queueing included (504 after)
    search_timeout_s: float = 30.0
    #: seconds an idle connection (a new one too) stays open; a request head has read_timeout_s
    keep_alive_s: float = 5.0
    #: open connections at once, per process (idle ones are closed first; then 503)
    max_connections: int = 1024
    #: open connections per client address, per process (idle ones are closed first; then 503)
    max_connections_per_client: int = 256
    #: how long the first request of a batch waits for others to join (milliseconds)
    batch_wait_ms: float = 2.0
    #: most queries searched in one batch
    max_batch_queries: int = 256

    def __post_init__(self):
        for name in (
            "max_body_bytes",
            "max_queries",
            "max_topk",
            "max_query_chars",
            "max_depth",
            "max_connections",
            "max_connections_per_client",
            "max_batch_queries",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("read_timeout_s", "search_timeout_s", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 <= self.batch_wait_ms <= 1000:
            raise ConfigError(f"batch_wait_ms must be in [0, 1000], got {self.batch_wait_ms}")


class BadRequest(TraceGymError):
    """A request the server refuses; `status` is the HTTP code."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


USAGE = 'send {"queries": ["..."], "topk": 3, "return_scores": true}'


_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_STRUCTURE = bytes(c for c in range(256) if chr(c) not in "[]{}")


def _check_depth(body: bytes, limit: int) -> None:
    """Refuse nesting deeper than `limit` before parsing (json.loads recurses per level)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return
    depth = 0
    for ch in _STRING.sub(b"", body).translate(
        None, _STRUCTURE
    ):  # only brackets outside strings remain
        depth += 1 if ch in b"[{" else -1
        if depth > limit:
            raise BadRequest(400, f"JSON nested deeper than {limit} levels; {USAGE}")


def parse_request(
    body: bytes, limits: ServerLimits = ServerLimits()
) -> tuple[list[str], int, bool]:
    """Validate a /retrieve body; raise `BadRequest` with a message saying what to send."""
    _check_depth(body, limits.max_depth)
    try:
        req = json.loads(body)
    except (
        ValueError,
        RecursionError,
    ) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise BadRequest(400, f"body is not JSON ({e}); {USAGE}") from e
    if not isinstance(req, dict):
        raise BadRequest(400, f"body must be a JSON object; {USAGE}")
    queries = req.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest(422, f"'queries' must be a list of strings; {USAGE}")
    if len(queries) > limits.max_queries:
        raise BadRequest(413, f"{len(queries)} queries; at most {limits.max_queries} per request")
    longest = max((len(q) for q in queries), default=0)
    if longest > limits.max_query_chars:
        raise BadRequest(422, f"a query has {longest} characters; at most {limits.max_query_chars}")
    topk = req.get("topk", 3)
    if topk is None:
        topk = 3
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= limits.max_topk:
        raise BadRequest(
            422, f"'topk' must be an integer in [1, {limits.max_topk}], got {topk!r:.40}"
        )
    return_scores = req.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise BadRequest(422, "'return_scores' must be true or false")
    return queries, topk, return_scores


def payload(results: list[list[Hit]], return_scores: bool) -> list[list[dict[str, Any]]]:
    """The ``result`` field of a /retrieve response (Search-R1's shape)."""
    out = []
    for hits in results:
        docs = [{"id": h.passage.id, "contents": h.passage.contents} for h in hits]
        out.append(
            [{"document": d, "score": h.score} for d, h in zip(docs, hits, strict=True)]
            if return_scores
            else docs
        )
    return out
