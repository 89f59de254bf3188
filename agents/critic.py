"""`critic`: a causal-LM backbone with a scalar head, the paper's shared predictor.

Registered in `trace_gym.predict.PREDICTORS` as ``"critic"`` by its entry point
``"trace_gym.agents.critic:CriticPredictor"``, so the core never imports it.

It reads the shared serialisation of a state (`trace_gym.predict.base.serialize`:
``<|prompt|>`` + prompt + ``<|action|>``/``<|observation|>`` turns), tokenised and
**left-truncated with the prompt kept**: the prompt's tokens come first (cut to half
the budget only if the prompt alone is longer), then the most recent history tokens
that fit in ``max_tokens``. The backbone's last hidden state at the final token
(concatenated with the mean over all tokens by default, ``pooling="last+mean"``) goes
through a linear head to a logit; P(success) = sigmoid(logit). The sequence ends with
the tokenizer's EOS token, so the head always reads the same position's state.

Training (``update``): **binary cross-entropy on soft targets** - the bottom-up success
rates of the tree nodes, in [0, 1] - weighted by the number of leaves behind each
target (normalised to mean 1 per batch). BCE rather than MSE: the targets are empirical
success rates, BCE is the proper scoring rule for them, its gradient does not vanish
near 0 and 1 (where most prompts pile up), and it matches the `features` predictor.
The update batch comes from `trace_gym.predict.training_batch`, where prefixes make up
``prefix_share`` of the batch (default 0.06, as in the paper); `CriticPredictor.batch`
builds one with the critic's own share for standalone training.

Backbone: any transformers causal-LM directory or hub id (``model_path``; e.g. a local
Qwen3-0.6B), else a freshly built tiny Qwen3 (`trace_gym.agents.tiny.CRITIC_BACKBONE`,
random init), which is what the CPU tests use. ``device`` may differ from the policy's (a separate
GPU); on CUDA the forward runs under bf16 autocast with float32 master weights.

Presets (`CRITIC_PRESETS`, ``preset=``): ``"tiny"`` (the CPU defaults above) and
``"qwen3-0.6b"``, the paper's size for a GPU: ``Qwen/Qwen3-0.6B`` (a hub id; pass
``model_path`` for a local copy), 2048 tokens, lr 1e-5 (head 1e-3), one epoch of batches
of 32. An option passed explicitly wins over the preset's; an option left at None takes the
preset's value. The 0.6B preset has not been run here (no GPU and no downloads were
available); docs/agents.md, "The LM critic", gives the measured CPU figures.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from trace_gym.errors import ConfigError, did_you_mean
from trace_gym.optional import require
from trace_gym.predict.base import ACTION_TAG, OBS_TAG, PROMPT_TAG, State

__all__ = ["CRITIC_PRESETS", "CriticPredictor", "critic_options"]

#: pooling -> multiple of the hidden size the head reads
_POOLING = {"last": 1, "last+mean": 2}

#: the options a preset sets (None elsewhere: the tiny CPU defaults)
_DEFAULTS: dict[str, Any] = {
    "model_path": None,
    "max_tokens": 512,
    "lr": 3e-4,
    "head_lr": None,
    "epochs": 2,
    "batch_size": 16,
}

#: preset name -> the options it sets (docs/agents.md, "The LM critic")
CRITIC_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "qwen3-0.6b": {
        "model_path": "Qwen/Qwen3-0.6B",
        "max_tokens": 2048,
        "lr": 1e-5,
        "head_lr": 1e-3,
        "epochs": 1,
        "batch_size": 32,
    },
}


def critic_options(preset: str | None = None, **given: Any) -> dict[str, Any]:
    """The preset-dependent options, checked: each given one that is not None, else the
    preset's, else the tiny default (`_DEFAULTS`)."""
    if preset is not None and preset not in CRITIC_PRESETS:
        raise ConfigError(
            f"unknown critic preset {preset!r}{did_you_mean(preset, CRITIC_PRESETS)}; "
            f"choose one of {', '.join(CRITIC_PRESETS)}"
        )
    chosen = {**_DEFAULTS, **CRITIC_PRESETS.get(preset or "tiny", {})}
    out = {k: given[k] if given.get(k) is not None else chosen[k] for k in _DEFAULTS}
    if out["max_tokens"] < 8 or out["lr"] <= 0 or out["epochs"] < 1 or out["batch_size"] < 1:
        raise ConfigError("critic needs max_tokens >= 8, lr > 0, epochs >= 1, batch_size >= 1")
    return out


