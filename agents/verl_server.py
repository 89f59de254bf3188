"""A CPU token server for verl's agent loop: HF transformers behind verl's generate API.

verl's agent loops ask an LLM server for one assistant turn with
``await server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` and
get a ``verl.workers.rollout.replica.TokenOutput`` back (``LLMServerClient.generate`` in
``verl/workers/rollout/llm_server.py``, which forwards to the rollout server's
``generate`` in ``verl/workers/rollout/vllm_rollout/vllm_async_server.py``).
`HFTokenServer` implements that server method on `trace_gym.agents.hf.HFPolicy`, so the
agent loop runs on CPU with a tiny local model, in two ways:

- **in process**: pass the server itself as the agent loop's ``server_manager`` (its
  ``generate`` takes the client's arguments);
- **behind verl's own client**: `ray_server_client` starts it as a Ray actor, puts
  verl's ``GlobalRequestLoadBalancer`` in front of it (``get_router_handle``) and returns
  verl's unmodified ``LLMServerClient`` - the path a vLLM/SGLang replica is reached by.

Sampling parameters are read the way verl's vLLM server reads them: ``temperature``,
``top_p``, ``top_k`` (-1 or 0 only: the HF sampler has no top-k), ``logprobs`` (bool),
``max_tokens`` / ``max_new_tokens`` (default ``min(response_length, prompt_length +
response_length - len(prompt_ids))`` from ``actor_rollout_ref.rollout``), ``stop``
(strings; kept in the output, as ``include_stop_str_in_output=True`` does in vLLM) and
``seed`` (per request; else a stable hash of the request id). ``repetition_penalty``
other than 1 and ``ignore_eos`` are refused rather than silently dropped. Requests run
one at a time on a worker thread (the event loop stays free for env steps).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from trace_gym.agents.hf import HFPolicy

from trace_gym.errors import ConfigError
from trace_gym.optional import require
from trace_gym.seeding import stable_seed

__all__ = ["HFTokenServer", "ray_server_client"]

_KNOWN = {
    "temperature",
    "top_p",
    "top_k",
    "logprobs",
    "max_tokens",
    "max_new_tokens",
    "stop",
    "include_stop_str_in_output",
    "seed",
    "repetition_penalty",
    "ignore_eos",
    "n",
}


class HFTokenServer:
    """Token-in, token-out generation on an `HFPolicy` (see the module docstring).

    `prompt_length` / `response_length` are verl's ``rollout.prompt_length`` and
    ``rollout.response_length`` (the default ``max_tokens``, as in verl's vLLM server).
    """

    def __init__(
        self,
        policy: HFPolicy | str,
        *,
        prompt_length: int = 1024,
        response_length: int = 1024,
        seed: int = 0,
    ):
        self.policy = HFPolicy.from_pretrained(policy) if isinstance(policy, str) else policy
        self.prompt_length, self.response_length = int(prompt_length), int(response_length)
        self.seed = int(seed)
        self.global_steps: int | None = None
        self.requests = 0
        self._locks: dict[int, asyncio.Lock] = {}  # one per event loop (a Lock binds to its loop)

    @classmethod
    def from_config(cls, config: Any, policy: HFPolicy | str | None = None) -> HFTokenServer:
        """A server for verl's trainer config (``actor_rollout_ref.model.path`` and rollout lengths)."""
        rollout = config.actor_rollout_ref.rollout
        return cls(
            policy or str(config.actor_rollout_ref.model.path),
            prompt_length=rollout.prompt_length,
            response_length=rollout.response_length,
            seed=int(config.get("seed", 0) or 0),
        )

    def set_global_steps(self, step: int) -> None:
        """The trainer step reported in ``TokenOutput.extra_fields["global_steps"]`` (as verl's servers do)."""
        self.global_steps = int(step)

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: Sequence[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> Any:
        """One assistant turn for `prompt_ids` as a verl ``TokenOutput``."""
        replica = require("verl.workers.rollout.replica", "verl", what="verl")
        if image_data is not None or video_data is not None or kwargs.get("audio_data") is not None:
            raise ConfigError(
                "HFTokenServer is text-only: image, video and audio inputs are not supported"
            )
        params = dict(sampling_params)
        unknown = sorted(set(params) - _KNOWN)
        if unknown:
            raise ConfigError(f"HFTokenServer does not support sampling params {unknown}")
        call = self._call(request_id, list(prompt_ids), params)
        loop = asyncio.get_running_loop()
        lock = self._locks.setdefault(id(loop), asyncio.Lock())
        async with lock:  # one request at a time; the thread keeps the event loop free
            ids, lps, reason = await loop.run_in_executor(None, call)
        self.requests += 1
        return replica.TokenOutput(
            token_ids=ids,
            log_probs=lps if params.get("logprobs") else None,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps, "finish_reason": reason},
        )

    def _call(self, request_id: str, prompt_ids: list[int], p: dict[str, Any]):
        if int(p.get("top_k") or -1) not in (-1, 0):
            raise ConfigError(
                f"HFTokenServer has no top-k sampling (top_k={p['top_k']}); use top_k=-1"
            )
        if float(p.get("repetition_penalty", 1.0)) != 1.0 or p.get("ignore_eos"):
            raise ConfigError(
                "HFTokenServer does not support repetition_penalty != 1 or ignore_eos"
            )
        if int(p.get("n", 1)) != 1:
            raise ConfigError("HFTokenServer generates one sample per request (n=1)")
        default = min(
            self.response_length, self.prompt_length + self.response_length - len(prompt_ids)
        )
        max_tokens = max(1, int(p.get("max_tokens", p.get("max_new_tokens", default))))
        stop = p.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        seed = (
            int(p["seed"])
            if p.get("seed") is not None
            else stable_seed("verl", self.seed, request_id)
        )
        temperature, top_p = float(p.get("temperature", 1.0)), float(p.get("top_p", 1.0))

        def run() -> tuple[list[int], list[float], str]:
            return self.policy.generate_ids(
                [prompt_ids],
                [seed],
                max_new_tokens=max_tokens,
                stop=stop,
                temperature=temperature,
                top_p=top_p,
            )[0]

        return run


def ray_server_client(
    config: Any, model_path: str, *, num_servers: int = 1
) -> tuple[Any, list[Any]]:
    """verl's own ``LLMServerClient`` over `num_servers` `HFTokenServer` Ray actors.

    Ray must be initialised. The servers are registered with verl's
    ``GlobalRequestLoadBalancer`` through ``verl.workers.rollout.router.get_router_handle``
    (as ``LLMServerManager._init_global_load_balancer`` does for vLLM replicas); returns
    (client, server actor handles).
    """
    ray = require("ray", "ray")
    llm_server = require("verl.workers.rollout.llm_server", "verl", what="verl")
    router = require("verl.workers.rollout.router", "verl", what="verl")
    rollout = config.actor_rollout_ref.rollout
    actor = ray.remote(num_cpus=0)(HFTokenServer)
    handles = [
        actor.remote(
            model_path,
            prompt_length=rollout.prompt_length,
            response_length=rollout.response_length,
            seed=i,
        )
        for i in range(num_servers)
    ]
    balancer = router.get_router_handle(
        servers={f"hf-cpu-{i}": h for i, h in enumerate(handles)},
        router_config_path=None,
        full_determinism=bool(rollout.get("full_determinism", False)),
    )
    return llm_server.LLMServerClient(config, load_balancer_handle=balancer), handles
