"""The clients' downtime through the front door (issue 27), next to the same node without one.

One run makes two sim nodes on the real Docker engine, one with `door: {enabled: true}`, one
without, and on each, after a warm-up switch to alpha:

  switch      alpha -> beta
  failed      beta -> crash (the report's Marlin crash at boot): rolled back to beta
  rollback    `b70deploy rollback` (beta -> alpha)

During each, a few clients (the official `openai` client, one streaming chat completion after
another, loopback only, each bounded in count and time) ask the node's port, and the
benchmark counts per operation: requests failed (refused, reset, 5xx), the longest wait of
one request, and the outage as the clients saw it: the longest time in which no request
ended with a full answer (start of the operation to its end plus one second).

Then the SSE first-chunk latency of the door's node: the time from sending a streaming
request to its first content chunk, through the door (the node's port) and direct (vllm's
loopback probe port), alternated, median of several with min and max.

Every client sends `Connection: close` (the server closes first): no idle client socket is
left on the node's port for the door-less switch's idle check to wait on.

    python benchmarks/bench_door.py --json benchmarks/results/door.json
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from switch_bench import REPO, Bench, docker, free_port, log, machine, report, stats

MODEL = "qwen3-30b-a3b-w4a16"


def openai_client(port: int, timeout: float) -> Any:
    import openai

    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=timeout,
                         default_headers={"Connection": "close"})


@dataclass
class Clients:
    """`n` clients asking in a loop until stopped, or `max_requests` each, or `max_seconds`."""

    port: int
    n: int = 3
    max_requests: int = 2000
    max_seconds: float = 300.0
    answers: list[tuple[float, float, bool, str]] = field(default_factory=list)  # (start, end, ok, why)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _one(self, client: Any) -> tuple[bool, str]:
        import openai

        try:
            stream = client.chat.completions.create(model=MODEL, stream=True, max_tokens=8,
                                                    messages=[{"role": "user", "content": "The capital of France?"}])
            chunks = list(stream)
            got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            return bool(got), "" if got else f"empty answer ({len(chunks)} chunks)"
        except openai.APIStatusError as e:
            return False, f"HTTP {e.status_code}"
        except openai.APIError as e:
            return False, type(e).__name__

    def _loop(self) -> None:
        try:
            client = openai_client(self.port, timeout=600)
        except ImportError as e:  # no answers would read as no failures: say it and count it
            with self.lock:
                self.answers.append((time.time(), time.time(), False, f"no openai client: {e}"))
            return
        deadline = time.monotonic() + self.max_seconds
        for _ in range(self.max_requests):
            if self.stop.is_set() or time.monotonic() >= deadline:
                return
            start = time.time()
            ok, why = self._one(client)
            with self.lock:
                self.answers.append((start, time.time(), ok, why))

    def __enter__(self) -> Clients:
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(self.n)]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=self.max_seconds)


def outcome(answers: list[tuple[float, float, bool, str]], start: float, end: float) -> dict[str, Any]:
    """Failed requests, the longest wait, the longest span without a full answer in [start, end]."""
    inside = [a for a in answers if a[1] >= start and a[0] <= end]
    oks = sorted(e for s, e, ok, _ in inside if ok)
    marks = [start, *[t for t in oks if start <= t <= end], end]
    failed = [why for _, _, ok, why in inside if not ok]
    return {"requests": len(inside), "failed": len(failed),
            "failed_kinds": sorted(set(failed)),
            "longest_wait_s": round(max((e - s for s, e, _, _ in inside), default=0.0), 3),
            "outage_s": round(max(b - a for a, b in itertools.pairwise(marks)), 3)}


@dataclass
class Node:
    bench: Bench
    door: bool

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(REPO), "B70DEPLOY_CONFIG": str(self.bench.config)}
        return subprocess.run([sys.executable, "-m", "b70deploy.cli", *args], capture_output=True, text=True,
                              env=env, timeout=600, check=False)

    def operation(self, name: str, argv: list[str], *, must_fail: bool, clients: int) -> dict[str, Any]:
        with Clients(self.bench.prod_port, n=clients) as c:
            time.sleep(1.0)  # the clients are answered before the operation starts
            start = time.time()
            r = self.cli(*argv)
            end = time.time() + 1.0
            time.sleep(1.0)
        if (r.returncode != 0) != must_fail:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        got = {"operation": name, "door": self.door, "seconds": round(end - 1.0 - start, 2),
               **outcome(c.answers, start, end)}
        if self.door:
            got["door_says"] = self.cli("door").stdout.strip()
        log(f"{'door' if self.door else 'direct'} {name}: {got}")
        return got


def make_node(root: Path, *, door: bool, boot: float, hold: float) -> Node:
    b = Bench(root, uuid.uuid4().hex[:8], boot)
    b.setup()
    if door:
        from b70deploy.sim.door_image import build

        tag = f"{b.project}/door:caddy"
        docker("tag", build().tag, tag)
        b.tags["door"] = tag  # removed with the bench's other tags
        cfg = yaml.safe_load(b.config.read_text())
        cfg["door"] = {"enabled": True, "image": tag, "hold_seconds": hold, "probe_port": free_port()}
        b.config.write_text(yaml.safe_dump(cfg))
    return Node(b, door)


def first_chunk(port: int) -> float:
    client = openai_client(port, timeout=60)
    t0 = time.perf_counter()
    stream = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=16, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            took = time.perf_counter() - t0
            stream.close()
            return took
    raise RuntimeError(f"no content chunk from port {port}: {stream.response.status_code} {stream.response.headers}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    nodes: list[Node] = []
    try:
        for door in (True, False):
            nodes.append(make_node(Path(tempfile.mkdtemp(prefix="b70door-bench-")), door=door, boot=args.boot,
                                   hold=args.hold))
        results = []
        for node in nodes:
            r = node.cli("switch", "alpha", "--yes")  # warm-up, not counted
            if r.returncode != 0:
                raise RuntimeError(f"warm-up switch failed:\n{r.stdout}\n{r.stderr}")
            results.append(node.operation("switch", ["switch", "beta", "--yes"], must_fail=False,
                                          clients=args.clients))
            results.append(node.operation("failed switch", ["switch", "crash", "--yes"], must_fail=True,
                                          clients=args.clients))
            results.append(node.operation("rollback", ["rollback", "--yes"], must_fail=False, clients=args.clients))
        door = nodes[0]
        probe = int(yaml.safe_load(door.bench.config.read_text())["door"]["probe_port"])
        through: list[float] = []
        direct: list[float] = []
        for _ in range(args.sse_runs):
            through.append(first_chunk(door.bench.prod_port))
            direct.append(first_chunk(probe))
        sse = {"through_door_ms": stats([t * 1000 for t in through]), "direct_ms": stats([t * 1000 for t in direct]),
               "difference_of_medians_ms": round((statistics.median(through) - statistics.median(direct)) * 1000, 3)}
        return {"machine": machine(), "boot_seconds": args.boot, "hold_seconds": args.hold, "clients": args.clients,
                "operations": results, "sse_first_chunk": sse}
    finally:
        for node in nodes:
            node.bench.cleanup()


def table(result: dict[str, Any]) -> str:
    lines = [f"clients: {result['clients']} openai streams; sim boot {result['boot_seconds']:g} s; door hold bound "
             f"{result['hold_seconds']:g} s",
             f"{'operation':<14} {'door':<6} {'s':>6} {'requests':>8} {'failed':>6} {'longest wait s':>14} "
             f"{'outage s':>9}  failures"]
    for r in result["operations"]:
        lines.append(f"{r['operation']:<14} {'on' if r['door'] else 'off':<6} {r['seconds']:>6.1f} {r['requests']:>8} "
                     f"{r['failed']:>6} {r['longest_wait_s']:>14.2f} {r['outage_s']:>9.2f}  "
                     f"{', '.join(r['failed_kinds'])}")
    sse = result["sse_first_chunk"]

    def fmt(st: dict[str, Any]) -> str:
        return f"median {st['median']:.2f} ms (min {st['min']:.2f}, max {st['max']:.2f}, n {st['n']})"

    lines.append(f"SSE first chunk: through the door {fmt(sse['through_door_ms'])}; direct {fmt(sse['direct_ms'])}; "
                 f"difference of medians {sse['difference_of_medians_ms']:.2f} ms")
    return "\n".join(lines)


def door_flags(p: argparse.ArgumentParser, *, boot: float) -> None:
    """The flags bench_door and bench_standby share: the sim's boot delay, the door's hold bound, the clients."""
    p.add_argument("--boot", type=float, default=boot, help=f"sim boot delay, B70SIM_BOOT_SECONDS (default {boot:g})")
    p.add_argument("--hold", type=float, default=120.0, help="the door's hold bound, seconds (default 120)")
    p.add_argument("--clients", type=int, default=3, help="concurrent client streams (default 3)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    door_flags(p, boot=2.0)
    p.add_argument("--sse-runs", type=int, default=15, help="first-chunk samples per path (default 15)")
    p.add_argument("--json", type=Path, help="write every operation and the summary here")
    return report(run, table, p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
