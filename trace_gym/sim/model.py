"""The simulator's generative model: tasks, the simulated policy's choices, exact values.

A task is a small decision process. It has a base success logit ``b``, a turn count
``T`` and, for every turn ``t`` and move ``a``, a logit shift ``delta[t, a]`` rounded to
a grid (so the latent logit after any history is ``b + grid * k`` for an integer
offset ``k``). Each turn the simulated policy

- writes malformed text with probability ``malformed_prob`` (a wasted turn, k unchanged),
- answers with probability ``answer_prob(t, logit)`` (t >= 1; the episode ends), or
- moves: picks ``a`` with probability ``softmax(skill * delta[t] + habit)``.

After ``T`` turns (or an answer) the reward is Bernoulli(sigmoid(logit)). The policy's
choice distribution depends only on (task, turn, moves so far, skill), so the exact
success probability from any history is a backward recursion over (t, k)::

    V[T, k] = sigmoid(b + grid k)
    V[t, k] = p_ans(t, k) sigmoid(b + grid k) + p_mal V[t+1, k]
              + p_move(t, k) sum_a pi_t(a) V[t+1, k + d[t, a]]

computed once per (task, skill) as a (T+1, 2R+1) table (R = the largest reachable
|k|) and cached. Z_t = V[t, k_t] is the martingale of docs/sim.md "The model".
"""

from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.sim.presets import PRESETS, SimPreset, get_preset

__all__ = [
    "ANSWER",
    "WASTE",
    "SimTask",
    "answer_prob",
    "make_task",
    "move_probs",
    "parse_action",
    "parse_task_id",
    "state_of",
    "task_id",
    "true_value",
    "value_table",
]

#: action codes besides the moves 0..K-1
WASTE, ANSWER = -1, -2

_ACTION = re.compile(r"^action\s*(\d+)$")
_TASK_ID = re.compile(r"^sim-(?P<preset>[a-z0-9_]+)-(?P<seed>\d+)-(?P<index>\d+)$")
#: what the observation before a turn says (v2): the hint the shared move effects key on
HINTS = ("a formula", "a name", "a date", "a number", "a contradiction", "a dead end")

_TOPICS = {
    "math": ("algebra", "geometry", "counting", "number-theory", "calculus", "probability"),
    "hotpotqa": ("film", "sports", "politics", "music", "science", "history"),
    "bfcl": ("filesystem", "trading", "travel", "messaging", "vehicle", "ticketing"),
}
_DEFAULT_TOPICS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")


def sigmoid(x):
    """Logistic function (numpy-friendly)."""
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=float)))


@dataclass(frozen=True, eq=False)
class SimTask:
    """The hidden parameters of one task (the simulated policy may read them by task id)."""

    id: str
    preset: SimPreset
    index: int
    turns: int
    topic: str
    base: float
    #: integer grid shifts, shape (turns, num_actions)
    shifts: np.ndarray
    #: the simulated policy's task-specific action biases, shape (num_actions,)
    habit: np.ndarray
    #: noisy difficulty reading shown in the prompt (0 = hardest .. 5 = easiest)
    clue: int
    #: largest reachable |k|
    reach: int
    #: v2: the hint shown before each turn (index into HINTS), shape (turns,); () in v1
    hints: tuple[int, ...] = ()
    #: v2: the knife-edge turns (0-based), sorted
    knife: tuple[int, ...] = ()
    #: v2: the shifts the simulated policy's preferences follow (the knife-edge part left
    #: out: at a knife edge the policy cannot tell which way it cuts); None = `shifts`
    pref: np.ndarray | None = None

    @property
    def preference_shifts(self) -> np.ndarray:
        return self.shifts if self.pref is None else self.pref

    def logit(self, k: int | np.ndarray) -> float | np.ndarray:
        return self.base + self.preset.grid * k


def task_id(preset: SimPreset, seed: int, index: int) -> str:
    """The id of task `index` of the pool seeded `seed` (``sim-<preset>-<seed>-<index>``)."""
    return f"sim-{preset.id_stem}-{int(seed)}-{int(index)}"


def parse_task_id(tid: str) -> tuple[str, int, int]:
    """(preset name, pool seed, index) of a simulator task id."""
    m = _TASK_ID.match(tid)
    if m is None:
        raise ConfigError(
            f"{tid!r} is not a simulator task id (expected sim-<preset>-<seed>-<index>)"
        )
    return m["preset"], int(m["seed"]), int(m["index"])


def _topic_offsets(preset: SimPreset) -> np.ndarray:
    rng = np.random.default_rng([zlib.crc32(preset.id_stem.encode()), 7])
    return rng.normal(0.0, preset.topic_sd, size=len(_DEFAULT_TOPICS))


