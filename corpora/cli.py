"""`trace-gym corpus ...`: build retrieval indexes and regenerate the bundled set.

    trace-gym corpus build --input wiki-18.jsonl --out indexes/wiki18-bm25
    trace-gym corpus build --input hotpot_dev_distractor_v1.json --retriever dense-hnsw --out idx/
    trace-gym corpus build --input wiki-18.jsonl --retriever dense-flat --encoder e5 \\
        --model-path /models/e5-base-v2 --out idx/e5
    trace-gym corpus generate-default          # rewrite the bundled HotpotQA-format files

The input is a wiki-18-style JSONL corpus (``{"id", "contents"}``) or HotpotQA JSON /
JSONL (its context paragraphs become the corpus); ``--format auto`` tells them apart.
The index directory is what ``gym.make("trace/HotpotQA-v0", retriever=DIR)`` and
``trace-gym serve-retriever --index DIR`` take.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from trace_gym.cli import Parser
from trace_gym.errors import did_you_mean

__all__ = ["build_index", "detect_format", "main"]


def detect_format(path: Path) -> str:
    """'wiki18' or 'hotpotqa', from the first record of the file."""
    from trace_gym.envs.hotpotqa.data import open_text

    with open_text(path) as f:
        first = f.readline()
        while first and not first.strip():
            first = f.readline()
    if first.lstrip().startswith("["):
        return "hotpotqa"
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        row = {}
    if "contents" in row:
        return "wiki18"
    if "context" in row or "question" in row:
        return "hotpotqa"
    raise SystemExit(
        f"trace-gym corpus: cannot tell the format of {path}; pass --format wiki18 or hotpotqa"
    )


def _load_passages(path: Path, fmt: str, limit: int | None, progress: bool) -> list:
    from tqdm import tqdm
    from trace_gym.envs.hotpotqa.data import (
        context_passages,
        iter_jsonl,
        load_hotpotqa,
        passage_from_contents,
    )

    if fmt == "hotpotqa":
        return context_passages(load_hotpotqa(path))[:limit]
    out = []
    for r in tqdm(
        iter_jsonl(path), desc="reading passages", unit="psg", disable=not progress, file=sys.stderr
    ):
        out.append(passage_from_contents(str(r.get("id", len(out))), str(r["contents"])))
        if limit is not None and len(out) >= limit:
            break
    return out


def build_index(
    input_path: Path,
    out: Path,
    retriever: str = "bm25",
    fmt: str = "auto",
    limit: int | None = None,
    progress: bool = True,
    **options: Any,
) -> dict[str, Any]:
    """Build and save an index; returns a small report (passages, seconds, path)."""
    from trace_gym.envs.hotpotqa.retrievers import build_retriever

    fmt = detect_format(input_path) if fmt == "auto" else fmt
    t0 = time.perf_counter()
    passages = _load_passages(input_path, fmt, limit, progress)
    t1 = time.perf_counter()
    r = build_retriever(retriever, passages, show_progress=progress, **options)
    r.save(out)
    r.close()
    t2 = time.perf_counter()
    return {
        "format": fmt,
        "passages": len(passages),
        "retriever": retriever,
        "out": str(out),
        "load_s": round(t1 - t0, 3),
        "build_s": round(t2 - t1, 3),
    }


def _build_main(argv: list[str]) -> int:
    ap = Parser(prog="trace-gym corpus build", description="Build a retrieval index from a corpus.")
    ap.add_argument(
        "--input", required=True, type=Path, help="wiki-18 JSONL or HotpotQA JSON/JSONL (.gz ok)"
    )
    ap.add_argument("--out", required=True, type=Path, help="index directory to write")
    ap.add_argument("--format", default="auto", choices=["auto", "wiki18", "hotpotqa"])
    ap.add_argument(
        "--retriever", default="bm25", help="bm25 (default), dense-flat, dense-hnsw, pyserini"
    )
    ap.add_argument("--limit", type=int, default=None, help="index only the first N passages")
    ap.add_argument(
        "--encoder", default="minilm", help="dense: minilm (bundled) or e5 (needs --model-path)"
    )
    ap.add_argument(
        "--model-path", default=None, help="dense: local directory of the embedding model"
    )
    ap.add_argument("--batch-size", type=int, default=64, help="dense: encoding batch size")
    ap.add_argument("--device", default="cpu", help="dense: torch device for the encoder")
    ap.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = ap.parse_args(argv)
    if not args.input.exists():
        print(f"trace-gym corpus build: {args.input} does not exist", file=sys.stderr)
        return 2
    options: dict[str, Any] = {}
    if args.retriever.startswith("dense"):
        options["encoder"] = {
            "model": args.encoder,
            "model_path": args.model_path,
            "batch_size": args.batch_size,
            "device": args.device,
        }
    from trace_gym.errors import TraceGymError

    try:
        report = build_index(
            args.input,
            args.out,
            args.retriever,
            args.format,
            args.limit,
            not args.no_progress,
            **options,
        )
    except TraceGymError as e:
        print(f"trace-gym corpus build: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0


def _generate_main(argv: list[str]) -> int:
    from trace_gym.corpora import build_hotpotqa

    return build_hotpotqa.main(argv)


SUBCOMMANDS = {
    "build": (_build_main, "build an index from a wiki-18 JSONL or HotpotQA JSON file"),
    "generate-default": (
        _generate_main,
        "regenerate the bundled HotpotQA-format question set and corpus",
    ),
}


def main(argv: list[str]) -> int:
    """Dispatch `trace-gym corpus SUBCOMMAND ...`."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: trace-gym corpus SUBCOMMAND [options]\n\nsubcommands:")
        for name, (_, help_) in SUBCOMMANDS.items():
            print(f"  {name:<18} {help_}")
        return 0
    if argv[0] not in SUBCOMMANDS:
        print(
            f"trace-gym corpus: unknown subcommand {argv[0]!r}"
            f"{did_you_mean(argv[0], SUBCOMMANDS)}; choose one of: {', '.join(SUBCOMMANDS)}",
            file=sys.stderr,
        )
        return 2
    return int(SUBCOMMANDS[argv[0]][0](argv[1:]) or 0)
