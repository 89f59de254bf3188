"""`trace-gym bench view`: how long the viewer takes at scale (1,000 trees x 50 nodes).

Builds synthetic trees shaped like a runner's (m root rollouts per prompt, replays from
prefixes inside them, a few failed branches, predicted values on the scored nodes,
skipped candidates in tree info), writes them as JSONL, then times `write_view` on the
file and - with the headless chromium of the browser tests - how long the first prompt
takes to render. Reported, never asserted (issue 19's goals: <= 10 s, <= 2 s).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from trace_gym.cli import Parser
from trace_gym.tree import Failure, RolloutTree, Turn, save_trees

__all__ = ["main", "run_bench", "synthetic_trees"]

_WORDS = "the agent calls search then reads the page and answers with a number after checking the units".split()


def _sentence(rng: np.random.Generator, chars: int) -> str:
    words = rng.choice(_WORDS, size=max(1, chars // 5))
    return " ".join(words)[:chars]


def _chain(tree: RolloutTree, rng, parent: int, turns: int, origin: str, chars: int) -> int:
    """Append `turns` turns below `parent` and end the episode; returns the leaf."""
    node = parent
    for k in range(turns):
        turn = Turn(
            action=_sentence(rng, chars),
            observation=_sentence(rng, chars),
            token_ids=list(range(chars // 4)),
        )
        node = tree.add_child(node, turn, origin=origin, policy_version=tree.step).id
        if k < turns - 1 and rng.random() < 0.5:
            tree.nodes[node].value = float(rng.random())
    if rng.random() < 0.05:
        tree.finish(node, error=Failure("env.step", "env", "tool server timed out"))
    else:
        tree.finish(node, reward=float(rng.random() < 0.5), terminated=True)
    return node


def synthetic_tree(prompt_id: str, step: int, nodes: int, rng, chars: int = 200) -> RolloutTree:
    """One tree of about `nodes` nodes: 4 roots of a few turns, then replays from their prefixes."""
    tree = RolloutTree(prompt_id, _sentence(rng, 2 * chars), env_id="synthetic", step=step)
    tree.root.value = float(rng.random())
    depth, roots = 4, 4
    tree.info.update(root_count=roots, candidate_value=tree.root.value)
    for _ in range(roots):
        _chain(tree, rng, 0, depth, "rollout", chars)
    while len(tree.nodes) < nodes:
        inner = [n.id for n in tree.nodes if n.origin == "rollout" and not n.terminal]
        prefix = int(rng.choice(inner))
        left = depth - tree.nodes[prefix].depth
        _chain(tree, rng, prefix, min(left, max(1, nodes - len(tree.nodes))), "replay", chars)
    tree.compute_targets(force=True)
    return tree


def synthetic_trees(
    num_trees: int, nodes: int, *, seed: int = 0, chars: int = 200, per_step: int = 100
) -> list[RolloutTree]:
    """`num_trees` trees over ceil(num_trees / per_step) steps; each step's first tree
    records three skipped candidates per selected one in ``info["skipped_candidates"]``."""
    rng = np.random.default_rng(seed)
    trees = [
        synthetic_tree(f"task-{i:05d}", i // per_step, nodes, rng, chars) for i in range(num_trees)
    ]
    for first in range(0, num_trees, per_step):
        k = min(per_step, num_trees - first)
        trees[first].info["skipped_candidates"] = [
            [f"skipped-{first + j:05d}", round(float(rng.random()), 3)] for j in range(3 * k)
        ]
    return trees


#: model text that would run script if the page pasted it into HTML or inline JSON
HOSTILE = (
    '</script><script>window.__pwned = "script"</script>',
    "<img src=x onerror=\"window.__pwned = 'onerror'\">",
    '<!-- <script>window.__pwned = "comment"</script>',
    "line\u2028separator\u2029paragraph & <b>bold</b> \"quotes\" 'single'",
    '<svg onload="window.__pwned = \'svg\'"></svg><a href="javascript:window.__pwned=1">x</a>',
)


def hostile_tree(prompt_id: str = "hostile-task", step: int = 0) -> RolloutTree:
    """A small tree whose assistant texts and observations are `HOSTILE` (and one failure)."""
    tree = RolloutTree(prompt_id, "Prompt " + HOSTILE[0], env_id="synthetic", step=step)
    tree.root.value = 0.5
    tree.info.update(
        root_count=2, candidate_value=0.5, skipped_candidates=[["skipped-" + HOSTILE[1], 0.1]]
    )
    a = tree.add_child(
        0, Turn(action="assistant " + HOSTILE[0], observation="observation " + HOSTILE[1])
    )
    b = tree.add_child(
        a.id, Turn(action="assistant " + HOSTILE[2], observation="observation " + HOSTILE[3])
    )
    tree.finish(b.id, reward=1.0, terminated=True)
    c = tree.add_child(
        a.id,
        Turn(action="assistant " + HOSTILE[4], observation="observation " + HOSTILE[2]),
        origin="replay",
    )
    tree.finish(c.id, error=Failure("policy.generate", "policy", "backend died " + HOSTILE[0]))
    d = tree.add_child(
        0, Turn(action="assistant " + HOSTILE[3], observation="observation " + HOSTILE[4])
    )
    tree.finish(d.id, reward=0.0, terminated=True)
    a.value = 0.7
    tree.compute_targets(force=True)
    return tree


def run_bench(
    num_trees: int, nodes: int, *, chars: int, work: Path, browser: bool
) -> dict[str, Any]:
    """Write the trees, time the page, and (if `browser`) time the first render."""
    from trace_gym.bench.view import write_view

    trees = synthetic_trees(num_trees, nodes, chars=chars)
    src = save_trees(trees, work / "trees.jsonl.gz")
    t0 = time.perf_counter()
    page = write_view([src], work / "view.html")
    write_s = time.perf_counter() - t0
    out: dict[str, Any] = {
        "trees": num_trees,
        "nodes_per_tree": round(sum(len(t) for t in trees) / num_trees, 1),
        "chars_per_text": chars,
        "tree_file_mb": round(src.stat().st_size / 1e6, 2),
        "write_s": round(write_s, 3),
        "page_mb": round(page.stat().st_size / 1e6, 2),
    }
    if browser:
        from trace_gym.bench.browser import BrowserMissing, open_page

        try:
            with open_page(page) as view:
                out.update(
                    first_render_s=round(view.load_s, 3), script_ready_ms=round(view.ready_ms, 1)
                )
        except BrowserMissing as e:
            out["first_render_s"] = None
            out["browser"] = str(e)
    return out


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="trace-gym bench view", description=__doc__.splitlines()[0])
    p.add_argument("--trees", type=int, default=1000, help="trees in the file (default 1000)")
    p.add_argument("--nodes", type=int, default=50, help="nodes per tree (default 50)")
    p.add_argument(
        "--chars", type=int, default=200, help="characters per assistant text and observation"
    )
    p.add_argument("--no-browser", action="store_true", help="skip the chromium render timing")
    p.add_argument(
        "--keep", type=Path, default=None, help="keep the tree file and page in this folder"
    )
    p.add_argument("--json", type=Path, default=None, help="write the figures here as JSON")
    args = p.parse_args(argv)
    if args.trees < 1 or args.nodes < 5:
        print("trace-gym bench view: need --trees >= 1 and --nodes >= 5", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        res = run_bench(
            args.trees, args.nodes, chars=args.chars, work=work, browser=not args.no_browser
        )
    goals = [
        ("page written <= 10 s", f"{res['write_s']:.2f} s"),
        ("page < 30 MB", f"{res['page_mb']:.1f} MB"),
    ]
    if res.get("first_render_s") is not None:
        goals.append(
            (
                "first prompt renders <= 2 s",
                f"{res['first_render_s']:.2f} s (script done at {res['script_ready_ms']:.0f} ms)",
            )
        )
    print(
        f"{res['trees']} trees x {res['nodes_per_tree']} nodes, {res['chars_per_text']} chars per text; tree file {res['tree_file_mb']} MB"
    )
    for goal, got in goals:
        print(f"  [report] {goal}: {got}")
    if "browser" in res:
        print(f"  render not timed: {res['browser']}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
