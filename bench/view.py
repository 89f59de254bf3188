"""`trace-gym view`: one self-contained, offline HTML page of rollout trees.

The page shows, per step, the candidate pool with the predictor's values and what each
candidate got (skipped, or m roots), and per prompt its rollout tree: nodes coloured by
their bottom-up success rate, the predicted value beside the realised rate, replays
marked where they branched, failed branches with their typed failure, mixed anchors and
contrastive pairs. Clicking a node opens its turns. One prompt is drawn at a time, so
the page stays usable at thousands of trees (docs/viewer.md).

The trees travel as one inline JSON document. Model text is hostile, so the JSON is
escaped for a ``<script>`` element (``<``, ``>``, ``&``, U+2028 and U+2029 become
``\\uXXXX``) and the page's script only ever writes it with ``textContent``.
The drawing is hand-written SVG and a small script (``view_assets/``): no CDN, no
server, and nothing beyond the standard library on the Python side.
"""

from __future__ import annotations

import gzip
import html
import json
import math
import re
import sys
import webbrowser
import zlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trace_gym.cli import Parser
from trace_gym.errors import TraceGymError, TreeFormatError
from trace_gym.files import write_page
from trace_gym.tree import FAILURE_KINDS, Node, RolloutTree, load_trees

__all__ = [
    "ViewError",
    "budget_by_depth",
    "collect_paths",
    "escape_json",
    "main",
    "page_html",
    "tree_payload",
    "write_view",
]

ASSETS = Path(__file__).with_name("view_assets")
#: characters of one turn's assistant text or observation kept in the page (the rest is
#: counted, and stays in the tree file)
MAX_TEXT = 4000
#: what the page's text may take (JSON escapes and the script come on top; the goal is < 30 MB)
PAGE_BUDGET_MB = 28.0
ORIGINS = ("root", "rollout", "replay")
_JSON_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_JSON_TABLE = str.maketrans(_JSON_ESCAPES)
_SURROGATE = re.compile("[\ud800-\udfff]")


_DATA_RE = re.compile(r'<script type="application/json" id="trace-data">(.*?)</script>', re.S)


class ViewError(TraceGymError):
    """A tree file the viewer cannot show (the message is one line for the CLI)."""


