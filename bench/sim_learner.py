"""A fast learner on the simulator: a softmax policy over moves, trained by the project's optimisers.

The policy reads only what the observation text shows: the topic (prompt), the hint
before the turn ("Next: you notice a formula.") and the turn number. Its move logits are
``theta[topic, hint, move] + beta[turn, move]`` (zero at the start: uniform moves), so
what it learns transfers to tasks it never saw (the simulator's shared effects are keyed
on topic x hint x move; knife edges and per-task noise are not learnable). Whether it
writes malformed text or answers early is the simulator's rule (`malformed_prob`,
`answer_prob`) and is not learned.

Trees come from the same `BranchingRunner`, allocators and predictors as every other
run; advantages from `trace_gym.trainers.advantages`; the update is `policy_loss` of
`trace_gym.trainers.losses` on per-move log-probabilities (one on-policy epoch, Adam).
Held-out success is exact: `trace_gym.sim.policy_value` under the current policy.

Asynchronous rollouts (`trace_gym.async_rollouts`): `LearnedSimPolicy.snapshot` is the
frozen copy the producer generates with, and `pg_update(..., behaviour=snapshot)` weights
the moves of stale units by the truncated ratio min(pi / pi_behaviour, is_cap) (the
simulator's answer and malformed probabilities do not depend on the parameters, so the
ratio of the move softmaxes is the ratio of the recorded choices' probabilities).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from trace_gym.trainers.advantages import TrainUnit, compute_advantages
from trace_gym.trainers.losses import policy_loss

from trace_gym.async_rollouts import unit_staleness
from trace_gym.errors import ConfigError
from trace_gym.optional import require
from trace_gym.policy import Conversation, PolicyOutput
from trace_gym.sim.env import SimEnv
from trace_gym.sim.model import HINTS, SimTask, answer_prob, parse_action, state_of, task_from_id
from trace_gym.sim.policy import fake_token_ids
from trace_gym.sim.policy_value import policy_success, policy_value_table
from trace_gym.sim.presets import SimPreset, get_preset
from trace_gym.tree import RolloutTree

torch = require("torch", "train")

__all__ = [
    "LearnedSimPolicy",
    "LearnedValuePredictor",
    "LearnerEnv",
    "MoveFeatures",
    "Staleness",
    "exact_success",
    "pg_update",
    "unit_moves",
]

_TOPIC = re.compile(r"Topic: ([a-z\-]+)\.")
_HINT = re.compile(r"Next: you notice (" + "|".join(re.escape(h) for h in HINTS) + r")\.")


def topics_of(preset: SimPreset) -> tuple[str, ...]:
    """The topic names a preset's prompts can show (its domain's six)."""
    from trace_gym.sim import model

    return model._TOPICS.get(preset.topic_domain, model._DEFAULT_TOPICS)


@dataclass(frozen=True)
class MoveFeatures:
    """What the policy conditions a move on: (topic, hint, turn) indices read from text."""

    topic: int
    hint: int
    turn: int


def read_features(preset: SimPreset, prompt: str, last_obs: str, turn: int) -> MoveFeatures:
    """Features of the next move from the prompt and the observation just before it."""
    m = _TOPIC.search(prompt)
    topics = topics_of(preset)
    if m is None or m.group(1) not in topics:
        raise ConfigError(f"no known topic in the prompt {prompt[:80]!r}")
    h = _HINT.search(last_obs)
    hint = HINTS.index(h.group(1)) if h else 0
    return MoveFeatures(topics.index(m.group(1)), hint, min(turn, preset.turns_max - 1))


class LearnedSimPolicy:
    """The learned policy: `generate` plays the simulator; its parameters are torch tensors."""

    def __init__(self, preset: str | SimPreset):
        self.preset = get_preset(preset)
        p = self.preset
        self.theta = torch.zeros(
            len(topics_of(p)),
            max(1, p.num_hints),
            p.num_actions,
            dtype=torch.float64,
            requires_grad=True,
        )
        self.beta = torch.zeros(p.turns_max, p.num_actions, dtype=torch.float64, requires_grad=True)
        self.version = 0
        self._sync()

    def parameters(self) -> list[Any]:
        return [self.theta, self.beta]

    def snapshot(self) -> LearnedSimPolicy:
        """A frozen copy (the parameters as of now, the same version) to generate with."""
        snap = object.__new__(LearnedSimPolicy)
        snap.preset = self.preset
        snap.theta, snap.beta = self.theta.detach().clone(), self.beta.detach().clone()
        snap._theta, snap._beta = self._theta.copy(), self._beta.copy()
        snap.version, snap._tables = self.version, {}
        return snap

    def _sync(self) -> None:
        self._theta = self.theta.detach().numpy().copy()
        self._beta = self.beta.detach().numpy().copy()
        self.version += 1
        self._tables: dict[str, np.ndarray] = {}

    def move_probs(self, f: MoveFeatures) -> np.ndarray:
        z = self._theta[f.topic, f.hint] + self._beta[f.turn]
        z = np.exp(z - z.max())
        return z / z.sum()

    def task_move_probs(self, task: SimTask) -> np.ndarray:
        """(T, K) move distribution on a task (the same features its observations show)."""
        topic = topics_of(task.preset).index(task.topic)
        hints = task.hints or (0,) * task.turns
        return np.stack(
            [
                self.move_probs(MoveFeatures(topic, hints[t], min(t, task.preset.turns_max - 1)))
                for t in range(task.turns)
            ]
        )

    def value_table(self, task: SimTask) -> np.ndarray:
        """Exact V[t, k + reach] on `task` under the current parameters (cached until the next update)."""
        if task.id not in self._tables:
            self._tables[task.id] = policy_value_table(task, self.task_move_probs(task))
        return self._tables[task.id]

    def value_at(self, task: SimTask, t: int, k: int, ended: bool) -> float:
        if ended:
            return float(1.0 / (1.0 + math.exp(-float(task.logit(k)))))
        return float(self.value_table(task)[t, k + task.reach])

    def generate(self, conversations: Sequence[Conversation]) -> list[PolicyOutput]:
        return [self._turn(c) for c in conversations]

    def _turn(self, conv: Conversation) -> PolicyOutput:
        task = task_from_id(conv.task_id, self.preset)
        p = task.preset
        rng = np.random.default_rng(conv.seed)
        t, k, ended = state_of(task, [turn.action for turn in conv.turns])
        if ended:
            return _output("answer", 1.0)
        last = conv.turns[-1].observation if conv.turns else conv.prompt
        pa = float(answer_prob(p, t, task.logit(k)))
        pm = (1.0 - p.malformed_prob - pa) * self.move_probs(read_features(p, conv.prompt, last, t))
        probs = np.concatenate([pm, [p.malformed_prob, pa]])
        cum = np.cumsum(probs)
        choice = min(
            int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), probs.size - 1
        )
        draft = f"Thought: draft {int(rng.integers(2**32)):08x}"
        if choice < p.num_actions:
            text = f"{draft}, trying option {choice}.\naction {choice}"
        elif choice == p.num_actions:
            text = f"{draft}. Let me think about which option to take."
        else:
            text = f"{draft}, ready to answer.\nanswer"
        return _output(text, float(probs[choice]))


def _output(text: str, prob: float) -> PolicyOutput:
    ids = fake_token_ids(text)
    lp = math.log(max(prob, 1e-300)) / len(ids)
    return PolicyOutput(text=text, token_ids=ids, logprobs=[lp] * len(ids))


def exact_success(policy: LearnedSimPolicy, tasks: Sequence[SimTask]) -> float:
    """Mean exact P(success) over `tasks` under the policy's current parameters."""
    return float(np.mean([policy_success(t, policy.task_move_probs(t)) for t in tasks]))


