"""The front door against the current one (issue 37): the same sim, both doors, in one run.

One run makes a sim node on the real Docker engine with `door: {enabled: true}`, deployed by this
tree, and with `--base`, a checkout of the current door (e.g. main), a second one beside it: its CLI
and its door image from that checkout, the sim image and stacks from this one. Then, `--runs` times,
on each node in turn:

  switch      alpha -> beta
  failed      beta -> crash (the report's Marlin crash at boot): rolled back to beta
  rollback    `b70deploy rollback` (beta -> alpha)

During each, `--clients` clients (the official `openai` client, one streaming chat completion
after another, loopback only) ask the node's port, and the benchmark counts per operation:
requests failed (refused, reset, 5xx), streams cut (a stream whose content chunks are not as many
as the sim's own answer to the same request, asked of vllm's probe port first), the longest wait
of one request, and the outage as the clients saw it (the longest time in which no request ended
with a full answer, from the operation's start to its end plus one second).

Then the SSE first-chunk latency of each node: the time from sending a streaming completion to
its first content chunk, through the door and direct to vllm, each on a new connection
(`Connection: close`) and on one kept across requests, and each from two clients: one on the
host's loopback (the node's port, vllm's loopback probe port) and one in a container on the node's
project network, as a companion (open-webui) is (door:8080, vllm:8000). Every path of every node is
asked once in each of `--sse` rounds per run, interleaved; a door's overhead in a run
is the median of its rounds' differences (through less direct), reported over the runs as their
median with min and max. The load average is recorded at each run's start and end (the machine
is shared).

Every client sends `Connection: close` (the server closes first), but the kept-connection paths.
From loopback both ways of the first chunk go through docker-proxy (Docker's userland proxy answers
a published port on loopback); from the network neither does, as from a remote client (the kernel
NATs a published port for it), so that overhead is what the door itself costs. On a new
connection the door dials vllm on a connection it keeps (its keep-alive), while the direct path
makes vllm accept one per request: the door saves that. On a kept connection neither path sets
one up, so that overhead is the door's relay alone.

    python benchmarks/bench_door.py [--base /work/wt-door-base] --json benchmarks/results/door.json
"""

from __future__ import annotations

import argparse
import http.client
import inspect
import itertools
import json
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
from switch_bench import REPO, Bench, container_id, docker, free_port, log, machine, report, stats

from b70deploy.render.door import DOOR_PORT
from b70deploy.render.vllm_args import CONTAINER_PORT

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
    model: str = MODEL  # the served name the clients ask for (the GPU lane's model is `lane`)
    answers: list[tuple[float, float, bool, str]] = field(default_factory=list)  # (start, end, ok, why)
    chunks: list[int] = field(default_factory=list)  # content chunks of each stream that ended without an error
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _one(self, client: Any) -> tuple[bool, str]:
        import openai

        try:
            stream = client.chat.completions.create(model=self.model, stream=True, max_tokens=8,
                                                    messages=[{"role": "user", "content": "The capital of France?"}])
            chunks = list(stream)
            content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
            with self.lock:
                self.chunks.append(len(content))
            got = "".join(content)
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


def sim_chunks(port: int) -> int:
    """The content chunks of the sim's own answer to the clients' request, asked of `port` directly."""
    c = Clients(port, n=1)
    ok, why = c._one(openai_client(port, timeout=60))
    if not ok:
        raise RuntimeError(f"the sim did not answer on port {port}: {why}")
    return c.chunks[0]


@dataclass
class Node:
    bench: Bench
    door: bool
    repo: Path = REPO  # the checkout whose CLI deploys this node (--base: the current door's)
    label: str = ""

    @property
    def probe(self) -> int:
        return int(yaml.safe_load(self.bench.config.read_text())["door"]["probe_port"])

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(self.repo), "B70DEPLOY_CONFIG": str(self.bench.config)}
        # In the checkout's own folder: `-m` puts the working directory first on sys.path, before PYTHONPATH.
        return subprocess.run([sys.executable, "-m", "b70deploy.cli", *args], capture_output=True, text=True,
                              env=env, timeout=600, check=False, cwd=self.repo)

    def operation(self, name: str, argv: list[str], *, must_fail: bool, clients: int,
                  sim: int | None = None) -> dict[str, Any]:
        """`sim`: the sim's chunk count for the clients' request; a stream with another count was cut."""
        with Clients(self.bench.prod_port, n=clients) as c:
            time.sleep(1.0)  # the clients are answered before the operation starts
            start = time.time()
            r = self.cli(*argv)
            end = time.time() + 1.0
            time.sleep(1.0)
        if (r.returncode != 0) != must_fail:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        got = {"operation": name, "door": self.door, "node": self.label, "seconds": round(end - 1.0 - start, 2),
               **outcome(c.answers, start, end)}
        if sim is not None:
            got |= {"streams": len(c.chunks), "cut": sum(n != sim for n in c.chunks), "sim_chunks": sim}
        if self.door:
            got["door_says"] = self.cli("door").stdout.strip()
        log(f"{self.label or ('door' if self.door else 'direct')} {name}: {got}")
        return got