@functools.lru_cache(maxsize=64)
def shared_effects(domain: str, num_hints: int, num_actions: int) -> np.ndarray:
    """E[topic, hint, move] ~ Normal(0, 1): the move effects every task of a domain shares."""
    rng = np.random.default_rng([zlib.crc32(domain.encode()), 11])
    e = rng.normal(size=(len(_DEFAULT_TOPICS), num_hints, num_actions))
    e.flags.writeable = False
    return e


def _v2_shifts(preset: SimPreset, seed: int, index: int, t_idx: int, turns: int):
    """(shared-effect shifts, knife-edge shifts (both (turns, K)), hints, knife turns) of a
    v2 task, from its own random stream."""
    rng = np.random.default_rng([zlib.crc32(preset.id_stem.encode()), int(seed), int(index), 2])
    K = preset.num_actions
    extra = np.zeros((turns, K))
    hints = np.zeros(turns, dtype=np.int64)
    if preset.num_hints:
        hints = rng.integers(preset.num_hints, size=turns)
        e = shared_effects(preset.topic_domain, preset.num_hints, K)
        extra += preset.shared_sd * e[t_idx, hints]
    n_knife = min(preset.knife_turns, turns)
    knife = np.sort(rng.choice(turns, size=n_knife, replace=False)) if n_knife else np.zeros(0, int)
    edge = np.zeros((turns, K))
    for t in knife:
        edge[t] = preset.knife_sd * rng.normal(size=K)
    return extra, edge, tuple(int(h) for h in hints), tuple(int(t) for t in knife)


@functools.lru_cache(maxsize=65536)
def make_task(preset: SimPreset, seed: int, index: int) -> SimTask:
    """Task `index` of the pool seeded `seed`: a pure function of its arguments."""
    rng = np.random.default_rng([zlib.crc32(preset.id_stem.encode()), int(seed), int(index)])
    turns = int(rng.integers(preset.turns_min, preset.turns_max + 1))
    t_idx = int(rng.integers(len(_DEFAULT_TOPICS)))
    topic = _TOPICS.get(preset.topic_domain, _DEFAULT_TOPICS)[t_idx]
    base = float(preset.base_mean + _topic_offsets(preset)[t_idx] + preset.base_sd * rng.normal())
    raw = rng.normal(0.0, preset.delta_sd, size=(turns, preset.num_actions))
    habit = rng.normal(0.0, preset.habit_sd, size=preset.num_actions)
    seen = float(sigmoid(base + preset.prompt_noise * rng.normal()))
    hints: tuple[int, ...] = ()
    knife: tuple[int, ...] = ()
    pref = None
    if preset.is_v2:  # a separate stream: the v1 draws above stay exactly as they were
        extra, edge, hints, knife = _v2_shifts(preset, seed, index, t_idx, turns)
        raw = raw + extra
        pref = np.rint(raw / preset.grid).astype(np.int64)
        pref.flags.writeable = False
        raw = raw + edge
    shifts = np.rint(raw / preset.grid).astype(np.int64)
    clue = int(np.searchsorted([0.1, 0.3, 0.5, 0.7, 0.9], seen))
    shifts.flags.writeable = False
    habit.flags.writeable = False
    reach = int(np.abs(shifts).max(axis=1).sum())
    return SimTask(
        task_id(preset, seed, index),
        preset,
        int(index),
        turns,
        topic,
        base,
        shifts,
        habit,
        clue,
        reach,
        hints,
        knife,
        pref,
    )


def task_from_id(tid: str, preset: str | SimPreset | None = None) -> SimTask:
    """The task behind a task id (the preset defaults to the one named in the id)."""
    stem, seed, index = parse_task_id(tid)
    p = get_preset(preset) if preset is not None else preset_for_stem(stem)
    if p.id_stem != stem:
        raise ConfigError(f"task {tid!r} belongs to preset stem {stem!r}, not {p.name!r}")
    return make_task(p, seed, index)


def preset_for_stem(stem: str) -> SimPreset:
    """The registered preset whose task ids read ``sim-<stem>-...``."""
    for p in PRESETS.values():
        if p.id_stem == stem:
            return p
    return get_preset(stem)  # raises UnknownNameError with the list of names


# ---------------------------------------------------------------------- the policy's choices
def answer_prob(preset: SimPreset, t: int, logit):
    """Chance that the policy answers at turn t (0 before the first turn): confident -> answers."""
    if t < 1:
        return np.zeros_like(np.asarray(logit, dtype=float))
    return preset.answer_rate * sigmoid(preset.answer_slope * (np.abs(logit) - preset.answer_at))


def move_probs(task: SimTask, t: int, skill: float) -> np.ndarray:
    """The policy's distribution over moves at turn t, given that it moves (shape (K,))."""
    z = skill * task.preset.grid * task.preference_shifts[t] + task.habit
    z = np.exp(z - z.max())
    return z / z.sum()