def _resolve(policy: Any) -> LearnedSimPolicy:
    """A `LearnedSimPolicy`, or a zero-argument function giving the one to follow now
    (``lambda: runner.policy``: an asynchronous run's snapshot of the step)."""
    return policy if isinstance(policy, LearnedSimPolicy) else policy()


class LearnerEnv(SimEnv):
    """`trace/Sim-v0` whose `true_value()` is exact under a `LearnedSimPolicy` (for the oracle arm).

    `policy` is the policy, or a function giving the one generating now (see `_resolve`).
    """

    def __init__(self, policy: LearnedSimPolicy | Any, **kwargs: Any):
        super().__init__(**kwargs)
        self._learner = policy

    @property
    def learner(self) -> LearnedSimPolicy:
        return _resolve(self._learner)

    def true_value(self) -> float:
        if self._task_index is None or (self._done and self._reward is not None):
            return super().true_value()
        task = self.task
        ended = self._turn >= task.turns
        return self.learner.value_at(task, self._turn, self._k, ended)


class LearnedValuePredictor:
    """Exact P(success | state) under the learned policy: the oracle arm's predictor (learns nothing)."""

    name = "learned_oracle"

    def __init__(self, policy: LearnedSimPolicy | Any):
        self._policy = policy

    @property
    def policy(self) -> LearnedSimPolicy:
        return _resolve(self._policy)

    def predict(self, states: Sequence[Any]) -> np.ndarray:
        out = []
        for s in states:
            task = task_from_id(s.prompt_id, self.policy.preset)
            t, k, ended = state_of(task, [a for a, _ in s.turns])
            out.append(self.policy.value_at(task, t, k, ended))
        return np.array(out, dtype=float)

    def update(
        self, states: Sequence[Any], targets: np.ndarray, weights: np.ndarray | None = None
    ) -> dict[str, float]:
        return {"n": float(len(states))}


