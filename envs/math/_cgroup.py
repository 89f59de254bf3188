"""Memory cgroups of the math sandbox and verifier: one total for a process tree.

`RLIMIT_AS` caps each process, not their sum: ten children of 250 MiB, or parked snapshots
whose pages the live interpreter rewrites (copy-on-write), add up without bound. A memory
cgroup charges every page once, to whichever process of the tree first touched it (tmpfs
files included), so its limit is the tree's real total. Both kernel interfaces are
handled: cgroup v2 (``memory.max``, the memory controller enabled in the parent's
``cgroup.subtree_control``) and the v1 memory controller (``memory.limit_in_bytes``, as on
hybrid hosts whose v2 hierarchy has no memory controller). Swap is never allowed, so the
limit is not dodged by swapping out.
"""

from __future__ import annotations

import contextlib
import os
import select
from pathlib import Path
from typing import NamedTuple

V1_MEMORY = "/sys/fs/cgroup/memory"
V2_BASES = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")


class MemoryUse(NamedTuple):
    """What a memory cgroup holds now and held at most, in MiB, and its OOM kills."""

    current_mb: float
    peak_mb: float
    limit_mb: float
    oom_kills: int


def v2_memory_ready(base: str) -> bool:
    """Whether new cgroups under the v2 `base` get the memory controller (enabling it if needed)."""
    try:
        if "memory" not in Path(base, "cgroup.controllers").read_text().split():
            return False
        control = Path(base, "cgroup.subtree_control")
        if "memory" not in control.read_text().split():
            control.write_text("+memory")  # EBUSY in a non-root cgroup that holds processes
        return True
    except OSError:
        return False


def limit_writes(version: str, limit_bytes: int, files: set[str]) -> list[tuple[str, str]]:
    """The (file, value) writes that cap a new cgroup at `limit_bytes` with no swap, in order.

    `files` are the names the cgroup directory holds (v1's ``memsw`` files exist only with
    swap accounting; v2's ``memory.swap.max`` only with swap support).
    """
    if version == "v2":
        writes = [("memory.max", str(limit_bytes))]
        if "memory.swap.max" in files:
            writes.append(("memory.swap.max", "0"))
        return writes
    # v1: memsw (memory + swap) may never be below the memory limit, so it is set after it
    writes = [("memory.limit_in_bytes", str(limit_bytes))]
    if "memory.memsw.limit_in_bytes" in files:
        writes.append(("memory.memsw.limit_in_bytes", str(limit_bytes)))
    return writes


def apply_limit(path: str, version: str, limit_mb: int) -> None:
    """Cap the cgroup at `path`; OSError if the kernel refuses a write."""
    files = set(os.listdir(path))
    for name, value in limit_writes(version, limit_mb << 20, files):
        Path(path, name).write_text(value)


def version_of(path: str) -> str:
    return "v1" if path.startswith(V1_MEMORY + "/") else "v2"


def usage(path: str) -> MemoryUse | None:
    """The memory a cgroup holds, held at most and may hold; None if it cannot be read."""
    v1 = version_of(path) == "v1"
    names = (
        ("memory.usage_in_bytes", "memory.max_usage_in_bytes", "memory.limit_in_bytes")
        if v1
        else ("memory.current", "memory.peak", "memory.max")
    )
    values = []
    for name in names:
        try:
            text = Path(path, name).read_text().strip()
        except OSError:
            if name == "memory.peak":  # kernels before 5.19 have no v2 peak
                text = "0"
            else:
                return None
        values.append(float("inf") if text == "max" else int(text) / (1 << 20))
    return MemoryUse(*values, oom_kills(path))


def oom_kills(path: str) -> int:
    """Processes the OOM killer has killed in this cgroup so far."""
    name = "memory.oom_control" if version_of(path) == "v1" else "memory.events"
    with contextlib.suppress(OSError, ValueError):
        for line in Path(path, name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return 0


def set_oom_score(pid: int, pidfd: int | None, value: int) -> None:
    """Make `pid` the OOM killer's preferred (1000) or an ordinary (0) victim (host is root).

    The file is opened first and the process checked through its pidfd while the open file
    pins it, so a pid reused in between is never touched.
    """
    if pidfd is None:
        return
    with contextlib.suppress(OSError):
        fd = os.open(f"/proc/{pid}/oom_score_adj", os.O_WRONLY)
        try:
            if not select.select([pidfd], [], [], 0)[0]:
                os.write(fd, str(value).encode())
        finally:
            os.close(fd)
