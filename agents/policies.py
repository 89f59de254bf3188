"""Policy specs for the CLIs: ``scripted[:SKILL]``, ``sim``, ``tiny``, ``hf:PATH``,
``vllm:PATH``, ``openai:URL[#MODEL]`` -> a `Policy`."""

from __future__ import annotations

from typing import Any

from trace_gym.errors import ConfigError

__all__ = ["POLICY_KINDS", "make_policy"]


def _scripted(arg: str, env_id: str, env: Any, opts: dict[str, Any]) -> Any:
    from trace_gym.agents.scripted import make_scripted

    skill = float(arg) if arg else float(opts.get("skill", 0.8))
    return make_scripted(env_id, skill=skill, env=env)


def _sim(arg: str, env_id: str, env: Any, opts: dict[str, Any]) -> Any:
    from trace_gym.sim import SimPolicy

    preset = arg or (getattr(env.unwrapped, "preset", None) if env is not None else None)
    return SimPolicy(preset)


def _sampling(opts: dict[str, Any]) -> dict[str, Any]:
    keys = ("temperature", "top_p", "max_new_tokens", "max_context", "max_batch")
    return {k: opts[k] for k in keys if opts.get(k) is not None}


def _hf(arg: str, env_id: str, env: Any, opts: dict[str, Any]) -> Any:
    from trace_gym.agents.hf import HFPolicy

    if not arg:
        raise ConfigError("hf needs a model path or hub id: --policy hf:PATH")
    return HFPolicy.from_pretrained(arg, device=opts.get("device") or "cpu", **_sampling(opts))


def _tiny(arg: str, env_id: str, env: Any, opts: dict[str, Any]) -> Any:
    from trace_gym.agents.tiny import load_tiny_policy

    return load_tiny_policy(**_sampling(opts))


def _vllm(arg: str, env_id: str, env: Any, opts: dict[str, Any]) -> Any:
    from trace_gym.agents.hf import SamplingConfig
    from trace_gym.agents.vllm_backend import VLLMPolicy

    if not arg:
        raise ConfigError("vllm needs a model path or hub id: --policy vllm:PATH")
    return VLLMPolicy(arg, sampling=SamplingConfig(**_sampling(opts)))


def _openai(arg: str, env_id: str, env: Any, opts: dict[str, Any]) -> Any:
    from trace_gym.agents.openai_backend import OpenAIConfig, OpenAIPolicy

    url, _, model = arg.partition("#")
    kw = {k: opts[k] for k in ("temperature", "top_p") if opts.get(k) is not None}
    if opts.get("max_new_tokens"):
        kw["max_tokens"] = opts["max_new_tokens"]
    if opts.get("concurrency"):
        kw["concurrency"] = opts["concurrency"]
    return OpenAIPolicy(OpenAIConfig(base_url=url, model=model or "default", **kw))


#: spec prefix -> builder(arg, env_id, env, options)
POLICY_KINDS = {
    "scripted": _scripted,
    "sim": _sim,
    "tiny": _tiny,
    "hf": _hf,
    "vllm": _vllm,
    "openai": _openai,
}


def make_policy(spec: str, env_id: str, env: Any = None, **opts: Any) -> Any:
    """Build the policy a CLI spec names (`env` gives scripted policies their task data)."""
    kind, _, arg = spec.partition(":")
    if kind not in POLICY_KINDS:
        raise ConfigError(
            f"unknown policy spec {spec!r}; use one of: scripted[:SKILL], sim, tiny, hf:PATH, vllm:PATH, openai:URL[#MODEL]"
        )
    return POLICY_KINDS[kind](arg, env_id, env, opts)