def unit_moves(
    preset: SimPreset, tree: RolloutTree, unit: TrainUnit
) -> list[tuple[MoveFeatures, int]]:
    """(features, move) of every move turn a unit trains (malformed and answer turns carry no gradient)."""
    out = []
    for nid in unit.nodes:
        node = tree[nid]
        if node.turn is None:
            continue
        code = parse_action(node.turn.action, preset.num_actions)
        if code < 0:
            continue
        parent = tree[node.parent] if node.parent is not None else None
        last = (
            parent.turn.observation
            if parent is not None and parent.turn is not None
            else tree.prompt
        )
        out.append((read_features(preset, tree.prompt, last, node.depth - 1), code))
    return out


def _batch(policy: LearnedSimPolicy, trees: Sequence[RolloutTree], units: Sequence[TrainUnit]):
    rows, cols, topic, hint, turn, move, adv, wts = [], [], [], [], [], [], [], []
    width = 1
    for b, u in enumerate(units):
        for j, (f, a) in enumerate(unit_moves(policy.preset, trees[u.tree], u)):
            (
                rows.append(b),
                cols.append(j),
                topic.append(f.topic),
                hint.append(f.hint),
                turn.append(f.turn),
                move.append(a),
            )
            adv.append(u.advantage), wts.append(u.weight)
            width = max(width, j + 1)
    idx = [torch.tensor(v, dtype=torch.long) for v in (rows, cols, topic, hint, turn, move)]
    return (
        idx,
        torch.tensor(adv, dtype=torch.float64),
        torch.tensor(wts, dtype=torch.float64),
        (len(units), width),
    )


def _move_logp(policy: LearnedSimPolicy, topic: Any, hint: Any, turn: Any, move: Any) -> Any:
    """log pi(move | topic, hint, turn) of the move softmax, per trained move [n]."""
    logits = policy.theta[topic, hint] + policy.beta[turn]
    return torch.log_softmax(logits, -1).gather(-1, move[:, None]).squeeze(-1)


@dataclass
class Staleness:
    """Asynchronous rollouts in `pg_update`: the policy that generated the trees, the bound."""

    #: the frozen policy the trees were generated with (`LearnedSimPolicy.snapshot`)
    behaviour: LearnedSimPolicy
    #: units staler than this (in policy versions) are dropped
    max_staleness: int
    #: cap of the truncated importance weight pi / pi_behaviour of stale moves
    is_cap: float = 2.0


def _stale_units(
    policy: LearnedSimPolicy, trees: Sequence[RolloutTree], units: list[TrainUnit], st: Staleness
) -> tuple[list[TrainUnit], list[int], int]:
    """(units within the bound, their staleness, how many were dropped)."""
    keep, ages = [], []
    for u in units:
        age = unit_staleness(trees[u.tree], u.nodes, policy.version)
        age = 0 if age is None else age
        if age <= st.max_staleness:
            keep.append(u)
            ages.append(age)
    return keep, ages, len(units) - len(keep)


def pg_update(
    policy: LearnedSimPolicy,
    optimizer: Any,
    trees: Sequence[RolloutTree],
    optimiser: str,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    aggregation: str = "token_mean",
    stale: Staleness | None = None,
) -> dict[str, float]:
    """One update: advantages by name, `policy_loss` on the per-move log-probs; with
    `stale`, units past its bound dropped and stale moves importance-weighted."""
    units = [u for u in compute_advantages(optimiser, trees) if u.advantage != 0.0]
    extra: dict[str, float] = {}
    ages: list[int] = [0] * len(units)
    if stale is not None:
        units, ages, dropped = _stale_units(policy, trees, units, stale)
        extra = {"dropped_stale": float(dropped), "staleness": float(np.mean(ages or [0]))}
    if not units:
        return {"units": 0.0, "trained_moves": 0.0, "pg_loss": 0.0, **extra}
    (rows, cols, topic, hint, turn, move), adv, wts, shape = _batch(policy, trees, units)
    if rows.numel() == 0:
        return {"units": float(len(units)), "trained_moves": 0.0, "pg_loss": 0.0, **extra}
    lp = _move_logp(policy, topic, hint, turn, move)

    def grid(values: Any) -> Any:
        g = torch.zeros(shape, dtype=torch.float64)
        return g.index_put((rows, cols), values)

    logp, mask = grid(lp), grid(torch.ones_like(lp))
    is_w = None
    if stale is not None and any(ages):
        with torch.no_grad():
            ratio = torch.exp(lp - _move_logp(stale.behaviour, topic, hint, turn, move))
            old = torch.tensor(ages, dtype=torch.long)[rows] > 0  # moves of stale units
            is_w = grid(torch.where(old, torch.clamp(ratio, max=stale.is_cap), 1.0))
            extra["is_weight"] = float(is_w[mask > 0].mean())
    out = policy_loss(
        logp,
        logp.detach(),
        grid(adv),
        mask,
        grid(wts),
        is_weights=is_w,
        clip_low=clip_low,
        clip_high=clip_high,
        aggregation=aggregation,
    )
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    policy._sync()
    return {
        "units": float(len(units)),
        "trained_moves": float(rows.numel()),
        "pg_loss": out.pg_loss,
        **extra,
    }