def parse_action(text: str, num_actions: int) -> int:
    """Action code of an assistant message: a move 0..K-1, `ANSWER`, or `WASTE` (malformed).

    The action is the last non-empty line: ``action N`` or ``answer`` (case and a
    trailing period ignored; N in ASCII digits); anything else is malformed, a line
    longer than any valid action included.
    """
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    if not lines or len(lines[-1]) > 64:  # "action" + spaces + a move number fit easily
        return WASTE
    last = lines[-1].lower().rstrip(".").strip()
    if last == "answer":
        return ANSWER
    m = re.fullmatch(r"action[ \t]*([0-9]{1,9})", last, re.ASCII)
    if m and int(m.group(1)) < num_actions:
        return int(m.group(1))
    return WASTE


def state_of(task: SimTask, actions: Sequence[int | str]) -> tuple[int, int, bool]:
    """(turns done, grid offset k, ended) after `actions` (codes or assistant texts)."""
    k, t, ended = 0, 0, False
    for a in actions:
        if ended:
            raise ConfigError(
                f"{task.id}: actions continue after the episode ended ({list(actions)!r})"
            )
        code = parse_action(a, task.preset.num_actions) if isinstance(a, str) else int(a)
        if code == ANSWER and t == 0:  # the env refuses to grade before the first turn
            code = WASTE
        if code >= 0:
            k += int(task.shifts[t, code])
        t += 1
        ended = code == ANSWER or t >= task.turns
    return t, k, ended


# ---------------------------------------------------------------------- exact values
def transition_parts(task: SimTask, skill: float):
    """(successor index (T, K, 2R+1), move probs (T, K), answer prob (2R+1,)) of the recursion."""
    p, R = task.preset, task.reach
    ks = np.arange(-R, R + 1)
    # successor offsets of every (turn, move, k), clipped at the (unreachable) edges
    succ = np.clip(np.arange(ks.size)[None, None, :] + task.shifts[:, :, None], 0, ks.size - 1)
    z = skill * p.grid * task.preference_shifts + task.habit  # (T, K) move logits
    pm = np.exp(z - z.max(axis=1, keepdims=True))
    pm /= pm.sum(axis=1, keepdims=True)
    ans = answer_prob(p, 1, task.logit(ks))  # the same for every t >= 1
    return succ, pm, ans


def backward_table(task: SimTask, skill: float, terminal: np.ndarray) -> np.ndarray:
    """E[terminal(k_end) | t, k] for every state: the value recursion with any end payoff."""
    p = task.preset
    succ, pm, ans = transition_parts(task, skill)
    V = np.empty((task.turns + 1, terminal.size))
    V[task.turns] = terminal
    for t in range(task.turns - 1, -1, -1):
        nxt = V[t + 1]
        pa = ans if t >= 1 else 0.0
        moved = pm[t] @ nxt[succ[t]]  # (K,) @ (K, 2R+1)
        V[t] = pa * terminal + p.malformed_prob * nxt + (1.0 - p.malformed_prob - pa) * moved
    return V


@functools.lru_cache(maxsize=4096)
def value_table(task: SimTask, skill: float) -> np.ndarray:
    """V[t, k + reach]: exact success probability after t turns at offset k (read-only)."""
    win = sigmoid(task.logit(np.arange(-task.reach, task.reach + 1)))
    V = backward_table(task, skill, win)
    V.flags.writeable = False
    return V


def value_at(task: SimTask, t: int, k: int, ended: bool, skill: float) -> float:
    """Exact P(success) at a state, before the final reward draw."""
    if ended:
        return float(sigmoid(task.logit(k)))
    return float(value_table(task, float(skill))[t, k + task.reach])


def true_value(
    task_id: str,
    actions_so_far: Sequence[int | str] = (),
    preset: str | SimPreset | None = None,
    skill: float | None = None,
) -> float:
    """Exact P(success | state) after `actions_so_far` under the simulated policy.

    `actions_so_far` are action codes or the assistant texts of a tree path
    (``[t.action for t in tree.turns(node_id)]``). After the episode's last turn this
    is sigmoid(final logit), the probability *before* the reward draw. `skill`
    defaults to the preset's (pass `skill_at(preset, step, drift)` under drift).
    """
    task = task_from_id(task_id, preset)
    t, k, ended = state_of(task, actions_so_far)
    return value_at(task, t, k, ended, task.preset.skill if skill is None else skill)


def pool_values(
    preset: str | SimPreset, num_tasks: int, seed: int = 0, skill: float | None = None
) -> np.ndarray:
    """Z_0 of every task in a pool (the prompt-level success probabilities)."""
    p = get_preset(preset)
    s = p.skill if skill is None else skill
    return np.array([value_at(make_task(p, seed, i), 0, 0, False, s) for i in range(num_tasks)])
