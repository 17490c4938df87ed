"""A rolling switch over 100 and 1,000 nodes, simulated: total time and pool capacity per K.

Model (stated, so the numbers can be judged):
- A node is out of the pool for  overhead + boot.  `overhead` (drain, verify, compose up,
  smoke) and the relative spread of `boot` are measured from real sim boots on the local
  engine (`--measure N` runs N of them: docker run of the sim image with a 1 s boot, time to
  /health 200, then docker stop). The scale of `boot` comes from the post's cold boots:
  231 s (W4A16, "~3m51s"), 324 s (Qwen3.5, "~5.4 min") and 450 s (TurboQuant rollback to
  healthy), one of the three drawn per node with equal weight (a mixed fleet), multiplied by
  a ratio drawn from the measured boots (each measured boot over their median).
- "batch" is what b70deploy does: K nodes at once, the next batch when all K are back.
  "window" (for comparison, not implemented): a new node starts as soon as any returns, so
  K are out at every moment until the tail.
- Capacity = nodes in the pool / N, over the whole rollout; minimum and time-weighted mean.
No failures are injected: the first failure stops the rollout (see docs/multinode.md).

    python benchmarks/rolling_sim.py --measure 30     # measure, write rolling_boots.json, plot
    python benchmarks/rolling_sim.py                  # reuse rolling_boots.json, plot
"""

from __future__ import annotations

import argparse
import heapq
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np

from b70deploy.sim.image import TAGS as SIM_TAGS

HERE = Path(__file__).resolve().parent
BOOTS_FILE = HERE / "rolling_boots.json"
PLOT_FILE = HERE / "rolling_sim.png"
POST_COLD_BOOTS = {"W4A16 (3m51s)": 231.0, "Qwen3.5 (5.4 min)": 324.0, "TQ rollback (450 s)": 450.0}
KS = [1, 2, 5, 10, 20, 50, 100]
FLEETS = {100: 200, 1000: 40}  # nodes: repetitions


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return int(r.status)
    except (urllib.error.URLError, OSError):
        return None


def measure(n: int, image: str = SIM_TAGS["bash-c"]) -> dict[str, list[float]]:
    """n real sim boots: seconds from docker run to /health 200, and the drain (docker stop)."""
    boots, stops = [], []
    for i in range(n):
        name, port = f"b70rsim-{uuid.uuid4().hex[:8]}", _free_port()
        t0 = time.monotonic()
        subprocess.run(["docker", "run", "-d", "--name", name, "--label", "b70deploy.bench=rolling-sim",
                        "-p", f"127.0.0.1:{port}:8000", "-e", "B70SIM_BOOT_SECONDS=1", image,
                        "vllm", "serve", "/models/x", "--max-model-len", "8192"], check=True, capture_output=True)
        try:
            while _health(port) != 200:
                if time.monotonic() - t0 > 60:
                    raise RuntimeError(f"sim boot {i} not healthy in 60 s")
                time.sleep(0.02)
            boots.append(time.monotonic() - t0)
            t1 = time.monotonic()
            subprocess.run(["docker", "stop", "-t", "10", name], check=True, capture_output=True)
            stops.append(time.monotonic() - t1)
        finally:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
        print(f"  boot {i + 1}/{n}: {boots[-1]:.2f} s, stop {stops[-1]:.2f} s", file=sys.stderr)
    return {"boot_seconds": boots, "stop_seconds": stops, "sim_boot_setting": [1.0]}


def sample_out_times(rng: np.random.Generator, n: int, ratios: np.ndarray, overhead: float) -> np.ndarray:
    anchors = np.array(list(POST_COLD_BOOTS.values()))
    return overhead + rng.choice(anchors, size=n) * rng.choice(ratios, size=n)


def batch_rollout(out: np.ndarray, k: int) -> tuple[float, float, float]:
    """(total seconds, minimum capacity, mean capacity) when batches of k wait for each other."""
    n = len(out)
    total, in_pool_area = 0.0, 0.0
    for i in range(0, n, k):
        batch = out[i:i + k]
        span = float(batch.max())
        # During the batch, node j is out for out[j] and back for the rest of the span.
        in_pool_area += (n - len(batch)) * span + float((span - batch).sum())
        total += span
    return total, (n - min(k, n)) / n, in_pool_area / (n * total)


def window_rollout(out: np.ndarray, k: int) -> tuple[float, float, float]:
    """The same with a sliding window: a node starts as soon as one of the k returns."""
    n = len(out)
    running: list[float] = []
    t, area, out_count, last = 0.0, 0.0, 0, 0.0
    queue = list(out)
    while queue or running:
        while queue and len(running) < k:
            end = t + queue.pop(0)
            heapq.heappush(running, end)
        t_next = heapq.heappop(running)
        out_count = len(running) + 1
        area += (n - out_count) * (t_next - last)
        last = t = t_next
    return t, (n - min(k, n)) / n, area / (n * t)


