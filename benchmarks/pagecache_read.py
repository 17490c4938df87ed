"""How long the switch's read-ahead of the weights takes here, cold (from disk) and warm (page cache).

Writes one file of --gib GiB (random bytes, so no filesystem can skip it) in a temp folder on
the disk under --dir, then per run: evicts the file's pages (posix_fadvise DONTNEED after an
fsync: the kernel drops exactly this file's clean pages, so other work on the machine keeps
its cache), reads it with the switch's own reader (b70deploy.docker.pagecache.read_files),
and reads it again. The folder is removed in a `finally`.

    python benchmarks/pagecache_read.py --gib 4 --runs 5 --json benchmarks/results/pagecache_read.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # measure the tree this script lives in

from b70deploy.docker import pagecache  # noqa: E402

GIB = 1 << 30


def write_file(path: Path, gib: float) -> None:
    chunk = os.urandom(64 << 20)
    left = int(gib * GIB)
    with open(path, "wb") as fh:
        while left > 0:
            n = min(left, len(chunk))
            fh.write(chunk[:n])
            left -= n
        fh.flush()
        os.fsync(fh.fileno())


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed_read(path: Path) -> float:
    t0 = time.monotonic()
    got = pagecache.read_files([path])
    seconds = time.monotonic() - t0
    assert got == path.stat().st_size, (got, path.stat().st_size)
    return seconds


def stats(values: Sequence[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0, help="file size in GiB (default 4)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the temp folder goes (on the disk to measure)")
    ap.add_argument("--json", help="write the runs here")
    args = ap.parse_args(argv)
    avail = pagecache.mem_available() or 0
    if args.gib * GIB > avail * pagecache.FIT_SHARE:
        print(f"{args.gib} GiB does not fit {pagecache.FIT_SHARE:.0%} of MemAvailable ({avail / GIB:.1f} GiB): "
              "the switch would skip it; use a smaller --gib", file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="b70-pagecache-", dir=args.dir))
    try:
        path = folder / "weights.bin"
        write_file(path, args.gib)
        cold, warm = [], []
        for i in range(args.runs):
            evict(path)
            cold.append(timed_read(path))
            warm.append(timed_read(path))
            print(f"run {i + 1}: cold {cold[-1]:.2f} s, warm {warm[-1]:.2f} s", file=sys.stderr)
        result: dict[str, Any] = {
            "gib": args.gib, "runs": args.runs, "mem_available_gib": round(avail / GIB, 2),
            "cold_s": cold, "warm_s": warm, "cold": stats(cold), "warm": stats(warm),
            "cold_gib_per_s": stats([args.gib / s for s in cold]),
            "warm_gib_per_s": stats([args.gib / s for s in warm]),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for side in ("cold", "warm"):
        s, r = result[side], result[f"{side}_gib_per_s"]
        print(f"{side}: {s['median']:.2f} s median ({s['min']:.2f}-{s['max']:.2f}), "
              f"{r['median']:.2f} GiB/s ({r['min']:.2f}-{r['max']:.2f})")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
