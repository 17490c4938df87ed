"""Where the door's first-chunk overhead comes from (issue 37): the door beside variant doors, in
front of one sim node, from a client on the host's loopback and one in a container on the node's
project network (bench_door's two clients, the same `first_chunk`).

One sim node is deployed with the door (bench_door's node, `switch alpha`); beside it, on the same
engine, three variant Caddy containers from the door's own image (Caddy 2.11.7, GOMAXPROCS=1), each
a bare `reverse_proxy` with the door's transport (keep-alive 2 s, `flush_interval: -1`) and none of
its gate, health checks, access log or metrics:

  plain    on the project network, dialing vllm:8000, as the door does: what the door's extras cost
  tuned    `plain` with HTTP/1.1 alone both ways, no compression towards vllm and 64 KiB buffers: the
           2.11 transport's settings that touch a request on a kept connection
  netns    on the project network with a second sim (the node's vllm container's image, argv,
           environment and mounts) in its network namespace (`--network container:`), dialing
           127.0.0.1:8000: the vllm service sharing the door's namespace
  host     on the host's network, listening on a loopback port and on the project network's gateway
           address, dialing the node's vllm by its container address: the host-network door
  host-probe  the same, dialing vllm's loopback probe port instead (an address that stays across a
           switch, through docker-proxy)

Paths, each on a new connection and on a kept one, every path once per round, the order turning
each round: from loopback, the door (the node's port), `host` and `host-probe` (their loopback
ports) and vllm direct (its loopback probe port; docker-proxy on the door's path and the direct
one, not on `host`'s); from the network, the door, `plain`, `tuned`, `host` and `host-probe` (at
the gateway address, as a remote client's packets reach the host) and vllm:8000, and `netns`
beside its own sim (netns:8000). An overhead is the median of a block's paired differences (a
path less its direct one), reported over `--blocks` as their median with min and max.

    python benchmarks/door_variants.py --blocks 5 --rounds 60 --json benchmarks/results/door-variants.json
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_door import Inside, Node, first_chunk, load, make_node, network_of
from switch_bench import container_id, docker, free_port, log, machine, report, stats

from b70deploy.render.door import DOOR_PORT, KEEP_ALIVE_IDLE
from b70deploy.render.vllm_args import CONTAINER_PORT

# The 2.11 transport's and server's settings that touch a request on a kept connection: HTTP/1.1 only
# both ways (no HTTP/2 to offer or detect), no Accept-Encoding added towards vllm, 64 KiB buffers.
TUNED_TRANSPORT = {"versions": ["1.1"], "compression": False, "read_buffer_size": 65536, "write_buffer_size": 65536}
TUNED_SERVER = {"protocols": ["h1"]}


def caddy(listen: list[str], dial: str, *, tuned: bool = False) -> str:
    """A bare reverse proxy with the door's transport (`tuned`: with TUNED_TRANSPORT and TUNED_SERVER)."""
    transport = {"protocol": "http", "keep_alive": {"enabled": True, "idle_timeout": KEEP_ALIVE_IDLE},
                 **(TUNED_TRANSPORT if tuned else {})}
    proxy = {"handler": "reverse_proxy", "upstreams": [{"dial": dial}], "flush_interval": -1, "transport": transport}
    return json.dumps({"admin": {"disabled": True}, "apps": {"http": {"servers": {"variant": {
        "listen": listen, "routes": [{"handle": [proxy]}], "automatic_https": {"disable": True},
        **(TUNED_SERVER if tuned else {})}}}}})


RUN_CONFIG = 'printf "%s" "$CONFIG" > /tmp/variant.json && exec caddy run --config /tmp/variant.json'