def escape_json(obj: Any) -> str:
    """JSON that is safe inside an HTML ``<script>`` element (no ``</script>``, ``<!--``)."""
    text = json.dumps(
        obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_plain
    )
    text = text.translate(_JSON_TABLE)
    # a lone surrogate (valid in a JSON file, not in UTF-8) stays an escape, not a crash
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _plain(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars in tree.info
        return o.item()
    return str(o)


def _num(x: float | None, digits: int = 4) -> float | None:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return round(float(x), digits)


def _text(s: str | None, max_text: int) -> tuple[str, int]:
    """The kept text and how many characters were cut."""
    s = s or ""
    return (s, 0) if len(s) <= max_text else (s[:max_text], len(s) - max_text)


def _node_payload(
    tree: RolloutTree, n: Node, pairs: dict[int, int], max_text: int
) -> dict[str, Any]:
    d: dict[str, Any] = {
        "p": n.parent,
        "d": n.depth,
        "o": ORIGINS.index(n.origin) if n.origin in ORIGINS else 1,
    }
    for key, val in (("v", n.value), ("t", n.target), ("tv", n.true_value), ("r", n.reward)):
        if _num(val) is not None:
            d[key] = _num(val)
    d["nl"], d["ns"] = n.num_leaves, n.num_success
    if n.terminal:
        d["end"] = (
            "failed"
            if n.failed
            else ("terminated" if n.terminated else ("truncated" if n.truncated else "ended"))
        )
    if n.failure is not None:
        d["f"] = [n.failure.kind, n.failure.where, n.failure.message[:max_text]]
    if n.policy_version is not None:
        d["pv"] = n.policy_version
    if starts_replay(tree, n):
        d["br"] = 1
    if pairs.get(n.id):
        d["pairs"] = pairs[n.id]
    if n.turn is not None:
        d["a"], cut_a = _text(n.turn.action, max_text)
        d["ob"], cut_o = _text(n.turn.observation, max_text)
        if cut_a or cut_o:
            d["cut"] = [cut_a, cut_o]
        if n.turn.token_ids is not None:
            d["tok"] = len(n.turn.token_ids)
    return d


def starts_replay(tree: RolloutTree, node: Node) -> bool:
    """Whether `node` is the first turn of a replay (its parent is the prefix it branched from)."""
    if node.origin != "replay" or node.parent is None:
        return False
    parent = tree.nodes[node.parent]
    return parent.origin != "replay" or parent.children[0] != node.id


def budget_by_depth(trees: Sequence[RolloutTree]) -> dict[int, int]:
    """Branches started per depth: root rollouts at 0, each replay at its prefix's depth."""
    out: Counter[int] = Counter()
    for t in trees:
        out[0] += sum(t.nodes[c].origin != "replay" for c in t.root.children)
        for n in t.nodes[1:]:
            if starts_replay(t, n):
                out[t.nodes[n.parent].depth] += 1  # type: ignore[index]
    return dict(sorted(out.items()))


def _root_count(tree: RolloutTree) -> int:
    """Roots the prompt got: the runner's record, else the root's fresh-rollout children."""
    m = tree.info.get("root_count")
    if isinstance(m, int):
        return m
    return sum(tree.nodes[c].origin != "replay" for c in tree.root.children)


def tree_payload(tree: RolloutTree, max_text: int = MAX_TEXT) -> dict[str, Any]:
    """What the page needs of one tree (short keys: the page holds thousands of them)."""
    tree.compute_targets(force=True)
    pairs = tree.contrastive_pairs_by_anchor()
    m = tree.metrics()
    value = tree.info.get("candidate_value", tree.root.value)
    prompt, cut = _text(tree.prompt, max_text)
    return {
        "id": tree.prompt_id,
        "step": tree.step,
        "env": tree.env_id,
        "prompt": prompt,
        "prompt_cut": cut,
        "value": _num(value),
        "roots": _root_count(tree),
        "metrics": {k: getattr(m, k) for k in m.__dataclass_fields__},
        "nodes": [_node_payload(tree, n, pairs, max_text) for n in tree.nodes],
    }


def _skipped(tree: RolloutTree) -> list[list[Any]] | None:
    """The step's skipped candidates (id, predicted value) where the runner recorded them."""
    rows = tree.info.get("skipped_candidates")
    if not isinstance(rows, list):
        return None
    return [
        [str(r[0]), _num(r[1]) if len(r) > 1 else None]
        for r in rows
        if isinstance(r, (list, tuple)) and r
    ]


def steps_payload(trees: Sequence[RolloutTree]) -> dict[str, Any]:
    """Per step: the candidate pool (selected with m roots, and skipped where recorded)."""
    steps: dict[int, dict[str, Any]] = {}
    for i, t in enumerate(trees):
        s = steps.setdefault(t.step, {"step": t.step, "selected": [], "skipped": None})
        s["selected"].append(
            [i, t.prompt_id, _num(t.info.get("candidate_value", t.root.value)), _root_count(t)]
        )
        skipped = _skipped(t)
        if skipped is not None:
            s["skipped"] = (s["skipped"] or []) + skipped
    for s in steps.values():  # files of several runs: one row per task id
        if s["skipped"] is not None:
            seen = {row[1] for row in s["selected"]}
            s["skipped"] = [r for r in s["skipped"] if r[0] not in seen and not seen.add(r[0])]
        s["uniform"] = one_value(s)
    return {str(k): v for k, v in sorted(steps.items())}


def one_value(step: dict[str, Any]) -> float | None:
    """The value every candidate of the step was given, where there were two or more and
    all got the same one (step 0: the predictor had no data, so the roots fell back to
    uniform, by the plan's cold start or a prior that ties them all); else None."""
    values = [row[2] for row in step["selected"]] + [row[1] for row in step["skipped"] or []]
    if len(values) < 2 or values[0] is None or any(v != values[0] for v in values):
        return None
    return values[0]


def text_cap(trees: Sequence[RolloutTree], max_text: int, budget_mb: float = PAGE_BUDGET_MB) -> int:
    """The largest per-text cap (<= `max_text`) that keeps the page within `budget_mb`.

    The estimate counts each kept text in UTF-8 bytes plus about 100 bytes of fields per
    node (measured on `trace-gym bench view`), so thousands of long trees still give a
    page a browser opens.
    """
    texts = [t.prompt for t in trees]
    texts += [s for t in trees for n in t.nodes[1:] for s in (n.turn.action, n.turn.observation)]
    room = budget_mb * 1e6 - 100 * sum(len(t) for t in trees)
    size = np.array([len(x.encode("utf-8", "surrogatepass")) for x in texts], dtype=float)
    per_char = size / np.maximum(1, [len(x) for x in texts])

    def fits(cap: int) -> bool:
        return float(np.minimum(size, cap * per_char).sum()) <= room

    if fits(max_text):
        return max_text
    lo, hi = 0, max_text  # fits(lo) holds (nothing kept), fits(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return max(lo, 100)


def page_data(
    trees: Sequence[RolloutTree], *, title: str, max_text: int = MAX_TEXT
) -> dict[str, Any]:
    """Everything the page shows; texts cut to `max_text`, or less where the page would pass 30 MB."""
    cap = text_cap(trees, max_text, PAGE_BUDGET_MB)
    if cap < max_text:
        max_text = cap
        title += f" (texts cut to {cap} characters to keep the page under 30 MB)"
    return {
        "title": title,
        "max_text": max_text,
        "failure_kinds": list(FAILURE_KINDS),
        "trees": [tree_payload(t, max_text) for t in trees],
        "steps": steps_payload(trees),
    }


def page_html(data: dict[str, Any]) -> str:
    """The whole page: styles, data and script inline."""
    css = (ASSETS / "viewer.css").read_text(encoding="utf-8")
    js = (ASSETS / "viewer.js").read_text(encoding="utf-8")
    template = (ASSETS / "viewer.html").read_text(encoding="utf-8")
    title = html.escape(data["title"]).encode("utf-8", "replace").decode("utf-8")  # odd file names
    parts = {"TITLE": title, "CSS": css, "JS": js, "DATA": escape_json(data)}
    # one pass: a title or text that spells "@JS@" is never expanded
    return re.sub(r"@(TITLE|CSS|JS|DATA)@", lambda m: parts[m.group(1)], template)


# ---------------------------------------------------------------------- files
def collect_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Tree files named directly, or every ``*.jsonl[.gz]`` in a named folder (sorted); a
    training run's folder (it has ``metrics.jsonl``) stands for its ``trees/``."""
    out: list[Path] = []
    for p in map(Path, paths):
        if (p / "metrics.jsonl").is_file():  # a `trace-gym train` run: its trees/ folder
            if not (p / "trees").is_dir():
                raise ViewError(
                    f"{p}: this training run saved no trees (no trees/ folder); train with "
                    "save_trees = true in the config (or --set save_trees=true)"
                )
            p = p / "trees"
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.name.endswith((".jsonl", ".jsonl.gz")))
            if not found:
                raise ViewError(f"{p}: no *.jsonl or *.jsonl.gz tree files in this folder")
            out += found
        else:
            out.append(p)
    return out


