"""The router companion's outage through a stop-first switch, this checkout beside a baseline's (issue 35).

naptha-node's layout on the sim: `webui` (the router: a client of vllm, OPENAI_API_BASE_URL names it) waits
for `db` (a database stand-in with a health check every `--interval` seconds, naptha-node's pgvector: 30 s)
with `depends_on: condition: service_healthy`. Two sim nodes (switch_bench's, no door), one driven by this
checkout's b70deploy and one by `--baseline` (a checkout of main: `git worktree add --detach DIR main`); after a
warm-up switch to alpha, `--runs` switches on each, alternating beta and alpha, the nodes alternating.

Measured from outside, by asking the router's published port every 0.05 s: the router's outage (its last
answer before the switch stopped it to its first answer after), and the time from the command's start to that
first answer. Medians with min and max; `db restarted` counts the switches after which db's container had
another StartedAt (docker inspect).

    python benchmarks/bench_companions.py --baseline ../wt-base --runs 5
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests
import yaml
from bench_door import Node, make_node
from bench_standby import remove_node
from switch_bench import docker, free_port, log, stats


class Router:
    """Asks the router's /health every 0.05 s: when it stopped answering and when it answered again."""

    def __init__(self, port: int) -> None:
        self.port, self.done = port, threading.Event()
        self.last_up: float | None = None   # the last answer before the first miss
        self.back: float | None = None      # the first answer after a miss
        self.thread = threading.Thread(target=self._ask, daemon=True)

    def _ask(self) -> None:
        missed = False
        while not self.done.is_set():
            try:
                ok = requests.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200
            except requests.RequestException:
                ok = False
            now = time.time()
            if ok and not missed:
                self.last_up = now
            elif ok and self.back is None:
                self.back = now
                return
            else:
                missed = True
            time.sleep(0.05)

    def __enter__(self) -> Router:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(timeout=60)  # the router back within a minute of the command's end, else none
        self.done.set()
        self.thread.join()


def companion_node(root: Path, repo: Path, label: str, interval: float) -> tuple[Node, int]:
    node = make_node(root, door=False, boot=2.0, hold=0, repo=repo, label=label)
    cfg = yaml.safe_load(node.bench.config.read_text())
    image, port = node.bench.tags["bash-c"], free_port()
    cfg["companions"] = [
        {"name": "db", "image": image, "command": ["sim-webui", "--port", "5432"],
         "compose": {"healthcheck": {"test": ["CMD-SHELL", "wget -q -O /dev/null http://127.0.0.1:5432/health"],
                                     "interval": f"{interval:g}s", "timeout": "5s", "retries": 5}}},
        {"name": "webui", "image": image, "command": ["sim-webui", "--port", "8080"], "port": port,
         "container_port": 8080, "environment": {"OPENAI_API_BASE_URL": "http://vllm:8000/v1"},
         "compose": {"depends_on": {"db": {"condition": "service_healthy"}}}}]
    node.bench.config.write_text(yaml.safe_dump(cfg))
    return node, port


def db_started(node: Node) -> str:
    ids = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={node.bench.project}",
                 "--filter", "label=com.docker.compose.service=db").stdout.split()
    return docker("inspect", "-f", "{{.State.StartedAt}}", *ids).stdout.strip()


def switch(node: Node, port: int, stack: str) -> dict[str, Any]:
    before = db_started(node)
    with Router(port) as router:
        time.sleep(0.3)
        start = time.time()
        r = node.cli("switch", stack, "--yes")
        if r.returncode != 0:
            raise RuntimeError(f"switch {stack} on {node.label}: {r.stdout}\n{r.stderr}")
    if router.back is None or router.last_up is None:
        raise RuntimeError(f"the router on {node.label} never came back, or never answered")
    got = {"node": node.label, "stack": stack, "outage": round(router.back - router.last_up, 2),
           "start_to_router": round(router.back - start, 2), "command": round(time.time() - start, 2),
           "db_restarted": db_started(node) != before}
    log(str(got))
    return got


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", type=Path, required=True, help="a checkout of main")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--interval", type=float, default=30.0, help="db's health interval (naptha-node's: 30 s)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    here = Path(__file__).resolve().parents[1]
    nodes: list[tuple[Node, int]] = []
    rows: list[dict[str, Any]] = []
    try:
        for repo, label in ((here, "this"), (args.baseline.resolve(), "baseline")):
            node, port = companion_node(Path(tempfile.mkdtemp(prefix="b70bench-")), repo, label, args.interval)
            nodes.append((node, port))
            if node.cli("switch", "alpha", "--yes").returncode != 0:
                raise RuntimeError(f"warm-up switch on {label} failed")
        for i in range(args.runs):
            for node, port in nodes:
                rows.append(switch(node, port, "beta" if i % 2 == 0 else "alpha"))
    finally:
        for node, _ in nodes:
            remove_node(node)
    result = {"interval": args.interval, "runs": rows, "summary": {
        label: {k: stats([r[k] for r in rows if r["node"] == label]) for k in ("outage", "start_to_router", "command")}
        | {"db_restarted": sum(r["db_restarted"] for r in rows if r["node"] == label)}
        for label in ("this", "baseline")}}
    print(json.dumps(result["summary"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