def door_image(repo: Path) -> str:
    """The door image as the checkout `repo` builds it (its own sim/door_image.py), by tag."""
    said = subprocess.run([sys.executable, "-c", "from b70deploy.sim.door_image import build; print(build().tag)"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(repo)}, timeout=600,
                          check=False, cwd=repo)  # `-c` puts the working directory first on sys.path
    if said.returncode != 0:
        raise RuntimeError(f"the door image of {repo} did not build:\n{said.stderr}")
    return said.stdout.strip().splitlines()[-1]


def make_node(root: Path, *, door: bool, boot: float, hold: float, repo: Path = REPO, label: str = "") -> Node:
    b = Bench(root, uuid.uuid4().hex[:8], boot)
    b.setup()
    if door:
        tag = f"{b.project}/door:caddy"
        docker("tag", door_image(repo), tag)
        b.tags["door"] = tag  # removed with the bench's other tags
        cfg = yaml.safe_load(b.config.read_text())
        cfg["door"] = {"enabled": True, "image": tag, "hold_seconds": hold, "probe_port": free_port()}
        # Every address: a door on the host's network is reached from a container at the project network's
        # gateway (vllm's probe port stays on loopback either way).
        cfg["bind_address"] = "0.0.0.0"
        b.config.write_text(yaml.safe_dump(cfg))
    return Node(b, door, repo, label)


def first_chunk(port: int, kept: http.client.HTTPConnection | None = None, host: str = "127.0.0.1") -> float:
    """Seconds from sending a streaming completion to its first content chunk; http.client, so that
    the client's own time is small and the same on both paths. On a new connection closed after the
    answer (`Connection: close`, as the clients make), or on `kept`, one connection kept open across
    requests (as the openai client's pool does): then no connection is set up on either path, and
    the door's overhead is its relay alone. The stream is read to its end, as a client does: one
    left early makes the door drop its connection to vllm, which a client's whole stream never does."""
    body = json.dumps({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 1, "stream": True})
    conn = kept or http.client.HTTPConnection(host, port, timeout=60)
    headers = {"Content-Type": "application/json"} | ({} if kept else {"Connection": "close"})
    took = None
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body, headers)
        r = conn.getresponse()
        while line := r.readline():
            if took is None and line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["text"]:
                took = time.perf_counter() - t0
    finally:
        if kept is None:
            conn.close()
    if took is None:
        raise RuntimeError(f"no content chunk from {host}:{port}: {r.status}")
    return took


# The client inside the door's network: `first_chunk` itself (its source), asked one line at a time
# ("HOST PORT new|kept") on stdin, answering the seconds or "error ..." on stdout.
INSIDE_LOOP = """
import sys
kept = {}
for line in sys.stdin:
    host, port, conn = line.split()
    k = None
    if conn == "kept":
        k = kept.setdefault((host, port), http.client.HTTPConnection(host, int(port), timeout=60))
    try:
        print(first_chunk(int(port), k, host), flush=True)
    except Exception as e:
        print("error", repr(e).replace(chr(10), " "), flush=True)
"""


def network_of(node: Node) -> str:
    """The node's project network (Compose's default one), where its companions are."""
    return f"{node.bench.project}_default"


def door_from_network(node: Node) -> tuple[str, int]:
    """Where a container on the project network reaches the door: by its name in the network, or, on the
    host's network, at the network's gateway and the node's port."""
    door = container_id(node.bench.project, "door")
    if docker("inspect", "-f", "{{.HostConfig.NetworkMode}}", door).stdout.strip() != "host":
        return "door", DOOR_PORT
    gateway = docker("network", "inspect", "-f", "{{range .IPAM.Config}}{{.Gateway}} {{end}}",
                     network_of(node)).stdout.split()[0]
    return gateway, node.bench.prod_port


