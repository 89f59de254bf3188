"""Rollout trees: one per prompt, nodes at turn boundaries, edges are turns.

Node 0 is the root (the prompt, before any turn). Every other node is the boundary
reached after one more turn; it stores only *its own* turn (assistant text, token ids
and logprobs when the policy gives them, the observation that followed, its token ids
when the policy tokenised it). A path is a walk from the root. Leaves end an episode
(terminated, truncated, or failed) and carry the episode reward.

Definitions (docs/alloc.md "Metrics" and the benchmark tables of docs/runner.md use them):

- success: a leaf whose reward is >= ``success_threshold`` (the *success event*);
- target of a node: the success rate of the (non-failed) leaves below it, bottom-up;
- anchor: the root, or any node with at least two children (a branch point);
- mixed group / mixed anchor: a tree / anchor whose scored leaves' rewards are not all
  equal (they differ by more than ``REWARD_TOL``);
- success-mixed: leaves below contain a success and a failure (the event allocation
  predicts: `expected_mixed_groups` counts success-mixed groups);
- contrastive pairs at an anchor: (success leaf, failure leaf) pairs whose lowest
  common ancestor is that anchor; summed over anchors this is S * F per tree;
- effective ratio of a batch: share of mixed trees.

Graded rewards (rewards in [0, 1], HotpotQA F1, BFCL partial credit, reasoning-gym):
allocation, targets, contrastive pairs and visit streaks use the success event
``reward >= success_threshold``; trainers use the raw reward; "mixed" is about raw
rewards, because a group whose rewards differ gives a nonzero group-normalised
advantage whatever the threshold. So a graded group can be mixed without being
success-mixed (rewards 0.2 and 0.7 at threshold 1.0), never the reverse. For rewards in
{0, 1} and any threshold in (0, 1] the two notions coincide and every number is what it
was. The constructor default stays 0.5 (files store it; for {0, 1} it is the same event
as 1.0); graded envs put ``success_threshold`` in their reset info (default
``EXACT_SUCCESS`` = 1.0 for `trace_gym.wrap` envs) and the runner builds their trees
with `success_threshold_for(reset_info)`.

Targets are derived data: `add_child` and `finish` mark them stale and the first reader
(`compute_targets`, `metrics`, `segments`, ...) computes them once, bottom-up.

File format (JSONL, one tree per line, ``version`` 2): version 2 added each node's
typed `Failure` record and the `policy_version` its turn was generated with. Version 1
files are still read; they are upgraded in memory (a failure record parsed from the
error text, no policy version).
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_gym.errors import TreeError, TreeFormatError

FORMAT_NAME = "trace-gym/rollout-tree"
FORMAT_VERSION = 2
#: versions `RolloutTree.from_dict` reads (older ones are upgraded in memory)
READ_VERSIONS = (1, 2)

#: the success threshold of graded rewards: exact success
EXACT_SUCCESS = 1.0
#: the stored default, for {0, 1} rewards (any threshold in (0, 1] gives the same event)
BINARY_THRESHOLD = 0.5
#: rewards closer than this are equal when deciding whether a group is mixed
REWARD_TOL = 1e-9

#: policy: the policy raised or returned an error; env: reset/step raised; overflow: the
#: context would exceed the model's window; infra: checkpoint restore, workers, the rest
FAILURE_KINDS = ("policy", "env", "overflow", "infra")

__all__ = [
    "FAILURE_KINDS",
    "FORMAT_VERSION",
    "Failure",
    "Node",
    "RolloutTree",
    "Segment",
    "Turn",
    "TreeMetrics",
    "batch_metrics",
    "effective_ratio",
    "success_threshold_for",
    "load_trees",
    "save_trees",
]


@dataclass
class Turn:
    """One assistant turn and the env's answer to it (the edge into a node)."""

    action: str
    observation: str
    reward: float = 0.0
    #: tokens as generated (None when the policy has no tokenizer)
    token_ids: list[int] | None = None
    #: behaviour-policy logprobs of `token_ids`, as the backend reports them
    logprobs: list[float] | None = None
    #: tokens appended to the context for `observation` (tokenised by the policy)
    obs_token_ids: list[int] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else 0


