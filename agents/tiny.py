"""Tiny local chat models: a Qwen3-architecture LM with a locally trained BPE tokenizer.

No weights can be downloaded here, so tests and CPU demos build their own model:

1. a byte-level BPE tokenizer trained by `tokenizers` on the texts the envs produce
   (ChatML special tokens and `CHAT_TEMPLATE`, which supports ``tools=`` and a ``tool``
   role like Qwen3's), wrapped as a transformers ``PreTrainedTokenizerFast``;
2. a randomly initialised ``Qwen3ForCausalLM`` (a few hundred thousand parameters);
3. a short SFT warm start on scripted trajectories (`trace_gym.agents.sft`), tokenised
   through the same token contract the policy uses, loss on assistant tokens only, so
   the model writes well-formed actions and sometimes succeeds.

`tiny_model_dir(config)` builds once and caches the directory under
``~/.cache/trace-gym/tiny/<key>`` (``TRACE_GYM_CACHE`` overrides the root), keyed by a
hash of the config; `load_tiny_policy` returns an `HFPolicy` on it. Real models load
from a local path or the hub through `HFPolicy.from_pretrained` (same code).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_gym.errors import ConfigError
from trace_gym.optional import require

__all__ = [
    "CHAT_TEMPLATE",
    "CRITIC_BACKBONE",
    "SPECIAL_TOKENS",
    "TinyConfig",
    "build_model",
    "build_tokenizer",
    "critic_backbone_dir",
    "load_tiny_policy",
    "tiny_model_dir",
]

logger = logging.getLogger(__name__)

#: bump when the build recipe changes, so cached directories are rebuilt
RECIPE_VERSION = 1

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

#: ChatML with Qwen3-style tools (in the system turn) and tool responses (in a user turn)
CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}{% endif %}"
    "{{ '# Tools\\n<tools>' }}{% for t in tools %}{{ '\\n' + (t | tojson) }}{% endfor %}"
    "{{ '\\n</tools><|im_end|>\\n' }}"
    "{% elif messages[0].role == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{% elif m.role != 'system' %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyConfig:
    """Everything that determines a tiny model directory (its hash is the cache key)."""

    #: BPE vocabulary size (special tokens included)
    vocab_size: int = 1024
    hidden_size: int = 96
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 64
    intermediate_size: int = 192
    #: context window (max_position_embeddings)
    max_context: int = 4096
    #: env ids whose scripted trajectories train the tokenizer and the warm start
    envs: tuple[str, ...] = ("trace/Math-v0", "trace/HotpotQA-v0", "trace/BFCL-v0", "trace/Sim-v0")
    #: scripted episodes per env for the warm start
    episodes_per_env: int = 16
    #: scripted policy skill for the warm-start data
    skill: float = 0.9
    #: SFT optimiser steps (0 = random init only)
    sft_steps: int = 600
    sft_lr: float = 3e-3
    sft_batch: int = 4
    #: longest SFT sequence in tokens (longer episodes are cut at the end)
    sft_max_len: int = 768
    seed: int = 0
    #: env constructor kwargs per env id (e.g. small task pools)
    env_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: ReActFormat overrides per env id, saved with the model (tiny contexts: tool names only)
    formats: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {"trace/BFCL-v0": {"tool_detail": "names"}}
    )

    def __post_init__(self) -> None:
        if self.vocab_size < 300:
            raise ConfigError(
                f"vocab_size must be >= 300 (256 bytes + specials + merges), got {self.vocab_size}"
            )
        if (
            min(self.hidden_size, self.num_layers, self.num_heads, self.num_kv_heads, self.head_dim)
            < 1
        ):
            raise ConfigError("model sizes must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.sft_steps < 0 or self.episodes_per_env < 0:
            raise ConfigError("sft_steps and episodes_per_env must be >= 0")

    def key(self) -> str:
        blob = json.dumps({"recipe": RECIPE_VERSION, **asdict(self)}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _require_transformers():
    for module in ("tokenizers", "torch", "transformers"):
        require(module, "train")


def build_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> Any:
    """A byte-level BPE tokenizer trained on `texts`, with ChatML specials and template."""
    _require_transformers()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(config: TinyConfig, tokenizer: Any) -> Any:
    """A randomly initialised Qwen3ForCausalLM sized by `config`."""
    _require_transformers()
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(config.seed)
    cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_context,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    return Qwen3ForCausalLM(cfg).float()


def _cache_root() -> Path:
    return Path(os.environ.get("TRACE_GYM_CACHE", Path.home() / ".cache" / "trace-gym")) / "tiny"


def tiny_model_dir(
    config: TinyConfig | None = None, *, cache_dir: str | Path | None = None, rebuild: bool = False
) -> Path:
    """Build (once) and return the directory of the tiny model for `config`."""
    config = config or TinyConfig()
    root = Path(cache_dir) if cache_dir is not None else _cache_root()
    target = root / config.key()
    if _complete(target) and not rebuild:
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        meta = _build(config, tmp)
        if not _complete(tmp, marker=False):  # e.g. a save that skipped a non-main rank
            raise RuntimeError(
                f"building the tiny model wrote no config.json and weights into {tmp}; "
                "build it in one process (or on rank 0 first) and retry"
            )
        (tmp / "trace_gym_tiny.json").write_text(json.dumps(meta, indent=1, default=str))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)  # atomic: concurrent builders never see half a directory
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _complete(path: Path, marker: bool = True) -> bool:
    """Whether `path` holds a whole tiny model: its config, weights (and the done marker).

    A directory with the marker but no weights (left by a build under a process group on
    a non-main rank, whose save wrote nothing) is rebuilt, not loaded.
    """
    weights = any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*.bin"))
    done = (path / "trace_gym_tiny.json").exists() or not marker
    return done and (path / "config.json").exists() and weights


def _build(config: TinyConfig, out: Path) -> dict[str, Any]:
    from trace_gym.agents.formats import formats_with
    from trace_gym.agents.hf import FORMATS_FILE
    from trace_gym.agents.sft import collect_episodes, episode_texts, sft_warm_start

    episodes = collect_episodes(
        config.envs,
        config.episodes_per_env,
        skill=config.skill,
        seed=config.seed,
        env_kwargs=config.env_kwargs,
    )
    texts = episode_texts(episodes)
    tokenizer = build_tokenizer(texts, config.vocab_size)
    model = build_model(config, tokenizer)
    formats = formats_with(config.formats)
    stats = (
        sft_warm_start(model, tokenizer, episodes, config, formats=formats)
        if config.sft_steps
        else {}
    )
    model.save_pretrained(out, is_main_process=True)  # every rank saves its own copy
    tokenizer.save_pretrained(out)
    (out / FORMATS_FILE).write_text(json.dumps(config.formats, indent=1))
    logger.info("built tiny model in %s (%s)", out, stats)
    return {
        "config": asdict(config),
        "recipe": RECIPE_VERSION,
        "episodes": len(episodes),
        "sft": stats,
    }


def load_tiny_policy(config: TinyConfig | None = None, **sampling: Any):
    """An `HFPolicy` on the (cached) tiny model; `sampling` -> SamplingConfig."""
    from trace_gym.agents.hf import HFPolicy

    return HFPolicy.from_pretrained(str(tiny_model_dir(config)), **sampling)


def sizes(model: Any) -> dict[str, int]:
    """Parameter count of a model (for reports)."""
    return {"parameters": sum(p.numel() for p in model.parameters())}


#: the critic's default backbone (`trace_gym.agents.critic`): untrained (no SFT), small
CRITIC_BACKBONE: dict[str, Any] = {
    "envs": ("trace/Sim-v0",),
    "sft_steps": 0,
    "episodes_per_env": 64,
    "hidden_size": 64,
    "intermediate_size": 128,
}


def critic_backbone_dir(overrides: dict[str, Any] | None = None) -> Path:
    """The directory of the critic's tiny random-init backbone, `CRITIC_BACKBONE` + overrides."""
    return tiny_model_dir(TinyConfig(**{**CRITIC_BACKBONE, **(overrides or {})}))


def default_test_config(envs: Sequence[str] = ("trace/Sim-v0",), **kw: Any) -> TinyConfig:
    """The smallest config that still proves the point in a test."""
    base = dict(
        vocab_size=512,
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        intermediate_size=128,
        episodes_per_env=8,
        sft_steps=40,
        sft_max_len=512,
    )
    base.update(kw)
    return TinyConfig(envs=tuple(envs), **base)
