"""VLLMPolicy against a fake engine honouring vLLM's ``LLM.generate`` API (vLLM is not installed).

The fake samples from the tiny HF model itself with each request's seed, so the test
also checks the token contract end to end: the ids sent are the recorded context, the
stop string is kept, text agrees with the ids, logprobs are passed through.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

import pytest
from trace_gym.agents.hf import HFPolicy, SamplingConfig
from trace_gym.agents.vllm_backend import VLLMPolicy

from trace_gym.errors import DependencyNotInstalled
from trace_gym.policy import Conversation
from trace_gym.testing import CountdownEnv

ENV = "trace/Countdown-v0"


@dataclass
class FakeParams:
    """The SamplingParams fields VLLMPolicy sets."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    logprobs: int | None = None
    skip_special_tokens: bool = True
    stop: list = field(default_factory=list)
    include_stop_str_in_output: bool = False
    detokenize: bool = True


@dataclass
class Logprob:
    logprob: float


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list
    logprobs: list | None
    finish_reason: str
    stop_reason: str | None = None


@dataclass
class RequestOutput:
    prompt_token_ids: list
    outputs: list


class FakeLLM:
    """Samples with an HFPolicy on the raw prompt ids (one row per requested sample)."""

    def __init__(self, hf: HFPolicy):
        self.hf = hf
        self.calls = []

    def get_tokenizer(self):
        return self.hf.tokenizer

    def generate(self, prompts, sampling_params, use_tqdm=True, lora_request=None):
        self.calls.append((prompts, sampling_params, lora_request))
        results = []
        for prompt, sp in zip(prompts, sampling_params, strict=True):
            ids = prompt["prompt_token_ids"]
            from trace_gym.agents.context import Context
            from trace_gym.agents.hf import _Row

            rows = [
                _Row(k, Context(ids, [], []), sp.seed + k, sp.max_tokens, False, tuple(sp.stop))
                for k in range(sp.n)
            ]
            outs = []
            for k, (tok, lps, reason) in enumerate(self.hf._sample(rows)):
                outs.append(
                    CompletionOutput(
                        k,
                        "<vllm text>",
                        tok,
                        [{t: Logprob(lp)} for t, lp in zip(tok, lps, strict=True)],
                        "length" if reason == "length" else "stop",
                    )
                )
            results.append(RequestOutput(ids, outs))
        return results


@pytest.fixture
def policies(countdown_model_dir):
    hf = HFPolicy.from_pretrained(str(countdown_model_dir), temperature=1.0)
    llm = FakeLLM(hf)
    vp = VLLMPolicy(
        llm=llm, sampling=SamplingConfig(temperature=1.0), sampling_params_cls=FakeParams
    )
    return hf, llm, vp


def _conv(seed=0, turns=()):
    prompt = CountdownEnv().reset(options={"task": 1})[0]
    return Conversation(ENV, "count-1", prompt, tuple(turns), seed=seed)


def test_without_vllm_a_clear_error():
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(DependencyNotInstalled, match="pip install"):
        VLLMPolicy("some/model")


def test_requests_carry_context_ids_and_per_conversation_seeds(policies):
    hf, llm, vp = policies
    convs = [_conv(seed=s) for s in (7, 8, 9)]
    outs = vp.generate(convs)
    prompts, params, _ = llm.calls[-1]
    assert [p["prompt_token_ids"] for p in prompts] == [hf.context(c).ids for c in convs]
    assert [p.seed for p in params] == [7, 8, 9] and all(
        p.n == 1 and p.logprobs == 0 for p in params
    )
    assert not any(p.detokenize for p in params)  # no stop strings: the text comes from the ids
    # same ids as the HF backend with the same seeds (the fake samples with it)
    assert [o.token_ids for o in outs] == [o.token_ids for o in hf.generate(convs)]
    for o in outs:
        assert o.text == hf.tokenizer.decode(
            o.token_ids, skip_special_tokens=True
        )  # not the engine's text
        assert len(o.logprobs) == len(o.token_ids)
        assert o.context_token_ids == hf.context(convs[0]).ids


def test_stop_strings_are_sent_kept(policies):
    _, llm, vp = policies
    vp.chat.formats[ENV] = __import__("trace_gym.agents.formats", fromlist=["x"]).ReActFormat(
        "c", "s", stop=("</x>",)
    )
    vp.generate([_conv()])
    p = llm.calls[-1][1][0]
    assert p.stop == ["</x>"] and p.include_stop_str_in_output is True and p.detokenize is True


def test_n_sampling_and_overflow(policies):
    hf, llm, vp = policies
    outs = vp.sample_n(_conv(seed=3), 4)
    assert len(outs) == 4 and llm.calls[-1][1][0].n == 4
    vp.max_context = 10
    out = vp.generate([_conv()])[0]
    assert out.finish_reason == "overflow" and out.token_ids == []


def _vllm_kernel_scan() -> None:
    """What vLLM 0.32's CPU platform does at engine start (triton_utils.dispatcher._rebind_kernels)."""
    import sys

    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None) or {}
        for value in list(namespace.values()):
            if hasattr(value, "__dict__"):
                vars(value).get("kernel")


def test_new_llm_builds_an_engine_after_numba_was_imported(monkeypatch):
    import sys
    import types

    numba = pytest.importorskip("numba")
    from llvmlite.binding import ffi
    from trace_gym.agents.vllm_backend import new_llm

    built = {}

    def fake_llm(model, **kwargs):
        _vllm_kernel_scan()  # raises if any loaded module still fabricates a __dict__
        built.update(model=model, **kwargs)
        return "engine"

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=fake_llm))
    assert new_llm("tiny", seed=0) == "engine" and built == {"model": "tiny", "seed": 0}
    assert not hasattr(ffi.lib, "__dict__")  # a dunder is no C symbol
    assert ffi.lib.LLVMPY_GetVersionInfo() > 0  # real symbols still resolve
    assert numba.njit(lambda x: x + 1)(41) == 42  # and numba still compiles