@dataclass(frozen=True)
class Failure:
    """Why a branch failed: where it happened, which kind of fault, and what was said."""

    #: the call that failed: "policy.generate", "policy", "env.reset", "env.step", ...
    where: str
    #: one of `FAILURE_KINDS`
    kind: str
    message: str

    def __post_init__(self) -> None:
        if self.kind not in FAILURE_KINDS:
            raise TreeError(f"failure kind {self.kind!r} is not one of {FAILURE_KINDS}")

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message

    @classmethod
    def from_text(cls, text: str) -> Failure:
        """The record of an error written as ``"where: message"`` (format-1 files, user code)."""
        where, sep, message = text.partition(": ")
        if not sep or " " in where:
            where, message = "", text
        head = where.lower()
        if head.startswith("env"):
            kind = "env"
        elif head.startswith(("overflow", "context")):
            kind = "overflow"
        elif head.startswith("policy"):
            kind = "policy"
        else:
            kind = "infra"
        return cls(where, kind, message)


@dataclass
class Node:
    """A turn boundary. The root (id 0) has no turn."""

    id: int
    parent: int | None
    depth: int
    turn: Turn | None = None
    children: list[int] = field(default_factory=list)
    #: "root" for the prompt, "rollout" for a fresh root rollout's turns, "replay" for
    #: turns generated by a continuation from a restored prefix
    origin: str = "root"
    #: episode ended here (terminated, truncated or failed)
    terminal: bool = False
    terminated: bool = False
    truncated: bool = False
    #: episode reward at a terminal node
    reward: float | None = None
    #: set when the branch failed here (env or policy error); the leaf has no reward.
    #: The one-line text of `failure`, kept for readers of format 1
    error: str | None = None
    #: the typed record of that failure (where, kind, message)
    failure: Failure | None = None
    #: version of the policy this node's turn was generated with (None: not exposed)
    policy_version: int | str | None = None
    #: seed the branch that created this node drew its randomness from
    seed: int | None = None
    #: predicted success probability when the allocator scored this node
    value: float | None = None
    #: exact success probability (simulator only)
    true_value: float | None = None
    #: bottom-up success rate of the leaves below (set by `compute_targets`)
    target: float | None = None
    #: leaves below (set by `compute_targets`)
    num_leaves: int = 0
    num_success: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def failed(self) -> bool:
        return self.error is not None


@dataclass(frozen=True)
class Segment:
    """A maximal chain of single-child nodes, hanging under an anchor.

    `nodes` are the node ids in order (their turns are the segment's tokens);
    `anchor` is the node the chain hangs from; `value` is the segment's target.
    """

    anchor: int
    nodes: tuple[int, ...]
    value: float | None


@dataclass(frozen=True)
class TreeMetrics:
    mixed: bool
    leaves: int
    successes: int
    failures: int
    failed_branches: int
    mixed_anchors: int
    anchors: int
    contrastive_pairs: int
    turns: int
    tokens: int
    #: the leaves contain a success and a failure at the tree's threshold
    success_mixed: bool = False
    #: mean raw reward of the scored leaves (nan when none)
    mean_reward: float = math.nan


