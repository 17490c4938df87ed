"""`make bench`: run the repository's benchmarks one after the other with short defaults.

    python benchmarks/run_all.py                     # switch_bench (3 runs, 1 s boots), then rolling_sim
    python benchmarks/run_all.py --runs 5 --boot 2   # switch_bench as benchmarks/README.md reports it
    python benchmarks/run_all.py --only rolling      # the rolling model only (no Docker needed)

- switch_bench.py: `b70deploy switch` next to `docker compose up --wait` on the sim image
  (needs the Docker engine with Compose v2). Its JSON goes to OUT/switch_bench.json, never
  over the committed results-switch_bench.*.
- rolling_sim.py: the rolling-switch model over 100 and 1,000 nodes from the committed
  rolling_boots.json (no Docker; it rewrites rolling_sim.json and rolling_sim.png beside it,
  seeded, so the same inputs give the same numbers). `--measure N` boots N sims first.

Each benchmark runs as its own process with this interpreter; the first that fails stops
the run and its exit code is returned (130 on Ctrl-C).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / ".bench-out"
BENCHES = ("switch", "rolling")


def docker_ready() -> str | None:
    """None when `docker compose` can run here, else why not."""
    if shutil.which("docker") is None:
        return "no docker binary on PATH"
    for argv in (["docker", "info"], ["docker", "compose", "version"]):
        try:
            r = subprocess.run(argv, capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"`{' '.join(argv)}` failed: {e}"
        if r.returncode != 0:
            return f"`{' '.join(argv)}` exited {r.returncode}"
    return None


def plan(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(name, argv) of each benchmark to run, in order."""
    py = sys.executable
    out: list[tuple[str, list[str]]] = []
    if "switch" in args.only:
        out.append(("switch_bench", [py, str(HERE / "switch_bench.py"), "--runs", str(args.runs),
                                     "--boot", str(args.boot), "--json", str(args.out / "switch_bench.json")]))
    if "rolling" in args.only:
        argv = [py, str(HERE / "rolling_sim.py")]
        if args.measure:
            argv += ["--measure", str(args.measure)]
        out.append(("rolling_sim", argv))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--only", choices=BENCHES, action="append", help="run only this one (repeatable)")
    p.add_argument("--runs", type=int, default=3, help="switch_bench runs per side and metric (default 3)")
    p.add_argument("--boot", type=float, default=1.0, help="switch_bench sim boot delay in s (default 1)")
    p.add_argument("--measure", type=int, default=0, help="rolling_sim: boot this many sims first (default 0)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results folder (default {DEFAULT_OUT})")
    args = p.parse_args(argv)
    args.only = args.only or list(BENCHES)
    if args.runs < 1 or args.boot < 0 or args.measure < 0:
        print("error: --runs must be at least 1, --boot and --measure not negative; fix: e.g. --runs 3 --boot 1",
              file=sys.stderr)
        return 2
    if "switch" in args.only or args.measure:
        why = docker_ready()
        if why:
            print(f"error: switch_bench and rolling_sim --measure need the Docker engine with Compose v2 ({why}); "
                  "fix: start Docker, or run `python benchmarks/run_all.py --only rolling`", file=sys.stderr)
            return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for name, cmd in plan(args):
        print(f"==> {name}: {' '.join(cmd[1:])}", flush=True)
        start = time.monotonic()
        try:
            rc = subprocess.run(cmd, check=False).returncode
        except KeyboardInterrupt:
            print(f"interrupted during {name}", file=sys.stderr)
            return 130
        print(f"<== {name}: exit {rc} after {time.monotonic() - start:.1f} s", flush=True)
        if rc != 0:
            print(f"error: {name} failed (exit {rc}); fix: run it alone to see why: {' '.join(cmd[1:])}",
                  file=sys.stderr)
            return rc
    print(f"done: results in {args.out} and benchmarks/rolling_sim.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
