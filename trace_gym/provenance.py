"""Run provenance: what produced an output directory, written beside the results.

`write_provenance(out_dir, config)` writes ``out_dir/provenance.json`` with the resolved
config, the project's git commit and dirty flag (None outside a git checkout, e.g. an
installed wheel), the versions of the packages that shape results, the Python and
platform, and the command line. The trainers' run directory and every benchmark
``--out`` directory get one, so a number can be traced to the code that made it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from trace_gym.files import write_page

__all__ = ["PACKAGES", "PROVENANCE_FILE", "collect", "git_state", "write_provenance"]

PROVENANCE_FILE = "provenance.json"
#: distributions whose versions are recorded when installed
PACKAGES = (
    "trace-gym",
    "numpy",
    "gymnasium",
    "sympy",
    "bm25s",
    "torch",
    "transformers",
    "peft",
    "trl",
    "vllm",
    "ray",
    "math-verify",
    "gem-llm",
    "reasoning-gym",
    "bfcl-eval",
)


def git_state(path: str | Path | None = None) -> dict[str, Any]:
    """``{"commit", "dirty", "root"}`` of the git checkout holding `path` (the package by default)."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=where, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None, "root": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status), "root": git("rev-parse", "--show-toplevel")}


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of `names` (absent ones are left out)."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def _plain(config: Any) -> Any:
    if config is None or isinstance(config, dict):
        return config
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if isinstance(config, argparse.Namespace):
        return vars(config)
    raise TypeError(
        f"provenance config must be a dataclass, dict or Namespace, got {type(config).__name__}"
    )


def collect(config: Any = None, *, argv: list[str] | None = None) -> dict[str, Any]:
    """The provenance record (see the module docstring)."""
    return {
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": list(sys.argv if argv is None else argv),
        "cwd": str(Path.cwd()),
        "config": _plain(config),
        "git": git_state(),
        "packages": package_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def write_provenance(
    out_dir: str | Path, config: Any = None, *, argv: list[str] | None = None
) -> Path:
    """Write ``out_dir/provenance.json``; returns its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / PROVENANCE_FILE
    # written whole, then moved: the ranks of a sharded run all write it at once
    return write_page(path, json.dumps(collect(config, argv=argv), indent=2, default=str) + "\n")
