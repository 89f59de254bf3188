"""`trace/BFCL-v0`: BFCL v4 multi-turn function calling on restorable backends.

An episode is one BFCL entry. The reset observation is the first user message; the
tools the model may call are in ``info["tools"]`` as OpenAI-style schemas. Each step is
one assistant message:

- a message with calls (Hermes ``<tool_call>``, OpenAI JSON, or BFCL's python syntax)
  runs them on this episode's backends; the observation is the results (role ``tool``);
- a message without calls ends the user turn: the turn is scored with BFCL's rules and
  the observation is the next user message (role ``user``); in miss_func the held-out
  functions appear at the turn BFCL specifies, with BFCL's "I have updated some more
  functions" message and ``info["tools"]`` / ``info["new_tools"]``;
- a malformed call answers with an ``Error during execution: ...`` observation and the
  turn goes on (``on_malformed="end_turn"`` ends the turn instead, as BFCL's own
  inference loop does when it cannot decode a message).

A user turn allows 20 steps that do not end it (BFCL's MAXIMUM_STEP_LIMIT; a
malformed-only message counts as one); one more force-quits the entry
(``multi_turn:force_terminated``, reward 0). After the last user turn the episode
terminates with reward 1 only if every turn passed; per-turn verdicts
are in ``info["turn_verdict"]`` (as each turn ends) and ``info["turn_verdicts"]`` /
``info["bfcl_result"]`` at the end. Checkpoints hold the pickled backends plus episode
progress (well under a millisecond either way; see ``trace-gym bench bfcl``).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from trace_gym.envs.bfcl import data as bfcl_data
from trace_gym.envs.bfcl.backends import CallOutcome, execute_call, make_backends, method_table
from trace_gym.envs.bfcl.data import (
    ADDITIONAL_FUNCTION_PROMPT,
    CATEGORIES,
    BFCLEntry,
    to_openai_tool,
)
from trace_gym.envs.bfcl.parsing import ParsedAction, ParseLimits, parse_action
from trace_gym.envs.bfcl.scoring import (
    FORCE_TERMINATED,
    TurnVerdict,
    entry_result,
    ground_truth_trace,
    score_turn,
)

from trace_gym.core import TraceEnv, Transition
from trace_gym.errors import ConfigError, ResetNeeded

__all__ = ["BFCLEnv"]

#: BFCL's MAXIMUM_STEP_LIMIT: steps with calls allowed in one user turn
MAX_STEPS_PER_TURN = 20


def _plain(results: Sequence[str]) -> str:
    return "\n".join(results)


def _hermes(results: Sequence[str]) -> str:
    return "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)


def _json(results: Sequence[str]) -> str:
    return json.dumps(list(results))


#: how the results of one step become the observation text
OBS_FORMATS: dict[str, Callable[[Sequence[str]], str]] = {
    "plain": _plain,
    "hermes": _hermes,
    "json": _json,
}


@dataclass
class _Progress:
    """Episode progress besides the backends (pickled with them into checkpoints)."""

    user_turn: int = 0
    #: steps taken in the current user turn (any step that did not end it)
    steps_in_turn: int = 0
    #: decoded calls (BFCL strings) of each step with calls, current turn
    turn_calls: list[list[str]] = field(default_factory=list)
    #: results of every decoded call so far, all turns (BFCL's response check pool)
    all_results: list[str] = field(default_factory=list)
    #: decoded calls per finished turn, per step (what BFCL's checker receives)
    decoded: list[list[list[str]]] = field(default_factory=list)
    verdicts: list[TurnVerdict] = field(default_factory=list)


class BFCLEnv(TraceEnv):
    """BFCL v4 multi-turn entries (base, miss_func, miss_param, long_context) as a TraceEnv.

    Args:
        categories: which BFCL v4 multi-turn categories to serve (all four by default).
        max_steps_per_turn: steps with calls allowed per user turn (BFCL: 20).
        obs_format: tool results as ``"plain"`` text (one line block per call),
            ``"hermes"`` (each in ``<tool_response>`` tags) or ``"json"`` (a list).
        on_malformed: ``"error"`` (answer with the error text, the turn goes on) or
            ``"end_turn"`` (an undecodable message ends the turn, as in BFCL's loop).
        check_irrelevance: score BFCL's irrelevance check (no calls in a turn whose
            ground truth is empty). bfcl-eval 2026.3.23's runner imports but does not
            call it; BFCL v3 did. On by default.
        max_turns: total step limit of an episode (default: enough for every turn to
            use its full step budget, so only the per-turn limit binds).
        max_action_chars: longest assistant message parsed; a longer one is answered
            like a malformed call (``Error during execution: ...``, the turn goes on, or
            ends with ``on_malformed="end_turn"``).
        parse_limits: bounds on the calls of one message (`ParseLimits`: calls, bracket
            depth, python-syntax tokens); a message over one is answered the same way,
            and ``info["error"] == "action_over_limit"``, ``info["limit"]`` names it.
    """

    env_id = "trace/BFCL-v0"
    volatile_info_keys = frozenset()

    def __init__(
        self,
        categories: Sequence[str] = CATEGORIES,
        max_steps_per_turn: int = MAX_STEPS_PER_TURN,
        obs_format: str = "plain",
        on_malformed: str = "error",
        check_irrelevance: bool = True,
        max_turns: int | None = None,
        max_action_chars: int = TraceEnv.max_action_chars,
        parse_limits: ParseLimits | None = None,
        render_mode: str | None = None,
    ):
        bfcl_data.require_bfcl()
        if isinstance(categories, str):
            categories = (categories,)
        if obs_format not in OBS_FORMATS:
            raise ConfigError(
                f"obs_format must be one of {sorted(OBS_FORMATS)}, got {obs_format!r}"
            )
        if on_malformed not in ("error", "end_turn"):
            raise ConfigError(f"on_malformed must be 'error' or 'end_turn', got {on_malformed!r}")
        if max_steps_per_turn < 1:
            raise ConfigError(f"max_steps_per_turn must be >= 1, got {max_steps_per_turn}")
        if max_action_chars < 1:
            raise ConfigError(f"max_action_chars must be >= 1, got {max_action_chars}")
        self.max_action_chars = int(max_action_chars)
        self.parse_limits = parse_limits or ParseLimits()
        self.categories = tuple(categories)
        self.entries: list[BFCLEntry] = bfcl_data.load_entries(self.categories)
        self.max_steps_per_turn = int(max_steps_per_turn)
        self.obs_format = obs_format
        self.on_malformed = on_malformed
        self.check_irrelevance = bool(check_irrelevance)
        if max_turns is None:
            max_turns = (self.max_steps_per_turn + 2) * max(e.num_turns for e in self.entries)
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self._ids = [e.id for e in self.entries]
        self._backends: dict[str, Any] = {}
        self._progress = _Progress()

    # ------------------------------------------------------------------ contract
    @property
    def task_ids(self) -> Sequence[str]:
        return self._ids

    @property
    def task_set(self) -> str:
        return f"bfcl-v4-multi-turn:{'+'.join(self.categories)}"

    @property
    def current_entry(self) -> BFCLEntry:
        """The entry of this episode, ground truth included (for oracles and analysis)."""
        if self._task_index is None:
            raise ResetNeeded("no episode yet; call env.reset() first")
        return self.entries[self._task_index]

    @property
    def user_turn(self) -> int:
        """Index of the current user turn."""
        return self._progress.user_turn

    @property
    def turn_calls(self) -> list[list[str]]:
        """Decoded calls of the current user turn, per step (BFCL strings)."""
        return [list(s) for s in self._progress.turn_calls]

    def tools(self, turn: int | None = None) -> list[dict[str, Any]]:
        """OpenAI-style schemas of the functions shown at `turn` (default: the current one)."""
        turn = self._progress.user_turn if turn is None else turn
        return [to_openai_tool(d) for d in self.current_entry.functions_at(turn)]

    def _reset_task(self, task_index: int) -> tuple[str, dict[str, Any]]:
        entry = self.entries[task_index]
        self._backends = make_backends(entry)
        self._progress = _Progress()
        info = {
            "category": entry.category,
            "user_turn": 0,
            "num_user_turns": entry.num_turns,
            "involved_classes": list(entry.involved_classes),
            "tools": self.tools(0),
            "obs_role": "user",
        }
        return entry.user_text(0), info

    def _get_state(self) -> Any:
        # bytes: immutable and comparable; a pickle round trip is ~2x faster than deepcopy here
        return pickle.dumps((self._backends, self._progress), protocol=pickle.HIGHEST_PROTOCOL)

    def _set_state(self, payload: Any) -> None:
        self._backends, self._progress = pickle.loads(payload)

    # ------------------------------------------------------------------ stepping
    def _step(self, action: str) -> Transition:
        parsed = parse_action(action, self.parse_limits)
        if parsed.calls or (parsed.errors and self.on_malformed == "error"):
            transition = self._call_step(parsed)
        else:
            transition = self._end_turn(parsed)
        if parsed.limit is not None:
            transition.info.update(error="action_over_limit", limit=parsed.limit)
        return transition

    def _reject_action(self, action: str, reason: str) -> Transition:
        """An over-long message is a malformed call: its error is the observation."""
        parsed = ParsedAction((), (f"Error during execution: {reason}",), "text")
        return self._call_step(parsed) if self.on_malformed == "error" else self._end_turn(parsed)

    def _call_step(self, parsed: ParsedAction) -> Transition:
        p = self._progress
        entry = self.current_entry
        table = method_table(entry.involved_classes)
        outcomes: list[CallOutcome] = [execute_call(self._backends, c, table) for c in parsed.calls]
        if outcomes:
            p.turn_calls.append([o.call for o in outcomes])
            p.all_results.extend(o.result for o in outcomes)
        p.steps_in_turn += 1
        results = [o.result for o in outcomes] + list(parsed.errors)
        shown = {d["name"] for d in entry.functions_at(p.user_turn)}
        info: dict[str, Any] = {
            "event": "calls",
            "syntax": parsed.syntax,
            "user_turn": p.user_turn,
            "step_in_turn": p.steps_in_turn,
            "calls": [
                {"call": o.call, "status": o.status, "shown": c.name in shown}
                for c, o in zip(parsed.calls, outcomes, strict=True)
            ],
            "malformed": list(parsed.errors),
            "tool_results": results,
            "obs_role": "tool",
        }
        obs = OBS_FORMATS[self.obs_format](results)
        if p.steps_in_turn > self.max_steps_per_turn:
            p.decoded.append([list(s) for s in p.turn_calls])
            result = entry_result(p.verdicts, entry.num_turns, force_terminated=True)
            info.update(self._final_info(result), event="force_quit")
            return Transition(obs, 0.0, True, info)
        return Transition(obs, 0.0, False, info)

    def _end_turn(self, parsed: ParsedAction) -> Transition:
        p = self._progress
        entry = self.current_entry
        turn = p.user_turn
        gt_calls = entry.ground_truth[turn]
        verdict = score_turn(
            turn,
            ground_truth_trace(entry.id),
            gt_calls,
            len(p.turn_calls),
            self._backends,
            p.all_results,
        )
        if not self.check_irrelevance and not gt_calls:
            verdict = TurnVerdict(turn, True, None, False, verdict.model_steps)
        p.verdicts.append(verdict)
        p.decoded.append([list(s) for s in p.turn_calls])
        p.user_turn, p.steps_in_turn, p.turn_calls = turn + 1, 0, []
        info: dict[str, Any] = {
            "event": "end_of_turn",
            "syntax": parsed.syntax,
            "malformed": list(parsed.errors),
            "user_turn": p.user_turn,
            "turn_verdict": verdict.to_info(),
        }
        if p.user_turn == entry.num_turns:
            result = entry_result(p.verdicts, entry.num_turns)
            info.update(self._final_info(result))
            return Transition("", float(result["valid"]), True, info)
        obs = entry.user_text(p.user_turn)
        new = entry.missed_function.get(p.user_turn)
        if new:
            docs = [d for d in entry.functions_at(p.user_turn) if d["name"] in new]
            info["new_tools"] = [to_openai_tool(d) for d in docs]
            info["tools"] = self.tools(p.user_turn)
            listing = json.dumps([t["function"] for t in info["new_tools"]])
            obs = f"{listing}\n{ADDITIONAL_FUNCTION_PROMPT}" if not obs else f"{listing}\n{obs}"
        info["obs_role"] = "user"
        return Transition(obs, 0.0, False, info)

    def _final_info(self, result: dict[str, Any]) -> dict[str, Any]:
        p = self._progress
        return {
            "bfcl_result": result,
            "turn_verdicts": [v.to_info() for v in p.verdicts],
            "decoded_calls": [[list(s) for s in t] for t in p.decoded],
            "force_terminated": result["error_type"] == FORCE_TERMINATED,
        }

    # ------------------------------------------------------------------ helpers
    def example_action(self, rng: np.random.Generator) -> str:
        """The next ground-truth call (various syntaxes), sometimes a reply or a stray call."""
        from trace_gym.envs.bfcl.scripted import example_action

        return example_action(self.current_entry, self._progress.user_turn, self.turn_calls, rng)
