"""How close `b70deploy bench` comes to the rates the simulated vLLM is configured with.

The tests hold the bench to orderings (a sim configured twice as fast measures faster); this
benchmark gives the figures: for each metric, measured / configured over several runs, as
median with min and max, on an idle machine or beside a load you start yourself.

    python benchmarks/bench_accuracy.py                  # 5 runs of each metric
    python benchmarks/bench_accuracy.py --runs 9 --json /tmp/accuracy.json

Each run starts a fresh sim as a host process on a free loopback port (no Docker needed),
measures prefill (ctx 4096, 3 prompts, 8,000 tok/s), decode (ctx 512, 64 tokens, 200 tok/s)
and the aggregate at C=4 (batch slow-down 0.04: the sim's own model, `aggregate_tps`, gives the
truth), then stops the sim, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from b70deploy.bench.client import Endpoint  # noqa: E402
from b70deploy.bench.run import BenchConfig, run_bench  # noqa: E402
from b70deploy.bench.sweep import run_sweep  # noqa: E402
from b70deploy.sim.server import aggregate_tps  # noqa: E402

PREFILL, DECODE, ALPHA = 8000.0, 200.0, 0.04


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def sim(prefill_tps: float, decode_tps: float) -> Iterator[Endpoint]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "B70SIM_BOOT_SECONDS": "0.1",
           "B70SIM_PREFILL_TPS": str(prefill_tps), "B70SIM_DECODE_TPS": str(decode_tps),
           "B70SIM_BATCH_ALPHA": str(ALPHA)}
    argv = [sys.executable, "-m", "b70deploy.sim.server", "serve", "/models/Qwen3-30B-A3B-W4A16", "--host",
            "127.0.0.1", "--port", str(port), "--served-model-name", "sim", "--max-model-len", "32768",
            "--dtype", "float16", "--kv-cache-dtype", "fp8"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the sim did not become healthy (exit {proc.poll()})")
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.05)
        yield Endpoint.parse(url)
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def prefill(ep: Endpoint) -> float:
    doc = run_bench(ep, BenchConfig(metric="prefill", ctx=4096, n_prompts=3, model="sim"), {}, show_progress=False)
    return float(doc["result"]["value"]) / PREFILL


def decode(ep: Endpoint) -> float:
    doc = run_bench(ep, BenchConfig(metric="decode", ctx=512, n_prompts=3, max_tokens=64, model="sim"), {},
                    show_progress=False)
    return float(doc["result"]["value"]) / DECODE


def aggregate(ep: Endpoint) -> float:
    cfg = BenchConfig(metric="aggregate", ctx=256, n_prompts=1, max_tokens=48, model="sim")
    doc = run_sweep(ep, cfg, [4], {}, show_progress=False)
    return float(doc["points"][0]["result"]["value"]) / aggregate_tps(4, DECODE, ALPHA)


METRICS: dict[str, Callable[[Endpoint], float]] = {"prefill": prefill, "decode": decode, "aggregate": aggregate}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="runs of each metric (default 5)")
    ap.add_argument("--json", type=Path, help="also write every run's ratio to this file")
    args = ap.parse_args(argv)
    ratios: dict[str, list[float]] = {m: [] for m in METRICS}
    load = os.getloadavg()[0]
    for i in range(args.runs):
        with sim(PREFILL, DECODE) as ep:
            for name, measure in METRICS.items():
                ratios[name].append(measure(ep))
        print(f"run {i + 1}/{args.runs}: " + ", ".join(f"{m} {v[-1]:.3f}" for m, v in ratios.items()),
              file=sys.stderr)
    rows: list[dict[str, Any]] = []
    print(f"measured / configured, {args.runs} runs, load average {load:.1f} at the start")
    print(f"{'metric':<10} {'median':>8} {'min':>8} {'max':>8}")
    for name, values in ratios.items():
        row = {"metric": name, "median": statistics.median(values), "min": min(values), "max": max(values),
               "runs": values}
        rows.append(row)
        print(f"{name:<10} {row['median']:>8.3f} {row['min']:>8.3f} {row['max']:>8.3f}")
    if args.json:
        args.json.write_text(json.dumps({"load_at_start": load, "metrics": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
