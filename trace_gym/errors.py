"""The one error hierarchy of trace-gym.

Every message says what went wrong *and* how to fix it. Bad agent input (an
unparseable action, a failing tool call) is never an exception: envs turn it into
an observation. These errors are for programming and configuration mistakes.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TraceGymError(Exception):
    """Base class of every error raised by trace-gym."""


class DependencyNotInstalled(TraceGymError, ImportError):
    """An optional dependency is missing; the message gives the install command."""

    def __init__(self, what: str, install: str):
        super().__init__(f"{what} is not installed. Install it with: {install}")
        self.install = install


class ResetNeeded(TraceGymError):
    """`step` (or a method that reads the episode) was called before `reset`, or after the end."""


class NotATraceEnv(TraceGymError, TypeError):
    """An env under its wrappers is not a `TraceEnv`, so it has no checkpoint/restore."""


class InvalidAction(TraceGymError, TypeError):
    """The action is not a string. (Malformed *text* is data, never this error.)"""


class TaskNotFound(TraceGymError, KeyError):
    """`options={"task": ...}` named a task id or index the env does not have."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class CheckpointError(TraceGymError):
    """A checkpoint cannot be restored into this env: foreign (other env id, class or task set) or stale."""


class CheckpointRefused(CheckpointError):
    """An env that cannot checkpoint (or a remote one that does not offer the calls) said so.

    Raised by the checkpointable-environment calls (`checkpoint()` on an OpenEnv server
    served by ``trace-gym serve-openenv``, or on its client) instead of silently resetting;
    callers that can replay fall back to replay."""


class CheckpointContractError(TraceGymError, AssertionError):
    """An env broke the restore contract (`trace_gym.checker.check_checkpoint`); the
    message says where. An AssertionError too: it is a failed check."""


class TreeError(TraceGymError, ValueError):
    """A rollout tree was built wrongly (a child under a terminal node, a leaf with children)."""


class TreeFormatError(TreeError):
    """A rollout-tree file is corrupted or written by an unsupported format version."""


class AllocationError(TraceGymError, ValueError):
    """An allocation problem is ill-posed (bad values, infeasible budget, empty pool),
    or an allocator returned counts the runner cannot use (mid-step, after rollouts ran)."""


class ConfigError(TraceGymError, ValueError):
    """A configuration value is invalid; raised at start-up, before any work."""


class UnknownNameError(ConfigError, KeyError):
    """A name (allocator, predictor, optimiser, policy, benchmark) is not registered."""

    def __init__(self, kind: str, name: str, known):
        known = sorted(known)
        super().__init__(
            f"unknown {kind} {name!r}{did_you_mean(name, known)}; choose one of: {', '.join(known)}"
        )
        self.kind, self.name, self.known = kind, name, known

    def __str__(self) -> str:
        return str(self.args[0])


class UsageError(TraceGymError):
    """A command line its parser refused (`trace_gym.cli.Parser`, instead of argparse's
    usage-and-exit); the message ends with where to read the usage."""


class PolicyError(TraceGymError, RuntimeError):
    """A policy backend failed to produce a turn (recorded on the branch, never fatal to a batch)."""


class EngineUnavailable(TraceGymError, RuntimeError):
    """No generation engine could answer a request (every engine of the pool is gone).

    Infrastructure, not data: the scheduler does not record it on the branch but lets it
    through, so the runner can re-run the prompt once engines are back.
    """


class BranchFailures(TraceGymError, RuntimeError):
    """Most of a step's branches failed (raised only with ``RunnerConfig.raise_on_failures``).

    An env or backend bug that fails every branch would otherwise only be counted.
    """


class WorkerLost(TraceGymError, RuntimeError):
    """Rollout workers kept dying on the same prompts; their trees could not be made
    (`trace_gym.distributed.RayRunner`)."""


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """``" (did you mean 'trace'?)"`` for the close matches of `name` among `known` (or "")."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def unknown(kind: str, name: str, table) -> UnknownNameError:
    """Build the error for an unregistered `name` of `kind`, listing the known ones."""
    return UnknownNameError(kind, name, list(table))
