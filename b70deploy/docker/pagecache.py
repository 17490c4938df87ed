"""Reading the next stack's weights into the page cache before the drain.

vLLM reads its safetensors at boot; if those pages are already in the kernel's page cache,
the read that happens after the drain (inside the outage) comes from memory. The read is
bounded by MemAvailable (/proc/meminfo): when the files would not fit in FIT_SHARE of it,
nothing is read and the switch says so (reading them would only evict the running stack's
pages and then its own). `plan_read` is pure; `read_files` does the reading.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

FIT_SHARE = 0.8          # of MemAvailable, at most, for the weights we read ahead
CHUNK = 8 << 20
MEMINFO = Path("/proc/meminfo")


def mem_available(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable in bytes, None when the kernel does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def weight_files(roots: Iterable[Path]) -> list[Path]:
    """The regular files under each model folder (weights, tokenizer, config), sorted, once each."""
    seen: dict[Path, None] = {}
    for root in roots:
        if root.is_file():
            seen.setdefault(root)
        elif root.is_dir():
            for p in sorted(root.rglob("*")):
                if p.is_file() and not p.is_symlink():
                    seen.setdefault(p)
    return list(seen)


@dataclass(frozen=True)
class ReadPlan:
    files: tuple[Path, ...]
    total: int
    available: int | None
    skip: str | None  # why nothing is read, or None

    def note(self, seconds: float | None = None) -> str:
        gib = self.total / (1 << 30)
        if self.skip is not None:
            return f"page cache: not read ahead: {self.skip}"
        rate = f" in {seconds:.2f} s ({gib / seconds:.2f} GiB/s)" if seconds else ""
        return f"page cache: read {len(self.files)} file(s), {gib:.2f} GiB of weights{rate}"


def plan_read(files: Sequence[tuple[Path, int]], available: int | None) -> ReadPlan:
    """Read everything when it fits FIT_SHARE of `available`; otherwise nothing, and why."""
    total = sum(size for _p, size in files)
    paths = tuple(p for p, _s in files)
    if not files:
        return ReadPlan(paths, 0, available, "no model files found on this host")
    if available is None:
        return ReadPlan(paths, total, None, "MemAvailable unknown (/proc/meminfo)")
    if total > available * FIT_SHARE:
        return ReadPlan(paths, total, available,
                        f"{total / (1 << 30):.2f} GiB of weights would not fit in "
                        f"{FIT_SHARE:.0%} of MemAvailable ({available / (1 << 30):.2f} GiB)")
    return ReadPlan(paths, total, available, None)


def read_files(paths: Iterable[Path]) -> int:
    """Read each file to its end (into the page cache); returns the bytes read."""
    done = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue  # a file gone since the plan: vLLM will say so at boot
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            while n := os.readv(fd, [view]):
                done += n
        finally:
            os.close(fd)
    return done


def warm(roots: Iterable[Path], *, meminfo: Path = MEMINFO) -> str:
    """Plan and do the read ahead of `roots`; returns the progress line."""
    files = [(p, p.stat().st_size) for p in weight_files(roots)]
    plan = plan_read(files, mem_available(meminfo))
    if plan.skip is not None:
        return plan.note()
    t0 = time.monotonic()
    read_files(plan.files)
    return plan.note(time.monotonic() - t0)
