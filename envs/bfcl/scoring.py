"""BFCL's multi-turn rules, reimplemented: state, response and irrelevance checks.

Mirrors ``bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker`` (2026.3.23):

- a turn whose ground truth has calls must have at least one model step with calls,
  else ``multi_turn:empty_turn_model_response``;
- after such a turn, every public attribute (``vars`` without ``_``-names) of every
  ground-truth backend must equal the model's, else ``multi_turn:instance_state_mismatch``;
- the ground truth's results of this turn must be an unordered sub-multiset of the
  model's results of *all* turns so far, else ``multi_turn:execution_response_mismatch``;
- a turn whose ground truth is empty is not state-checked; the irrelevance check
  (``multi_turn_irrelevance_checker``) requires the model to make no call there, else
  ``multi_turn:irrelevance_error:decoder_success``;
- a turn that runs past the step limit force-quits the entry: ``multi_turn:force_terminated``.

BFCL reports the first failure only; here every finished turn gets its own verdict, and
`entry_result` derives BFCL's entry-level verdict (accuracy errors in turn order first,
then irrelevance errors, which BFCL checks after the accuracy checker).
The ground-truth backends are executed per entry once and cached, read-only.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trace_gym.envs.bfcl.backends import execute_call, make_backends, method_table
from trace_gym.envs.bfcl.data import get_entry
from trace_gym.envs.bfcl.parsing import parse_python_calls

__all__ = [
    "EMPTY_TURN",
    "FORCE_TERMINATED",
    "IRRELEVANCE",
    "RESPONSE_MISMATCH",
    "STATE_MISMATCH",
    "GroundTruthTrace",
    "TurnVerdict",
    "entry_result",
    "ground_truth_trace",
    "score_turn",
    "state_differences",
    "unordered_missing",
]

STATE_MISMATCH = "multi_turn:instance_state_mismatch"
RESPONSE_MISMATCH = "multi_turn:execution_response_mismatch"
EMPTY_TURN = "multi_turn:empty_turn_model_response"
IRRELEVANCE = "multi_turn:irrelevance_error:decoder_success"
FORCE_TERMINATED = "multi_turn:force_terminated"
_ACCURACY_ERRORS = (EMPTY_TURN, STATE_MISMATCH, RESPONSE_MISMATCH)


@dataclass(frozen=True)
class GroundTruthTrace:
    """The ground truth executed turn by turn on its own backends (never mutate)."""

    #: per turn, the results of the ground-truth calls of that turn
    results: tuple[tuple[str, ...], ...]
    #: per turn, the ground-truth backends after that turn, pickled: bytes hold nothing
    #: for the garbage collector to walk (as live objects, the 800 cached entries doubled
    #: the objects a full collection walks, 48k to 95k, and full collections were the
    #: env's slowest steps)
    snapshots: tuple[bytes, ...]

    def backends_after(self, turn: int) -> Mapping[str, Any]:
        """A fresh copy of the ground-truth backends after `turn` (~0.1 ms to unpickle)."""
        return pickle.loads(self.snapshots[turn])


@functools.lru_cache(maxsize=1024)
def ground_truth_trace(entry_id: str) -> GroundTruthTrace:
    """Execute an entry's ground truth (cached; tens of microseconds to a few ms)."""
    entry = get_entry(entry_id)
    backends = make_backends(entry)
    table = method_table(entry.involved_classes)
    results, snapshots = [], []
    for turn_calls in entry.ground_truth:
        turn_results = []
        for text in turn_calls:
            for call in parse_python_calls(text):
                turn_results.append(execute_call(backends, call, table).result)
        results.append(tuple(turn_results))
        snapshots.append(pickle.dumps(backends, protocol=pickle.HIGHEST_PROTOCOL))
    return GroundTruthTrace(tuple(results), tuple(snapshots))


def unordered_missing(expected: Sequence[str], got: Sequence[str]) -> list[str]:
    """Items of `expected` not matched one-to-one in `got` (BFCL's unordered subsequence)."""
    pool = list(got)
    missing = []
    for item in expected:
        try:
            pool.remove(item)
        except ValueError:
            missing.append(item)
    return missing


def state_differences(model: Mapping[str, Any], truth: Mapping[str, Any]) -> list[str]:
    """``Class.attribute`` names whose public value differs from the ground truth's."""
    diffs = []
    for cls, gt_instance in truth.items():
        model_instance = model[cls]
        for attr, value in vars(gt_instance).items():
            if attr.startswith("_"):
                continue
            if getattr(model_instance, attr, _MISSING) != value:
                diffs.append(f"{cls}.{attr}")
    return diffs


_MISSING = object()


@dataclass(frozen=True)
class TurnVerdict:
    """The checks of one finished user turn (JSON-friendly through `to_info`)."""

    turn: int
    valid: bool
    #: BFCL's error type of the first failing check, None when the turn passes
    error_type: str | None
    #: the ground truth of this turn had calls (else it is an irrelevance turn)
    expects_calls: bool
    #: model steps with at least one decoded call, in this turn
    model_steps: int
    #: ``Class.attribute`` names that differ (state check)
    state_differences: tuple[str, ...] = ()
    #: ground-truth results the model's results lack (response check)
    missing_results: tuple[str, ...] = ()

    def to_info(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "valid": self.valid,
            "error_type": self.error_type,
            "expects_calls": self.expects_calls,
            "model_steps": self.model_steps,
            "state_differences": list(self.state_differences),
            "missing_results": list(self.missing_results),
        }


def score_turn(
    turn: int,
    trace: GroundTruthTrace,
    ground_truth_calls: Sequence[str],
    model_steps: int,
    model_backends: Mapping[str, Any],
    all_model_results: Sequence[str],
) -> TurnVerdict:
    """Apply BFCL's checks to one finished user turn."""
    if not ground_truth_calls:
        ok = model_steps == 0
        return TurnVerdict(turn, ok, None if ok else IRRELEVANCE, False, model_steps)
    if model_steps == 0:
        return TurnVerdict(turn, False, EMPTY_TURN, True, 0)
    diffs = state_differences(model_backends, trace.backends_after(turn))
    if diffs:
        return TurnVerdict(turn, False, STATE_MISMATCH, True, model_steps, tuple(diffs))
    missing = unordered_missing(trace.results[turn], all_model_results)
    if missing:
        return TurnVerdict(turn, False, RESPONSE_MISMATCH, True, model_steps, (), tuple(missing))
    return TurnVerdict(turn, True, None, True, model_steps)


def entry_result(
    verdicts: Sequence[TurnVerdict], num_turns: int, force_terminated: bool = False
) -> dict[str, Any]:
    """BFCL's entry-level verdict from per-turn verdicts (``valid``, ``error_type``, ``turn``)."""
    if force_terminated or len(verdicts) != num_turns:
        return {"valid": False, "error_type": FORCE_TERMINATED, "turn": len(verdicts)}
    for kinds in (_ACCURACY_ERRORS, (IRRELEVANCE,)):
        for v in verdicts:
            if v.error_type in kinds:
                return {"valid": False, "error_type": v.error_type, "turn": v.turn}
    return {"valid": True, "error_type": None, "turn": None}