logger = logging.getLogger(__name__)


class CriticPredictor:
    """LM critic: backbone + scalar head over the shared serialisation, trained with BCE.

    Args:
        model_path: transformers model directory or hub id (None: the preset's; for "tiny",
            a tiny random-init Qwen3).
        preset: a name in `CRITIC_PRESETS` ("tiny" by default, "qwen3-0.6b"); it sets
            model_path, max_tokens, lr, head_lr, epochs and batch_size where they are None.
        max_tokens: token budget of one serialised state (history left-truncated; tiny: 512).
        lr: AdamW learning rate of the backbone (tiny: 3e-4); head_lr: of the head (default 10x lr).
        epochs: passes over each update batch (tiny: 2); batch_size: states per forward (tiny: 16).
        device: "cpu", "cuda", "cuda:1", ... (None: cuda when available, else cpu).
        prefix_share: prefix share of `batch` (the runner uses its own config's share).
        tiny: overrides for the tiny backbone's `TinyConfig` when model_path is None.
        pooling: what the head reads - "last" (the final EOS token's state) or "last+mean"
            (that concatenated with the mean over all tokens).
        weight_decay: AdamW weight decay.
        seed: head initialisation and shuffling.
    """

    name: ClassVar[str] = "critic"

    def __init__(
        self,
        model_path: str | None = None,
        *,
        preset: str | None = None,
        max_tokens: int | None = None,
        lr: float | None = None,
        head_lr: float | None = None,
        epochs: int | None = None,
        batch_size: int | None = None,
        device: str | None = None,
        prefix_share: float = 0.06,
        tiny: dict[str, Any] | None = None,
        pooling: str = "last+mean",
        weight_decay: float = 0.01,
        seed: int = 0,
    ):
        opts = critic_options(
            preset,
            model_path=model_path,
            max_tokens=max_tokens,
            lr=lr,
            head_lr=head_lr,
            epochs=epochs,
            batch_size=batch_size,
        )
        if pooling not in _POOLING:
            raise ConfigError(f"pooling must be one of {sorted(_POOLING)}, got {pooling!r}")
        if not 0.0 <= prefix_share <= 1.0:
            raise ConfigError(f"prefix_share must be in [0, 1], got {prefix_share}")
        self.preset, self.pooling = preset or "tiny", pooling
        self.max_tokens, self.epochs, self.batch_size = (
            int(opts["max_tokens"]),
            int(opts["epochs"]),
            int(opts["batch_size"]),
        )
        self.prefix_share = float(prefix_share)
        self._load(opts["model_path"], tiny, device, seed)
        torch = require("torch", "train")
        lr = float(opts["lr"])
        self.opt = torch.optim.AdamW(
            [
                {"params": self.backbone.parameters(), "lr": lr},
                {"params": self.head.parameters(), "lr": opts["head_lr"] or 10 * lr},
            ],
            weight_decay=weight_decay,
        )
        self.rng = np.random.default_rng(seed)
        self.updates = 0

    def _load(
        self, model_path: str | None, tiny: dict[str, Any] | None, device: str | None, seed: int
    ) -> None:
        """Tokenizer, backbone (float32 master weights) and the zero-initialised head."""
        torch = require("torch", "train", what="the LM critic (torch)")
        transformers = require("transformers", "train", what="the LM critic (transformers)")
        if model_path is None:
            from trace_gym.agents.tiny import critic_backbone_dir

            model_path = str(critic_backbone_dir(tiny))
        self.model_path = model_path
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        # a fixed last token: the head reads the hidden state of the same token every time
        eos = self.tokenizer.eos_token_id
        self.end = [eos] if eos is not None else []
        torch.manual_seed(seed)
        self.backbone = transformers.AutoModel.from_pretrained(model_path, dtype=torch.float32).to(
            self.device
        )
        hidden = self.backbone.config.hidden_size
        self.head = torch.nn.Linear(hidden * _POOLING[self.pooling], 1).to(self.device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    # ------------------------------------------------------------------ encoding
    def encode(self, state: State) -> list[int]:
        """Token ids of a state: the prompt first, then the most recent history that fits, then EOS."""
        enc = self.tokenizer
        budget = self.max_tokens - len(self.end)
        head = enc(f"{PROMPT_TAG}{state.prompt}", add_special_tokens=False)["input_ids"]
        head = head[: budget // 2] if len(head) > budget // 2 and state.turns else head
        head = list(head[:budget])
        room = budget - len(head)
        if room > 0 and state.turns:
            body_text = "".join(f"{ACTION_TAG}{a}{OBS_TAG}{o}" for a, o in state.turns)
            head += list(enc(body_text, add_special_tokens=False)["input_ids"])[-room:]
        return head + self.end

    def _logits(self, states: Sequence[State]):
        torch = require("torch", "train")
        rows = [self.encode(s) for s in states]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, r in enumerate(rows):  # right-padded: the last real token is at len - 1
            ids[b, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[b, : len(r)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"
        ):
            hidden = self.backbone(
                input_ids=ids, attention_mask=mask
            ).last_hidden_state  # [B, T, H]
        last = hidden[
            torch.arange(len(rows), device=self.device), mask.sum(1) - 1
        ].float()  # [B, H]
        if self.pooling == "last+mean":
            m = mask.unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
            mean = ((hidden * m).sum(1) / m.sum(1)).float()  # [B, H]
            last = torch.cat([last, mean], dim=-1)  # [B, 2H]
        return self.head(last).squeeze(-1)  # [B]

    # ------------------------------------------------------------------ protocol
    def predict(self, states: Sequence[State]) -> np.ndarray:
        """P(success) per state."""
        torch = require("torch", "train")
        if not states:
            return np.zeros(0)
        out = []
        self.backbone.eval()
        with torch.no_grad():
            for start in range(0, len(states), self.batch_size):
                out.append(
                    torch.sigmoid(self._logits(states[start : start + self.batch_size]))
                    .cpu()
                    .numpy()
                )
        return np.concatenate(out).astype(float)

    def update(
        self, states: Sequence[State], targets: np.ndarray, weights: np.ndarray | None = None
    ) -> dict[str, float]:
        """`epochs` passes of weighted BCE on soft targets; returns the mean loss of the first pass."""
        torch = require("torch", "train")
        n = len(states)
        if n == 0:
            return {"loss": float("nan"), "n": 0.0}
        y = torch.tensor(
            np.clip(np.asarray(targets, dtype=float), 0, 1), dtype=torch.float32, device=self.device
        )
        w = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
        w = torch.tensor(w / max(w.mean(), 1e-12), dtype=torch.float32, device=self.device)
        self.backbone.train()
        losses = []
        for epoch in range(self.epochs):
            order = self.rng.permutation(n)
            for start in range(0, n, self.batch_size):
                idx = order[start : start + self.batch_size]
                logits = self._logits([states[i] for i in idx])
                it = torch.as_tensor(idx, device=self.device)
                loss = (
                    torch.nn.functional.binary_cross_entropy_with_logits(
                        logits, y[it], reduction="none"
                    )
                    * w[it]
                ).mean()
                self.opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(
                    [*self.backbone.parameters(), *self.head.parameters()], 1.0
                )
                self.opt.step()
                if epoch == 0:
                    losses.append(float(loss.detach()) * len(idx))
        self.backbone.eval()
        self.updates += 1
        return {"loss": sum(losses) / n, "n": float(n)}

    def state_dict(self) -> dict[str, Any]:
        """Backbone and head weights (CPU copies), the optimiser, the shuffling generator, updates."""
        return {
            "backbone": {
                k: v.detach().cpu().clone() for k, v in self.backbone.state_dict().items()
            },
            "head": {k: v.detach().cpu().clone() for k, v in self.head.state_dict().items()},
            "optimizer": copy.deepcopy(self.opt.state_dict()),
            "rng": self.rng.bit_generator.state,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            self.backbone.load_state_dict(state["backbone"])
            self.head.load_state_dict(state["head"])
        except RuntimeError as e:  # torch's shape/key mismatch
            raise ConfigError(
                f"critic state does not fit this backbone ({self.model_path}); build the critic with "
                f"the options the state was saved with: {e}"
            ) from e
        # a copy: torch keeps same-device state tensors (AdamW's step) and updates them in place
        self.opt.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.rng.bit_generator.state = state["rng"]
        self.updates = int(state["updates"])

    def batch(self, trees: Sequence[Any], rng: np.random.Generator | None = None):
        """A training batch from finished trees with this critic's prefix share."""
        from trace_gym.predict.training import training_batch

        return training_batch(trees, prefix_share=self.prefix_share, rng=rng or self.rng)
