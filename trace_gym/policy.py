"""The batched, backend-neutral policy protocol the runner drives.

A policy receives a list of `Conversation`s (one per live episode) and returns one
`PolicyOutput` per conversation, in order. Conversations carry the exact turns so far
(text *and* token ids where a backend recorded them), so an LLM backend can extend the
context token by token and a replay from a prefix starts from exactly that prefix's
tokens - history is never re-rendered from text.

Every conversation has its own `seed`, derived by the runner from
(step, prompt id, node, child index), so sampling does not depend on how the work is
batched. A backend that fails on one conversation returns a `PolicyOutput` with
`error` set (or raises, and the runner records the failure on every branch of that
call); siblings go on either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from trace_gym.tree import Turn

__all__ = ["Conversation", "Policy", "PolicyOutput", "policy_version"]


@dataclass(frozen=True)
class Conversation:
    """One live episode as the policy sees it."""

    env_id: str
    task_id: str
    #: the env's reset observation (the task prompt)
    prompt: str
    #: turns so far, oldest first (each: action, observation, token ids when known)
    turns: tuple[Turn, ...]
    #: per-branch seed, independent of batch composition
    seed: int
    #: the env's reset info (tools schema for BFCL, etc.)
    reset_info: dict[str, Any] = field(default_factory=dict)
    #: the templated prompt's token ids, once a backend has computed them
    prompt_token_ids: tuple[int, ...] | None = None

    def messages(self, system: str | None = None) -> list[dict[str, str]]:
        """OpenAI/transformers chat messages (for display and text-only backends)."""
        msgs = [{"role": "system", "content": system}] if system else []
        msgs.append({"role": "user", "content": self.prompt})
        for t in self.turns:
            msgs.append({"role": "assistant", "content": t.action})
            msgs.append({"role": "user", "content": t.observation})
        return msgs

    @property
    def depth(self) -> int:
        return len(self.turns)


@dataclass
class PolicyOutput:
    """One generated assistant turn."""

    text: str
    #: generated tokens exactly as sampled (None for text-only backends)
    token_ids: list[int] | None = None
    #: behaviour-policy logprobs of `token_ids` (see the backend's docs for which)
    logprobs: list[float] | None = None
    #: tokens the backend appended before generating: the templated prompt on the first
    #: turn, afterwards the previous observation's tokens (chat-template wrapping included)
    context_token_ids: list[int] | None = None
    #: "stop", "length", "overflow" (context would exceed the model's window), ...
    finish_reason: str = "stop"
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Policy(Protocol):
    """Anything with ``generate(conversations) -> outputs`` (same length, same order)."""

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]: ...


def policy_version(policy: Any) -> int | str | None:
    """The version of the weights `policy` generates with, if it exposes one.

    A policy whose weights change during training (a backend synced from the trainer)
    says which ones it holds with a ``version`` attribute (an int or a string); the
    runner records it on every node it generates. None when there is none.
    """
    version = getattr(policy, "version", None)
    if version is None or isinstance(version, (int, str)) and not isinstance(version, bool):
        return version
    return str(version)