class Variants:
    """The variant containers beside one node; `close` removes every one."""

    def __init__(self, node: Node) -> None:
        self.names: list[str] = []
        try:
            self._start(node)
        except BaseException:  # those started before the failure (or Ctrl-C) go too
            self.close()
            raise

    def _start(self, node: Node) -> None:
        project = node.bench.project
        self.network = network_of(node)
        door = json.loads(docker("inspect", container_id(project, "door")).stdout)[0]
        vllm = json.loads(docker("inspect", container_id(project, "vllm")).stdout)[0]
        image = door["Config"]["Image"]
        self.vllm_ip = vllm["NetworkSettings"]["Networks"][self.network]["IPAddress"]
        self.gateway = vllm["NetworkSettings"]["Networks"][self.network]["Gateway"]
        self.host_port = free_port()
        self.caddy(f"{project}-plain", image, ["--network", self.network], caddy([f":{DOOR_PORT}"],
                                                                                 f"vllm:{CONTAINER_PORT}"))
        self.caddy(f"{project}-tuned", image, ["--network", self.network],
                   caddy([f":{DOOR_PORT}"], f"vllm:{CONTAINER_PORT}", tuned=True))
        netns = f"{project}-netns"
        self.names.append(netns)
        docker_env("run", "-d", "--name", netns, "--network", self.network, "-e", "CONFIG", "--entrypoint", "sh",
                   image, "-c", RUN_CONFIG, env={"CONFIG": caddy([f":{DOOR_PORT}"], f"127.0.0.1:{CONTAINER_PORT}")})
        self.sim(f"{project}-netns-vllm", vllm, netns)
        self.wait(netns, DOOR_PORT)
        self.caddy(f"{project}-host", image, ["--network", "host"],
                   caddy([f"127.0.0.1:{self.host_port}", f"{self.gateway}:{self.host_port}"],
                         f"{self.vllm_ip}:{CONTAINER_PORT}"), self.host_port)
        self.probe_port = free_port()
        self.caddy(f"{project}-host-probe", image, ["--network", "host"],
                   caddy([f"127.0.0.1:{self.probe_port}", f"{self.gateway}:{self.probe_port}"],
                         f"127.0.0.1:{node.probe}"), self.probe_port)
        self.netns = netns

    def caddy(self, name: str, image: str, network: list[str], config: str, port: int = DOOR_PORT) -> str:
        """A variant Caddy on `port` (on its loopback too), up once vllm's /health answers through it."""
        self.names.append(name)
        docker_env("run", "-d", "--name", name, *network, "-e", "CONFIG", "--entrypoint", "sh", image, "-c",
                   RUN_CONFIG, env={"CONFIG": config})
        self.wait(name, port)
        return name

    @staticmethod
    def wait(name: str, port: int) -> None:
        deadline = time.monotonic() + 120
        while docker("exec", name, "wget", "-qO-", f"http://127.0.0.1:{port}/health", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing answered /health on port {port} in {name}")
            time.sleep(0.5)

    def sim(self, name: str, vllm: dict[str, Any], netns: str) -> None:
        """A second sim as the node's vllm container runs it, in `netns`'s network namespace."""
        self.names.append(name)
        cfg = vllm["Config"]
        mounts = [f"--mount=type={m['Type']},src={m['Source'] if m['Type'] == 'bind' else m['Name']},"
                  f"dst={m['Destination']}{'' if m.get('RW', True) else ',readonly'}" for m in vllm["Mounts"]]
        env = [f"--env={e}" for e in cfg.get("Env") or []]
        entry = cfg.get("Entrypoint") or []
        docker("run", "-d", "--name", name, f"--network=container:{netns}", *env, *mounts,
               *([f"--entrypoint={entry[0]}"] if entry else []), cfg["Image"], *entry[1:], *(cfg.get("Cmd") or []))
        deadline = time.monotonic() + 120
        while docker("exec", netns, "wget", "-qO-", f"http://127.0.0.1:{CONTAINER_PORT}/health",
                     check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the sim in {netns}'s namespace did not answer /health")
            time.sleep(0.5)

    def close(self) -> None:
        for name in reversed(self.names):
            docker("rm", "-f", name, check=False)


def docker_env(*args: str, env: dict[str, str]) -> None:
    """`docker ARGS` with `env` added to its environment (a config passed by `-e NAME`, no shell string)."""
    subprocess.run(["docker", *args], env={**os.environ, **env}, capture_output=True, text=True, check=True,
                   timeout=120)


# (label, where, target) -> its direct counterpart
PAIRS = {
    "door": ("loopback", "door", "direct"),
    "host": ("loopback", "host", "direct"),
    "host-probe": ("loopback", "host-probe", "direct"),
    "door network": ("network", "door", "direct"),
    "plain network": ("network", "plain", "direct"),
    "tuned network": ("network", "tuned", "direct"),
    "host network": ("network", "host", "direct"),
    "host-probe network": ("network", "host-probe", "direct"),
    "netns network": ("network", "netns", "netns direct"),
}


def block(node: Node, v: Variants, inside: Inside, rounds: int) -> dict[str, Any]:
    addresses = {("loopback", "door"): ("127.0.0.1", node.bench.prod_port),
                 ("loopback", "host"): ("127.0.0.1", v.host_port),
                 ("loopback", "host-probe"): ("127.0.0.1", v.probe_port),
                 ("loopback", "direct"): ("127.0.0.1", node.probe),
                 ("network", "door"): ("door", DOOR_PORT),
                 ("network", "plain"): (v.names[0], DOOR_PORT),
                 ("network", "tuned"): (v.names[1], DOOR_PORT),
                 ("network", "host"): (v.gateway, v.host_port),
                 ("network", "host-probe"): (v.gateway, v.probe_port),
                 ("network", "direct"): ("vllm", CONTAINER_PORT),
                 ("network", "netns"): (v.netns, DOOR_PORT),
                 ("network", "netns direct"): (v.netns, CONTAINER_PORT)}
    paths = [(where, target, conn) for where, target in addresses for conn in ("new", "kept")]
    kept = {addresses[(w, t)]: http.client.HTTPConnection("127.0.0.1", addresses[(w, t)][1], timeout=60)
            for w, t, c in paths if w == "loopback" and c == "kept"}
    got: dict[tuple[str, str, str], list[float]] = {p: [] for p in paths}
    try:
        for i in range(rounds):
            for where, target, conn in paths[i % len(paths):] + paths[:i % len(paths)]:
                host, port = addresses[(where, target)]
                took = (first_chunk(port, kept.get((host, port)) if conn == "kept" else None) if where == "loopback"
                        else inside.first_chunk(host, port, conn))
                got[(where, target, conn)].append(took * 1000)
    finally:
        for c in kept.values():
            c.close()
    out: dict[str, Any] = {}
    for label, (where, target, direct) in PAIRS.items():
        for conn in ("new", "kept"):
            t, d = got[(where, target, conn)], got[(where, direct, conn)]
            out[f"{label} {conn}"] = {"through_ms": stats(t), "direct_ms": stats(d),
                                      "overhead_ms": round(statistics.median(a - b for a, b in zip(t, d, strict=True)),
                                                           3)}
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    node = make_node(Path(tempfile.mkdtemp(prefix="b70door-variants-")), door=True, boot=args.boot, hold=120.0,
                     label="door")
    v: Variants | None = None
    inside: Inside | None = None
    try:
        r = node.cli("switch", "alpha", "--yes")
        if r.returncode != 0:
            raise RuntimeError(f"switch alpha failed:\n{r.stdout}\n{r.stderr}")
        v = Variants(node)
        inside = Inside(node)
        blocks = []
        for i in range(args.blocks):
            got = {"block": i + 1, "load_start": load(), "paths": block(node, v, inside, args.rounds)}
            got["load_end"] = load()
            log(f"block {i + 1}: " + "; ".join(f"{k} {p['overhead_ms']:+.2f}" for k, p in got["paths"].items()))
            blocks.append(got)
        keys = list(blocks[0]["paths"])
        summary = {k: stats([b["paths"][k]["overhead_ms"] for b in blocks]) for k in keys}
        return {"machine": machine(), "rounds": args.rounds, "blocks": blocks, "summary": summary}
    finally:
        if inside is not None:
            inside.close()
        if v is not None:
            v.close()
        with contextlib.suppress(Exception):
            node.bench.cleanup()


def table(result: dict[str, Any]) -> str:
    lines = [f"first-chunk overhead, ms (a path less its direct one, median of {result['rounds']} paired rounds a "
             f"block; over the blocks: median (min to max))"]
    for k, s in result["summary"].items():
        lines.append(f"  {k:<22} {s['median']:+.2f} ({s['min']:+.2f} to {s['max']:+.2f})")
    lines.append("load average at each block's start and end: " + "; ".join(
        f"{b['load_start']} -> {b['load_end']}" for b in result["blocks"]))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--boot", type=float, default=2.0, help="sim boot delay, B70SIM_BOOT_SECONDS (default 2)")
    p.add_argument("--blocks", type=int, default=5, help="blocks of rounds (default 5)")
    p.add_argument("--rounds", type=int, default=60, help="rounds per block, every path once a round (default 60)")
    p.add_argument("--json", type=Path, help="write every block and the summary here")
    return report(run, table, p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
