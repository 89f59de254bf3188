"""`trace-gym data`: convert HotpotQA files to the env's format, or fetch the public sets.

- ``trace-gym data convert IN OUT``: read any layout `load_hotpotqa` reads (original
  JSON/JSONL, the ``[title, [sent_ids], [sentences], doc]`` variant, Hugging Face
  ``hotpot_qa`` parquet/JSON, FlashRAG JSONL) and write the original HotpotQA layout as
  JSON Lines (``.gz`` if OUT ends so), which ``gym.make("trace/HotpotQA-v0",
  dataset=OUT)`` reads.
- ``trace-gym data fetch SOURCE OUT``: download a public set through the Hugging Face
  ``datasets`` library (needs network and ``pip install datasets``), then convert it.
- ``trace-gym data sets``: the real data sets the tests and benchmarks read
  (`trace_gym.realdata`): where each is looked for (``$TRACE_GYM_DATA``), whether it is
  there, and how to get it.

Errors are one line and exit code 2.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

from trace_gym.envs.hotpotqa.data import QATask, load_hotpotqa

from trace_gym.cli import Parser
from trace_gym.errors import TraceGymError
from trace_gym.optional import require

__all__ = ["SOURCES", "convert", "fetch", "main", "write_tasks"]

#: source name -> (datasets repo, config, default split); the layout is detected on load
SOURCES = {
    "hotpot_qa-distractor": ("hotpotqa/hotpot_qa", "distractor", "validation"),
    "hotpot_qa-fullwiki": ("hotpotqa/hotpot_qa", "fullwiki", "validation"),
    "flashrag-hotpotqa": ("RUC-NLPIR/FlashRAG_datasets", "hotpotqa", "dev"),
}


def write_tasks(tasks: list[QATask], out: Path) -> Path:
    """Write `tasks` as original-layout HotpotQA JSON Lines (gzipped if `out` ends in .gz)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if out.suffix == ".gz" else open
    with opener(out, "wt", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(t.to_record(), ensure_ascii=False) + "\n")
    return out


def convert(src: Path, out: Path, limit: int | None = None) -> int:
    """Convert one file of any supported layout; returns the number of records written."""
    tasks = load_hotpotqa(src, limit=limit)
    write_tasks(tasks, out)
    return len(tasks)


def fetch(source: str, out: Path, split: str | None = None, limit: int | None = None) -> int:
    """Download `source` (a key of `SOURCES`) with `datasets` and convert it to `out`."""
    repo, config, default_split = SOURCES[source]
    datasets = require("datasets", "pip install datasets", what="the Hugging Face datasets library")
    try:
        ds = datasets.load_dataset(repo, config, split=split or default_split)
    except Exception as e:  # network, hub and cache failures all arrive as different types
        raise TraceGymError(
            f"could not fetch {repo} ({config}): {type(e).__name__}: {e}; "
            "this needs network access to the Hugging Face hub"
        ) from e
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.jsonl"
        ds.to_json(str(raw), lines=True, force_ascii=False)
        return convert(raw, out)


def _parser() -> argparse.ArgumentParser:
    ap = Parser(prog="trace-gym data", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="convert a HotpotQA file of any supported layout")
    c.add_argument("src", type=Path)
    c.add_argument("out", type=Path)
    c.add_argument("--limit", type=int, default=None, help="convert the first N records only")
    f = sub.add_parser("fetch", help="download a public set with `datasets` and convert it")
    f.add_argument("source", choices=sorted(SOURCES))
    f.add_argument("out", type=Path)
    f.add_argument(
        "--split", default=None, help="dataset split (default: the source's dev/validation split)"
    )
    f.add_argument("--limit", type=int, default=None)
    sub.add_parser("sets", help="the real data sets tests read: where, found or not, how to get")
    return ap


def print_sets() -> None:
    """One block per real data set: its path under $TRACE_GYM_DATA, found or not, how to get it."""
    from trace_gym.realdata import ENV_VAR, SETS, data_root, path_of

    print(f"data root: {data_root()} (${ENV_VAR})")
    for name, s in SETS.items():
        where = path_of(name)
        print(
            f"{name}: {'found' if where.exists() else 'MISSING'} at {where}\n  {s.what}\n  get it: {s.how}"
        )


def main(argv: list[str]) -> int:
    """Convert or fetch HotpotQA data (see the module docstring)."""
    args = _parser().parse_args(argv)
    if getattr(args, "limit", None) is not None and args.limit < 1:
        print(f"trace-gym data: --limit must be >= 1, got {args.limit}", file=sys.stderr)
        return 2
    if args.cmd == "sets":
        print_sets()
        return 0
    try:
        if args.cmd == "convert":
            n = convert(args.src, args.out, args.limit)
        else:
            n = fetch(args.source, args.out, args.split, args.limit)
    except (TraceGymError, OSError) as e:
        print(f"trace-gym data: {e}".replace("\n", " "), file=sys.stderr)
        return 2
    print(f"wrote {n} records to {args.out}")
    return 0
