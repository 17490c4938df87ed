"""The GPU lane's hot-standby run (issue 36, deliver 4): `b70deploy switch` and `rollback` with `standby: sleep`
and the door, on a Docker engine, with clients through the door; run by `scripts/gpu_lane.sh standby`.

A node as an operator builds one: a node config (`platform: cuda`, the door, `standby: sleep`) and two stacks
of one model that differ as two revisions do (alpha: max-model-len 4096, `enforce_eager`; beta: 8192, vLLM's
default torch.compile and CUDA graphs). Then, with the tool's own CLI:

  first switch   to alpha on an empty node (the door comes up; nobody waits): its boot, eager
  switch         to beta, measured: alpha sleeps in its slot, beta boots cold beside it (its compile cache,
                 the tool's per-image folder, empty: alpha compiled nothing)
  rollback       measured, `--rollbacks` times: each wakes the sleeping revision and gives it the door

Measured as benchmarks/bench_seconds.py measures (its clients and its outcome: bench_door.py): `--clients`
clients (the `openai` client, streaming chat completions one after another) ask through the door; per
operation the longest wait of a request that overlapped it (command start to 1 s after its end), failed
requests, the engine's own time (the new slot's StartedAt to its "Starting vLLM API server" line; vLLM's
"It took X seconds to wake up"), the command's seconds. After each, the node is asked from outside which
revision serves: `/v1/models` through the door (its `max_model_len`), the slots' containers and labels.
Results: OUT/results-standby.json; each command's output, the slots' logs and the journal beside it.

    python scripts/gpu_lane_standby.py --model DIR --image b70gpu/vllm:0.24.0 --root DIR --out DIR
    python scripts/gpu_lane_standby.py --sim ...   # the same run on the simulator (tests/sim/test_gpu_lane_on_sim.py)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_door import Clients, outcome  # noqa: E402 - benchmarks/ is not a package
from gpu_lane import gpu_mib, gpu_name, log  # noqa: E402
from switch_bench import parse_docker_time, ready_instant, started_instant  # noqa: E402

# what the stacks name, as an operator's would; the node's image_map points it at the lane's image
IMAGE_REF = "vllm/vllm-openai:v0.24.0"
DOOR_IMAGE = "b70deploy/door:caddy-2.11.7"
NAME = "lane"
PROJECT = "b70gl"
FIRST_PORT = 18600


def free_ports(n: int) -> list[int]:
    got: list[int] = []
    port = FIRST_PORT
    while len(got) < n:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                got.append(port)
            except OSError:
                pass
        port += 1
    return got


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120,  # noqa: S603 - argv list
                          check=check)


def write_node(root: Path, model: Path, image: str, sim: bool, eager: bool = False) -> Path:
    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    if not (models / NAME).exists():
        # hard links: the weights appear in the models folder without a copy (same file system)
        shutil.copytree(model, models / NAME, copy_function=os.link)
    prod, dark, probe = free_ports(3)
    first = probe + 1  # the slots' loopback ports after those (ports.standby)
    last = first + 20
    cfg: dict[str, Any] = {
        "project": PROJECT, "platform": "cuda", "gpus": "all", "device_dir": None,
        "deploy_dir": str(root / "deploy"), "state_dir": str(root / "state"), "stacks_dir": str(root / "stacks"),
        "models_dir": str(models), "bind_address": "127.0.0.1",
        "ports": {"prod": prod, "dark": dark, "standby": [first, last]},
        "door": {"enabled": True, "image": DOOR_IMAGE, "probe_port": probe, "hold_seconds": 900},
        "standby": "sleep", "load_threshold": 1000, "companions": [],
        "timeouts": {"health": 540, "rollback": 540},
        "production": {"model_family": "qwen3-0.6b", "aliases": [NAME]},
        "image_map": {IMAGE_REF: image},
    }
    if sim:
        cfg["stack_overlay"] = {"env": {"B70SIM_PLATFORM": "cuda", "B70SIM_VERSION": "0.24.0",
                                        "B70SIM_BOOT_SECONDS": "3", "B70SIM_WAKE_SECONDS": "0.4"}}
    (root / "node.yaml").write_text(yaml.safe_dump(cfg))
    stacks = root / "stacks"
    stacks.mkdir(exist_ok=True)
    alpha = {"description": "the lane's model, eager, 4k context", "image": IMAGE_REF, "entrypoint_style": "vllm-serve",
             "model": {"path": NAME}, "model_family": "qwen3-0.6b", "served_model_names": [NAME],
             "max_model_len": 4096, "enforce_eager": True,
             # FlashInfer's sampler JIT-compiles with nvcc at first use; the lane's bare runs left it off too
             "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
             "smoke": {"aliases": True}}
    beta = {"extends": "alpha", "description": "the next revision: 8k context, "
            + ("eager" if eager else "torch.compile and CUDA graphs"),
            "max_model_len": 8192, "enforce_eager": eager}
    for name, doc in (("alpha", alpha), ("beta", beta)):
        (stacks / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    return root / "node.yaml"


def cli(config: Path, out: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "B70DEPLOY_CONFIG": str(config)}
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "b70deploy.cli", *args], capture_output=True, text=True, env=env,  # noqa: S603
                       timeout=900, check=False, cwd=REPO)
    (out / "standby-cli.txt").open("a").write(f"=== {name} at {time.strftime('%H:%M:%S', time.gmtime(t0))}Z "
                                              f"({time.time() - t0:.1f} s): b70deploy {' '.join(args)}\n"
                                              f"exit {r.returncode}\n{r.stdout}\n{r.stderr}\n")
    return r


def slots() -> dict[str, dict[str, str]]:
    """container id -> its compose project, state and b70deploy labels, of the node's vllm slots."""
    rows = docker("ps", "-a", "--no-trunc", "--filter", "label=b70deploy.role=vllm", "--format",
                  '{{.ID}}\t{{.Label "com.docker.compose.project"}}\t{{.State}}\t{{.Labels}}').stdout.splitlines()
    got = {}
    for row in rows:
        cid, project, state, labels = [*row.split("\t"), "", "", ""][:4]
        if project.startswith(f"{PROJECT}-r"):
            got[cid] = {"project": project, "state": state,
                        "labels": {k: v for k, _, v in (kv.partition("=") for kv in labels.split(","))
                                   if k.startswith("b70deploy.")}}
    return got