class Inside:
    """A client in a container on a node's project network (as a companion such as open-webui is): it
    reaches vllm by its service name and the door by its own (or, on the host's network, at the
    gateway: `door_from_network`), with no published port and so no docker-proxy on either path. The
    sim image's Python runs `first_chunk`, the same code as the host's client."""

    def __init__(self, node: Node) -> None:
        self.name = f"{node.bench.project}-inside"
        script = "\n".join(["from __future__ import annotations", "import http.client, json, time",
                             f"MODEL = {MODEL!r}", inspect.getsource(first_chunk), INSIDE_LOOP])
        self.proc = subprocess.Popen(["docker", "run", "-i", "--rm", "--name", self.name, "--network", network_of(node),
                                      "--entrypoint", "python3", node.bench.tags["bash-c"], "-u", "-c", script],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def first_chunk(self, host: str, port: int, conn: str) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{host} {port} {conn}\n")
        self.proc.stdin.flush()
        said = self.proc.stdout.readline()
        if not said or said.startswith("error"):
            raise RuntimeError(f"the client inside the network, {host}:{port} ({conn}): {said.strip() or 'ended'}")
        return float(said)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            docker("rm", "-f", self.name, check=False)
            self.proc.wait(timeout=30)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


WHERE = ("loopback", "network")  # the client on the host's 127.0.0.1, or in a container on the door's network


def overhead(nodes: list[Node], samples: int) -> dict[str, Any]:
    """First-chunk latency through each node's door and direct to its vllm, on a new connection and
    on a kept one, from the host's loopback (both through docker-proxy) and from a container on the
    node's network (door:8080 and vllm:8000, neither through it): the paths interleaved in every round
    (the order turning each round), so the shared machine's load falls on all alike; a node's
    overhead is the median of its rounds' differences (through less direct)."""
    paths = [(n.label, where, way, conn) for n in nodes for where in WHERE for way in ("through", "direct")
             for conn in ("new", "kept")]
    by_label = {n.label: n for n in nodes}
    doors = {n.label: door_from_network(n) for n in nodes}

    def address(label: str, where: str, way: str) -> tuple[str, int]:
        n = by_label[label]
        if where == "loopback":
            return "127.0.0.1", n.bench.prod_port if way == "through" else n.probe
        return doors[label] if way == "through" else ("vllm", CONTAINER_PORT)

    kept = {address(label, where, way): http.client.HTTPConnection("127.0.0.1", address(label, where, way)[1],
                                                                   timeout=60)
            for label, where, way, conn in paths if where == "loopback" and conn == "kept"}
    inside: dict[str, Inside] = {}
    got: dict[tuple[str, str, str, str], list[float]] = {p: [] for p in paths}
    try:
        for n in nodes:
            inside[n.label] = Inside(n)
        for i in range(samples):
            for label, where, way, conn in paths[i % len(paths):] + paths[:i % len(paths)]:
                host, port = address(label, where, way)
                took = (first_chunk(port, kept.get((host, port)) if conn == "kept" else None) if where == "loopback"
                        else inside[label].first_chunk(host, port, conn))
                got[(label, where, way, conn)].append(took * 1000)
    finally:
        for c in kept.values():
            c.close()
        for client in inside.values():
            client.close()
    out: dict[str, Any] = {}
    for n in nodes:
        for where in WHERE:
            for conn in ("new", "kept"):
                key = " ".join([n.label, *(["network"] if where == "network" else []), *(["kept"] if conn == "kept"
                                                                                           else [])])
                through, direct = got[(n.label, where, "through", conn)], got[(n.label, where, "direct", conn)]
                out[key] = {"through_ms": stats(through), "direct_ms": stats(direct),
                            "overhead_ms": round(statistics.median(t - d for t, d in zip(through, direct,
                                                                                           strict=True)), 3)}
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    nodes: list[Node] = []
    try:
        nodes.append(make_node(Path(tempfile.mkdtemp(prefix="b70door-bench-")), door=True, boot=args.boot,
                               hold=args.hold, label="new"))
        if args.base is not None:
            nodes.append(make_node(Path(tempfile.mkdtemp(prefix="b70door-bench-")), door=True, boot=args.boot,
                                   hold=args.hold, repo=args.base.resolve(), label="current"))
        sims: dict[str, int] = {}
        for node in nodes:
            r = node.cli("switch", "alpha", "--yes")  # warm-up, not counted
            if r.returncode != 0:
                raise RuntimeError(f"warm-up switch of {node.label} failed:\n{r.stdout}\n{r.stderr}")
            sims[node.label] = sim_chunks(node.probe)
        runs = []
        for i in range(args.runs):
            got: dict[str, Any] = {"run": i + 1, "load_start": load(), "operations": [], "sse": {}}
            for node in nodes:
                sim = sims[node.label]
                ops = got["operations"]
                ops.append(node.operation("switch", ["switch", "beta", "--yes"], must_fail=False,
                                          clients=args.clients, sim=sim))
                ops.append(node.operation("failed switch", ["switch", "crash", "--yes"], must_fail=True,
                                          clients=args.clients, sim=sim))
                ops.append(node.operation("rollback", ["rollback", "--yes"], must_fail=False, clients=args.clients,
                                          sim=sim))
            got["sse"] = overhead(nodes, args.sse)
            log(f"run {i + 1} first chunk: {got['sse']}")
            got["load_end"] = load()
            runs.append(got)
        summary = {n.label: {"overhead_ms": stats([r["sse"][n.label]["overhead_ms"] for r in runs]),
                             "kept_overhead_ms": stats([r["sse"][f"{n.label} kept"]["overhead_ms"] for r in runs]),
                             "network_overhead_ms": stats([r["sse"][f"{n.label} network"]["overhead_ms"]
                                                           for r in runs]),
                             "network_kept_overhead_ms": stats([r["sse"][f"{n.label} network kept"]["overhead_ms"]
                                                                for r in runs]),
                             "failed": sum(o["failed"] for r in runs for o in r["operations"] if o["node"] == n.label),
                             "cut": sum(o["cut"] for r in runs for o in r["operations"] if o["node"] == n.label),
                             "streams": sum(o["streams"] for r in runs for o in r["operations"]
                                            if o["node"] == n.label)}
                   for n in nodes}
        return {"machine": machine(), "boot_seconds": args.boot, "hold_seconds": args.hold, "clients": args.clients,
                "base": str(args.base) if args.base is not None else None, "sim_chunks": sims, "runs": runs,
                "summary": summary}
    finally:
        for node in nodes:
            node.bench.cleanup()


def table(result: dict[str, Any]) -> str:
    lines = [f"clients: {result['clients']} openai streams; sim boot {result['boot_seconds']:g} s; door hold bound "
             f"{result['hold_seconds']:g} s; new: this tree (Caddy 2.11.7); current: {result['base'] or '(none)'}",
             f"{'run':>3} {'operation':<14} {'door':<8} {'s':>5} {'requests':>8} {'failed':>6} {'cut':>4} "
             f"{'longest wait s':>14} {'outage s':>9}  failures"]
    for r in result["runs"]:
        for o in r["operations"]:
            lines.append(f"{r['run']:>3} {o['operation']:<14} {o['node']:<8} {o['seconds']:>5.1f} {o['requests']:>8} "
                         f"{o['failed']:>6} {o['cut']:>4} {o['longest_wait_s']:>14.2f} {o['outage_s']:>9.2f}  "
                         f"{', '.join(o['failed_kinds'])}")
    lines.append("SSE first chunk, per run (median ms through the door / direct, median of the rounds' "
                 "differences; load average 1/5/15 min at the run's start and end):")
    for r in result["runs"]:
        parts = [f"{k} {v['through_ms']['median']:.2f}/{v['direct_ms']['median']:.2f} ({v['overhead_ms']:+.2f})"
                 for k, v in r["sse"].items()]
        lines.append(f"  run {r['run']}: {'; '.join(parts)}; load {r['load_start']} -> {r['load_end']}")
    for label, s in result["summary"].items():
        o, k = s["overhead_ms"], s["kept_overhead_ms"]
        no, nk = s["network_overhead_ms"], s["network_kept_overhead_ms"]
        lines.append(f"{label}: first-chunk overhead from loopback, median {o['median']:.2f} ms (min {o['min']:.2f}, "
                     f"max {o['max']:.2f}, {o['n']} runs; on a kept connection {k['median']:.2f}, "
                     f"{k['min']:.2f} to {k['max']:.2f}); from the door's network {no['median']:.2f} ms "
                     f"({no['min']:.2f} to {no['max']:.2f}; kept {nk['median']:.2f}, {nk['min']:.2f} to "
                     f"{nk['max']:.2f}); {s['failed']} failed requests, "
                     f"{s['cut']} cut of {s['streams']} streams (sim: {result['sim_chunks'][label]} chunks)")
    return "\n".join(lines)


def door_flags(p: argparse.ArgumentParser, *, boot: float) -> None:
    """The flags bench_door and bench_standby share: the sim's boot delay, the door's hold bound, the clients."""
    p.add_argument("--boot", type=float, default=boot, help=f"sim boot delay, B70SIM_BOOT_SECONDS (default {boot:g})")
    p.add_argument("--hold", type=float, default=120.0, help="the door's hold bound, seconds (default 120)")
    p.add_argument("--clients", type=int, default=4, help="concurrent client streams (default 4)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    door_flags(p, boot=2.0)
    p.add_argument("--base", type=Path,
                   help="a checkout of the current door (main), whose CLI and door image deploy a second node")
    p.add_argument("--runs", type=int, default=5, help="runs of the three operations and the SSE samples (default 5)")
    p.add_argument("--sse", type=int, default=15, help="first-chunk samples per path per run (default 15)")
    p.add_argument("--json", type=Path, help="write every operation and the summary here")
    return report(run, table, p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