class RolloutTree:
    """The rollout tree of one prompt in one step."""

    def __init__(
        self,
        prompt_id: str,
        prompt: str,
        *,
        env_id: str = "",
        step: int = 0,
        prompt_token_ids: list[int] | None = None,
        success_threshold: float = 0.5,
        info: dict[str, Any] | None = None,
    ):
        self.prompt_id = str(prompt_id)
        self.prompt = prompt
        self.env_id = env_id
        self.step = int(step)
        self.prompt_token_ids = prompt_token_ids
        self.success_threshold = float(success_threshold)
        self.info: dict[str, Any] = dict(info or {})
        self.nodes: list[Node] = [Node(id=0, parent=None, depth=0)]
        self._targets_stale = True

    # ------------------------------------------------------------------ building
    @property
    def root(self) -> Node:
        return self.nodes[0]

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, node_id: int) -> Node:
        return self.nodes[node_id]

    def add_child(self, parent: int, turn: Turn, *, origin: str = "rollout", **fields: Any) -> Node:
        """Append the node reached from `parent` by `turn`; returns it."""
        p = self.nodes[parent]
        if p.terminal:
            raise TreeError(
                f"node {parent} is terminal; it cannot have children (finish() ended it)"
            )
        node = Node(
            id=len(self.nodes), parent=parent, depth=p.depth + 1, turn=turn, origin=origin, **fields
        )
        self.nodes.append(node)
        p.children.append(node.id)
        self._targets_stale = True
        return node

    def finish(
        self,
        node_id: int,
        *,
        reward: float | None = None,
        terminated: bool = False,
        truncated: bool = False,
        error: str | Failure | None = None,
    ) -> None:
        """Mark `node_id` as the end of an episode, or of a failed branch (`error` set).

        `error` is a `Failure` record, or its text ``"where: message"`` (parsed into one).
        """
        node = self.nodes[node_id]
        if node.children:
            raise TreeError(f"node {node_id} has children and cannot end an episode")
        if isinstance(error, str):
            error = Failure.from_text(error)
        node.terminal = True
        node.terminated, node.truncated = bool(terminated), bool(truncated)
        node.failure = error
        node.error = None if error is None else str(error)
        node.reward = None if error is not None else (0.0 if reward is None else float(reward))
        self._targets_stale = True

    # ------------------------------------------------------------------ walking
    def path(self, node_id: int) -> list[Node]:
        """Nodes from the root's first child down to `node_id` (the root is excluded)."""
        out = []
        node = self.nodes[node_id]
        while node.parent is not None:
            out.append(node)
            node = self.nodes[node.parent]
        return out[::-1]

    def turns(self, node_id: int) -> list[Turn]:
        """The turns that lead from the prompt to `node_id`."""
        return [n.turn for n in self.path(node_id) if n.turn is not None]  # only the root has none

    def leaves(self, *, include_failed: bool = True) -> list[Node]:
        return [
            n for n in self.nodes if n.is_leaf and n.id != 0 and (include_failed or not n.failed)
        ]

    def is_success(self, node: Node) -> bool:
        return node.reward is not None and node.reward >= self.success_threshold

    def descendants(self, node_id: int) -> Iterator[Node]:
        stack = [node_id]
        while stack:
            n = self.nodes[stack.pop()]
            yield n
            stack.extend(reversed(n.children))

    def leaves_under(self, node_id: int) -> list[Node]:
        return [n for n in self.descendants(node_id) if n.is_leaf and n.id != 0]

    # ------------------------------------------------------------------ targets
    def compute_targets(self, *, force: bool = False) -> None:
        """Bottom-up success rates: a node's target is the success rate of its leaves.

        Failed branches (no reward) are not counted; a node with only failed leaves
        below gets target None. Computed once after the last `add_child` / `finish`;
        pass ``force=True`` after editing nodes by hand.
        """
        if not (self._targets_stale or force):
            return
        self._targets_stale = False
        for node in reversed(self.nodes):  # children always have larger ids
            if node.is_leaf:
                scored = node.reward is not None and node.id != 0
                node.num_leaves = int(scored)
                node.num_success = int(scored and self.is_success(node))
            else:
                node.num_leaves = sum(self.nodes[c].num_leaves for c in node.children)
                node.num_success = sum(self.nodes[c].num_success for c in node.children)
            node.target = node.num_success / node.num_leaves if node.num_leaves else None

    # ------------------------------------------------------------------ structure
    def anchors(self) -> list[Node]:
        """The root and every branch point (a node with two or more children)."""
        return [n for n in self.nodes if n.id == 0 or len(n.children) >= 2]

    def segments(self) -> list[Segment]:
        """Chain compression: every maximal single-child chain becomes one segment.

        A segment starts at a child of an anchor and runs down while each node has
        exactly one child; it ends at a leaf or at the next anchor.
        """
        self.compute_targets()
        out = []
        for anchor in self.anchors():
            for child in anchor.children:
                chain = [child]
                while len(self.nodes[chain[-1]].children) == 1:
                    chain.append(self.nodes[chain[-1]].children[0])
                out.append(
                    Segment(anchor=anchor.id, nodes=tuple(chain), value=self.nodes[child].target)
                )
        return out

    # ------------------------------------------------------------------ metrics
    def contrastive_pairs_by_anchor(self) -> dict[int, int]:
        """(success, failure) leaf pairs counted at their lowest common ancestor."""
        self.compute_targets()
        out = {}
        for anchor in self.anchors():
            s = [self.nodes[c].num_success for c in anchor.children]
            f = [self.nodes[c].num_leaves - self.nodes[c].num_success for c in anchor.children]
            # pairs across different children: total S*F minus pairs inside one child
            pairs = sum(s) * sum(f) - sum(si * fi for si, fi in zip(s, f, strict=True))
            out[anchor.id] = pairs
        return out

    def reward_spans(self) -> list[tuple[float, float] | None]:
        """Per node, (min, max) raw reward of the scored leaves below (None if none)."""
        span: list[tuple[float, float] | None] = [None] * len(self.nodes)
        for node in reversed(self.nodes):  # children always have larger ids
            if node.is_leaf:
                if node.reward is not None and node.id != 0:
                    span[node.id] = (float(node.reward), float(node.reward))
                continue
            below = [s for c in node.children if (s := span[c]) is not None]
            if below:
                span[node.id] = (min(b[0] for b in below), max(b[1] for b in below))
        return span

    def metrics(self) -> TreeMetrics:
        self.compute_targets()
        leaves = self.leaves()
        scored = [n for n in leaves if n.reward is not None]
        succ = sum(self.is_success(n) for n in scored)
        anchors = self.anchors()
        span = self.reward_spans()
        mixed_anchors = sum(_spread(span[a.id]) for a in anchors)
        turns = len(self.nodes) - 1
        tokens = sum(n.turn.num_tokens for n in self.nodes if n.turn is not None)
        rewards = [float(n.reward) for n in scored if n.reward is not None]
        return TreeMetrics(
            mixed=_spread(span[0]),
            success_mixed=0 < succ < len(scored),
            mean_reward=sum(rewards) / len(rewards) if rewards else math.nan,
            leaves=len(scored),
            successes=succ,
            failures=len(scored) - succ,
            failed_branches=len(leaves) - len(scored),
            mixed_anchors=mixed_anchors,
            anchors=len(anchors),
            contrastive_pairs=sum(self.contrastive_pairs_by_anchor().values()),
            turns=turns,
            tokens=tokens,
        )

    # ------------------------------------------------------------------ io
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "prompt_id": self.prompt_id,
            "prompt": self.prompt,
            "env_id": self.env_id,
            "step": self.step,
            "prompt_token_ids": self.prompt_token_ids,
            "success_threshold": self.success_threshold,
            "info": self.info,
            "nodes": [_node_to_dict(n) for n in self.nodes],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RolloutTree:
        if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
            raise TreeFormatError(
                "not a trace-gym rollout tree (missing 'format': "
                f"{FORMAT_NAME!r}); was the file written by trace_gym.tree.save_trees?"
            )
        version = d.get("version")
        if version not in READ_VERSIONS:
            raise TreeFormatError(
                f"rollout-tree format version {version!r} is not supported by this trace-gym "
                f"(reads versions {READ_VERSIONS}); upgrade trace-gym or re-export the trees"
            )
        _check_fields(d, _TREE_SCHEMA, f"corrupted rollout tree {d.get('prompt_id')!r:.60}")
        try:
            tree = cls(
                d["prompt_id"],
                d["prompt"],
                env_id=d["env_id"],
                step=d["step"],
                prompt_token_ids=d["prompt_token_ids"],
                success_threshold=d["success_threshold"],
                info=d["info"],
            )
            tree.nodes = [_node_from_dict(nd, version) for nd in d["nodes"]]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise TreeFormatError(f"corrupted rollout tree {d.get('prompt_id')!r}: {e!r}") from e
        _validate(tree)
        return tree

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RolloutTree) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"RolloutTree(prompt_id={self.prompt_id!r}, nodes={len(self.nodes)}, leaves={len(self.leaves())})"


