"""The clients' outage of a switch, b70deploy next to the field report's by-hand procedure (issue 13).

One run on the sim image and the real Docker engine measures, per round and per side:

  outage      a client outside the node POSTs /v1/completions (max_tokens 1) every 50 ms; the
              outage is the longest gap between two answers with status 200 (the last 200
              before the drain -> the first 200 after);
  boot        the new vllm container's own boot: its StartedAt (docker inspect) -> that first 200;
  overhead    the procedure's wall time (the `switch` process; the by-hand commands) minus boot;
  failed      a switch to a stack that crashes at boot (the report's Marlin crash): crash (the
              container's `die` event) -> the old stack's first 200 again, next to that second
              boot (its container's StartedAt -> first 200).

By hand is the report's procedure, scripted with no typing time: `docker compose stop vllm
webui`, the new files in place, `docker compose up -d vllm`, `curl /health` every 5 s until
200, `docker compose up -d webui`; when a poll finds the new container restarting or exited,
the old files go back and the same `up` and polling follow. It runs on its own compose project
and port with the bytes b70deploy rendered (same image id, command, mounts and caches), so both
sides boot the same container. The sides alternate within each round.

A second part measures the warm-boot mechanism: the same stack booted by `switch` with its
image's cache folder removed first (cold) and with the cache its previous boot left (warm), boot
read from the container's own log (StartedAt -> the "Starting vLLM ... server on" line).

Everything made (temp dirs, compose projects, networks, the image tag) is removed in a
`finally`, also on Ctrl-C or SIGTERM.

    python benchmarks/downtime.py --runs 5 --json benchmarks/results/downtime.json
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from switch_bench import (
    SETTLE,
    Bench,
    container_id,
    docker,
    first_crash,
    free_port,
    log,
    machine,
    ready_instant,
    report,
    started_instant,
)

from b70deploy.docker.compose import Compose

MODEL = "qwen3-30b-a3b-w4a16"  # the bench stacks' served name
HAND_POLL = 5.0                # the report's by-hand /health poll


# ---------------------------------------------------------------- the client outside


@dataclass
class Client:
    """POSTs a one-token completion every `every` seconds; keeps (done epoch, ok) per request."""

    port: int
    every: float = 0.05
    answers: list[tuple[float, bool]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Client:
        self._thread = threading.Thread(target=self._run, name="client", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _ask(self) -> bool:
        body = json.dumps({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 1})
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            try:
                conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                return conn.getresponse().status == 200
            finally:
                conn.close()
        except (OSError, http.client.HTTPException):
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            ok = self._ask()
            self.answers.append((time.time(), ok))
            self._stop.wait(self.every)

    def wait_ok(self, timeout: float = 60) -> None:
        """Until the last answer is a 200 (the node serves again after the procedure returned)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.answers and self.answers[-1][1]:
                return
            time.sleep(0.05)
        raise RuntimeError(f"port {self.port} did not answer 200 within {timeout:.0f} s")

    def outage(self) -> tuple[float, float]:
        """(last 200 before, first 200 after) around the longest gap between two 200s."""
        oks = [t for t, ok in self.answers if ok]
        if len(oks) < 2:
            raise RuntimeError("the client saw fewer than two 200s")
        gaps = [(b - a, a, b) for a, b in itertools.pairwise(oks)]
        _gap, before, after = max(gaps)
        return before, after


# ---------------------------------------------------------------- the by-hand side


@dataclass
class Hand:
    """The report's procedure on its own compose project and port, with b70deploy's rendered bytes."""

    folder: Path
    project: str
    port: int

    def argv(self, *args: str) -> list[str]:
        return [*Compose(self.folder, self.project).base(), *args]  # the same `docker compose` line

    def compose(self, *args: str) -> None:
        subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=300, check=True)

    def place(self, revision: Path) -> None:
        """The revision's files, on this side's port."""
        for src in (revision / "files").rglob("*"):
            if src.is_file():
                dst = self.folder / src.relative_to(revision / "files")
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
        env = (self.folder / ".env").read_text().splitlines()
        (self.folder / ".env").write_text("\n".join(f"VLLM_PORT='{self.port}'" if ln.startswith("VLLM_PORT=") else ln
                                                    for ln in env) + "\n")

    def health(self) -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            try:
                conn.request("GET", "/health")
                return conn.getresponse().status == 200
            finally:
                conn.close()
        except (OSError, http.client.HTTPException):
            return False

    def vllm_state(self) -> tuple[str, int]:
        out = docker("inspect", "-f", "{{.State.Status}} {{.RestartCount}}", container_id(self.project)).stdout.split()
        return out[0], int(out[1])

    def poll(self, *, give_up_on_crash: bool) -> bool:
        """/health every 5 s: True when 200; False when the container has crashed (restarting, exited)."""
        while True:
            time.sleep(HAND_POLL)
            if self.health():
                return True
            status, restarts = self.vllm_state()
            if give_up_on_crash and (status != "running" or restarts > 0):
                return False

    def switch(self, revision: Path, *, back_to: Path | None = None) -> float:
        """stop; files; up; poll; (on a crash: old files, up, poll); webui. Returns the wall time."""
        t0 = time.monotonic()
        self.compose("stop", "--timeout", "30", "vllm", "webui")
        self.place(revision)
        self.compose("up", "-d", "--no-deps", "--pull", "never", "vllm")
        if not self.poll(give_up_on_crash=back_to is not None):
            assert back_to is not None
            self.place(back_to)
            self.compose("up", "-d", "--no-deps", "--pull", "never", "vllm")
            self.poll(give_up_on_crash=False)
        self.compose("up", "-d", "--no-deps", "--pull", "never", "webui")
        return time.monotonic() - t0


