"""How fast `b70deploy switch` notices a ready or a crashed vLLM, next to `docker compose up --wait`.

Runs on the sim image against the real Docker engine, in one process, and measures (issue 4):

  (a) switch overhead: wall time of `b70deploy switch STACK --yes` minus the sim's boot delay,
      broken down by the step timings the revision records;
  (b) ready -> noticed: from the instant the server starts listening (the container log's own
      timestamp of the "Starting vLLM ... server on http://" line, written right after bind)
      to the instant the deployer knows: the journal's `step-done` of wait-healthy for b70deploy,
      the return of `docker compose up -d --wait` (compose healthcheck) for compose;
  (c) crash -> reported: from the container's first `die` event (exit code 1, docker events)
      to the journal's `step-failed` of wait-healthy, or to `docker compose up --wait` returning.

The sides alternate (b70deploy, compose, compose, b70deploy, ...) so drift on the machine hits
all of them alike. Everything it creates (temp dirs, compose projects and their networks, image
tags) carries a random suffix and is removed in a `finally`, also on Ctrl-C or SIGTERM.

    python benchmarks/switch_bench.py --runs 5 --boot 2 --json /tmp/switch_bench.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
READY_MARK = "Starting vLLM"  # "Starting vLLM server on http://..." / "Starting vLLM API server 0 on http://..."
HEALTH_URL = "http://127.0.0.1:8000/health"  # inside the container


# ---------------------------------------------------------------- small helpers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


def parse_docker_time(text: str) -> float:
    """RFC 3339 with nanoseconds in UTC (docker logs/inspect) -> epoch seconds."""
    text = text.strip().rstrip("Z")
    whole, _, frac = text.partition(".")
    base = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def container_id(project: str, service: str = "vllm") -> str:
    ids = docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={project}",
                 "--filter", f"label=com.docker.compose.service={service}").stdout.split()
    if len(ids) != 1:
        raise RuntimeError(f"expected one {service} container in {project}, found {ids}")
    return ids[0]


def ready_instant(cid: str) -> float:
    """When the server started listening, by the engine's own log timestamp."""
    out = docker("logs", "--timestamps", cid)
    for line in (out.stdout + out.stderr).splitlines():
        stamp, _, text = line.partition(" ")
        if READY_MARK in text and " on http://" in text:
            return parse_docker_time(stamp)
    raise RuntimeError(f"no '{READY_MARK}' line in the log of {cid}")


def started_instant(cid: str) -> float:
    return parse_docker_time(docker("inspect", "-f", "{{.State.StartedAt}}", cid).stdout)


def first_crash(project: str, since: float) -> float | None:
    """Epoch of the first `die` of a container of `project` with a crash exit code after `since`."""
    out = docker("events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}",
                 "--filter", f"label=com.docker.compose.project={project}", "--filter", "event=die",
                 "--format", "{{.TimeNano}} {{.Actor.Attributes.exitCode}}").stdout.split("\n")
    dies = [int(t) / 1e9 for t, code in (ln.split() for ln in out if ln.strip()) if code not in ("0", "137", "143")]
    return min(dies) if dies else None


def journal_run(state: Path) -> list[dict[str, Any]]:
    """The events of the last run in the journal."""
    events = [json.loads(ln) for ln in (state / "journal.jsonl").read_text().splitlines() if ln.strip()]
    starts = [i for i, e in enumerate(events) if e["event"] == "run-start"]
    return events[starts[-1]:] if starts else []


def event_ts(events: Sequence[dict[str, Any]], event: str, step: str | None = None) -> float:
    for e in events:
        if e["event"] == event and (step is None or e.get("step") == step):
            return float(e["ts"])
    raise RuntimeError(f"no {event} {step or ''} in the journal run")


def stats(values: Sequence[float]) -> dict[str, float | int]:
    return {"n": len(values), "min": min(values), "median": statistics.median(values), "max": max(values)}


# ---------------------------------------------------------------- the throwaway node