def read_trees(paths: Sequence[str | Path]) -> list[RolloutTree]:
    """Every tree of the files, in order; any unreadable file raises `ViewError` (one line)."""
    trees: list[RolloutTree] = []
    for path in collect_paths(paths):
        try:
            got = load_trees(path)
        except TreeFormatError as e:
            raise ViewError(str(e).splitlines()[0]) from e
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError) as e:
            what = "truncated or not gzip" if path.suffix == ".gz" else "unreadable"
            raise ViewError(
                f"{path}: {what} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            ) from e
        if not got:
            raise ViewError(f"{path}: no rollout trees in this file (empty)")
        trees += got
    return trees


def write_view(
    paths: Sequence[str | Path],
    out: str | Path,
    *,
    title: str | None = None,
    max_text: int = MAX_TEXT,
) -> Path:
    """Read the tree files and write the page atomically (no half-written page on error)."""
    trees = read_trees(paths)
    names = ", ".join(Path(p).name for p in paths)
    text = page_html(
        page_data(trees, title=title or f"trace-gym trees: {names}", max_text=max_text)
    )
    return write_page(out, text)


def screenshot(page: Path, png: Path) -> Path:
    """A PNG of `page` showing its prompt with the most contrastive pairs, a branch point open."""
    from trace_gym.bench.browser import open_page

    data = json.loads(_DATA_RE.search(page.read_text(encoding="utf-8")).group(1))  # type: ignore[union-attr]
    pairs = [t["metrics"]["contrastive_pairs"] for t in data["trees"]]
    with open_page(page, fragment=str(pairs.index(max(pairs)))) as view:
        view.click_branch_point()
        return view.screenshot(png)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="trace-gym view", description=__doc__.splitlines()[0])
    p.add_argument(
        "trees", nargs="+", help="tree files (JSONL, .gz) or folders of them (a run's trees/)"
    )
    p.add_argument(
        "--out", type=Path, default=Path("view.html"), help="the page to write (default view.html)"
    )
    p.add_argument("--open", action="store_true", help="open the page in the default browser")
    p.add_argument(
        "--max-text",
        type=int,
        default=MAX_TEXT,
        help=f"characters kept per turn text (default {MAX_TEXT})",
    )
    p.add_argument(
        "--screenshot",
        type=Path,
        default=None,
        help="also save a PNG of the prompt with the most contrastive pairs (headless chromium)",
    )
    args = p.parse_args(argv)
    if args.max_text < 100:
        print(f"trace-gym view: --max-text must be >= 100, got {args.max_text}", file=sys.stderr)
        return 2
    try:
        out = write_view(args.trees, args.out, max_text=args.max_text)
    except ViewError as e:
        print(f"trace-gym view: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"trace-gym view: cannot write {args.out}: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    if args.screenshot is not None:
        from trace_gym.bench.browser import BrowserMissing

        try:
            print(f"wrote {screenshot(out, args.screenshot)}")
        except BrowserMissing as e:
            print(f"trace-gym view: no screenshot: {e}", file=sys.stderr)
            return 2
    if args.open:
        webbrowser.open(out.resolve().as_uri())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