def serving(port: int) -> dict[str, Any]:
    """What the node serves, asked from outside: /v1/models through the door, and the slots' containers."""
    got: dict[str, Any] = {"slots": slots()}
    try:
        r = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=30)
        got["models"] = [{"id": m.get("id"), "max_model_len": m.get("max_model_len")} for m in r.json()["data"]]
    except (requests.RequestException, ValueError, KeyError) as e:
        got["models"] = f"no answer: {e}"
    return got


def woke_seconds(cids: list[str]) -> float | None:
    """vLLM's own "It took X seconds to wake up", the last one in the slots' logs."""
    import re

    found: list[tuple[float, float]] = []
    for cid in cids:
        got = docker("logs", "--timestamps", "--tail", "300", cid, check=False)
        for line in (got.stdout + got.stderr).splitlines():
            m = re.search(r"It took ([0-9.]+) seconds to wake up", line)
            if m:
                found.append((parse_docker_time(line.split(" ", 1)[0]), float(m.group(1))))
    return max(found)[1] if found else None


def measure(config: Path, out: Path, op: str, args: list[str], port: int, clients: int) -> dict[str, Any]:
    """bench_seconds.measure's way: the clients answered once each, the command, one more second."""
    before = set(slots())
    with Clients(port, n=clients, max_seconds=1200, model=NAME) as c:
        deadline = time.monotonic() + 120
        while sum(ok for _, _, ok, _ in c.answers) < clients and time.monotonic() < deadline:
            time.sleep(0.05)
        start = time.time()
        mib_before = gpu_mib()
        r = cli(config, out, op, *args)
        end = time.time()
        time.sleep(1.0)
    if not any(ok for _, _, ok, _ in c.answers):  # no answers would read as no wait
        raise RuntimeError(f"{op}: the clients had no answer at all: {c.answers[:3]}")
    seen = outcome(c.answers, start, end + 1.0)
    usual = sorted(e - s for s, e, ok, _ in c.answers if ok and e < start)
    got: dict[str, Any] = {"operation": op, "argv": args, "exit": r.returncode, **seen,
                           "usual_s": round(usual[len(usual) // 2], 3) if usual else None,
                           "command_s": round(end - start, 3), "gpu_mib_before": mib_before, "gpu_mib_after": gpu_mib(),
                           "answered_before": sum(ok for _, e, ok, _ in c.answers if e < start)}
    got["beyond_usual_s"] = round(seen["longest_wait_s"] - (got["usual_s"] or 0.0), 3)
    new = [cid for cid in slots() if cid not in before]
    if op.startswith("switch") and new:
        got["engine_s"] = round(ready_instant(new[0]) - started_instant(new[0]), 3)
        got["engine_is"] = "the new slot's boot: its StartedAt to its 'Starting vLLM API server' line"
    elif op.startswith("rollback"):
        got["engine_s"] = woke_seconds(list(slots()))
        got["engine_is"] = "vLLM's own 'It took X seconds to wake up' in the woken slot's log"
    if got.get("engine_s") is not None:
        got["beyond_engine_s"] = round(seen["longest_wait_s"] - got["engine_s"], 3)
    got["after"] = serving(port)
    log(f"{op}: exit {r.returncode}, longest wait {seen['longest_wait_s']} s, engine {got.get('engine_s')} s, "
        f"failed {seen['failed']} of {seen['requests']}; serving {got['after'].get('models')}")
    return got


def compile_cache(root: Path) -> list[str]:
    """The torch.compile cache folders in the tool's per-image cache (docs/warm-boots.md)."""
    return sorted(str(p.relative_to(root)) for p in (root / "state").glob("caches/*/vllm/torch_compile_cache/*"))


def run(a: argparse.Namespace) -> dict[str, Any]:
    root: Path = a.root
    config = write_node(root, a.model, a.image, a.sim, a.eager)
    port = int(yaml.safe_load(config.read_text())["ports"]["prod"])
    res: dict[str, Any] = {
        "gpu": gpu_name(), "image": a.image, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "engine": docker("version", "--format", "{{.Server.Version}}").stdout.strip(),
        "compose": docker("compose", "version", "--short").stdout.strip(),
        "clients": a.clients, "node": yaml.safe_load(config.read_text()),
        "stacks": {p.stem: yaml.safe_load(p.read_text()) for p in sorted((root / "stacks").glob("*.yaml"))}}
    t0 = time.time()
    r = cli(config, a.out, "first switch", "switch", "alpha", "--yes")
    first = {"exit": r.returncode, "command_s": round(time.time() - t0, 3), "after": serving(port)}
    boxes = list(slots())
    if r.returncode == 0 and boxes:
        first["engine_s"] = round(ready_instant(boxes[0]) - started_instant(boxes[0]), 3)
    res["first_switch"] = first
    log(f"first switch: {first}")
    if r.returncode != 0:
        raise RuntimeError(f"the first switch failed:\n{r.stdout}\n{r.stderr}")
    res["compile_cache_before_switch"] = compile_cache(root)
    res["switch"] = measure(config, a.out, "switch", ["switch", "beta", "--yes"], port, a.clients)
    res["compile_cache_after_switch"] = compile_cache(root)
    res["rollbacks"] = [measure(config, a.out, f"rollback {i + 1}", ["rollback", "--yes"], port, a.clients)
                        for i in range(a.rollbacks)]
    res["status"] = json.loads(cli(config, a.out, "status", "status", "--json").stdout or "{}")
    return res


def keep_logs(out: Path) -> None:
    for cid, slot in slots().items():
        got = docker("logs", "--timestamps", cid, check=False)
        (out / f"slot-{slot['project']}.log").write_text(got.stdout + got.stderr)
    door = docker("ps", "-aq", "--filter", "label=b70deploy.role=door", check=False).stdout.split()
    for cid in door[:1]:
        got = docker("logs", "--tail", "400", cid, check=False)
        (out / "door.log").write_text(got.stdout + got.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--image", required=True, help="the lane's vLLM image (gpu_lane.sh engine imports it)")
    p.add_argument("--root", type=Path, required=True, help="the node's folders (config, stacks, state, deploy)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rollbacks", type=int, default=2)
    p.add_argument("--eager", action="store_true",
                   help="beta eager too: its cold boot without torch.compile and CUDA graphs (a shorter device call)")
    p.add_argument("--sim", action="store_true", help="the stacks run the simulator as vLLM 0.24.0 on CUDA")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    try:
        res = run(a)
    finally:
        keep_logs(a.out)
        journal = a.root / "state" / "journal.jsonl"
        if journal.exists():
            shutil.copy(journal, a.out / "journal.jsonl")
    (a.out / "results-standby.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    log(f"wrote {a.out / 'results-standby.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