@dataclass
class Bench:
    root: Path
    suffix: str
    boot: float
    tags: dict[str, str] = field(default_factory=dict)
    projects: list[str] = field(default_factory=list)

    @property
    def project(self) -> str:
        return f"b70bench-{self.suffix}"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def config(self) -> Path:
        return self.root / "node.yaml"

    def setup(self) -> None:
        sys.path.insert(0, str(REPO))  # measure the tree this script lives in
        from b70deploy.sim.box import write_models
        from b70deploy.sim.image import build

        build()  # skips when the sim image is up to date
        self.projects = [self.project, f"{self.project}-dark"]
        self.tags = {"bash-c": f"b70bench-{self.suffix}/vllm:bash-c"}
        for variant, tag in self.tags.items():
            docker("tag", f"b70sim/vllm:{variant}", tag)
        write_models(self.root / "models")
        self.write_stacks()
        cfg = {
            "project": self.project, "deploy_dir": str(self.root / "deploy"), "state_dir": str(self.state),
            "stacks_dir": str(self.root / "stacks"), "models_dir": str(self.root / "models"), "device_dir": None,
            "bind_address": "127.0.0.1", "ports": {"prod": free_port(), "dark": free_port()},
            "load_threshold": 1000, "image_map": {"intel/vllm:latest": self.tags["bash-c"]},
            "stack_overlay": {"env": {"B70SIM_BOOT_SECONDS": f"{self.boot:g}"}},
            # timeouts: the defaults (poll_interval 2 s) except a bound on health, so a stuck run ends
            "timeouts": {"health": 60, "rollback": 60},
            "companions": [{"name": "webui", "image": self.tags["bash-c"], "command": ["sim-webui", "--port", "8080"]}],
        }
        self.config.write_text(yaml.safe_dump(cfg))

    def write_stacks(self) -> None:
        folder = self.root / "stacks"
        folder.mkdir(parents=True)
        alpha = {"image": "intel/vllm:latest", "entrypoint_style": "bash-c",
                 "model": {"path": "Qwen/Qwen3-30B-A3B-W4A16", "quantization": "compressed-tensors"},
                 "served_model_names": ["qwen3-30b-a3b-w4a16"], "dtype": "float16", "max_model_len": 131072,
                 "kv_cache_dtype": "fp8", "tool_calling": {"parser": "hermes", "auto_tool_choice": True},
                 "patches": ["marlin-xpu-carveout"],
                 "expect": {"attention_backend": "FLASH_ATTN", "kv_cache_dtype": "fp8", "min_kv_tokens": 270000},
                 "smoke": {"completion": {"prompt": "The capital of France is", "expect": "Paris", "max_tokens": 4},
                           "tool_call": True, "aliases": True}}
        docs = {"alpha": alpha, "beta": {"extends": "alpha", "max_model_len": 262144},
                "crash": {"extends": "alpha", "env": {"B70SIM_FAIL": "marlin"}}}
        for name, doc in docs.items():
            (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc))

    def switch(self, stack: str) -> tuple[subprocess.CompletedProcess[str], float, float]:
        """Run `b70deploy switch STACK --yes`; returns the result, its start (epoch) and wall seconds."""
        env = {**os.environ, "PYTHONPATH": str(REPO), "B70DEPLOY_CONFIG": str(self.config)}
        env.pop("B70DEPLOY_FAULT", None)
        t_epoch, t0 = time.time(), time.monotonic()
        r = subprocess.run([sys.executable, "-m", "b70deploy.cli", "switch", stack, "--yes"], capture_output=True,
                           text=True, env=env, timeout=300, check=False)
        return r, t_epoch, time.monotonic() - t0

    def latest_revision(self) -> Path:
        return sorted((self.state / "revisions").glob("[0-9]*"))[-1]

    def compose_side(self, name: str, revision: Path, healthcheck: dict[str, Any]) -> ComposeSide:
        """The files b70deploy rendered for a revision, on their own project and port, plus a healthcheck."""
        folder = self.root / f"compose-{name}"
        shutil.copytree(revision / "files", folder)
        doc = yaml.safe_load((folder / "docker-compose.yml").read_text())
        doc["name"] = f"{self.project}-{name}"
        doc["services"] = {"vllm": {**doc["services"]["vllm"], "healthcheck": healthcheck}}
        (folder / "docker-compose.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        env_lines = (folder / ".env").read_text().splitlines()
        port = free_port()
        (folder / ".env").write_text("\n".join(f"VLLM_PORT='{port}'" if ln.startswith("VLLM_PORT=") else ln
                                               for ln in env_lines) + "\n")
        side = ComposeSide(folder, doc["name"])
        self.projects.append(side.project)
        return side

    def cleanup(self) -> None:
        for proj in self.projects:
            with contextlib.suppress(Exception):
                ids = docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={proj}").stdout.split()
                if ids:
                    docker("rm", "-f", *ids, check=False)
                nets = docker("network", "ls", "-q", "--filter",
                              f"label=com.docker.compose.project={proj}").stdout.split()
                if nets:
                    docker("network", "rm", *nets, check=False)
        if self.tags:
            with contextlib.suppress(Exception):
                docker("rmi", *self.tags.values(), check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class ComposeSide:
    folder: Path
    project: str

    def argv(self, *args: str) -> list[str]:
        return ["docker", "compose", "--project-directory", str(self.folder), "-f",
                str(self.folder / "docker-compose.yml"), "-p", self.project, "--profile", "gpu", *args]

    def up_wait(self, wait_timeout: float) -> tuple[subprocess.CompletedProcess[str], float, float, float]:
        """`up -d --force-recreate --wait`; returns the result, start (epoch), return (epoch), wall seconds."""
        t_epoch, t0 = time.time(), time.monotonic()
        r = subprocess.run(self.argv("up", "-d", "--no-deps", "--pull", "never", "--force-recreate", "--wait",
                                     "--wait-timeout", f"{wait_timeout:.0f}", "vllm"),
                           capture_output=True, text=True, timeout=wait_timeout + 120, check=False)
        t_ret = time.time()
        return r, t_epoch, t_ret, time.monotonic() - t0

    def stop(self) -> None:
        subprocess.run(self.argv("stop", "--timeout", "5", "vllm"), capture_output=True, text=True, timeout=120,
                       check=False)


def healthcheck(interval: float | None) -> dict[str, Any]:
    """busybox wget against /health inside the container; interval None = compose's defaults (30 s)."""
    check: dict[str, Any] = {"test": ["CMD", "wget", "-q", "-O", "/dev/null", HEALTH_URL]}
    if interval is not None:
        check |= {"interval": f"{interval:g}s", "timeout": "2s", "retries": 3}
    return check


# ---------------------------------------------------------------- the measurements


def measure_switch(b: Bench, stack: str) -> dict[str, Any]:
    r, t_start, wall = b.switch(stack)
    if r.returncode != 0:
        raise RuntimeError(f"switch {stack} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    t_end = t_start + wall
    events = journal_run(b.state)
    status = json.loads((b.latest_revision() / "status.json").read_text())
    cid = container_id(b.project)
    ready, started = ready_instant(cid), started_instant(cid)
    noticed = event_ts(events, "step-done", "wait-healthy")
    probe_200 = event_ts(events, "step-start", "wait-healthy") + float(status["facts"]["time_to_healthy"])
    breakdown = {"before steps": event_ts(events, "run-start") - t_start,
                 **{k: float(v) for k, v in status["timings"].items()},
                 "after steps": t_end - event_ts(events, "run-ok")}
    return {"stack": stack, "wall": wall, "overhead": wall - b.boot, "boot_measured": ready - started,
            "overhead_vs_measured_boot": wall - (ready - started), "ready_to_noticed": noticed - ready,
            "ready_to_probe_200": probe_200 - ready, "breakdown": breakdown}


def measure_compose_ready(side: ComposeSide, wait_timeout: float) -> dict[str, Any]:
    side.stop()  # the previous run's container; b70deploy's drain is inside its own timing, this is not
    r, _, t_ret, wall = side.up_wait(wait_timeout)
    if r.returncode != 0:
        raise RuntimeError(f"compose up --wait exited {r.returncode}: {r.stderr.strip()[-500:]}")
    cid = container_id(side.project)
    ready, started = ready_instant(cid), started_instant(cid)
    return {"wall": wall, "boot_measured": ready - started, "ready_to_noticed": t_ret - ready}


def measure_switch_crash(b: Bench) -> dict[str, Any]:
    r, t_start, wall = b.switch("crash")
    if r.returncode != 1:
        raise RuntimeError(f"switch crash exited {r.returncode}, expected 1:\n{r.stdout}\n{r.stderr}")
    events = journal_run(b.state)
    reported = event_ts(events, "step-failed", "wait-healthy")
    crashed = first_crash(b.project, t_start)
    if crashed is None:
        raise RuntimeError("no die event of the crashed container")
    said = next((ln for ln in r.stderr.splitlines() if ln.strip()), "")
    return {"wall": wall, "crash_to_reported": reported - crashed, "said": said[:200]}


def measure_compose_crash(side: ComposeSide, wait_timeout: float) -> dict[str, Any]:
    r, t_start, t_ret, wall = side.up_wait(wait_timeout)
    crashed = first_crash(side.project, t_start)
    side.stop()
    if crashed is None:
        raise RuntimeError("no die event of the crashed container")
    said = (r.stderr.strip().splitlines() or [""])[-1]
    timed_out = r.returncode != 0 and wall >= wait_timeout - 0.5
    return {"wall": wall, "rc": r.returncode, "crash_to_reported": t_ret - crashed, "timed_out": timed_out,
            "said": said[:200]}


# ---------------------------------------------------------------- the run


def machine() -> dict[str, Any]:
    info = docker("info", "--format", "{{.ServerVersion}} {{.Driver}}", check=False).stdout.split()
    compose = docker("compose", "version", "--short", check=False).stdout.strip()
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "dockerd": info[0] if info else "?", "storage_driver": info[1] if len(info) > 1 else "?",
            "compose": compose}


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    b = Bench(Path(tempfile.mkdtemp(prefix="b70bench-")), uuid.uuid4().hex[:8], args.boot)
    try:
        b.setup()
        log(f"node {b.project} in {b.root}; warm-up switch (not counted)")
        r, _, cold = b.switch("alpha")
        if r.returncode != 0:
            raise RuntimeError(f"warm-up switch failed:\n{r.stdout}\n{r.stderr}")
        sides = {f"compose {i:g}s" if i else "compose default (30s)":
                 b.compose_side(f"hc{i:g}".replace(".", "p"), b.latest_revision(), healthcheck(i or None))
                 for i in args.intervals}
        healthy: dict[str, list[dict[str, Any]]] = {"b70deploy": [], **{k: [] for k in sides}}
        for i in range(args.runs):
            res = measure_switch(b, "beta" if i % 2 == 0 else "alpha")
            healthy["b70deploy"].append(res)
            log(f"run {i + 1}/{args.runs} b70deploy switch: wall {res['wall']:.2f} s, "
                f"ready->noticed {res['ready_to_noticed']:.3f} s")
            for name, side in sides.items():
                res = measure_compose_ready(side, args.wait_timeout)
                healthy[name].append(res)
                log(f"run {i + 1}/{args.runs} {name}: ready->noticed {res['ready_to_noticed']:.3f} s")
        for side in sides.values():
            side.stop()
        crash: dict[str, list[dict[str, Any]]] = {"b70deploy": [], f"compose {args.crash_interval:g}s": []}
        crash_side: ComposeSide | None = None
        for i in range(args.runs):
            res = measure_switch_crash(b)
            crash["b70deploy"].append(res)
            log(f"run {i + 1}/{args.runs} b70deploy crash: reported {res['crash_to_reported']:.3f} s after exit")
            if crash_side is None:  # the files b70deploy rendered for the crashing stack
                crash_side = b.compose_side("crash", b.latest_revision(), healthcheck(args.crash_interval))
            res = measure_compose_crash(crash_side, args.crash_wait_timeout)
            crash[f"compose {args.crash_interval:g}s"].append(res)
            log(f"run {i + 1}/{args.runs} compose crash: rc {res['rc']} after {res['crash_to_reported']:.3f} s "
                f"({res['said']})")
        return {"machine": machine(), "boot_seconds": args.boot, "runs": args.runs, "cold_first_switch": cold,
                "intervals": args.intervals, "wait_timeout": args.wait_timeout,
                "crash_interval": args.crash_interval, "crash_wait_timeout": args.crash_wait_timeout,
                "healthy": healthy, "crash": crash, "summary": summarize(healthy, crash)}
    finally:
        log("cleaning up")
        b.cleanup()


def summarize(healthy: dict[str, list[dict[str, Any]]], crash: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    sw = healthy["b70deploy"]
    steps: dict[str, list[float]] = {}
    for res in sw:
        for k, v in res["breakdown"].items():
            steps.setdefault(k, []).append(v)
    out: dict[str, Any] = {
        "switch": {k: stats([r[k] for r in sw]) for k in ("wall", "overhead", "boot_measured",
                                                           "overhead_vs_measured_boot")},
        "switch_steps": {k: stats(v) for k, v in steps.items()},
        "ready_to_noticed": {name: stats([r["ready_to_noticed"] for r in rows]) for name, rows in healthy.items()},
        "ready_to_probe_200": stats([r["ready_to_probe_200"] for r in sw]),
        "boot_measured": {name: stats([r["boot_measured"] for r in rows]) for name, rows in healthy.items()},
        "crash_to_reported": {name: stats([r["crash_to_reported"] for r in rows]) for name, rows in crash.items()},
        "crash_said": {name: sorted({r["said"] for r in rows}) for name, rows in crash.items()},
        "crash_timed_out": {name: sum(bool(r.get("timed_out")) for r in rows) for name, rows in crash.items()},
    }
    return out


def fmt(st: dict[str, float | int]) -> str:
    return f"{st['min']:7.3f} {st['median']:7.3f} {st['max']:7.3f}"


def ratio(a: dict[str, float | int], b: dict[str, float | int]) -> str:
    return f"{a['median'] / b['median']:.2f}" if b["median"] else "-"


def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    m = result["machine"]
    lines = [f"machine: {m['cpus']} cpus, dockerd {m['dockerd']} ({m['storage_driver']}), compose {m['compose']}, "
             f"python {m['python']}; boot delay {result['boot_seconds']:g} s; {result['runs']} runs per side",
             "", f"{'seconds':44} {'min':>7} {'median':>7} {'max':>7}",
             "(a) b70deploy switch"]
    for k, label in (("wall", "wall time"), ("overhead", "overhead = wall - boot delay"),
                     ("boot_measured", "measured boot (container start -> listening)"),
                     ("overhead_vs_measured_boot", "wall - measured boot")):
        lines.append(f"  {label:42} {fmt(s['switch'][k])}")
    lines.append("  by step:")
    for k, st in s["switch_steps"].items():
        lines.append(f"    {k:40} {fmt(st)}")
    base = s["ready_to_noticed"]["b70deploy"]
    lines.append("(b) server ready -> noticed                                               ratio to b70deploy")
    for name, st in s["ready_to_noticed"].items():
        lines.append(f"  {name:42} {fmt(st)}   {ratio(st, base) if name != 'b70deploy' else ''}")
    lines.append(f"  {'(b70deploy: /health 200 seen)':42} {fmt(s['ready_to_probe_200'])}")
    base = s["crash_to_reported"]["b70deploy"]
    lines.append("(c) container crash -> failure reported")
    for name, st in s["crash_to_reported"].items():
        extra = f"   {ratio(st, base)}" if name != "b70deploy" else ""
        timed = s["crash_timed_out"][name]
        lines.append(f"  {name:42} {fmt(st)}{extra}" + (f"   ({timed} timed out)" if timed else ""))
    for name, said in s["crash_said"].items():
        for text in said:
            lines.append(f"  {name} said: {text}")
    return "\n".join(lines)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=5, help="runs per side and metric (default 5)")
    p.add_argument("--boot", type=float, default=2.0, help="sim boot delay, B70SIM_BOOT_SECONDS (default 2)")
    p.add_argument("--intervals", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 0.0],
                   help="compose healthcheck intervals for (b), 0 = compose's default of 30 s (default 1,0)")
    p.add_argument("--wait-timeout", type=float, default=90, help="compose --wait-timeout for (b)")
    p.add_argument("--crash-interval", type=float, default=1.0, help="compose healthcheck interval for (c)")
    p.add_argument("--crash-wait-timeout", type=float, default=30,
                   help="compose --wait-timeout for (c): how long compose may take to report the crash")
    p.add_argument("--json", type=Path, help="write every run and the summary here")
    args = p.parse_args(argv)
    try:
        with sigterm_as_interrupt():
            result = run(args)
    except KeyboardInterrupt:
        log("interrupted; everything created was removed")
        return 130
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