def _node_to_dict(n: Node) -> dict[str, Any]:
    d = asdict(n)
    return d


def _node_from_dict(d: dict[str, Any], version: int = FORMAT_VERSION) -> Node:
    d = dict(d)
    turn = d.pop("turn")
    failure = d.pop("failure", None)
    if version == 1 and d.get("error") is not None:  # upgrade: parse the error text
        failure = Failure.from_text(d["error"])
    elif failure is not None:
        failure = Failure(**failure)
    return Node(turn=Turn(**turn) if turn is not None else None, failure=failure, **d)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_finite(x: Any) -> bool:
    return _is_num(x) and math.isfinite(x)


def _list_of(check):
    return lambda x: isinstance(x, list) and all(check(v) for v in x)


def _optional(check):
    return lambda x: x is None or check(x)


_IS_STR = lambda x: isinstance(x, str)  # noqa: E731
_IS_DICT = lambda x: isinstance(x, dict)  # noqa: E731
_IS_BOOL = lambda x: isinstance(x, bool)  # noqa: E731
#: field -> (check, what the format says it is); what loading checks before anything reads it
_TREE_SCHEMA = {
    "prompt_id": (_IS_STR, "a string"),
    "prompt": (_IS_STR, "a string"),
    "env_id": (_optional(_IS_STR), "a string or null"),
    "step": (_is_int, "an integer"),
    "prompt_token_ids": (_optional(_list_of(_is_int)), "a list of integers or null"),
    "success_threshold": (_is_num, "a number"),
    "info": (_IS_DICT, "an object"),
}
_NODE_SCHEMA = {
    "id": (_is_int, "an integer"),
    "parent": (_optional(_is_int), "an integer or null"),
    "depth": (_is_int, "an integer"),
    "children": (_list_of(_is_int), "a list of node ids"),
    "origin": (_IS_STR, "a string"),
    "terminal": (_IS_BOOL, "true or false"),
    "terminated": (_IS_BOOL, "true or false"),
    "truncated": (_IS_BOOL, "true or false"),
    "reward": (_optional(_is_finite), "a finite number or null"),
    "error": (_optional(_IS_STR), "a string or null"),
    "policy_version": (
        _optional(lambda x: _is_int(x) or isinstance(x, str)),
        "an integer, a string or null",
    ),
    "seed": (_optional(_is_int), "an integer or null"),
    "value": (_optional(_is_num), "a number or null"),
    "true_value": (_optional(_is_num), "a number or null"),
    "target": (_optional(_is_num), "a number or null"),
    "num_leaves": (_is_int, "an integer"),
    "num_success": (_is_int, "an integer"),
    "info": (_IS_DICT, "an object"),
}
_TURN_SCHEMA = {
    "action": (_IS_STR, "a string"),
    "observation": (_IS_STR, "a string"),
    "reward": (_is_finite, "a finite number"),
    "token_ids": (_optional(_list_of(_is_int)), "a list of integers or null"),
    "logprobs": (_optional(_list_of(_is_num)), "a list of numbers or null"),
    "obs_token_ids": (_optional(_list_of(_is_int)), "a list of integers or null"),
    "info": (_IS_DICT, "an object"),
}


