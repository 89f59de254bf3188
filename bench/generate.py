"""`trace-gym bench generate`: policy overhead - raw engine generate beside the policies, same prompts.

Four figures from one run on the same prompts (the first-turn contexts of ``--prompts``
tasks of an env, as the token contract builds them): transformers ``model.generate``
(``hf``), `HFPolicy.generate` (``hf_policy``), vLLM ``LLM.generate`` (``vllm``) and
`VLLMPolicy.generate` (``vllm_policy``), each as generated tokens per second, at the
same temperature and token cap. The raw calls get no stop strings; the policies stop at
the env format's stops and end-of-turn tokens, so tokens/s (not total time) is the
comparable figure. Each is the fastest of ``--repeats`` timed runs after a warm-up (a
shared machine only ever slows a run down). Goal (issue 18): each policy >= 70% of its raw engine.
CPU / tiny-model figures. Engines reached by "module:attr" strings (core never imports agents).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from trace_gym.cli import Parser

__all__ = ["main", "run"]


def _prompts(env_id: str, n: int, seed: int) -> list[Any]:
    import gymnasium as gym

    from trace_gym.policy import Conversation

    env = gym.make(env_id)
    convs = []
    for k in range(n):
        prompt, info = env.reset(seed=seed + k, options={"task": k})
        convs.append(Conversation(env_id, str(k), prompt, (), seed + k, dict(info)))
    env.close()
    return convs


def _best(runs: list[tuple[int, float]]) -> dict[str, float]:
    """The fastest of repeated runs (tokens, seconds): shared machines add noise, never speed."""
    tokens, s = max(runs, key=lambda r: r[0] / r[1] if r[1] else 0.0)
    return {
        "tokens": tokens,
        "seconds": s,
        "tokens_per_s": tokens / s if s else 0.0,
        "repeats": len(runs),
    }


def _policy_rate(policy: Any, convs: list[Any], repeats: int) -> dict[str, float]:
    policy.generate(convs[:2])  # warm-up
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        outs = policy.generate(convs)
        runs.append((sum(len(o.token_ids or ()) for o in outs), time.perf_counter() - t0))
    return _best(runs)


def _raw_rate(
    fn: Any, engine: Any, ids: list[list[int]], max_new_tokens: int, repeats: int, **kw: Any
) -> dict[str, float]:
    fn(engine, ids[:2], max_new_tokens, **kw)  # warm-up
    runs = [fn(engine, ids, max_new_tokens, **kw) for _ in range(repeats)]
    return _best([(r.tokens, r.seconds) for r in runs])


def run(
    *,
    engines: tuple[str, ...] = ("hf", "vllm"),
    env_id: str = "trace/Sim-v0",
    prompts: int = 16,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    seed: int = 0,
    repeats: int = 3,
    model_dir: str | None = None,
) -> dict[str, Any]:
    """Tokens/s of raw generate and of the policy for each engine; returns the figures."""
    from trace_gym.agents import engines as eng

    path = Path(model_dir) if model_dir else eng.bench_model_dir()
    sampling = dict(temperature=temperature, max_new_tokens=max_new_tokens, max_batch=prompts)
    convs = _prompts(env_id, prompts, seed)
    hf = eng.hf_policy(path, **sampling)
    ids = [hf.context(c).ids for c in convs]
    detail: dict[str, dict[str, float]] = {}
    if "hf" in engines:
        detail["hf"] = _raw_rate(
            eng.raw_hf_generate,
            hf.model,
            ids,
            max_new_tokens,
            repeats,
            temperature=temperature,
            pad_id=hf.pad_id,
            batch=prompts,
        )
        detail["hf_policy"] = _policy_rate(hf, convs, repeats)
    if "vllm" in engines:
        vp = eng.vllm_policy(path, **sampling)
        detail["vllm"] = _raw_rate(
            eng.raw_vllm_generate, vp.llm, ids, max_new_tokens, repeats, temperature=temperature
        )
        detail["vllm_policy"] = _policy_rate(vp, convs, repeats)
    rates = {k: v["tokens_per_s"] for k, v in detail.items()}
    ratios = {
        f"{p}/{raw}": rates[p] / rates[raw]
        for p, raw in (("hf_policy", "hf"), ("vllm_policy", "vllm"))
        if p in rates and rates[raw]
    }
    return {
        "tokens_per_s": rates,
        "policy_over_raw": ratios,
        "detail": detail,
        "goals_met": {f"{k}>=0.7": v >= 0.7 for k, v in ratios.items()},
        "env": env_id,
        "prompts": prompts,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "model_dir": str(path),
        "note": "CPU / tiny-model figures",
        "machine": platform.machine(),
    }


def main(argv: list[str]) -> int:
    """Entry point of `trace-gym bench generate [--json PATH]`."""
    p = Parser(
        prog="trace-gym bench generate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    p.add_argument("--engines", default="hf,vllm", help="comma-separated: hf, vllm")
    p.add_argument("--env", default="trace/Sim-v0")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument(
        "--model", default=None, help="model directory (default: the cached tiny bench model)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--repeats", type=int, default=3, help="timed runs of each, the fastest reported"
    )
    a = p.parse_args(argv)
    r = run(
        engines=tuple(a.engines.split(",")),
        env_id=a.env,
        prompts=a.prompts,
        max_new_tokens=a.max_new_tokens,
        temperature=a.temperature,
        seed=a.seed,
        repeats=a.repeats,
        model_dir=a.model,
    )
    for k, v in r["detail"].items():
        print(
            f"  {k:<12} {v['tokens_per_s']:10.1f} tok/s  ({v['tokens']} tokens in {v['seconds']:.2f} s)"
        )
    for k, v in r["policy_over_raw"].items():
        print(f"  {k:<18} {v:6.1%}  (goal >= 70%)")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(r, indent=2) + "\n")
        print(f"wrote {a.json}")
    return 0
