"""HFPolicy: token contract, logprobs, seeds, stop strings, overflow."""

from __future__ import annotations

import math

import pytest
from trace_gym.agents.formats import ReActFormat, find_stop
from trace_gym.agents.hf import HFPolicy, SamplingConfig

from trace_gym.errors import ConfigError
from trace_gym.policy import Conversation
from trace_gym.testing import CountdownEnv
from trace_gym.tree import Turn

torch = pytest.importorskip("torch")

ENV = "trace/Countdown-v0"


def _conv(prompt, turns=(), seed=0, prompt_ids=None):
    return Conversation(
        ENV, "count-1", prompt, tuple(turns), seed=seed, prompt_token_ids=prompt_ids
    )


def _episode(policy, env, seed, max_turns=4):
    """Drive one episode the way the runner does; returns the recorded turns and prompt ids."""
    prompt, _ = env.reset(seed=0, options={"task": 1})
    turns, prompt_ids = [], None
    for k in range(max_turns):
        out = policy.generate([_conv(prompt, turns, seed=seed + k, prompt_ids=prompt_ids)])[0]
        assert out.error is None
        if prompt_ids is None:
            prompt_ids = tuple(out.context_token_ids)
        else:
            turns[-1].obs_token_ids = list(out.context_token_ids)
        obs, r, term, trunc, _ = env.step(out.text)
        turns.append(Turn(out.text, obs, r, token_ids=out.token_ids, logprobs=out.logprobs))
        if term or trunc:
            break
    return prompt, prompt_ids, turns


def test_sampling_config_validates():
    with pytest.raises(ConfigError):
        SamplingConfig(top_p=0)
    with pytest.raises(ConfigError):
        SamplingConfig(temperature=-1)


def test_observation_wrap_follows_the_template(countdown_policy_factory):
    pol = countdown_policy_factory()
    tok = pol.tokenizer
    fmt = pol.chat.format(ENV)
    obs = pol.chat.obs_ids("total=3 <|im_end|>", fmt, tok.encode("add 3", add_special_tokens=False))
    assert (
        tok.decode(obs)
        == "<|im_end|>\n<|im_start|>user\ntotal=3 <|im_end|><|im_end|>\n<|im_start|>assistant\n"
    )
    # an observation cannot inject a template marker: its text is tokenised with specials split
    assert obs.count(tok.convert_tokens_to_ids("<|im_end|>")) == 2
    # a turn that already ended with the end-of-turn token is not closed twice
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    obs2 = pol.chat.obs_ids("x", fmt, [5, eos])
    assert tok.decode(obs2).startswith("\n<|im_start|>user\nx")


def test_logprobs_and_tokens_match_a_recomputation(countdown_policy_factory):
    temp = 0.7
    # logprobs are of the temperature-scaled distribution before top-p (see agents/hf.py)
    pol = countdown_policy_factory(temperature=temp, top_p=0.9)
    prompt, prompt_ids, turns = _episode(pol, CountdownEnv(), seed=3)
    assert len(turns) >= 2
    conv = _conv(prompt, turns[:-1], prompt_ids=prompt_ids)
    ids = pol.context(conv).ids + turns[-1].token_ids
    # the whole history, rebuilt from recorded ids, scored by one unpadded forward pass
    with torch.no_grad():
        logits = pol.model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits / temp, dim=-1)
    pos = 0
    full = list(prompt_ids)
    for t in turns:
        pos = len(full)
        for j, (tid, lp) in enumerate(zip(t.token_ids, t.logprobs, strict=True)):
            assert math.isclose(float(logp[pos + j - 1, tid]), lp, abs_tol=1e-4)
        full += t.token_ids + (t.obs_token_ids or [])
    assert full[: len(ids)] == ids[: len(full)]
    # text agrees with the tokens
    for t in turns:
        assert t.action == pol.tokenizer.decode(t.token_ids, skip_special_tokens=True)


def test_replay_prefix_is_byte_identical(countdown_policy_factory):
    pol = countdown_policy_factory()
    prompt, prompt_ids, turns = _episode(pol, CountdownEnv(), seed=11)
    assert len(turns) >= 2
    parent = pol.context(_conv(prompt, turns[:1], prompt_ids=prompt_ids))
    turns[0].obs_token_ids = parent.appended
    # a replay branching after turn 1 with another seed starts from exactly the prefix ids
    for seed in (100, 101):
        child = _conv(prompt, turns[:1], seed=seed, prompt_ids=prompt_ids)
        assert pol.context(child).ids == parent.ids
        out = pol.generate([child])[0]
        assert out.context_token_ids == parent.appended
    # and the prefix is the recorded ids, not a re-rendering of the text
    assert parent.ids == list(prompt_ids) + turns[0].token_ids + turns[0].obs_token_ids


def test_seeds_are_per_conversation_not_per_batch(countdown_policy_factory):
    pol = countdown_policy_factory(temperature=1.5)
    prompt = CountdownEnv().reset(options={"task": 2})[0]
    convs = [_conv(prompt, seed=s) for s in range(6)]
    together = pol.generate(convs)
    alone = [pol.generate([c])[0] for c in convs]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert pol.generate(convs[:1])[0].token_ids == together[0].token_ids


