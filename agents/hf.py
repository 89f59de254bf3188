"""`HFPolicy`: batched ReAct sampling on HF transformers, token-faithful, CPU or GPU.

One `generate` call takes many conversations, builds each context with the token
contract (`trace_gym.agents.context`), left-pads them into one batch and runs a small
sampling loop over the model with a KV cache: one batched forward per step, then one
vectorised inverse-CDF draw over the batch, where row b's uniform comes from its own
CPU ``torch.Generator`` seeded by ``Conversation.seed`` (one draw per step). A row's
samples therefore do not depend on which other rows share its batch (up to
floating-point differences of padded attention, which change a sample only when a draw
falls within ~1e-6 of a token boundary). A row that finishes leaves the batch and its
KV cache at once, so a batch's cost follows its live rows, not its longest row.

Sampling: temperature, then top-p (nucleus) over the temperature-scaled distribution;
``temperature == 0`` is greedy.

**Logprobs** (`PolicyOutput.logprobs`): for each sampled token, its log-probability under
the temperature-scaled distribution ``log_softmax(logits / T)`` *before* top-p
filtering (with ``T = 1`` when greedy). That is what a trainer recomputes from the
same tokens; with ``top_p = 1`` it is exactly the sampling distribution.

**Turn ends**: at the first stop string of the env's format (kept in text and tokens),
at an end-of-turn token (kept in the token ids; special tokens are skipped in the
text), at ``max_new_tokens`` (``finish_reason="length"``), or at the context window
(``finish_reason="overflow"``; a context that is already full generates nothing). The
text is ``tokenizer.decode(token_ids, skip_special_tokens=True)``.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_gym.agents.context import ChatTokens, Context
from trace_gym.agents.formats import ReActFormat, find_stop, formats_with

from trace_gym.errors import ConfigError
from trace_gym.optional import require
from trace_gym.policy import Conversation, PolicyOutput

__all__ = ["HFPolicy", "SamplingConfig", "model_formats", "read_formats"]

logger = logging.getLogger(__name__)


@dataclass
class SamplingConfig:
    """How an assistant turn is sampled."""

    #: softmax temperature (0 = greedy)
    temperature: float = 1.0
    #: nucleus mass kept (1 = no filtering)
    top_p: float = 1.0
    #: cap on one turn's tokens (None: the env format's default)
    max_new_tokens: int | None = None
    #: context window in tokens (None: the model's max_position_embeddings)
    max_context: int | None = None
    #: most conversations per forward batch
    max_batch: int = 16

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_context is not None and self.max_context < 2:
            raise ConfigError(f"max_context must be >= 2, got {self.max_context}")
        if self.max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {self.max_batch}")


@dataclass
class _Row:
    """One conversation inside a sampling batch."""

    index: int
    context: Context
    seed: int
    budget: int
    window_limited: bool
    stop: tuple[str, ...]


#: per-env format overrides a model directory may carry (the tiny models do)
FORMATS_FILE = "trace_gym_formats.json"


def read_formats(path: str) -> dict[str, dict[str, Any]]:
    """The chat formats saved beside a model at `path` (`FORMATS_FILE`), or none."""
    f = Path(path) / FORMATS_FILE
    return json.loads(f.read_text()) if f.is_file() else {}


def model_formats(path: str) -> dict[str, ReActFormat]:
    """The ReAct formats for a model directory: the defaults plus the overrides it carries."""
    return formats_with(read_formats(path))


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _select_rows(cache: Any, sel: Any) -> Any:
    """The KV cache restricted to batch rows `sel` (a LongTensor of positions)."""
    if callable(getattr(cache, "batch_select_indices", None)):
        cache.batch_select_indices(sel)
        return cache
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer in layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys = layer.keys.index_select(0, sel)
                layer.values = layer.values.index_select(0, sel)
        return cache
    if isinstance(cache, tuple):  # legacy tuple of (key, value) per layer
        return tuple((k.index_select(0, sel), v.index_select(0, sel)) for k, v in cache)
    raise ConfigError(f"cannot drop finished rows from a {type(cache).__name__} KV cache")


class HFPolicy:
    """A `Policy` over a transformers causal LM and its tokenizer (chat template required)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        sampling: SamplingConfig | None = None,
        *,
        formats: dict[str, ReActFormat] | None = None,
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingConfig()
        self.chat = ChatTokens(tokenizer, formats)
        self.max_context = self.sampling.max_context or int(
            getattr(model.config, "max_position_embeddings", 0) or 4096
        )
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # transformers >= 5.2x renamed past_key_values to cache
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        #: weight syncs received (bumped by trace_gym.trainers.sync.sync_weights); the
        #: runner records it on each node it generates
        self.version = 0

    @classmethod
    def from_pretrained(
        cls, path: str, *, device: str = "cpu", dtype: str | None = None, **sampling: Any
    ) -> HFPolicy:
        """Load a model directory (or hub id) with its tokenizer; `sampling` -> SamplingConfig."""
        torch = require("torch", "train")
        transformers = require("transformers", "train")
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        formats = model_formats(path)
        torch_dtype = (
            getattr(torch, dtype)
            if dtype
            else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
        )
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(
            device
        )
        return cls(model, tokenizer, SamplingConfig(**sampling), formats=formats)

    @property
    def device(self):
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ policy
    def context(self, conv: Conversation) -> Context:
        """The exact context ids the model will see for `conv`."""
        return self.chat.context(conv)

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        """One assistant turn per conversation (same order); failures are per-row outputs."""
        outputs: list[PolicyOutput | None] = [None] * len(conversations)
        rows: list[_Row] = []
        for i, conv in enumerate(conversations):
            try:
                row = self._row(i, conv)
            except Exception as e:  # a bad conversation fails alone
                logger.warning("conversation %s failed before sampling: %r", conv.task_id, e)
                outputs[i] = PolicyOutput(text="", error=f"context: {e!r}")
                continue
            if row.budget <= 0:
                outputs[i] = PolicyOutput(
                    text="",
                    token_ids=[],
                    logprobs=[],
                    context_token_ids=row.context.appended,
                    finish_reason="overflow",
                    info={"context_tokens": len(row.context.ids)},
                )
                continue
            rows.append(row)
        # similar lengths together waste less padding; results go back by index
        rows.sort(key=lambda r: len(r.context.ids))
        for start in range(0, len(rows), self.sampling.max_batch):
            chunk = rows[start : start + self.sampling.max_batch]
            try:
                results = self._sample(chunk)
            except Exception as e:
                logger.exception("sampling failed for a batch of %d", len(chunk))
                results = [None] * len(chunk)
                err = f"sampling: {e!r}"
            for row, res in zip(chunk, results, strict=True):
                if res is None:
                    outputs[row.index] = PolicyOutput(
                        text="", error=err, context_token_ids=row.context.appended
                    )
                    continue
                ids, lps, reason = res
                outputs[row.index] = PolicyOutput(
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    token_ids=ids,
                    logprobs=lps,
                    context_token_ids=row.context.appended,
                    finish_reason=reason,
                    info={"context_tokens": len(row.context.ids)},
                )
        return outputs  # type: ignore[return-value]

    def generate_ids(
        self,
        contexts: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        max_new_tokens: int,
        stop: Sequence[str] = (),
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> list[tuple[list[int], list[float], str]]:
        """Token-in, token-out sampling: (ids, logprobs, finish reason) per context.

        For servers that build contexts themselves (`trace_gym.agents.verl_server`): the
        same sampler, stop handling and logprobs as `generate`, with the sampling
        settings of this call (None: the policy's own). A context that fills the window
        generates nothing (``"overflow"``).
        """
        s = self.sampling
        sampling = SamplingConfig(
            temperature=s.temperature if temperature is None else float(temperature),
            top_p=s.top_p if top_p is None else float(top_p),
            max_new_tokens=max_new_tokens,
            max_context=s.max_context,
            max_batch=s.max_batch,
        )
        runner = copy.copy(self)  # same model and tokenizer, this call's sampling settings
        runner.sampling = sampling
        results: list[tuple[list[int], list[float], str]] = [([], [], "overflow")] * len(contexts)
        rows = []
        for i, (ids, seed) in enumerate(zip(contexts, seeds, strict=True)):
            room = self.max_context - len(ids)
            if room > 0:
                ctx = Context(ids=list(ids), appended=[], prompt=[])
                rows.append(
                    _Row(
                        i,
                        ctx,
                        int(seed),
                        min(max_new_tokens, room),
                        room < max_new_tokens,
                        tuple(stop),
                    )
                )
        for start in range(0, len(rows), sampling.max_batch):
            chunk = rows[start : start + sampling.max_batch]
            for row, res in zip(chunk, runner._sample(chunk), strict=True):
                results[row.index] = res
        return results

    def _row(self, index: int, conv: Conversation) -> _Row:
        fmt = self.chat.format(conv.env_id)
        ctx = self.chat.context(conv)
        vocab = self.model.get_input_embeddings().num_embeddings
        if any(not 0 <= i < vocab for i in ctx.ids):
            raise ValueError(f"context has token ids outside the model's vocabulary [0, {vocab})")
        want = self.sampling.max_new_tokens or fmt.max_new_tokens
        room = self.max_context - len(ctx.ids)
        return _Row(index, ctx, int(conv.seed), min(want, room), room < want, fmt.stop)

    # ------------------------------------------------------------------ sampling
    def _sample(self, rows: list[_Row]) -> list[tuple[list[int], list[float], str]]:
        """Sample every row to its end; a row that finishes leaves the batch at once."""
        torch = require("torch", "train")
        device = self.device
        cfg = self.sampling
        input_ids, mask = self._left_pad(rows, device)  # [B, width]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, width]
        # one CPU generator per row: row b's draws depend only on its own seed
        gens = [torch.Generator().manual_seed(r.seed % (2**63)) for r in rows]
        out_ids: list[list[int]] = [[] for _ in rows]
        out_lps: list[list[float]] = [[] for _ in rows]
        reasons: list[str | None] = [None] * len(rows)
        tail = max((len(s) for r in rows for s in r.stop), default=0) + 4
        live = list(range(len(rows)))  # batch position -> row index

        with torch.no_grad():
            out = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = _cache_of(out)
            logits = out.logits[:, -1, :].float()  # [L, V], L = live rows
            for _ in range(max(r.budget for r in rows)):
                logp = torch.log_softmax(
                    logits / cfg.temperature if cfg.temperature > 0 else logits, dim=-1
                )
                # one uniform per live row from its own generator (one draw per sampled token)
                u = torch.tensor(
                    [float(torch.rand(1, generator=gens[b])) for b in live], device=device
                )
                picked = self._pick(logp, u)  # [L]
                picked_lp = logp.gather(1, picked[:, None])[:, 0]  # [L]
                keep = self._record(
                    rows, live, picked, picked_lp, (out_ids, out_lps, reasons), tail
                )
                if not keep:
                    break
                if len(keep) < len(live):  # finished rows leave the batch (and the KV cache)
                    sel = torch.tensor(keep, device=device)
                    picked, mask, positions = picked[sel], mask[sel], positions[sel]
                    cache = _select_rows(cache, sel)
                    live = [live[j] for j in keep]
                mask = torch.cat(
                    [mask, torch.ones((len(live), 1), dtype=torch.long, device=device)], dim=1
                )
                positions = positions[:, -1:] + 1
                out = self.model(
                    input_ids=picked[:, None],
                    attention_mask=mask,
                    position_ids=positions,
                    use_cache=True,
                    **{self._cache_kw: cache},
                )
                cache = _cache_of(out)
                logits = out.logits[:, -1, :].float()
        return list(zip(out_ids, out_lps, [r or "length" for r in reasons], strict=True))

    def _record(
        self,
        rows: list[_Row],
        live: list[int],
        picked: Any,
        picked_lp: Any,
        outs: tuple[list[list[int]], list[list[float]], list[str | None]],
        tail: int,
    ) -> list[int]:
        """Append each live row's sampled token; the batch positions of rows still going."""
        out_ids, out_lps, reasons = outs
        keep = []
        for j, (b, tok, lp) in enumerate(
            zip(live, picked.tolist(), picked_lp.tolist(), strict=True)
        ):
            out_ids[b].append(tok)
            out_lps[b].append(lp)
            reasons[b] = self._finished(rows[b], out_ids[b], tail)
            if reasons[b] is None:
                keep.append(j)
        return keep

    def _left_pad(self, rows: list[_Row], device: Any) -> tuple[Any, Any]:
        """input_ids and attention mask [B, width] of the rows' contexts, left-padded."""
        torch = require("torch", "train")
        width = max(len(r.context.ids) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, r in enumerate(rows):
            n = len(r.context.ids)
            input_ids[b, width - n :] = torch.tensor(r.context.ids, dtype=torch.long)
            mask[b, width - n :] = 1
        return input_ids.to(device), mask.to(device)

    def _pick(self, logp, u):
        """Token ids [B] from temperature-scaled log-probs [B, V] and uniforms u [B].

        Inverse-CDF sampling over the top-p nucleus (tokens sorted by probability, the
        smallest prefix whose mass reaches top_p, always at least the top token);
        greedy at temperature 0.
        """
        torch = require("torch", "train")
        if self.sampling.temperature == 0:
            return torch.argmax(logp, dim=-1)
        # stable: tied probabilities (common in bf16) keep token-id order. An unstable sort may order a tie by what else is in the row, so a
        # rounding-size change elsewhere (another batch, another rank) swapped the token drawn
        probs, order = torch.sort(logp.exp(), dim=-1, descending=True, stable=True)  # [B, V]
        if self.sampling.top_p < 1:
            keep = (probs.cumsum(-1) - probs) < self.sampling.top_p
            probs = torch.where(keep, probs, torch.zeros_like(probs))
        cdf = probs.cumsum(-1)  # [B, V]
        idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp(
            max=probs.shape[-1] - 1
        )  # [B, 1]
        return order.gather(1, idx)[:, 0]

    def _finished(self, row: _Row, ids: list[int], tail: int) -> str | None:
        if ids[-1] in self.chat.eos_ids:
            return "stop"
        if row.stop:
            text = self.tokenizer.decode(ids[-tail:], skip_special_tokens=True)
            if find_stop(text, row.stop) is not None:
                return "stop"
        if len(ids) >= row.budget:
            return "overflow" if row.window_limited else "length"
        return None
