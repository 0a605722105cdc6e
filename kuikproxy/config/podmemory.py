"""How much memory the process may use: the pod's limit, as its cgroup tells it.

A container's memory limit is its cgroup's: ``memory.max`` under cgroup v2 (``max`` when there is
none), ``memory.limit_in_bytes`` under v1 (a huge number when there is none). Without one —
a laptop, a test — the budget is the chart's default limit, so a proxy behaves the same in and
out of its pod.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

DEFAULT_MEMORY = 512 * 1024**2  # the chart's resources.limits.memory
CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # v1
)
_UNLIMITED = 1 << 60  # v1 writes "no limit" as the largest page-aligned value: far above this


@lru_cache(maxsize=1)  # read once a process: a pod's limit does not change under it
def pod_memory() -> tuple[int, str]:
    """The memory budget's default and where it came from (for ``check-config``/``/status``)."""
    for path in CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < _UNLIMITED:
            return int(text), str(path)
    return DEFAULT_MEMORY, "default"