# ---------------------------------------------------------------- one measurement


def healthy_run(side: str, project: str, port: int, go: Any) -> dict[str, Any]:
    with Client(port) as client:
        time.sleep(0.3)  # a few 200s before the drain
        wall = go()
        client.wait_ok()
        time.sleep(0.2)
    before, after = client.outage()
    started = started_instant(container_id(project))
    boot = after - started
    outage = after - before
    settle = SETTLE if side == "b70deploy" else 0.0  # by hand commits to nothing: no settle window
    return {"side": side, "wall": wall, "outage": outage, "boot": boot, "overhead": wall - boot,
            "outage_minus_boot": outage - boot, "overhead_minus_settle": wall - boot - settle}


def failed_run(side: str, project: str, port: int, go: Any) -> dict[str, Any]:
    t_start = time.time()
    with Client(port) as client:
        time.sleep(0.3)
        wall = go()
        client.wait_ok()
        time.sleep(0.2)
    before, after = client.outage()
    crashed = first_crash(project, t_start)
    if crashed is None:
        raise RuntimeError(f"{side}: no die event of the crashing container")
    second_boot = after - started_instant(container_id(project))
    back = after - crashed
    return {"side": side, "wall": wall, "outage": after - before, "crash_to_serving": back,
            "second_boot": second_boot, "crash_to_serving_minus_second_boot": back - second_boot}


def tool_switch(b: Bench, stack: str, expect_rc: int) -> float:
    r, _t, wall, _p = b.switch(stack)
    if r.returncode != expect_rc:
        raise RuntimeError(f"switch {stack} exited {r.returncode}, expected {expect_rc}:\n{r.stdout}\n{r.stderr}")
    return wall


def revision_of(b: Bench, stack: str) -> Path:
    for d in sorted((b.state / "revisions").glob("[0-9]*"), reverse=True):
        meta = json.loads((d / "meta.json").read_text())
        if meta["stack"] == stack:
            return d
    raise RuntimeError(f"no revision of {stack}")


def set_boot(b: Bench, seconds: float) -> None:
    cfg = yaml.safe_load(b.config.read_text())
    cfg["stack_overlay"]["env"]["B70SIM_BOOT_SECONDS"] = f"{seconds:g}"
    b.config.write_text(yaml.safe_dump(cfg))


def container_boot(project: str) -> float:
    cid = container_id(project)
    return ready_instant(cid) - started_instant(cid)


def compile_seconds(b: Bench) -> float | None:
    latest = sorted((b.state / "revisions").glob("[0-9]*"))[-1]
    facts = json.loads((latest / "status.json").read_text()).get("facts", {})
    value = facts.get("compile_seconds")
    return float(value) if value is not None else None


# ---------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> dict[str, Any]:
    b = Bench(Path(tempfile.mkdtemp(prefix="b70down-")), uuid.uuid4().hex[:8], args.boot)
    hand: Hand | None = None
    try:
        b.setup()
        log(f"node {b.project} in {b.root}; first switches (not counted)")
        tool_switch(b, "alpha", 0)
        tool_switch(b, "beta", 0)
        tool_switch(b, "crash", 1)  # b70deploy renders the crashing stack's files once, for the by-hand side
        tool_switch(b, "alpha", 0)
        revs = {s: revision_of(b, s) for s in ("alpha", "beta", "crash")}
        hand = Hand(b.root / "hand", f"{b.project}-hand", free_port())
        b.projects.append(hand.project)
        hand.place(revs["alpha"])
        hand.compose("up", "-d", "--no-deps", "--pull", "never", "vllm", "webui")
        hand.poll(give_up_on_crash=False)
        rows: list[dict[str, Any]] = []
        hand_on = "alpha"
        for i in range(args.runs):
            target = "beta" if i % 2 == 0 else "alpha"
            res = healthy_run("b70deploy", b.project, b.prod_port, lambda t=target: tool_switch(b, t, 0))
            rows.append({"kind": "switch", **res})
            log(f"run {i + 1}/{args.runs} b70deploy switch {target}: outage {res['outage']:.2f} s, boot "
                f"{res['boot']:.2f} s, overhead {res['overhead']:.2f} s")
            hand_target = "beta" if hand_on == "alpha" else "alpha"
            res = healthy_run("by hand", hand.project, hand.port, lambda t=hand_target: hand.switch(revs[t]))
            hand_on = hand_target
            rows.append({"kind": "switch", **res})
            log(f"run {i + 1}/{args.runs} by hand {hand_target}: outage {res['outage']:.2f} s, boot "
                f"{res['boot']:.2f} s, overhead {res['overhead']:.2f} s")
            res = failed_run("b70deploy", b.project, b.prod_port, lambda: tool_switch(b, "crash", 1))
            rows.append({"kind": "failed", **res})
            log(f"run {i + 1}/{args.runs} b70deploy failed switch: crash->serving {res['crash_to_serving']:.2f} s, "
                f"second boot {res['second_boot']:.2f} s")
            res = failed_run("by hand", hand.project, hand.port,
                             lambda o=hand_on: hand.switch(revs["crash"], back_to=revs[o]))
            rows.append({"kind": "failed", **res})
            log(f"run {i + 1}/{args.runs} by hand failed switch: crash->serving {res['crash_to_serving']:.2f} s, "
                f"second boot {res['second_boot']:.2f} s")
        hand.compose("down", "--timeout", "5")
        warm = warm_boots(b, args)
        return {"machine": machine(), "boot_seconds": args.boot, "runs": args.runs, "rows": rows, "warm": warm,
                "summary": summarize(rows, warm)}
    finally:
        log("cleaning up")
        b.cleanup()


