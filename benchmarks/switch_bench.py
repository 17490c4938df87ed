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
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from b70deploy.deploy import interrupts
from b70deploy.docker.compose import Compose
from b70deploy.docker.keep import REPO as KEEP_REPO
from b70deploy.docker.keep import is_keep_tag
from b70deploy.sim.image import TAGS as SIM_TAGS

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


def remove_keep_tags(project: str) -> None:
    """The keep tags b70deploy gave this run's revisions (b70deploy/docker/keep.py)."""
    refs = [ref for ref in docker("images", "--format", "{{.Repository}}:{{.Tag}}", KEEP_REPO).stdout.split()
            if is_keep_tag(project, ref)]
    if refs:
        docker("rmi", *refs, check=False)


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


def stats(values: Sequence[float | None]) -> dict[str, float | int]:
    got = [v for v in values if v is not None]
    if not got:
        return {"n": 0, "of": len(values)}
    return {"n": len(got), "of": len(values), "min": min(got), "median": statistics.median(got), "max": max(got)}


class Prober:
    """Finds the instant /health first answers 200 from the host, by asking every `every` seconds.

    `gate` holds the probing back (b70deploy's verify step must see an idle prod port); the
    instant recorded is when the first successful request was sent, so it is late by at most
    `every` plus one connect. Both sides get the same prober, so its small load is shared.
    """

    def __init__(self, port: int, *, every: float = 0.02, gate: Callable[[], bool] | None = None) -> None:
        self.port, self.every, self.gate = port, every, gate
        self.ready: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _ok(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                return s.recv(64).startswith((b"HTTP/1.0 200", b"HTTP/1.1 200"))
        except OSError:
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.gate is None or self.gate():
                sent = time.time()
                if self._ok():
                    self.ready = sent
                    return
            self._stop.wait(self.every)


# ---------------------------------------------------------------- the throwaway node


SETTLE = 0.5  # the bench stacks' settle window: a switch stays healthy this long before it commits


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
            docker("tag", SIM_TAGS[variant], tag)
        write_models(self.root / "models")
        self.write_stacks()
        cfg = {
            "project": self.project, "deploy_dir": str(self.root / "deploy"), "state_dir": str(self.state),
            "stacks_dir": str(self.root / "stacks"), "models_dir": str(self.root / "models"), "device_dir": None,
            "bind_address": "127.0.0.1", "ports": {"prod": free_port(), "dark": free_port()},
            "load_threshold": 1000, "image_map": {"intel/vllm:latest": self.tags["bash-c"]},
            "stack_overlay": {"env": {"B70SIM_BOOT_SECONDS": f"{self.boot:g}"}, "settle_seconds": SETTLE},
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
                 "model_family": "qwen3-30b-a3b",
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

    @property
    def prod_port(self) -> int:
        return int(yaml.safe_load(self.config.read_text())["ports"]["prod"])

    def switch(self, stack: str, *, probe: bool = False) -> tuple[subprocess.CompletedProcess[str], float, float,
                                                                    float | None]:
        """Run `b70deploy switch STACK --yes`: result, start (epoch), wall seconds, first 200 (epoch) if probed."""
        env = {**os.environ, "PYTHONPATH": str(REPO), "B70DEPLOY_CONFIG": str(self.config)}
        env.pop("B70DEPLOY_FAULT", None)
        journal = self.state / "journal.jsonl"
        offset = journal.stat().st_size if journal.exists() else 0

        def activated() -> bool:  # probe only once this run has started `compose up`
            with journal.open("rb") as fh:
                fh.seek(offset)
                return b'"step": "activate"' in fh.read()

        with Prober(self.prod_port, gate=activated) if probe else contextlib.nullcontext() as prober:
            t_epoch, t0 = time.time(), time.monotonic()
            r = subprocess.run([sys.executable, "-m", "b70deploy.cli", "switch", stack, "--yes"], capture_output=True,
                               text=True, env=env, timeout=300, check=False)
            wall = time.monotonic() - t0
        return r, t_epoch, wall, prober.ready if prober is not None else None

    def latest_revision(self) -> Path:
        return sorted((self.state / "revisions").glob("[0-9]*"))[-1]

    def compose_side(self, key: str, revision: Path, check: dict[str, Any] | None) -> ComposeSide:
        """The files b70deploy rendered for a revision, on their own project and port, plus a healthcheck."""
        folder = self.root / f"compose-{key}"
        shutil.copytree(revision / "files", folder)
        doc = yaml.safe_load((folder / "docker-compose.yml").read_text())
        doc["name"] = f"{self.project}-{key}"
        vllm = dict(doc["services"]["vllm"])  # same image, command, env, mounts and restart policy
        if check is not None:
            vllm["healthcheck"] = check
        doc["services"] = {"vllm": vllm}
        (folder / "docker-compose.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        port = free_port()
        env_lines = (folder / ".env").read_text().splitlines()
        (folder / ".env").write_text("\n".join(f"VLLM_PORT='{port}'" if ln.startswith("VLLM_PORT=") else ln
                                               for ln in env_lines) + "\n")
        side = ComposeSide(folder, doc["name"], port)
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
        for proj in self.projects:
            with contextlib.suppress(Exception):
                remove_keep_tags(proj)
        if self.tags:
            with contextlib.suppress(Exception):
                docker("rmi", *self.tags.values(), check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class ComposeSide:
    folder: Path
    project: str
    port: int

    def argv(self, *args: str) -> list[str]:
        return [*Compose(self.folder, self.project).base(), *args]  # the same `docker compose` line

    def up_wait(self, wait_timeout: float, *, probe: bool = False) -> tuple[subprocess.CompletedProcess[str], float,
                                                                             float, float, float | None]:
        """`up -d --force-recreate --wait`: result, start and return (epoch), wall seconds, first 200 (epoch)."""
        with Prober(self.port) if probe else contextlib.nullcontext() as prober:
            t_epoch, t0 = time.time(), time.monotonic()
            r = subprocess.run(self.argv("up", "-d", "--no-deps", "--pull", "never", "--force-recreate", "--wait",
                                         "--wait-timeout", f"{wait_timeout:.0f}", "vllm"),
                               capture_output=True, text=True, timeout=wait_timeout + 120, check=False)
            t_ret, wall = time.time(), time.monotonic() - t0
            if probe and r.returncode == 0:  # a side that returns before the server listens: keep probing
                deadline = time.monotonic() + 30
                while prober is not None and prober.ready is None and time.monotonic() < deadline:
                    time.sleep(0.05)
        return r, t_epoch, t_ret, wall, prober.ready if prober is not None else None

    def stop(self) -> None:
        subprocess.run(self.argv("stop", "--timeout", "5", "vllm"), capture_output=True, text=True, timeout=120,
                       check=False)


@dataclass(frozen=True)
class SideSpec:
    label: str
    key: str
    check: dict[str, Any] | None


def compose_specs(intervals: Sequence[float], *, none: bool) -> list[SideSpec]:
    """busybox wget against /health inside the container; interval 0 = compose's defaults (30 s, 3 retries)."""
    specs = []
    for i in intervals:
        check: dict[str, Any] = {"test": ["CMD", "wget", "-q", "-O", "/dev/null", HEALTH_URL]}
        if i:
            check |= {"interval": f"{i:g}s", "timeout": "2s", "retries": 3}
        label = f"compose --wait, healthcheck {i:g}s" if i else "compose --wait, healthcheck default (30s)"
        specs.append(SideSpec(label, f"hc{i:g}".replace(".", "p"), check))
    if none:
        specs.append(SideSpec("compose --wait, no healthcheck", "nohc", None))
    return specs


# ---------------------------------------------------------------- the measurements


def measure_switch(b: Bench, stack: str) -> dict[str, Any]:
    r, t_start, wall, probed = b.switch(stack, probe=True)
    if r.returncode != 0:
        raise RuntimeError(f"switch {stack} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    events = journal_run(b.state)
    cid = container_id(b.project)
    logged, started = ready_instant(cid), started_instant(cid)
    ready = probed if probed is not None else logged
    noticed = event_ts(events, "step-done", "wait-healthy")
    # every step as the journal timed it (the revision's "timings" are frozen at commit, before commit and restore)
    breakdown = {"before steps": event_ts(events, "run-start") - t_start,
                 **{str(e["step"]): float(e["seconds"]) for e in events if e["event"] == "step-done"},
                 "after steps": t_start + wall - event_ts(events, "run-ok")}
    return {"stack": stack, "wall": wall, "overhead": wall - b.boot, "boot_measured": ready - started,
            "overhead_vs_measured_boot": wall - (ready - started), "ready_probed": probed is not None,
            "ready_to_noticed": noticed - ready,
            "log_ready_to_noticed": noticed - logged, "breakdown": breakdown}


def measure_compose_ready(side: ComposeSide, wait_timeout: float) -> dict[str, Any]:
    side.stop()  # the previous run's container; b70deploy's drain is inside its own timing, this is not
    r, _, t_ret, wall, probed = side.up_wait(wait_timeout, probe=True)
    if r.returncode != 0:
        raise RuntimeError(f"compose up --wait exited {r.returncode}: {r.stderr.strip()[-500:]}")
    cid = container_id(side.project)
    logged, started = ready_instant(cid), started_instant(cid)
    ready = probed if probed is not None else logged
    return {"wall": wall, "boot_measured": ready - started, "ready_probed": probed is not None,
            "ready_to_noticed": t_ret - ready, "log_ready_to_noticed": t_ret - logged}


def measure_switch_crash(b: Bench) -> dict[str, Any]:
    r, t_start, wall, _ = b.switch("crash")
    if r.returncode != 1:
        raise RuntimeError(f"switch crash exited {r.returncode}, expected 1:\n{r.stdout}\n{r.stderr}")
    events = journal_run(b.state)
    reported = event_ts(events, "step-failed", "wait-healthy")
    crashed = first_crash(b.project, t_start)
    if crashed is None:
        raise RuntimeError("no die event of the crashed container")
    said = next((ln for ln in r.stderr.splitlines() if ln.startswith("diagnosis:")), r.stderr.strip()[-200:])
    return {"wall": wall, "crash_to_reported": reported - crashed, "said": said[:160]}


def measure_compose_crash(side: ComposeSide, wait_timeout: float) -> dict[str, Any]:
    r, t_start, t_ret, wall, _ = side.up_wait(wait_timeout)
    if r.returncode == 0:
        time.sleep(3)  # let the boot crash, so the die event below is seen
    crashed = first_crash(side.project, t_start)
    side.stop()
    if crashed is None:
        raise RuntimeError("no die event of the crashed container")
    said = (r.stderr.strip().splitlines() or [""])[-1] if r.returncode else "(exit 0: reported success)"
    return {"wall": wall, "rc": r.returncode,
            # exit 0 reports success: the crash is never reported, so there is no lag to count
            "crash_to_reported": t_ret - crashed if r.returncode else None,
            "returned_before_crash": t_ret < crashed, "timed_out": r.returncode != 0 and wall >= wait_timeout - 0.5,
            "said": said[:160]}


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
        r, _, cold, _ = b.switch("alpha")
        if r.returncode != 0:
            raise RuntimeError(f"warm-up switch failed:\n{r.stdout}\n{r.stderr}")
        sides = {s.label: b.compose_side(s.key, b.latest_revision(), s.check)
                 for s in compose_specs(args.intervals, none=True)}
        healthy: dict[str, list[dict[str, Any]]] = {"b70deploy switch": [], **{k: [] for k in sides}}
        for i in range(args.runs):
            res = measure_switch(b, "beta" if i % 2 == 0 else "alpha")
            healthy["b70deploy switch"].append(res)
            log(f"(a,b) run {i + 1}/{args.runs} b70deploy switch: wall {res['wall']:.2f} s, "
                f"ready->noticed {res['ready_to_noticed']:.3f} s")
            for name, side in sides.items():
                res = measure_compose_ready(side, args.wait_timeout)
                healthy[name].append(res)
                log(f"(b) run {i + 1}/{args.runs} {name}: ready->noticed {res['ready_to_noticed']:.3f} s")
        for side in sides.values():
            side.stop()
        crash: dict[str, list[dict[str, Any]]] = {"b70deploy switch": []}
        crash_sides: dict[str, ComposeSide] = {}
        for i in range(args.runs):
            res = measure_switch_crash(b)
            crash["b70deploy switch"].append(res)
            log(f"(c) run {i + 1}/{args.runs} b70deploy switch: reported {res['crash_to_reported']:.3f} s after exit")
            if not crash_sides:  # the files b70deploy rendered for the crashing stack
                crash_sides = {s.label: b.compose_side("crash-" + s.key, b.latest_revision(), s.check)
                               for s in compose_specs(args.crash_intervals, none=True)}
                crash |= {k: [] for k in crash_sides}
            for name, side in crash_sides.items():
                res = measure_compose_crash(side, args.crash_wait_timeout)
                crash[name].append(res)
                lag = "never" if res["crash_to_reported"] is None else f"{res['crash_to_reported']:.3f} s"
                log(f"(c) run {i + 1}/{args.runs} {name}: rc {res['rc']}, reported {lag} after exit ({res['said']})")
        return {"machine": machine(), "boot_seconds": args.boot, "runs": args.runs, "cold_first_switch": cold,
                "intervals": args.intervals, "wait_timeout": args.wait_timeout,
                "crash_intervals": args.crash_intervals, "crash_wait_timeout": args.crash_wait_timeout,
                "healthy": healthy, "crash": crash, "summary": summarize(healthy, crash)}
    finally:
        log("cleaning up")
        b.cleanup()


def summarize(healthy: dict[str, list[dict[str, Any]]], crash: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    sw = healthy["b70deploy switch"]
    steps: dict[str, list[float | None]] = {}
    for res in sw:
        for k, v in res["breakdown"].items():
            steps.setdefault(k, []).append(v)
    return {
        "switch": {k: stats([r[k] for r in sw]) for k in ("wall", "overhead", "boot_measured",
                                                           "overhead_vs_measured_boot")},
        "switch_steps": {k: stats(v) for k, v in steps.items()},
        "ready_to_noticed": {name: stats([r["ready_to_noticed"] for r in rows]) for name, rows in healthy.items()},
        "log_ready_to_noticed": {name: stats([r["log_ready_to_noticed"] for r in rows])
                                 for name, rows in healthy.items()},
        "boot_measured": {name: stats([r["boot_measured"] for r in rows]) for name, rows in healthy.items()},
        "all_ready_probed": all(r["ready_probed"] for rows in healthy.values() for r in rows),
        "crash_to_reported": {name: stats([r["crash_to_reported"] for r in rows]) for name, rows in crash.items()},
        "crash_said": {name: sorted({r["said"] for r in rows}) for name, rows in crash.items()},
        "crash_timed_out": {name: sum(bool(r.get("timed_out")) for r in rows) for name, rows in crash.items()},
    }


def fmt(st: dict[str, float | int]) -> str:
    if not st["n"]:
        return f"{'-':>8} {'-':>8} {'-':>8}"
    return f"{st['min']:8.3f} {st['median']:8.3f} {st['max']:8.3f}"


def ratio(a: dict[str, float | int], base: dict[str, float | int]) -> str:
    if not a["n"] or not base["n"] or a["median"] <= 0 or base["median"] <= 0:
        return ""
    return f"{a['median'] / base['median']:8.2f}x"


def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    m = result["machine"]
    w = 46
    out = [f"machine: {m['cpus']} cpus, dockerd {m['dockerd']} ({m['storage_driver']}), compose {m['compose']}, "
           f"python {m['python']}; sim boot delay {result['boot_seconds']:g} s; {result['runs']} runs per side",
           "", f"{'seconds':{w}} {'min':>8} {'median':>8} {'max':>8} {'median vs b70deploy':>20}",
           "(a) b70deploy switch"]
    for k, label in (("wall", "wall time"), ("overhead", "overhead = wall - boot delay"),
                     ("boot_measured", "measured boot (container start -> 200)"),
                     ("overhead_vs_measured_boot", "wall - measured boot")):
        out.append(f"  {label:{w - 2}} {fmt(s['switch'][k])}")
    out.append("  by step (journal; 'before steps' = CLI start, render, lint, lock):")
    for k, st in s["switch_steps"].items():
        out.append(f"    {k:{w - 4}} {fmt(st)}")
    out.append("(b) server ready (first /health 200 from the host) -> noticed")
    base = s["ready_to_noticed"]["b70deploy switch"]
    for name, st in s["ready_to_noticed"].items():
        out.append(f"  {name:{w - 2}} {fmt(st)} {ratio(st, base) if name != 'b70deploy switch' else '':>20}")
    out.append("  (negative: returned before the server was ready)")
    out.append("(c) container crash (die event) -> failure reported")
    base = s["crash_to_reported"]["b70deploy switch"]
    for name, st in s["crash_to_reported"].items():
        note = "" if st["n"] == st["of"] else f"   reported in {st['n']} of {st['of']}"
        rat = ratio(st, base) if name != "b70deploy switch" else ""
        out.append(f"  {name:{w - 2}} {fmt(st)} {rat:>20}{note}")
    out.append("what each side said on the crash:")
    for name, said in s["crash_said"].items():
        out += [f"  {name}: {text}" for text in said]
    return "\n".join(out)


def report(run: Callable[[argparse.Namespace], dict[str, Any]], table: Callable[[dict[str, Any]], str],
           args: argparse.Namespace) -> int:
    """A benchmark's ending: run it (Ctrl-C and SIGTERM end it with everything created removed:
    exit 130), print its table, write every run to --json."""
    try:
        with interrupts.installed():
            result = run(args)
    except KeyboardInterrupt:
        log("interrupted; everything created was removed")
        return 130
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        log(f"wrote {args.json}")
    return 0


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=5, help="runs per side and metric (default 5)")
    p.add_argument("--boot", type=float, default=2.0, help="sim boot delay, B70SIM_BOOT_SECONDS (default 2)")
    p.add_argument("--intervals", type=floats, default=[1.0, 0.0],
                   help="compose healthcheck intervals for (b), 0 = compose's default of 30 s (default 1,0)")
    p.add_argument("--wait-timeout", type=float, default=90, help="compose --wait-timeout for (b)")
    p.add_argument("--crash-intervals", type=floats, default=[1.0, 0.0],
                   help="compose healthcheck intervals for (c) (default 1,0)")
    p.add_argument("--crash-wait-timeout", type=float, default=30,
                   help="compose --wait-timeout for (c): how long compose may take to report the crash")
    p.add_argument("--json", type=Path, help="write every run and the summary here")
    return report(run, table, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
