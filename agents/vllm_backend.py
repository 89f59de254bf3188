"""`VLLMPolicy`: token-faithful batched sampling on a vLLM engine (optional extra, GPU).

Same token contract as `HFPolicy` (`trace_gym.agents.context`): contexts are built from
recorded token ids and sent as ``{"prompt_token_ids": [...]}``, so vLLM never re-renders
history. With **prefix caching on** (the default here), a replay from a prefix reuses
the KV cache of the prefix's tokens, and the roots of one prompt share the prompt's.

Per conversation: ``SamplingParams(n=1, seed=conversation.seed, temperature, top_p,
max_tokens, stop=<format's stop strings>, include_stop_str_in_output=True,
logprobs=0)``. The text returned is re-derived as ``tokenizer.decode(token_ids,
skip_special_tokens=True)`` so text and ids always agree. Logprobs are the ones vLLM
reports for the sampled tokens: with vLLM's default ``logprobs_mode="raw_logprobs"``
they are the model's log-softmax *before* temperature and top-p; pass
``logprobs_mode="processed_logprobs"`` in ``engine_kwargs`` (vLLM >= 0.10) to get them
after temperature and top-p. Say which one you train with.

n-sampling: `sample_n(conversation, n)` draws n continuations of one context in one
request (vLLM's ``n``; their seeds are no longer independent of each other). LoRA:
``lora_path`` attaches an adapter to every request (the engine is built with
``enable_lora=True``).

vLLM is imported lazily; without it, constructing a `VLLMPolicy` from a model path
raises `DependencyNotInstalled`. Tests drive it with a fake engine that honours
``LLM.generate(prompts=[{"prompt_token_ids": ...}], sampling_params=[...])``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from trace_gym.agents.context import ChatTokens, Context
from trace_gym.agents.formats import ReActFormat
from trace_gym.agents.hf import SamplingConfig

from trace_gym.errors import ConfigError, DependencyNotInstalled
from trace_gym.policy import Conversation, PolicyOutput

__all__ = ["VLLMPolicy"]

logger = logging.getLogger(__name__)


def _vllm():
    try:
        import vllm
    except ImportError as e:
        raise DependencyNotInstalled("vLLM", 'pip install "trace-gym[vllm]" (GPU machines)') from e
    return vllm


class VLLMPolicy:
    """A `Policy` over a vLLM ``LLM`` engine (or any object with its ``generate`` API)."""

    def __init__(
        self,
        model: str | None = None,
        *,
        llm: Any = None,
        tokenizer: Any = None,
        sampling: SamplingConfig | None = None,
        formats: dict[str, ReActFormat] | None = None,
        lora_path: str | None = None,
        sampling_params_cls: Any = None,
        **engine_kwargs: Any,
    ):
        if llm is None:
            if model is None:
                raise ConfigError("pass a model path/hub id or a ready engine (llm=...)")
            vllm = _vllm()
            engine_kwargs.setdefault("enable_prefix_caching", True)
            if lora_path:
                engine_kwargs.setdefault("enable_lora", True)
            llm = vllm.LLM(model=model, **engine_kwargs)
        if sampling_params_cls is None:
            sampling_params_cls = _vllm().SamplingParams
        self.llm = llm
        self.tokenizer = tokenizer if tokenizer is not None else llm.get_tokenizer()
        self.sampling = sampling or SamplingConfig()
        self.chat = ChatTokens(self.tokenizer, formats)
        self.params_cls = sampling_params_cls
        self.max_context = self.sampling.max_context or _max_model_len(llm)
        self.lora = None
        if lora_path:
            from vllm.lora.request import LoRARequest

            self.lora = LoRARequest("trace-gym-adapter", 1, lora_path)

    # ------------------------------------------------------------------ policy
    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        """One turn per conversation (one batched engine call; per-row failures are outputs)."""
        outputs: list[PolicyOutput | None] = [None] * len(conversations)
        prompts, params, ctxs, index = [], [], [], []
        for i, conv in enumerate(conversations):
            try:
                ctx, p = self._request(conv, n=1)
            except Exception as e:
                outputs[i] = PolicyOutput(text="", error=f"context: {e!r}")
                continue
            if p is None:
                outputs[i] = _overflow(ctx)
                continue
            prompts.append({"prompt_token_ids": ctx.ids})
            params.append(p)
            ctxs.append(ctx)
            index.append(i)
        if prompts:
            results = self._engine(prompts, params)
            for i, ctx, res in zip(index, ctxs, results, strict=True):
                outputs[i] = self._output(res.outputs[0], ctx)
        return outputs  # type: ignore[return-value]

    def sample_n(self, conv: Conversation, n: int) -> list[PolicyOutput]:
        """n continuations of one conversation in one request (vLLM n-sampling)."""
        ctx, p = self._request(conv, n=n)
        if p is None:
            return [_overflow(ctx) for _ in range(n)]
        res = self._engine([{"prompt_token_ids": ctx.ids}], [p])[0]
        return [self._output(o, ctx) for o in res.outputs]

    # ------------------------------------------------------------------ pieces
    def _request(self, conv: Conversation, n: int) -> tuple[Context, Any]:
        fmt = self.chat.format(conv.env_id)
        ctx = self.chat.context(conv)
        room = self.max_context - len(ctx.ids)
        budget = min(self.sampling.max_new_tokens or fmt.max_new_tokens, room)
        if budget <= 0:
            return ctx, None
        kw: dict[str, Any] = dict(
            n=n,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            max_tokens=budget,
            seed=int(conv.seed) % (2**63),
            logprobs=0,
            skip_special_tokens=True,
        )
        if fmt.stop:
            kw.update(stop=list(fmt.stop), include_stop_str_in_output=True)
        return ctx, self.params_cls(**kw)

    def _engine(self, prompts: list[dict], params: list[Any]) -> list[Any]:
        kw: dict[str, Any] = {"use_tqdm": False}
        if self.lora is not None:
            kw["lora_request"] = self.lora
        return self.llm.generate(prompts, params, **kw)

    def _output(self, out: Any, ctx: Context) -> PolicyOutput:
        ids = list(out.token_ids)
        lps = None
        if getattr(out, "logprobs", None):
            lps = [float(step[t].logprob) for step, t in zip(out.logprobs, ids, strict=False)]
        reason = out.finish_reason or "stop"
        if reason == "length" and len(ctx.ids) + len(ids) >= self.max_context:
            reason = "overflow"  # cut by the context window, not by max_tokens
        return PolicyOutput(
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            token_ids=ids,
            logprobs=lps,
            context_token_ids=ctx.appended,
            finish_reason=reason,
            info={"context_tokens": len(ctx.ids), "stop_reason": getattr(out, "stop_reason", None)},
        )


def _overflow(ctx: Context) -> PolicyOutput:
    return PolicyOutput(text="", token_ids=[], logprobs=[], context_token_ids=ctx.appended,
                        finish_reason="overflow", info={"context_tokens": len(ctx.ids)})


def _max_model_len(llm: Any) -> int:
    try:
        return int(llm.llm_engine.model_config.max_model_len)
    except AttributeError:
        return int(getattr(llm, "max_model_len", 32768))
