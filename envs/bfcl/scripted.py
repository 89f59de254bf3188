"""A scripted BFCL player: replays the ground truth with a tunable error rate.

Used to benchmark allocation on the real env without an LLM (the agents package wraps
it as a policy), by the env's `example_action`, and by the tests. It is stateless: the
position in the episode is recovered from the assistant messages so far (a message
without calls ended a user turn), and within a turn the next ground-truth call is the
first one not yet made (in order). Each step errs with probability ``error_rate``:

- ``wrong_argument``: the next ground-truth call with one argument changed;
- ``extra_call``: a ground-truth call of another turn of the same entry (often
  state-changing) instead of the next one;
- ``stop_early``: a plain reply, ending the user turn with calls still missing;
- in a turn whose ground truth is empty (miss_param / miss_func / irrelevance turns),
  a stray call instead of the reply.

A wrong or extra call is followed by the correct call on the next correct step, so
some errors are recoverable and others (state changes, a stopped turn) are not, which
gives intermediate success rates.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from trace_gym.envs.bfcl.backends import call_signature as signature
from trace_gym.envs.bfcl.backends import execute_call, method_table
from trace_gym.envs.bfcl.data import BFCLEntry
from trace_gym.envs.bfcl.parsing import Call, parse_action, parse_python_calls
from trace_gym.envs.bfcl.scoring import ground_truth_trace, state_differences

from trace_gym.errors import ConfigError

__all__ = [
    "ERROR_KINDS",
    "PERTURBATIONS",
    "SYNTAXES",
    "ScriptedBFCL",
    "example_action",
    "format_calls",
    "ground_truth_actions",
    "replay_position",
]

#: BFCL's MAXIMUM_STEP_LIMIT (steps with calls per user turn)
MAX_STEPS_PER_TURN = 20
ERROR_KINDS: tuple[str, ...] = ("wrong_argument", "extra_call", "stop_early")
SYNTAXES: tuple[str, ...] = ("hermes", "python", "json")
DONE_REPLY = "I have completed the request."
CANNOT_REPLY = "I cannot complete this request with the functions and information I have."


def _named(call: Call, involved: tuple[str, ...]) -> Call:
    """The call with positional arguments turned into keywords (via the backend signature)."""
    if not call.args:
        return call
    cls = method_table(involved).get(call.name)
    if cls is None:
        return call
    names = [p for p in signature(cls, call.name).parameters if p != "self"]
    kwargs = dict(zip(names, call.args, strict=False))
    kwargs.update(call.kwargs)
    return Call(call.name, (), kwargs)


def _key(call: Call, involved: tuple[str, ...]) -> str:
    named = _named(call, involved)
    return json.dumps([named.name, sorted(named.kwargs.items())], default=repr)


def format_calls(calls: Sequence[Call], syntax: str, involved: tuple[str, ...]) -> str:
    """Assistant text making `calls` in one of `SYNTAXES`."""
    named = [_named(c, involved) for c in calls]
    if syntax == "hermes":
        return "\n".join(
            f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.kwargs})}\n</tool_call>"
            for c in named
        )
    if syntax == "json":
        items = [{"name": c.name, "arguments": c.kwargs} for c in named]
        return json.dumps(items[0] if len(items) == 1 else items)
    if syntax == "python":
        return "[" + ", ".join(c.to_bfcl() for c in named) + "]"
    raise ConfigError(f"syntax must be one of {SYNTAXES}, got {syntax!r}")


def replay_position(actions: Sequence[str]) -> tuple[int, list[list[str]]]:
    """(user turn, decoded calls per step of that turn) after `actions` (env defaults)."""
    turn, steps = 0, []
    for text in actions:
        parsed = parse_action(text)
        if parsed.is_reply:
            turn, steps = turn + 1, []
        elif parsed.calls:
            steps.append([c.to_bfcl() for c in parsed.calls])
    return turn, steps


def _calls_made(text: str) -> list[Call]:
    """The calls of one recorded call string; none when the model's call cannot be parsed back.

    The env records whatever the model called, so a name such as ``"a b"`` or a lone
    surrogate (``"\\ud800"``, which `ast.parse` cannot encode) does not parse; such a call
    never matches the ground truth, so it is simply not counted.
    """
    try:
        return parse_python_calls(text)
    except (
        SyntaxError,
        ValueError,
        RecursionError,
        MemoryError,
    ):  # UnicodeEncodeError is a ValueError
        return []


def _perturb(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.5
    if isinstance(value, str):
        return value + "_x" if value else "x"
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    if isinstance(value, dict):
        return {}
    return "x"


@dataclass
class ScriptedBFCL:
    """Ground-truth replay with errors; `act` maps the messages so far to the next one."""

    #: probability that a step errs (0 replays the ground truth exactly)
    error_rate: float = 0.0
    #: how calls are written: "hermes" (<tool_call> JSON), "python" or "json"
    syntax: str = "hermes"
    #: make all remaining ground-truth calls of a turn in one message (else one per step)
    parallel: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise ConfigError(f"error_rate must be in [0, 1], got {self.error_rate}")
        if self.syntax not in SYNTAXES:
            raise ConfigError(f"syntax must be one of {SYNTAXES}, got {self.syntax!r}")

    def act(self, entry: BFCLEntry, actions: Sequence[str], rng: np.random.Generator) -> str:
        """The next assistant message after `actions` (this episode's messages so far)."""
        turn, steps = replay_position(actions)
        return self.next_action(entry, turn, steps, rng)

    def next_action(
        self,
        entry: BFCLEntry,
        turn: int,
        turn_calls: Sequence[Sequence[str]],
        rng: np.random.Generator,
    ) -> str:
        """The next message at user turn `turn`, given the calls made in it so far."""
        if turn >= entry.num_turns:
            return DONE_REPLY
        involved = entry.involved_classes
        truth = [c for text in entry.ground_truth[turn] for c in parse_python_calls(text)]
        err = rng.random() < self.error_rate
        if not truth:
            return (
                format_calls([self._stray(entry, turn, rng)], self.syntax, involved)
                if err
                else CANNOT_REPLY
            )
        made = [
            _key(c, involved) for step in turn_calls for text in step for c in _calls_made(text)
        ]
        done = 0
        for key in made:  # greedy in-order match of the ground truth against the calls made
            if done < len(truth) and key == _key(truth[done], involved):
                done += 1
        if done >= len(truth):
            return DONE_REPLY
        if not err:
            # one call per step, unless the turn has more calls than BFCL's step limit
            per_step = len(truth) if self.parallel else -(-len(truth) // MAX_STEPS_PER_TURN)
            todo = truth[done : done + per_step]
            return format_calls(todo, self.syntax, involved)
        kind = ERROR_KINDS[int(rng.integers(len(ERROR_KINDS)))]
        if kind == "stop_early":
            return DONE_REPLY
        if kind == "wrong_argument":
            named = _named(truth[done], involved)
            if named.kwargs:
                keys = sorted(named.kwargs)
                k = keys[int(rng.integers(len(keys)))]
                wrong = Call(named.name, (), {**named.kwargs, k: _perturb(named.kwargs[k])})
                return format_calls([wrong], self.syntax, involved)
        return format_calls([self._stray(entry, turn, rng)], self.syntax, involved)

    @staticmethod
    def _stray(entry: BFCLEntry, turn: int, rng: np.random.Generator) -> Call:
        """A ground-truth call of another turn (or any turn when there is no other)."""
        pool = [t for i, calls in enumerate(entry.ground_truth) if i != turn for t in calls]
        pool = pool or [t for calls in entry.ground_truth for t in calls]
        return parse_python_calls(pool[int(rng.integers(len(pool)))])[0]


def example_action(
    entry: BFCLEntry, turn: int, turn_calls: Sequence[Sequence[str]], rng: np.random.Generator
) -> str:
    """A plausible message for the env's current state (mostly right, in a random syntax)."""
    syntax = SYNTAXES[int(rng.integers(len(SYNTAXES)))]
    return ScriptedBFCL(error_rate=0.2, syntax=syntax).next_action(entry, turn, turn_calls, rng)


#: systematic perturbations of a ground-truth replay (see `ground_truth_actions`)
PERTURBATIONS: tuple[str, ...] = ("drop_call", "wrong_argument", "extra_call", "irrelevant_call")


def ground_truth_actions(
    entry: BFCLEntry,
    perturbation: str | None = None,
    rng: np.random.Generator | None = None,
    syntax: str = "python",
) -> list[str] | None:
    """The assistant messages replaying `entry`'s ground truth, optionally perturbed once.

    Each turn with calls is one message with all its calls, followed by a plain reply
    ending the turn.
    `perturbation` (one of `PERTURBATIONS`) changes one place chosen with `rng`:
    ``drop_call`` removes a call, ``wrong_argument`` changes one argument of a call,
    ``extra_call`` adds a state-changing call (one of another turn) to a turn with calls, ``irrelevant_call``
    adds a call to a turn whose ground truth is empty. Returns None when the entry has
    no place for the perturbation.
    """
    involved = entry.involved_classes
    turns = [
        [c for text in calls for c in parse_python_calls(text)] for calls in entry.ground_truth
    ]
    if perturbation is not None:
        if perturbation not in PERTURBATIONS:
            raise ConfigError(f"perturbation must be one of {PERTURBATIONS}, got {perturbation!r}")
        rng = rng if rng is not None else np.random.default_rng(0)
        if not _perturb_turns(entry, turns, perturbation, rng):
            return None
    actions = []
    for calls in turns:
        if calls:
            actions.append(format_calls(calls, syntax, involved))
        actions.append(DONE_REPLY if calls else CANNOT_REPLY)
    return actions


def _pick(rng: np.random.Generator, items: Sequence[Any]) -> Any:
    return items[int(rng.integers(len(items)))] if items else None


def _perturb_turns(
    entry: BFCLEntry, turns: list[list[Call]], kind: str, rng: np.random.Generator
) -> bool:
    """Apply one perturbation in place; False when the entry has no place for it."""
    involved = entry.involved_classes
    places = [(t, i) for t, calls in enumerate(turns) for i in range(len(calls))]
    if kind == "drop_call":
        place = _pick(rng, places)
        if place is None:
            return False
        del turns[place[0]][place[1]]
        return True
    if kind == "wrong_argument":
        place = _pick(rng, [(t, i) for t, i in places if _named(turns[t][i], involved).kwargs])
        if place is None:
            return False
        named = _named(turns[place[0]][place[1]], involved)
        k = _pick(rng, sorted(named.kwargs))
        turns[place[0]][place[1]] = Call(
            named.name, (), {**named.kwargs, k: _perturb(named.kwargs[k])}
        )
        return True
    with_calls = [t for t, calls in enumerate(turns) if calls]
    targets = (
        with_calls if kind == "extra_call" else [t for t, calls in enumerate(turns) if not calls]
    )
    t = _pick(rng, targets)
    if t is None:
        return False
    pool = [c for u, calls in enumerate(turns) if u != t for c in calls]
    if kind == "extra_call":
        pool = [pool[i] for i in rng.permutation(len(pool))]
        pool = [c for c in pool if _changes_state(entry, t, c)][:1]
    if not pool:
        return False
    turns[t].append(_pick(rng, pool))
    return True


def _changes_state(entry: BFCLEntry, turn: int, call: Call) -> bool:
    """Whether `call`, made after the ground truth of `turn`, changes a public attribute."""
    after = ground_truth_trace(entry.id).backends_after(turn)
    backends = pickle.loads(pickle.dumps(after))
    execute_call(backends, call, method_table(entry.involved_classes))
    return bool(state_differences(backends, after))
