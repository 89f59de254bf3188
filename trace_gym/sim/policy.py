"""`SimPolicy`: the simulated agent that drives `trace/Sim-v0` through the `Policy` protocol.

It reads the task's hidden parameters by task id (it *is* a simulation of a policy),
rebuilds the latent state from the conversation's recorded actions, and samples its
next turn from the distribution in `trace_gym.sim.model` using only
``np.random.default_rng(conversation.seed)``: the same conversation always gives the
same turn, however the runner batches the work.

Each turn opens with a ``Thought: draft <8 hex digits>`` line, a random nonce that
stands for the variability of an LLM's text. The env mixes a hash of the assistant
text into its draws, so two replays from one prefix are independent experiments even
when they choose the same move (with identical text they would share the env's
noise and reward draw, as the restore contract demands).

Token accounting: each turn comes with fake token ids (one id per whitespace word,
a crc32 hash mod 32000) and logprobs that sum to the log-probability of the choice,
so measured-token budgets have numbers; they are not a real tokenizer's.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

from trace_gym.policy import Conversation, PolicyOutput
from trace_gym.sim.model import answer_prob, move_probs, state_of, task_from_id
from trace_gym.sim.presets import SimPreset, get_preset, skill_at

__all__ = ["SimPolicy", "fake_token_ids"]

_JUNK = (
    "Let me think about which option to take.",
    "action?",
    "I would try option {a} but I am not sure.",
)


def fake_token_ids(text: str) -> list[int]:
    """One stable pseudo-token id per whitespace word (for token accounting only)."""
    return [zlib.crc32(w.encode()) % 32000 for w in text.split()] or [0]


class SimPolicy:
    """The simulated policy (seeded per conversation; skill grows with the step under drift).

    Args:
        preset: the preset whose tasks it plays; None reads it from each task id
            (``sim-<preset>-<seed>-<index>``), which works for the built-in presets.
        drift: False, True (the preset's per-step gain) or a per-step skill gain; must
            match the env's `drift` for `env.true_value()` to describe this policy.
        step: initial training step.
    """

    def __init__(
        self, preset: str | SimPreset | None = None, drift: bool | float = False, step: int = 0
    ):
        self.preset = None if preset is None else get_preset(preset)
        skill_at(self.preset or get_preset("math"), 0, drift)  # validates drift at start-up
        self.drift = drift
        self.step = 0
        self.calls = 0
        self.set_step(step)

    def set_step(self, step: int) -> None:
        """Set the training step (changes the skill only when drift is on)."""
        self.step = int(step)

    def skill_for(self, preset: SimPreset) -> float:
        """The skill this policy plays `preset`'s tasks with at the current step."""
        return skill_at(preset, self.step, self.drift)

    @property
    def skill(self) -> float:
        """Skill at the current step (for the fixed preset, or `math` when none is fixed)."""
        return self.skill_for(self.preset or get_preset("math"))

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        """One turn per conversation, in order."""
        self.calls += 1
        return [self._turn(conv) for conv in conversations]

    def _turn(self, conv: Conversation) -> PolicyOutput:
        task = task_from_id(conv.task_id, self.preset)
        p = task.preset
        rng = np.random.default_rng(conv.seed)
        t, k, ended = state_of(task, [turn.action for turn in conv.turns])
        if ended:  # nothing left to decide; answering is the only sensible text
            return self._output("answer", 1.0)
        pa = float(answer_prob(p, t, task.logit(k)))
        pm = (1.0 - p.malformed_prob - pa) * move_probs(task, t, self.skill_for(p))
        probs = np.concatenate([pm, [p.malformed_prob, pa]])  # moves, malformed, answer
        cum = np.cumsum(probs)
        choice = min(
            int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), probs.size - 1
        )
        draft = f"Thought: draft {int(rng.integers(2**32)):08x}"
        if choice < p.num_actions:
            text = f"{draft}, trying option {choice}.\naction {choice}"
        elif choice == p.num_actions:
            junk = _JUNK[int(rng.integers(len(_JUNK)))].format(a=int(rng.integers(p.num_actions)))
            text = f"{draft}. {junk}"
        else:
            text = f"{draft}, ready to answer.\nanswer"
        return self._output(text, float(probs[choice]))

    @staticmethod
    def _output(text: str, prob: float) -> PolicyOutput:
        ids = fake_token_ids(text)
        lp = math.log(max(prob, 1e-300)) / len(ids)
        return PolicyOutput(text=text, token_ids=ids, logprobs=[lp] * len(ids))
