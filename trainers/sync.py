"""Weight sync from the trained model to the generator, once per step, with a version.

Three cases, tried in order by `sync_weights`:

1. **shared** - the generator samples with the very module the trainer updates
   (`trace_gym.agents.hf.HFPolicy` in process, LoRA adapters included): nothing to copy;
2. **pushed** - the generator exposes ``sync_weights(model)``: it is called;
3. **vllm** / **vllm-lora** - the generator holds a vLLM engine in ``.llm`` (`VLLMPolicy`):
   - a peft model on a policy whose engine serves LoRA (``policy.lora_enabled``): the
     adapter alone is saved to a fresh directory and the policy switches to it
     (`VLLMPolicy.load_adapter`, a new ``LoRARequest`` id, so vLLM cannot serve the old
     adapter from its cache);
   - otherwise the full weights (LoRA merged in, peft names mapped back to the base
     model's) go in with ``llm.collective_rpc("reload_weights", kwargs={"weights_iterator":
     ...})``, vLLM's in-place reload (it keeps the engine's own parameter objects; the
     CPU backend replaces parameters after the first load, so the model's
     ``load_weights`` fails there with ``'Parameter' object has no attribute
     'weight_loader'``). Engines without ``reload_weights`` (older vLLM) fall back to
     the in-process model's ``load_weights``.
   After every push the prefix cache is reset (``llm.reset_prefix_cache()``): cached KV
   of the old weights must not be reused.

Every sync bumps the policy's ``version`` (when it has one; `HFPolicy` and `VLLMPolicy`
do), and the runner records ``policy.version`` on each node it generates, so a tree says
which weights produced each turn.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from typing import Any

from trace_gym.errors import ConfigError

__all__ = [
    "base_name",
    "engine_weights",
    "export_weights",
    "load_engine_weights",
    "push_full_weights",
    "sync_weights",
]

#: attribute paths from a vLLM ``LLM`` to its in-process model, newest first (fallback only)
_VLLM_MODEL_PATHS = (
    "llm_engine.model_executor.driver_worker.worker.model_runner.model",
    "llm_engine.model_executor.driver_worker.model_runner.model",
)


def base_name(name: str) -> str:
    """A peft LoRA model's parameter name as the base architecture names it."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def export_weights(model: Any) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of the full model as the base architecture names them, LoRA merged in."""
    merged = hasattr(model, "merge_adapter")
    if merged:
        model.merge_adapter()
    try:
        for name, tensor in model.state_dict().items():
            if "lora_" in name:
                continue
            if merged and ".base_layer." in name:
                # merged in place: a view would read the unmerged weight once the
                # caller has taken the last tensor (the unmerge below runs then)
                tensor = tensor.clone()
            yield base_name(name), tensor.detach()
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
        "cannot push weights into the vLLM engine: it has no collective_rpc('reload_weights') and "
        f"its model is not reachable (looked for {' or '.join('llm.' + p for p in _VLLM_MODEL_PATHS)}); "
        "run vLLM in process (VLLM_ENABLE_V1_MULTIPROCESSING=0), use vLLM >= 0.11, or give the "
        "policy a sync_weights(model) method"
    )


def push_full_weights(llm: Any, model: Any) -> str:
    """Load `model`'s full weights into the engine in place; returns the method used."""
    # materialised once: the merge/unmerge of a LoRA model must not span the rpc
    return _push_weight_list(llm, [(n, t.contiguous()) for n, t in export_weights(model)])


def _push_weight_list(llm: Any, weights: list[tuple[str, Any]]) -> str:
    method = "reload_weights"
    if callable(getattr(llm, "collective_rpc", None)):
        try:
            llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        except (AttributeError, NotImplementedError, TypeError) as e:
            if "reload_weights" not in str(e):
                raise
            method = "load_weights"
    else:
        method = "load_weights"
    if method == "load_weights":
        _vllm_model(llm).load_weights(iter(weights))
    return method


def _push_adapter(policy: Any, model: Any) -> None:
    path = tempfile.mkdtemp(prefix="trace-gym-lora-")
    model.save_pretrained(path)
    policy.load_adapter(path)


def engine_weights(policy: Any) -> list[tuple[str, Any]]:
    """The weights a generation-engine pool pushes: the driver policy's model, on CPU.

    `trace_gym.distributed.RayConfig(engine_export="trace_gym.trainers.sync:engine_weights",
    engine_apply="trace_gym.trainers.sync:load_engine_weights")`; the pool pushes them
    when ``policy.version`` changed (every `sync_weights` bumps it).
    """
    model = getattr(policy, "model", None)
    if model is None:
        raise ConfigError(f"policy {type(policy).__name__} has no .model to export weights from")
    # copies: on CPU .to("cpu") would alias the live weights, which `export_weights`
    # unmerges in place (LoRA) once the last tensor is taken
    return [(n, t.to("cpu", copy=True).contiguous()) for n, t in export_weights(model)]


def load_engine_weights(policy: Any, weights: list[tuple[str, Any]]) -> str:
    """Load pushed weights into an engine's policy: a vLLM engine in place, an HF model by
    state dict (a LoRA-wrapped copy is first unwrapped to its base model: `engine_weights`
    pushes the adapters merged in, under the base model's names)."""
    llm = getattr(policy, "llm", None)
    if llm is not None:
        method = _push_weight_list(llm, list(weights))
        if callable(getattr(llm, "reset_prefix_cache", None)):
            llm.reset_prefix_cache()
        return method
    model = getattr(policy, "model", None)
    if model is None:
        raise ConfigError(
            f"engine policy {type(policy).__name__} has neither .llm nor .model to load weights into"
        )
    if hasattr(model, "peft_config"):  # the driver's LoRA copy: the pushes are merged weights
        policy.model = model = model.merge_and_unload()
    device = next(model.parameters()).device
    model.load_state_dict({n: t.to(device) for n, t in weights}, strict=True)
    return "state_dict"


def sync_weights(policy: Any, model: Any) -> str:
    """Make the generator sample from `model`'s current weights and bump its version.

    Returns "shared", "pushed", "vllm" (full weights) or "vllm-lora" (adapter).
    """
    if getattr(policy, "model", None) is model:
        mode = "shared"
    elif callable(getattr(policy, "sync_weights", None)):
        policy.sync_weights(model)
        mode = "pushed"
    elif getattr(policy, "llm", None) is not None:
        llm = policy.llm
        t0 = time.perf_counter()
        if getattr(policy, "lora_enabled", False) and hasattr(model, "peft_config"):
            _push_adapter(policy, model)
            mode = "vllm-lora"
        else:
            push_full_weights(llm, model)
            mode = "vllm"
        if callable(getattr(llm, "reset_prefix_cache", None)):
            llm.reset_prefix_cache()
        if hasattr(policy, "last_push_s"):
            policy.last_push_s = time.perf_counter() - t0
    else:
        raise ConfigError(
            f"policy {type(policy).__name__} neither shares the trained model (policy.model), nor has "
            "sync_weights(model), nor a vLLM engine (policy.llm); the generator would never see the updates"
        )
    version = getattr(policy, "version", None)
    if isinstance(version, int) and not isinstance(version, bool):
        policy.version = version + 1
    return mode
