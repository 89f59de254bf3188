"""`OpenAIPolicy`: a `Policy` over any OpenAI-compatible chat-completions server.

vLLM's ``vllm serve``, SGLang, TGI or a hosted API. Conversations are sent as chat
messages (`trace_gym.agents.formats.chat_messages`), so this backend is *text-level*:
the server applies its own template and the returned turns carry no token ids (a
token-faithful replay needs the HF or vLLM backend). What it does guarantee:

- **concurrency cap**: at most ``concurrency`` requests in flight (an asyncio
  semaphore; requests run on ``httpx.AsyncClient`` when httpx is installed, else on
  urllib in worker threads);
- **timeouts**: each attempt has ``timeout_s``; a timed-out attempt is retried;
- **retries with backoff**: connection errors, timeouts, HTTP 429 and 5xx are retried
  up to ``max_retries`` times, waiting ``backoff_s * 2**attempt`` (capped at
  ``max_backoff_s``); other HTTP errors (400, 401, 404 ...) fail at once;
- **failures are per conversation**: a request that still fails comes back as a
  `PolicyOutput` with ``error`` set; its siblings go on;
- **per-sequence seeds**: ``Conversation.seed`` is sent as the request's ``seed``
  (honoured by vLLM and most servers);
- **stop strings kept**: the env format's stop strings are sent as ``stop``, with
  vLLM's ``include_stop_str_in_output``; when a server strips the stop string anyway
  and names it (``stop_reason``), it is appended back, so the text matches the other
  backends'.

Token logprobs, when the server returns them (``logprobs: true``), go to
``PolicyOutput.info["logprobs"]`` (they belong to the server's tokens, not to ids we hold).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trace_gym.agents.formats import ReActFormat, chat_messages, format_for, restore_stop

from trace_gym.errors import ConfigError, TraceGymError
from trace_gym.policy import Conversation, PolicyOutput

__all__ = ["OpenAIConfig", "OpenAIPolicy"]

logger = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


@dataclass
class OpenAIConfig:
    """Where the server is and how to talk to it."""

    #: base URL up to and including the version, e.g. "http://127.0.0.1:8000/v1"
    base_url: str
    #: model name the server serves
    model: str = "default"
    #: bearer token (None: $OPENAI_API_KEY, else no Authorization header)
    api_key: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    #: cap on one turn's tokens (None: the env format's default)
    max_tokens: int | None = None
    #: most requests in flight at once
    concurrency: int = 8
    #: seconds per attempt
    timeout_s: float = 60.0
    #: retries after the first attempt (timeouts, connection errors, 429, 5xx)
    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    #: ask the server for token logprobs
    logprobs: bool = False
    #: use the models' native tool calls (`tools=`) for BFCL instead of tags in text
    native_tools: bool = False

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"base_url must start with http:// or https://, got {self.base_url!r}"
            )
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.timeout_s <= 0 or self.backoff_s < 0 or self.max_retries < 0:
            raise ConfigError("timeout_s must be > 0, backoff_s and max_retries >= 0")


class _Retryable(TraceGymError):
    """An attempt failed in a way worth retrying."""


class OpenAIPolicy:
    """Batched chat-completions client with a concurrency cap, retries and timeouts."""

    def __init__(self, config: OpenAIConfig, formats: dict[str, ReActFormat] | None = None):
        self.config = config
        self.formats = dict(formats or {})
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self.api_key = (
            config.api_key if config.api_key is not None else os.environ.get("OPENAI_API_KEY")
        )
        self.requests = 0  # attempts made (for tests and reports)

    # ------------------------------------------------------------------ policy
    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        """One turn per conversation; runs its own event loop (in a thread if one is running)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.agenerate(conversations))
        result: list[list[PolicyOutput]] = []
        t = threading.Thread(
            target=lambda: result.append(asyncio.run(self.agenerate(conversations)))
        )
        t.start()
        t.join()
        return result[0]

    async def agenerate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        """The async form of `generate` (for callers that own an event loop)."""
        sem = asyncio.Semaphore(self.config.concurrency)

        async def one(conv: Conversation) -> PolicyOutput:
            async with sem:
                return await self._complete(conv)

        return list(await asyncio.gather(*(one(c) for c in conversations)))

    # ------------------------------------------------------------------ requests
    def request_body(self, conv: Conversation) -> dict[str, Any]:
        """The JSON body sent for `conv`."""
        fmt = self.formats.get(conv.env_id) or format_for(conv.env_id)
        cfg = self.config
        body: dict[str, Any] = {
            "model": cfg.model,
            "messages": chat_messages(conv, fmt, native_tools=cfg.native_tools),
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_tokens": cfg.max_tokens or fmt.max_new_tokens,
            "seed": int(conv.seed) % (2**31),
            "n": 1,
        }
        if fmt.stop:
            body["stop"] = list(fmt.stop)
            body["include_stop_str_in_output"] = True
        if cfg.logprobs:
            body["logprobs"] = True
        if cfg.native_tools and fmt.tools and conv.reset_info.get("tools"):
            from trace_gym.agents.formats import tools_of

            body["tools"] = tools_of(conv, fmt)
        return body

    async def _complete(self, conv: Conversation) -> PolicyOutput:
        body = self.request_body(conv)
        cfg = self.config
        last = ""
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                await asyncio.sleep(min(cfg.max_backoff_s, cfg.backoff_s * 2 ** (attempt - 1)))
            try:
                reply = await self._post(body)
                return self._parse(reply, attempt)
            except _Retryable as e:
                last = str(e)
                logger.info("attempt %d for %s failed: %s", attempt + 1, conv.task_id, last)
            except Exception as e:  # a non-retryable failure ends this conversation only
                return PolicyOutput(text="", error=f"openai: {e}", info={"attempts": attempt + 1})
        return PolicyOutput(
            text="",
            error=f"openai: gave up after {cfg.max_retries + 1} attempts: {last}",
            info={"attempts": cfg.max_retries + 1},
        )

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        self.requests += 1
        try:
            import httpx
        except ImportError:
            return await asyncio.to_thread(self._post_urllib, body)
        return await self._post_httpx(httpx, body)

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _post_urllib(self, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers=self._headers(), method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
                return json.loads(resp.read().decode())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:200]
            if e.code in _RETRY_STATUS:
                raise _Retryable(f"HTTP {e.code}: {detail}") from e
            raise RuntimeError(f"HTTP {e.code}: {detail}") from e
        except TimeoutError as e:
            raise _Retryable(f"timed out after {self.config.timeout_s}s") from e
        except urllib.error.URLError as e:
            raise _Retryable(f"connection error: {e.reason}") from e
        except (ConnectionError, OSError) as e:
            raise _Retryable(f"connection error: {e!r}") from e

    async def _post_httpx(self, httpx: Any, body: dict[str, Any]) -> dict[str, Any]:
        try:
            async with httpx.AsyncClient(timeout=self.config.timeout_s) as client:
                resp = await client.post(self.url, json=body, headers=self._headers())
        except httpx.TimeoutException as e:
            raise _Retryable(f"timed out after {self.config.timeout_s}s") from e
        except httpx.TransportError as e:
            raise _Retryable(f"connection error: {e!r}") from e
        if resp.status_code in _RETRY_STATUS:
            raise _Retryable(f"HTTP {resp.status_code}: {resp.text[:200]}")
        if resp.status_code >= 400:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        return resp.json()

    @staticmethod
    def _parse(reply: dict[str, Any], attempt: int) -> PolicyOutput:
        try:
            choice = reply["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            raise RuntimeError(
                f"malformed completion (no choices[0].message): {str(reply)[:200]}"
            ) from e
        reason = choice.get("finish_reason") or "stop"
        stop_reason = choice.get("stop_reason")
        if reason == "stop" and isinstance(stop_reason, str):
            text = restore_stop(text, stop_reason)
        info: dict[str, Any] = {"attempts": attempt + 1}
        if choice["message"].get("tool_calls"):
            info["tool_calls"] = choice["message"]["tool_calls"]
        lp = choice.get("logprobs")
        if isinstance(lp, dict) and lp.get("content"):
            info["logprobs"] = [float(t["logprob"]) for t in lp["content"]]
        if "usage" in reply:
            info["usage"] = reply["usage"]
        return PolicyOutput(text=text, finish_reason=reason, info=info)