def _check_fields(fields_: dict[str, Any], schema: dict, where: str) -> None:
    for name, (check, what) in schema.items():
        if name in fields_ and not check(fields_[name]):
            raise TreeFormatError(f"{where}: {name!r} must be {what}, got {fields_[name]!r:.60}")


def _validate(tree: RolloutTree) -> None:
    where = f"corrupted rollout tree {tree.prompt_id!r}"
    if not tree.nodes:
        raise TreeFormatError(f"{where}: 'nodes' is empty (a tree has at least its root)")
    for i, n in enumerate(tree.nodes):
        _check_fields(vars(n), _NODE_SCHEMA, f"{where}, node {i}")
        if n.turn is not None:
            _check_fields(vars(n.turn), _TURN_SCHEMA, f"{where}, node {i} turn")
        if n.id != i:
            raise TreeFormatError(f"{where}: node {i} has id {n.id}")
        if len(set(n.children)) != len(n.children):
            twice = sorted({c for c in n.children if n.children.count(c) > 1})
            raise TreeFormatError(f"{where}: node {i} lists child {twice[0]} more than once")
        for c in n.children:
            if not i < c < len(tree.nodes):
                raise TreeFormatError(f"{where}: node {i} lists child {c}, not a node after it")
            if tree.nodes[c].parent != i:
                raise TreeFormatError(
                    f"{where}: node {c} has a bad parent (node {i} lists it as a child)"
                )
        if i == 0:
            if n.parent is not None or n.turn is not None:
                raise TreeFormatError(f"{where}: bad root")
            continue
        if n.parent is None or not 0 <= n.parent < i or i not in tree.nodes[n.parent].children:
            raise TreeFormatError(f"{where}: node {i} has a bad parent")
        if n.turn is None:
            raise TreeFormatError(f"{where}: node {i} has no turn")
        if n.depth != tree.nodes[n.parent].depth + 1:
            raise TreeFormatError(f"{where}: node {i} has a bad depth")