def warm_boots(b: Bench, args: argparse.Namespace) -> list[dict[str, Any]]:
    """alpha booted by `switch` with its image's caches removed first, then with the cache its boot left."""
    set_boot(b, args.warm_boot)
    image = docker("image", "inspect", "-f", "{{.Id}}", b.tags["bash-c"]).stdout.strip()
    folder = b.state / "caches" / image.replace(":", "-", 1)
    out: list[dict[str, Any]] = []
    for i in range(args.runs):
        tool_switch(b, "beta", 0)
        shutil.rmtree(folder)
        tool_switch(b, "alpha", 0)
        cold = {"cache": "cold", "boot": container_boot(b.project), "compile_seconds": compile_seconds(b)}
        tool_switch(b, "beta", 0)
        tool_switch(b, "alpha", 0)
        hot = {"cache": "warm", "boot": container_boot(b.project), "compile_seconds": compile_seconds(b)}
        out += [cold, hot]
        log(f"warm boots {i + 1}/{args.runs}: cold {cold['boot']:.2f} s, warm {hot['boot']:.2f} s")
    return out


def st(values: Sequence[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(rows: list[dict[str, Any]], warm: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, keys in (("switch", ("outage", "boot", "outage_minus_boot", "wall", "overhead", "overhead_minus_settle")),
                       ("failed", ("outage", "crash_to_serving", "second_boot", "crash_to_serving_minus_second_boot",
                                   "wall"))):
        for side in ("b70deploy", "by hand"):
            got = [r for r in rows if r["kind"] == kind and r["side"] == side]
            out[f"{kind}/{side}"] = {k: st([r[k] for r in got]) for k in keys}
    for cache in ("cold", "warm"):
        got = [w for w in warm if w["cache"] == cache]
        out[f"boot/{cache}"] = {"boot": st([w["boot"] for w in got]),
                                "compile_seconds": st([w["compile_seconds"] for w in got if w["compile_seconds"]])}
    return out


def fmt(s: dict[str, float]) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = ["| | b70deploy switch | by hand (stop; up; poll /health every 5 s) |", "|---|---:|---:|"]
    for label, kind, key in (
            ("clients' outage (last 200 → first 200)", "switch", "outage"),
            ("container boot (StartedAt → first 200)", "switch", "boot"),
            ("outage − boot", "switch", "outage_minus_boot"),
            ("procedure wall time", "switch", "wall"),
            ("overhead = wall − boot", "switch", "overhead"),
            (f"overhead − the {SETTLE:g} s settle window (by hand has none)", "switch", "overhead_minus_settle"),
            ("failed switch: outage", "failed", "outage"),
            ("failed switch: crash → old stack's first 200", "failed", "crash_to_serving"),
            ("failed switch: second boot (StartedAt → first 200)", "failed", "second_boot"),
            ("failed switch: (crash → serving) − second boot", "failed", "crash_to_serving_minus_second_boot"),
            ("failed switch: procedure wall time", "failed", "wall")):
        lines.append(f"| {label} | {fmt(s[f'{kind}/b70deploy'][key])} | {fmt(s[f'{kind}/by hand'][key])} |")
    lines += ["", "| sim boot by `switch` | container boot, s | torch.compile in the log, s |", "|---|---:|---:|"]
    for cache in ("cold", "warm"):
        w = s[f"boot/{cache}"]
        lines.append(f"| {cache} cache | {fmt(w['boot'])} | {fmt(w['compile_seconds'])} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=5, help="runs per side and measurement (default 5)")
    p.add_argument("--boot", type=float, default=2.0, help="sim boot delay for the downtime part (default 2)")
    p.add_argument("--warm-boot", type=float, default=10.0, help="sim cold boot delay for the warm-boot part "
                   "(default 10: the compile window is 15 %% of it)")
    p.add_argument("--json", type=Path, help="write every run and the summary here")
    return report(run, table, p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
