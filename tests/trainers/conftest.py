"""Hand-built rollout trees with known advantages (shared by the trainer tests)."""

from __future__ import annotations

import pytest

from trace_gym.core import TraceEnv, Transition
from trace_gym.tree import RolloutTree, Turn


def turn(ids: list[int] | None = None, obs: list[int] | None = None, **info) -> Turn:
    return Turn(
        action="a",
        observation="o",
        token_ids=ids,
        logprobs=[-0.5] * len(ids) if ids else None,
        obs_token_ids=obs,
        info=info,
    )


def flat_tree(rewards=(1.0, 0.0, 0.0, 1.0)) -> RolloutTree:
    """The prompt's root rollouts only: one single-turn leaf per reward."""
    t = RolloutTree("flat", "p", prompt_token_ids=[1])
    for r in rewards:
        n = t.add_child(0, turn([5, 6]))
        t.finish(n.id, reward=r, terminated=True)
    return t


def trace_tree(failed_branch: bool = False) -> RolloutTree:
    """Two root rollouts and one replay from the first rollout's prefix.

    0 -> 1 -> 2 -> 3 (r=0)   root rollout 1 (turns 1, 2, 3)
    0 -> 4 -> 5 (r=1)        root rollout 2
         1 -> 6 (r=1)        replay from node 1
         1 -> 7 (error)      a failed replay (only with failed_branch=True)
    """
    t = RolloutTree("trace", "p", prompt_token_ids=[1, 2])
    t.add_child(0, turn([10, 11], [20]))  # 1
    t.add_child(1, turn([12], [21, 22]))  # 2
    t.add_child(2, turn([13, 14]))  # 3
    t.finish(3, reward=0.0, terminated=True)
    t.add_child(0, turn([30], [31]))  # 4
    t.add_child(4, turn([32]))  # 5
    t.finish(5, reward=1.0, terminated=True)
    t.add_child(1, turn([40, 41]), origin="replay")  # 6
    t.finish(6, reward=1.0, terminated=True)
    if failed_branch:
        t.add_child(1, turn([50]), origin="replay")  # 7
        t.finish(7, error="boom")
    return t


@pytest.fixture
def make_flat_tree():
    return flat_tree


@pytest.fixture
def make_trace_tree():
    return trace_tree


# ---------------------------------------------------------------------- a tiny LM policy
CHARS = "\n abcdefghijklmnopqrstuvwxyz0123456789:?"
NEWLINE = 0


def encode(text: str) -> list[int]:
    return [CHARS.index(c) if c in CHARS else CHARS.index("?") for c in text.lower()]


def decode(ids) -> str:
    return "".join(CHARS[i] for i in ids)


def tiny_qwen3(seed: int = 0):
    """A random-init 2-layer Qwen3 over the character vocabulary above (tests only)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(CHARS),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=NEWLINE,
        eos_token_id=NEWLINE,
        bos_token_id=None,
    )
    return Qwen3ForCausalLM(cfg).float().eval()


class CharPolicy:
    """Token-faithful sampling from `model` with a character tokenizer (newline ends a turn)."""

    def __init__(self, model, max_new_tokens: int = 4):
        self.model = model
        self.max_new_tokens = max_new_tokens

    def _context(self, conv):
        prompt = (
            list(conv.prompt_token_ids)
            if conv.prompt_token_ids is not None
            else encode(conv.prompt + "\n")
        )
        ids = list(prompt)
        appended = prompt if not conv.turns else None
        for k, t in enumerate(conv.turns):
            ids += t.token_ids
            obs = t.obs_token_ids if t.obs_token_ids is not None else encode(t.observation + "\n")
            if k == len(conv.turns) - 1:
                appended = obs
            ids += obs
        return ids, appended

    def generate(self, conversations):
        import torch

        from trace_gym.policy import PolicyOutput

        outs = []
        with torch.no_grad():
            for conv in conversations:
                ids, appended = self._context(conv)
                gen = torch.Generator().manual_seed(conv.seed % (2**63))
                new, lps = [], []
                for _ in range(self.max_new_tokens):
                    logits = self.model(input_ids=torch.tensor([ids + new])).logits[0, -1].float()
                    logp = torch.log_softmax(logits, -1)
                    tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
                    new.append(tok)
                    lps.append(float(logp[tok]))
                    if tok == NEWLINE:
                        break
                text = decode([t for t in new if t != NEWLINE])
                outs.append(
                    PolicyOutput(text=text, token_ids=new, logprobs=lps, context_token_ids=appended)
                )
        return outs


# ---------------------------------------------------------------------- a learnable env
class GuessEnv(TraceEnv):
    """Two turns; success iff the second action starts with a letter of the task's half of a-z."""

    env_id = "trace/TestGuess-v0"

    def __init__(self, num_tasks: int = 4, render_mode=None):
        super().__init__(max_turns=4, render_mode=render_mode)
        self._ids = [f"guess-{i}" for i in range(num_tasks)]
        self._t = 0

    @property
    def task_ids(self):
        return self._ids

    @property
    def task_set(self):
        return f"guess-{len(self._ids)}"

    def _letters(self) -> str:
        return "abcdefghijklm" if self._task_index % 2 == 0 else "nopqrstuvwxyz"

    def _reset_task(self, task_index):
        self._t = 0
        return f"task {task_index}: say a letter", {}

    def _step(self, action):
        self._t += 1
        if self._t < 2:
            return Transition("go", 0.0, False, {})
        ok = bool(action) and action[0] in self._letters()
        return Transition("done", float(ok), True, {"ok": ok})

    def _get_state(self):
        return {"t": self._t}

    def _set_state(self, payload):
        self._t = payload["t"]

    def example_action(self, rng):
        return "abc"


@pytest.fixture
def char_policy():
    return CharPolicy(tiny_qwen3())


@pytest.fixture
def guess_env_factory():
    return lambda: GuessEnv()


@pytest.fixture
def policy_factory():
    """Fresh identical policies (same init seed) for runs that must match."""
    return lambda: CharPolicy(tiny_qwen3())


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models run far faster on one thread, especially on a shared machine."""
    try:
        import torch
    except ImportError:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
