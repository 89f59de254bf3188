"""`VLLMPolicy`: token-faithful batched sampling on a vLLM engine (optional extra, GPU).

Same token contract as `HFPolicy` (`trace_gym.agents.context`): contexts are built from
recorded token ids and sent as ``{"prompt_token_ids": [...]}``, so vLLM never re-renders
history. With **prefix caching on** (the default here), a replay from a prefix reuses
the KV cache of the prefix's tokens, and the roots of one prompt share the prompt's.

Per conversation: ``SamplingParams(n=1, seed=conversation.seed, temperature, top_p,
max_tokens, stop=<format's stop strings>, include_stop_str_in_output=True,
logprobs=0)`` (``detokenize=False`` when the format has no stop strings). The text returned is re-derived as ``tokenizer.decode(token_ids,
skip_special_tokens=True)`` so text and ids always agree.

Logprobs are the ones vLLM reports for the sampled tokens. A `VLLMPolicy` that builds its
engine asks for ``logprobs_mode="processed_logprobs"``: the log-probabilities of the
distribution vLLM sampled from, after temperature *and* top-p (the nucleus
renormalised). At ``top_p = 1`` that is ``log_softmax(logits / T)``, the same quantity
`HFPolicy` reports; at ``top_p < 1`` vLLM (0.32) has no mode that gives
``log_softmax(logits / T)`` before top-p (``raw_logprobs`` is before temperature), so the
two backends differ by ``log(nucleus mass)`` there. ``info["logprob_kind"]`` says which:
"temperature" (log_softmax(logits / T)), "sampling" (after top-p) or "raw" (an engine
built elsewhere with vLLM's default ``raw_logprobs``: before temperature).

n-sampling: `sample_n(conversation, n)` draws n continuations of one context in one
request (vLLM's ``n``; their seeds are no longer independent of each other). LoRA:
``lora_path`` (or ``lora=True`` with no adapter yet) builds the engine with
``enable_lora=True`` and attaches the current adapter to every request;
`load_adapter(path)` switches to a new adapter under a fresh ``LoRARequest`` id (what
`trace_gym.trainers.sync.sync_weights` calls after each optimiser step).

Versions: ``version`` counts the weight syncs this policy has received (0 at start);
the runner records it on every node, so a tree says which weights produced each turn.

vLLM is imported lazily; without it, constructing a `VLLMPolicy` from a model path
raises `DependencyNotInstalled`. Tests drive it with a fake engine that honours
``LLM.generate(prompts=[{"prompt_token_ids": ...}], sampling_params=[...])``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

from trace_gym.agents.context import ChatTokens, Context
from trace_gym.agents.formats import ReActFormat
from trace_gym.agents.hf import SamplingConfig

from trace_gym.errors import ConfigError, DependencyNotInstalled
from trace_gym.policy import Conversation, PolicyOutput

__all__ = ["VLLMPolicy", "new_llm"]

logger = logging.getLogger(__name__)


def _vllm():
    try:
        import vllm
    except ImportError as e:
        raise DependencyNotInstalled("vLLM", 'pip install "trace-gym[vllm]" (GPU machines)') from e
    return vllm


def new_llm(model: str, **engine_kwargs: Any) -> Any:
    """``vllm.LLM(model=model, **engine_kwargs)``, safe to build after numba was imported.

    vLLM (0.32, CPU platform) rebinds its Triton kernels at engine start by scanning every
    module namespace and calling ``vars(value).get("kernel")`` on each value with a
    ``__dict__``. llvmlite's lock-wrapped library handle (``llvmlite.binding.ffi.lib``,
    loaded with numba: the HotpotQA retriever's batched BM25 kernels) answers *any* missing
    attribute with a wrapped C function, ``__dict__`` included, and the engine fails with
    ``'_lib_fn_wrapper' object has no attribute 'get'``. `_dunder_safe_llvmlite` makes the
    handle raise ``AttributeError`` for dunder names instead, as ``ctypes.CDLL`` itself does.
    """
    _dunder_safe_llvmlite()
    return _vllm().LLM(model=model, **engine_kwargs)


def _dunder_safe_llvmlite() -> None:
    """Missing ``__dunder__`` attributes of llvmlite's library wrapper raise (idempotent).

    A no-op while llvmlite is not imported: the scan only meets modules already loaded.
    """
    ffi = sys.modules.get("llvmlite.binding.ffi")
    wrapper = getattr(ffi, "_lib_wrapper", None)
    if wrapper is None or getattr(wrapper, "_dunder_safe", False):
        return
    fallback = wrapper.__getattr__

    def __getattr__(self: Any, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # C symbols are never dunders (ctypes.CDLL's rule)
        return fallback(self, name)

    wrapper.__getattr__ = __getattr__
    wrapper._dunder_safe = True


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
        lora: bool = False,
        max_lora_rank: int = 16,
        sampling_params_cls: Any = None,
        **engine_kwargs: Any,
    ):
        if llm is None:
            if model is None:
                raise ConfigError("pass a model path/hub id or a ready engine (llm=...)")
            engine_kwargs.setdefault("enable_prefix_caching", True)
            engine_kwargs.setdefault("logprobs_mode", "processed_logprobs")
            if lora_path or lora:
                engine_kwargs.setdefault("enable_lora", True)
                engine_kwargs.setdefault("max_lora_rank", max_lora_rank)
            llm = new_llm(model, **engine_kwargs)
        if sampling_params_cls is None:
            sampling_params_cls = _vllm().SamplingParams
        self.llm = llm
        self.tokenizer = tokenizer if tokenizer is not None else llm.get_tokenizer()
        self.sampling = sampling or SamplingConfig()
        self.chat = ChatTokens(self.tokenizer, formats)
        self.params_cls = sampling_params_cls
        self.max_context = self.sampling.max_context or _max_model_len(llm)
        self.logprobs_mode = _logprobs_mode(llm)
        #: weight syncs received (bumped by trace_gym.trainers.sync.sync_weights)
        self.version = 0
        #: seconds the last weight push took (set by sync_weights)
        self.last_push_s: float | None = None
        self.lora_enabled = bool(lora_path or lora)
        self.lora = None
        self._lora_ids = 0
        if lora_path:
            self.load_adapter(lora_path)

    def load_adapter(self, path: str) -> None:
        """Serve the LoRA adapter saved in `path` from now on (a fresh adapter id)."""
        if not self.lora_enabled:
            raise ConfigError(
                "this VLLMPolicy was built without LoRA: pass lora=True or lora_path=..."
            )
        from vllm.lora.request import LoRARequest

        self._lora_ids += 1
        self.lora = LoRARequest(f"trace-gym-adapter-{self._lora_ids}", self._lora_ids, path)

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
                outputs[i] = self._output(res.outputs[0], ctx, res)
        return outputs  # type: ignore[return-value]

    def sample_n(self, conv: Conversation, n: int) -> list[PolicyOutput]:
        """n continuations of one conversation in one request (vLLM n-sampling)."""
        ctx, p = self._request(conv, n=n)
        if p is None:
            return [_overflow(ctx) for _ in range(n)]
        res = self._engine([{"prompt_token_ids": ctx.ids}], [p])[0]
        return [self._output(o, ctx, res) for o in res.outputs]

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
        if fmt.stop:  # vLLM matches stop strings on its detokenized text
            kw.update(stop=list(fmt.stop), include_stop_str_in_output=True)
        else:
            # the text is re-derived from the ids, so vLLM's detokenizer is not needed; with
            # logprobs on it decodes every sampled token again, which halved tokens/s on CPU
            kw["detokenize"] = False
        return ctx, self.params_cls(**kw)

    def _engine(self, prompts: list[dict], params: list[Any]) -> list[Any]:
        kw: dict[str, Any] = {"use_tqdm": False}
        if self.lora is not None:
            kw["lora_request"] = self.lora
        return self.llm.generate(prompts, params, **kw)

    def _logprob_kind(self) -> str:
        """Which log-probabilities the engine reports at this policy's sampling settings."""
        t = self.sampling.temperature
        if "processed" not in self.logprobs_mode:  # before temperature and top-p
            return "temperature" if t in (0, 1) else "raw"
        return "sampling" if self.sampling.top_p < 1 and t > 0 else "temperature"

    def _output(self, out: Any, ctx: Context, request: Any = None) -> PolicyOutput:
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
            info={
                "context_tokens": len(ctx.ids),
                "stop_reason": getattr(out, "stop_reason", None),
                # prompt tokens served by the prefix cache (vLLM V1; None when not reported)
                "cached_tokens": getattr(request, "num_cached_tokens", None),
                "logprob_kind": self._logprob_kind(),
            },
        )


def _logprobs_mode(llm: Any) -> str:
    try:
        return str(llm.llm_engine.model_config.logprobs_mode)
    except AttributeError:
        return "raw_logprobs"


def _overflow(ctx: Context) -> PolicyOutput:
    return PolicyOutput(
        text="",
        token_ids=[],
        logprobs=[],
        context_token_ids=ctx.appended,
        finish_reason="overflow",
        info={"context_tokens": len(ctx.ids)},
    )


def _max_model_len(llm: Any) -> int:
    try:
        return int(llm.llm_engine.model_config.max_model_len)
    except AttributeError:
        return int(getattr(llm, "max_model_len", 32768))