def test_tied_probabilities_draw_the_same_token_whatever_else_the_row_holds():
    """Three tokens share the top probability; the other logits move by 1e-6 (another batch
    or rank). The token drawn for a uniform inside each tied token's share must not change:
    an unstable sort put ties in an order that depended on the rest of the row (about 1 row
    in 10 here), which made 2 FSDP ranks' trees differ from one process's."""
    from types import SimpleNamespace

    pick = HFPolicy._pick
    me = SimpleNamespace(sampling=SimpleNamespace(temperature=1.0, top_p=1.0))
    gen = torch.Generator().manual_seed(0)
    tied = torch.tensor([5, 10, 300])
    for _ in range(200):
        x = torch.randn(512, generator=gen)
        x[tied] = x.max() + 1.0
        y = x.clone()
        others = torch.randint(0, 512, (20,), generator=gen)
        others = others[~torch.isin(others, tied)]
        y[others] += 1e-6
        for row in (x, y):
            logp = torch.log_softmax(row, -1)
            share = float(logp[5].exp() / logp.exp().sum())
            u = torch.tensor([0.5, 1.5, 2.5]) * share
            got = pick(me, logp.expand(3, -1), u)
            assert got.tolist() == tied.tolist()  # ties in token-id order, in every row


def test_stop_string_is_kept_in_text_and_tokens(countdown_model_dir):
    fmt = ReActFormat("countdown", "Reach the target.", stop=("d",), max_new_tokens=20)
    pol = HFPolicy.from_pretrained(str(countdown_model_dir), temperature=0)
    pol.chat.formats[ENV] = fmt
    prompt = CountdownEnv().reset(options={"task": 1})[0]
    out = pol.generate([_conv(prompt)])[0]
    assert out.finish_reason == "stop"
    assert find_stop(out.text, fmt.stop) is not None
    assert out.text == pol.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    # the stop string is in the last token, not earlier
    assert find_stop(pol.tokenizer.decode(out.token_ids[:-1]), fmt.stop) is None


def test_context_overflow_is_flagged(countdown_policy_factory):
    pol = countdown_policy_factory(max_context=40)
    prompt = CountdownEnv().reset(options={"task": 1})[0]
    n_prompt = len(pol.context(_conv(prompt)).ids)
    assert n_prompt >= 40
    out = pol.generate([_conv(prompt)])[0]
    assert out.finish_reason == "overflow" and out.token_ids == [] and out.context_token_ids
    # a window that leaves room for a few tokens only: generation is cut by the window
    pol2 = countdown_policy_factory(max_context=n_prompt + 1, temperature=0)
    out2 = pol2.generate([_conv(prompt)])[0]
    assert len(out2.token_ids) == 1
    assert out2.finish_reason in ("overflow", "stop")


def test_a_bad_conversation_fails_alone(countdown_policy_factory):
    pol = countdown_policy_factory()
    prompt = CountdownEnv().reset(options={"task": 1})[0]
    bad = Conversation(
        ENV,
        "count-1",
        prompt,
        (Turn("x", "y", token_ids=[10**9]),),
        seed=0,
        prompt_token_ids=(1, 2),
    )
    outs = pol.generate([bad, _conv(prompt, seed=1)])
    assert outs[0].error is not None
    assert outs[1].error is None and outs[1].token_ids


def test_tools_go_through_the_native_template_argument(countdown_policy_factory):
    from dataclasses import replace

    from trace_gym.agents.formats import FORMATS

    pol = countdown_policy_factory()
    tool = {
        "type": "function",
        "function": {"name": "mkdir", "description": "make a dir", "parameters": {}},
    }
    conv = Conversation(
        "trace/BFCL-v0", "b0", "make a dir", (), seed=0, reset_info={"tools": [tool]}
    )
    assert pol.chat.native_tools
    pol.chat.formats["trace/BFCL-v0"] = FORMATS["trace/BFCL-v0"]
    full = pol.tokenizer.decode(pol.chat.prompt_ids(conv))
    assert "# Tools\n<tools>\n" in full and '"name": "mkdir"' in full
    pol.chat.formats["trace/BFCL-v0"] = replace(FORMATS["trace/BFCL-v0"], tool_detail="names")
    names = pol.tokenizer.decode(pol.chat.prompt_ids(conv))
    assert "Available functions: mkdir" in names and "<tools>" not in names
    # tool results are wrapped in the template's tool-response turn
    obs = pol.tokenizer.decode(
        pol.chat.obs_ids("ok", pol.chat.format("trace/BFCL-v0"), [5], role="tool")
    )
    assert (
        obs
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_cached_tiny_model_without_weights_is_rebuilt_not_loaded(tmp_path):
    """A marker with no config/weights (a save skipped on a non-main rank) is not a cache hit."""
    from trace_gym.agents.tiny import default_test_config, tiny_model_dir

    config = default_test_config(envs=("trace/Countdown-v0",), sft_steps=0, episodes_per_env=4)
    broken = tmp_path / config.key()
    broken.mkdir()
    (broken / "trace_gym_tiny.json").write_text("{}")
    (broken / "tokenizer.json").write_text("{}")
    out = tiny_model_dir(config, cache_dir=tmp_path)
    assert out == broken and (out / "config.json").exists()
    assert any(out.glob("*.safetensors"))
