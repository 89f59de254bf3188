"""Weight sync from the trained model to the generator, once per step.

Three cases, tried in order by `sync_weights`:

1. **shared** - the generator samples with the very module the trainer updates
   (`trace_gym.agents.hf.HFPolicy` in process, LoRA adapters included): nothing to copy;
2. **pushed** - the generator exposes ``sync_weights(model)``: it is called;
3. **vllm** - the generator holds a vLLM engine in ``.llm`` (`VLLMPolicy`): the trainer's
   weights (LoRA merged in, peft names mapped back to the base model's) are streamed
   into the engine's model with its ``load_weights``. The engine's model is reached
   through the in-process executor (``llm.llm_engine.model_executor.driver_worker``,
   V0, or ``...driver_worker.worker``, V1 with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``);
   these are vLLM internals that move between releases, so this path is a best-effort
   hook: it is tested here against a fake engine with the same attribute path, not
   against a real vLLM, and a mismatch raises an error that says what was looked for.
   After loading, vLLM's prefix cache is reset when the engine offers
   ``reset_prefix_cache`` (cached KV of old weights must not be reused).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trace_gym.errors import ConfigError

__all__ = ["export_weights", "sync_weights"]

#: attribute paths from a vLLM ``LLM`` to its in-process model, newest first
_VLLM_MODEL_PATHS = (
    "llm_engine.model_executor.driver_worker.worker.model_runner.model",
    "llm_engine.model_executor.driver_worker.model_runner.model",
)


def export_weights(model: Any) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of the full model as the base architecture names them, LoRA merged in."""
    merged = hasattr(model, "merge_adapter")
    if merged:
        model.merge_adapter()
    try:
        for name, tensor in model.state_dict().items():
            if "lora_" in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            yield name, tensor.detach()
    finally:
        if merged:
            model.unmerge_adapter()


def _vllm_model(llm: Any) -> Any:
    for path in _VLLM_MODEL_PATHS:
        obj = llm
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None and callable(getattr(obj, "load_weights", None)):
            return obj
    raise ConfigError(
        "cannot reach the vLLM engine's model to load new weights (looked for "
        f"{' or '.join('llm.' + p + '.load_weights' for p in _VLLM_MODEL_PATHS)}); run vLLM in process "
        "(VLLM_ENABLE_V1_MULTIPROCESSING=0) or give the policy a sync_weights(model) method"
    )


def sync_weights(policy: Any, model: Any) -> str:
    """Make the generator sample from `model`'s current weights; returns "shared", "pushed" or "vllm"."""
    if getattr(policy, "model", None) is model:
        return "shared"
    if callable(getattr(policy, "sync_weights", None)):
        policy.sync_weights(model)
        return "pushed"
    llm = getattr(policy, "llm", None)
    if llm is not None:
        target = _vllm_model(llm)
        target.load_weights(export_weights(model))
        if callable(getattr(llm, "reset_prefix_cache", None)):
            llm.reset_prefix_cache()
        return "vllm"
    raise ConfigError(
        f"policy {type(policy).__name__} neither shares the trained model (policy.model), nor has "
        "sync_weights(model), nor a vLLM engine (policy.llm); the generator would never see the updates"
    )
