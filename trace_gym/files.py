"""How the project writes the files a user opens: pages, plots, summaries.

Every page goes through `write_page`: written whole beside its final name, then moved
into place (a reader never sees half a page, concurrent writers never interleave), and
given `PAGE_MODE`. A temporary file is created private (0600) and ``write_text`` follows
the umask, so without one helper the tree viewer's page and the report's index beside
it had different modes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["PAGE_MODE", "set_page_mode", "write_page"]

#: the mode of every page the project writes: the owner writes, everyone reads
PAGE_MODE = 0o644


def write_page(path: str | Path, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path` atomically, with mode `PAGE_MODE`; returns it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, PAGE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def set_page_mode(path: str | Path) -> Path:
    """Give a file another library wrote (a matplotlib figure, a CSV) `PAGE_MODE`."""
    os.chmod(path, PAGE_MODE)
    return Path(path)
