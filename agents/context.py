"""The token contract: a conversation's context as exact token ids, never re-rendered.

Shared by every token-level backend (HF transformers, vLLM):

1. **At reset** the chat template is applied once, to the system prompt and the task
   prompt (with the env's tools through the template's native ``tools=`` argument when
   the template has one), with the generation prompt added. Those ids are the
   conversation's ``prompt_token_ids``.
2. **Generated tokens are kept exactly as sampled**, stop string and end-of-turn token
   included (`PolicyOutput.token_ids`).
3. **Each observation is tokenised on its own and appended**, wrapped in the template's
   turn markers. The markers are found once per (template, role) by rendering a probe
   conversation whose assistant and observation contents are sentinels and cutting the
   text around them: ``between`` is what the template puts after an assistant message
   and before the observation's content (for ChatML: ``<|im_end|>\\n<|im_start|>user\\n``)
   and ``after`` is what follows the content up to and including the next generation
   prompt (``<|im_end|>\\n<|im_start|>assistant\\n``). When the model ended its turn with
   an end-of-turn token already, the copy of that token at the start of ``between`` is
   dropped. The observation text is tokenised with special tokens split (an observation
   cannot inject template markers).
4. **History is rebuilt from token ids**: ``prompt_token_ids`` + for each turn its
   ``token_ids`` + its ``obs_token_ids``. Nothing earlier is ever re-rendered from text
   (templates such as Qwen3's drop earlier ``<think>`` content, and re-tokenising text
   drifts), so a replay from a prefix starts from exactly the prefix's ids.

Turns without token ids (made by a text-only backend or a scripted policy) are tokenised
from their text as a fallback; that is the only place text becomes tokens after reset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trace_gym.agents.formats import ReActFormat, format_for, system_prompt, tools_of

from trace_gym.errors import ConfigError
from trace_gym.policy import Conversation

__all__ = ["ChatTokens", "Context", "obs_role"]

_ASSISTANT_SENTINEL = "\u2063ASSISTANT\u2063"
_OBS_SENTINEL = "\u2063OBSERVATION\u2063"


def obs_role(info: dict | None) -> str | None:
    """The chat role an env gave its observation in the step info (None: the format's)."""
    role = (info or {}).get("obs_role")
    return role if role in ("user", "tool") else None


@dataclass(frozen=True)
class Context:
    """A conversation's full context ids and the part this call appended."""

    #: every token the model conditions on (prompt + turns + observations)
    ids: list[int]
    #: what this call added: the templated prompt on the first turn, else the last observation
    appended: list[int]
    #: the templated prompt ids (the first ``len(prompt)`` entries of ``ids``)
    prompt: list[int]


class ChatTokens:
    """Builds contexts for a tokenizer with a chat template, following the token contract."""

    def __init__(self, tokenizer: Any, formats: dict[str, ReActFormat] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "the tokenizer has no chat template; use an instruct/chat model or set "
                "tokenizer.chat_template (trace_gym.agents.tiny.CHAT_TEMPLATE is a ChatML one)"
            )
        self.tokenizer = tokenizer
        self.formats = dict(formats or {})
        self.native_tools = "tools" in tokenizer.chat_template
        self._wraps: dict[tuple[str, tuple], tuple[str, str]] = {}
        self.eos_ids = self._eos_ids()

    # ------------------------------------------------------------------ pieces
    def format(self, env_id: str) -> ReActFormat:
        return self.formats.get(env_id) or format_for(env_id)

    def _eos_ids(self) -> set[int]:
        tok = self.tokenizer
        ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        for name in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
            i = tok.convert_tokens_to_ids(name)
            if isinstance(i, int) and i != tok.unk_token_id and i >= 0:
                ids.add(i)
        return ids

    def _render(
        self, messages: list[dict], *, tools=None, add_generation_prompt: bool, **kw
    ) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **kw
        )

    def encode(self, text: str, *, split_special: bool = False) -> list[int]:
        """Token ids of `text` with no BOS/EOS added."""
        kw = {"split_special_tokens": True} if split_special else {}
        return list(self.tokenizer(text, add_special_tokens=False, **kw)["input_ids"])

    def prompt_ids(self, conv: Conversation) -> list[int]:
        """The templated prompt (system + task prompt + generation prompt), applied once."""
        fmt = self.format(conv.env_id)
        tools = tools_of(conv, fmt) if self.native_tools and fmt.tool_detail == "full" else None
        messages = [
            {"role": "system", "content": system_prompt(conv, fmt, native_tools=self.native_tools)},
            {"role": "user", "content": conv.prompt},
        ]
        text = self._render(
            messages, tools=tools, add_generation_prompt=True, **fmt.template_kwargs
        )
        return self.encode(text)

    def wrap(self, fmt: ReActFormat, role: str | None = None) -> tuple[str, str]:
        """(between, after): the template's text around an observation (see module doc)."""
        role = role or fmt.obs_role
        key = (role, tuple(sorted(fmt.template_kwargs.items())))
        if key not in self._wraps:
            self._wraps[key] = self._probe_wrap(role, fmt.template_kwargs)
        return self._wraps[key]

    def _probe_wrap(self, role: str, template_kwargs: dict) -> tuple[str, str]:
        messages = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _ASSISTANT_SENTINEL},
            {"role": role, "content": _OBS_SENTINEL},
        ]
        try:
            text = self._render(messages, add_generation_prompt=True, **template_kwargs)
        except Exception:  # a template without a tool role: observations go in as user turns
            if role == "user":
                raise
            return self._probe_wrap("user", template_kwargs)
        ia, io = text.find(_ASSISTANT_SENTINEL), text.find(_OBS_SENTINEL)
        if ia < 0 or io < ia:
            raise ConfigError(
                "cannot locate the turn markers of this chat template (the probe conversation "
                "did not render its messages in order); pass an explicit ReActFormat or template"
            )
        return text[ia + len(_ASSISTANT_SENTINEL) : io], text[io + len(_OBS_SENTINEL) :]

    def obs_ids(
        self, observation: str, fmt: ReActFormat, prev_token_ids: list[int], role: str | None = None
    ) -> list[int]:
        """The tokens appended for one observation after an assistant turn.

        `role` is the observation's chat role when the env says it (BFCL's step info
        carries ``obs_role``: tool results vs the next user message); else the format's.
        """
        between, after = self.wrap(fmt, role)
        ids = self.encode(between)
        if (
            prev_token_ids
            and prev_token_ids[-1] in self.eos_ids
            and ids
            and ids[0] == prev_token_ids[-1]
        ):
            ids = ids[1:]  # the model already closed its turn
        return ids + self.encode(observation, split_special=True) + self.encode(after)

    def action_ids(self, text: str) -> list[int]:
        """Fallback for turns a text-only policy made: their text, tokenised."""
        return self.encode(text)

    # ------------------------------------------------------------------ contexts
    def context(self, conv: Conversation) -> Context:
        """The full context of `conv` from its token ids (see the module docstring)."""
        fmt = self.format(conv.env_id)
        prompt = (
            list(conv.prompt_token_ids)
            if conv.prompt_token_ids is not None
            else self.prompt_ids(conv)
        )
        ids = list(prompt)
        appended = list(prompt) if not conv.turns else []
        for k, turn in enumerate(conv.turns):
            gen = (
                list(turn.token_ids) if turn.token_ids is not None else self.action_ids(turn.action)
            )
            ids += gen
            if turn.obs_token_ids is not None:
                obs = list(turn.obs_token_ids)
            else:
                obs = self.obs_ids(turn.observation, fmt, gen, obs_role(turn.info))
            ids += obs
            if k == len(conv.turns) - 1:
                appended = obs
        return Context(ids=ids, appended=appended, prompt=prompt)