def _spread(span: tuple[float, float] | None) -> bool:
    """Whether the rewards in a (min, max) span are not all equal."""
    return span is not None and span[1] - span[0] > REWARD_TOL


def success_threshold_for(reset_info: dict[str, Any] | None) -> float:
    """The success threshold an env declares in its reset info (else `BINARY_THRESHOLD`)."""
    value = (reset_info or {}).get("success_threshold", BINARY_THRESHOLD)
    if not 0.0 < float(value) <= 1.0:
        raise TreeError(
            f"success_threshold must be in (0, 1], got {value!r} in the env's reset info"
        )
    return float(value)


# ---------------------------------------------------------------------- batch level
def effective_ratio(trees: Sequence[RolloutTree]) -> float:
    """Share of mixed trees: scored leaf rewards not all equal (nan for no trees)."""
    if not trees:
        return math.nan
    return sum(t.metrics().mixed for t in trees) / len(trees)


def batch_metrics(trees: Sequence[RolloutTree]) -> dict[str, float]:
    """Effective ratio, mixed groups/anchors, contrastive pairs, turns and tokens of a batch."""
    ms = [t.metrics() for t in trees]
    return {
        "prompts": len(ms),
        "effective_ratio": (sum(m.mixed for m in ms) / len(ms)) if ms else math.nan,
        "mixed_groups": sum(m.mixed for m in ms),
        "success_mixed_groups": sum(m.success_mixed for m in ms),
        "mixed_anchors": sum(m.mixed_anchors for m in ms),
        "contrastive_pairs": sum(m.contrastive_pairs for m in ms),
        "leaves": sum(m.leaves for m in ms),
        "success_rate": (sum(m.successes for m in ms) / max(1, sum(m.leaves for m in ms))),
        "failed_branches": sum(m.failed_branches for m in ms),
        "turns": sum(m.turns for m in ms),
        "tokens": sum(m.tokens for m in ms),
    }


# ---------------------------------------------------------------------- files
def _open(path: Path, mode: str):
    return (
        gzip.open(path, mode + "t", encoding="utf-8")
        if path.suffix == ".gz"
        else open(path, mode, encoding="utf-8")
    )


def save_trees(trees: Iterable[RolloutTree], path: str | Path, *, append: bool = False) -> Path:
    """Write trees as JSONL (one tree per line; ``.gz`` compresses)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _open(path, "a" if append else "w") as f:
        for tree in trees:
            f.write(json.dumps(tree.to_dict(), separators=(",", ":"), allow_nan=True))
            f.write("\n")
    return path


def load_trees(path: str | Path) -> list[RolloutTree]:
    """Read trees written by `save_trees`.

    Anything wrong with the file (not UTF-8, a broken gzip stream, bad or too deeply
    nested JSON, a field of the wrong type, a broken node structure) raises
    `TreeFormatError` naming the file and line.
    """
    path = Path(path)
    trees: list[RolloutTree] = []
    lineno = 0
    try:
        with _open(path, "r") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    trees.append(_tree_from_line(line, f"{path}:{lineno}"))
    except UnicodeDecodeError as e:
        raise TreeFormatError(
            f"{path}:{lineno + 1}: not UTF-8 text ({e.reason}); the file is corrupted"
        ) from e
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise
        raise TreeFormatError(
            f"{path}:{lineno + 1}: unreadable ({e}); the file is truncated or not what its name says"
        ) from e
    return trees


def _tree_from_line(line: str, where: str) -> RolloutTree:
    try:
        d = json.loads(line)
    except json.JSONDecodeError as e:
        raise TreeFormatError(f"{where}: not valid JSON ({e.msg}); the file is corrupted") from e
    except RecursionError as e:
        raise TreeFormatError(f"{where}: JSON nested too deeply to be a rollout tree") from e
    try:
        return RolloutTree.from_dict(d)
    except TreeFormatError as e:
        raise TreeFormatError(f"{where}: {e}") from e
    except RecursionError as e:
        raise TreeFormatError(f"{where}: a value is nested too deeply to be a rollout tree") from e