def simulate(boots: dict[str, list[float]], seed: int = 7) -> dict[str, list[dict[str, float]]]:
    measured = np.array(boots["boot_seconds"])
    ratios = measured / float(np.median(measured))
    # Out of the pool beyond the boot itself: the stop, plus what a sim switch spends around
    # its boot (compose up, smoke): measured boot minus the configured 1 s boot delay.
    overhead = float(np.median(boots["stop_seconds"])) + float(np.median(measured) - boots["sim_boot_setting"][0])
    rng = np.random.default_rng(seed)
    results: dict[str, list[dict[str, float]]] = {}
    for n, reps in FLEETS.items():
        rows = []
        for k in [k for k in KS if k <= n]:
            per = {"batch": [], "window": []}  # type: dict[str, list[tuple[float, float, float]]]
            for _ in range(reps):
                out = sample_out_times(rng, n, ratios, overhead)
                per["batch"].append(batch_rollout(out, k))
                per["window"].append(window_rollout(out, k))
            for strategy, runs in per.items():
                totals = np.array([r[0] for r in runs])
                rows.append({"k": k, "strategy": strategy, "total_median_s": float(np.median(totals)),
                             "total_p95_s": float(np.percentile(totals, 95)),
                             "min_capacity": float(min(r[1] for r in runs)),
                             "mean_capacity": float(statistics.fmean(r[2] for r in runs))})
        results[str(n)] = rows
    results["model"] = [{"overhead_s": overhead, "measured_boots": len(measured),
                         "ratio_p05": float(np.percentile(ratios, 5)), "ratio_p95": float(np.percentile(ratios, 95))}]
    return results


def plot(results: dict[str, list[dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    colours = {"100": "tab:blue", "1000": "tab:red"}
    for n in ("100", "1000"):
        for strategy, style in (("batch", "-o"), ("window", "--s")):
            rows = [r for r in results[n] if r["strategy"] == strategy]
            ks = [r["k"] for r in rows]
            axes[0].plot(ks, [r["total_median_s"] / 3600 for r in rows], style, color=colours[n],
                         label=f"N={n}, {strategy}" + (" (b70deploy)" if strategy == "batch" else ""))
            axes[0].fill_between(ks, [r["total_median_s"] / 3600 for r in rows],
                                 [r["total_p95_s"] / 3600 for r in rows], color=colours[n], alpha=0.12)
            axes[1].plot(ks, [100 * r["mean_capacity"] for r in rows], style, color=colours[n],
                         label=f"N={n}, {strategy}: mean")
        batch = [r for r in results[n] if r["strategy"] == "batch"]
        axes[1].plot([r["k"] for r in batch], [100 * r["min_capacity"] for r in batch], ":", color=colours[n],
                     marker="v", label=f"N={n}: minimum (both)")
    axes[0].set(xscale="log", yscale="log", xlabel="max-unavailable K", ylabel="rollout time, hours (median to p95)",
                title="Total time of a rolling switch")
    axes[1].set(xscale="log", xlabel="max-unavailable K", ylabel="% of nodes in the pool",
                title="Pool capacity during the rollout", ylim=(0, 101))
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    model = results["model"][0]
    fig.suptitle(f"Out of pool per node = {model['overhead_s']:.1f} s overhead + cold boot from the post "
                 "(231 / 324 / 450 s, equal mix) x measured sim-boot spread "
                 f"({int(model['measured_boots'])} boots)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", type=int, default=0, help="Run this many real sim boots first.")
    args = parser.parse_args()
    if args.measure:
        BOOTS_FILE.write_text(json.dumps(measure(args.measure), indent=1) + "\n")
    boots = json.loads(BOOTS_FILE.read_text())
    results = simulate(boots)
    (HERE / "rolling_sim.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, PLOT_FILE)
    for n in ("100", "1000"):
        print(f"N={n}")
        print(f"  {'K':>4} {'strategy':<8} {'median':>10} {'p95':>10} {'min cap':>8} {'mean cap':>9}")
        for r in results[n]:
            print(f"  {r['k']:>4} {r['strategy']:<8} {r['total_median_s'] / 3600:>9.2f}h "
                  f"{r['total_p95_s'] / 3600:>9.2f}h {100 * r['min_capacity']:>7.1f}% "
                  f"{100 * r['mean_capacity']:>8.1f}%")
    print(f"model: {results['model'][0]}; plot: {PLOT_FILE}")


if __name__ == "__main__":
    main()
