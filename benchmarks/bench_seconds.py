"""The clients' longest wait beside the engine's own time (issue 35), this checkout beside a baseline's, in one run.

Two sim nodes on the real Docker engine, built as bench_standby.py builds its standby node (the door, `standby:
sleep`, the sim reporting vLLM 0.32.0 on XPU, the stacks' default 5 s settle window), one driven by this
checkout's b70deploy and one by `--baseline` (a checkout of main: `git worktree add --detach DIR main`). On
each, after switching to alpha and then beta, `--runs` rounds, the two nodes alternating within a round:

  switch          to alpha (beta sleeps; alpha boots cold in a new slot)
  rollback        back to beta, asleep in its slot (woken)
  failed switch   to `crash` (the report's Marlin crash at boot); beta, asleep, woken back

Four clients (the `openai` client, chat completions one after another, through the door), half of them
streaming (`--streaming`, default half the clients; `--streaming 4` is the mix of the runs before, all
streaming), run through each operation. Measured, over the requests that overlapped the operation (start of
the command to 1 s after its end):
  longest wait    what a client waited: a streaming client until its first token (time to first token, what
                  operators call latency), a non-streaming one for its whole answer
  longest request the longest any one request took, its own stream included (the measure of the runs before)
  beyond usual    the most any request's wait exceeded the usual wait of its kind (the median, streaming or
                  not, of the requests answered before the command started): the part the operation added
  engine          what the engine needed: the new slot's boot (its container's StartedAt to its "Starting vLLM
                  API server" line), the wake (the sim's B70SIM_WAKE_SECONDS, vLLM's "It took X seconds to wake
                  up" line), or the crashed boot (its start to its `die` event) plus the wake
  failed          requests that failed (refused, reset, 5xx)
  steps           seconds of each step of the run, and of each undo, from the state dir's journal
each the median of the runs with min and max, and the host's 1-minute load average beside them (the machine
is shared: numbers are noisy). The bounds the issue sets: switch <= boot + 1 s, rollback <= 1.5 s, failed
switch <= crash boot + wake + 1 s, 0 failed.

    python benchmarks/bench_seconds.py --baseline ../wt-base --json benchmarks/results/seconds.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from bench_door import MODEL, Clients, Node, door_flags, openai_client, outcome
from bench_standby import remove_node, standby_node
from switch_bench import REPO, docker, log, machine, ready_instant, report, started_instant, stats

WAKE = 0.5  # B70SIM_WAKE_SECONDS here: the wake on the sim (the sim's own default is the H200 log's 0.82 s)
_WOKE = re.compile(r"It took ([0-9.]+) seconds to wake up")


@dataclass
class MixedClients(Clients):
    """bench_door's clients, the first `streaming` of them streaming, the others not; each request's wait is
    noted beside its answer: a streaming one's until its first content chunk, another's whole answer."""

    streaming: int = 0
    waits: list[tuple[float, float, bool, bool]] = field(default_factory=list)  # (start, waited, ok, streamed)

    def _ask(self, client: Any, stream: bool) -> None:
        import openai

        start = time.time()
        first: float | None = None
        try:
            got = client.chat.completions.create(model=MODEL, stream=stream, max_tokens=8,
                                                 messages=[{"role": "user", "content": "The capital of France?"}])
            if stream:
                text = ""
                for c in got:
                    if c.choices and c.choices[0].delta.content:
                        first = first or time.time()
                        text += c.choices[0].delta.content
            else:
                text = got.choices[0].message.content or ""
            ok, why = bool(text), "" if text else "empty answer"
        except openai.APIStatusError as e:
            ok, why = False, f"HTTP {e.status_code}"
        except openai.APIError as e:
            ok, why = False, type(e).__name__
        end = time.time()
        with self.lock:
            self.answers.append((start, end, ok, why))
            self.waits.append((start, (first or end) - start, ok, stream))

    def _loop(self) -> None:
        stream = threading.current_thread().name == "streaming"
        try:
            client = openai_client(self.port, timeout=600)
        except ImportError as e:  # no answers would read as no failures: say it and count it
            with self.lock:
                self.answers.append((time.time(), time.time(), False, f"no openai client: {e}"))
                self.waits.append((time.time(), 0.0, False, stream))
            return
        deadline = time.monotonic() + self.max_seconds
        for _ in range(self.max_requests):
            if self.stop.is_set() or time.monotonic() >= deadline:
                return
            self._ask(client, stream)

    def __enter__(self) -> MixedClients:
        self.threads = [threading.Thread(target=self._loop, daemon=True, name="streaming" if i < self.streaming
                                         else "whole") for i in range(self.n)]
        for t in self.threads:
            t.start()
        return self


def waited(c: MixedClients, start: float, end: float) -> dict[str, float]:
    """The longest wait, by the measure above, of the requests that overlapped [start, end], and the most one of
    them waited beyond the usual wait of its kind before `start`."""
    inside = [(s, w, streamed) for (s, w, _, streamed), (_, e, _, _) in zip(c.waits, c.answers, strict=True)
              if e >= start and s <= end]
    usual = {kind: statistics.median([w for s, w, ok, streamed in c.waits if ok and streamed == kind
                                      and s + w < start] or [0.0]) for kind in (True, False)}
    return {"longest_wait_s": round(max((w for _, w, _ in inside), default=0.0), 3),
            "longest_first_token_s": round(max((w for _, w, k in inside if k), default=0.0), 3),
            "longest_answer_s": round(max((w for _, w, k in inside if not k), default=0.0), 3),
            "beyond_usual_s": round(max((w - usual[k] for _, w, k in inside), default=0.0), 3),
            "usual_first_token_s": round(usual[True], 3), "usual_answer_s": round(usual[False], 3)}


def steps_of(node: Node) -> dict[str, float]:
    """Seconds of each step (and `undo STEP`) of the journal's last run: from its start line to its end line."""
    lines = [json.loads(ln) for ln in (node.bench.state / "journal.jsonl").read_text().splitlines() if ln.strip()]
    last = next((ln["run"] for ln in reversed(lines) if ln["event"] == "run-start"), None)
    out: dict[str, float] = {}
    began: dict[str, float] = {}
    for ln in lines:
        if ln["run"] != last:
            continue
        kind, _, edge = ln["event"].rpartition("-")
        name = ("undo " if kind == "undo" else "") + str(ln.get("step", ""))
        if kind in ("step", "undo") and edge == "start":
            began[name] = ln["ts"]
        elif kind in ("step", "undo") and name in began:
            out[name] = round(ln["ts"] - began.pop(name), 3)
    return out


def cli(node: Node, code: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(code), "B70DEPLOY_CONFIG": str(node.bench.config)}
    env.pop("B70DEPLOY_FAULT", None)
    # cwd outside both checkouts: `python -m` puts the cwd first on sys.path, before PYTHONPATH
    return subprocess.run([sys.executable, "-m", "b70deploy.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600, check=False, cwd=node.bench.root)


def slot_boxes(node: Node) -> dict[str, str]:
    """container id -> compose project of the node's vllm slots, stopped ones included."""
    rows = docker("ps", "-a", "--no-trunc", "--filter", "label=b70deploy.role=vllm", "--format",
                  '{{.ID}} {{.Label "com.docker.compose.project"}}').stdout.splitlines()
    return {i: p for i, _, p in (r.partition(" ") for r in rows) if p.startswith(f"{node.bench.project}-r")}


def events(node: Node, since: float, kind: str) -> list[tuple[float, str]]:
    out = docker("events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}", "--filter",
                 f"event={kind}", "--filter", "label=b70deploy.role=vllm", "--format",
                 '{{.TimeNano}} {{index .Actor.Attributes "com.docker.compose.project"}}').stdout.splitlines()
    return [(int(t) / 1e9, p) for t, _, p in (ln.partition(" ") for ln in out if ln.strip())
            if p.startswith(f"{node.bench.project}-r")]


def woke_seconds(node: Node, wake: float) -> float:
    """vLLM's own line (the sim prints it as vLLM does) in the live slot's log: the last wake's seconds."""
    found: list[float] = []
    for cid in slot_boxes(node):
        got = docker("logs", "--tail", "200", cid, check=False)
        found += [float(m.group(1)) for m in _WOKE.finditer(got.stdout + got.stderr)]
    return found[-1] if found else wake


def measure(node: Node, code: Path, op: str, argv: list[str], *, must_fail: bool, clients: int, streaming: int,
            wake: float) -> dict[str, Any]:
    before = set(slot_boxes(node))
    load = os.getloadavg()[0]
    with MixedClients(node.bench.prod_port, n=clients, streaming=streaming) as c:
        time.sleep(1.0)  # the clients are answered before the operation starts: one answer each, at least
        deadline = time.monotonic() + 30
        while sum(ok for _, _, ok, _ in c.answers) < clients and time.monotonic() < deadline:
            time.sleep(0.05)
        start = time.time()
        r = cli(node, code, *argv)
        end = time.time()
        time.sleep(1.0)
    if (r.returncode != 0) != must_fail:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    if not any(ok for _, _, ok, _ in c.answers):
        raise RuntimeError(f"the clients had no answer at all: {c.answers[:3]}")
    seen = outcome(c.answers, start, end + 1.0)
    wait = waited(c, start, end + 1.0)
    if op == "switch":
        new = [cid for cid in slot_boxes(node) if cid not in before]
        engine = ready_instant(new[0]) - started_instant(new[0]) if new else None
    elif op == "rollback":
        engine = woke_seconds(node, wake)
    else:
        starts, dies = events(node, start, "start"), events(node, start, "die")
        crashed = [(t, p) for t, p in starts if any(p == q and d > t for d, q in dies)]
        boot = min(d for d, q in dies if q == crashed[0][1]) - crashed[0][0] if crashed else None
        engine = boot + woke_seconds(node, wake) if boot is not None else None
    got = {"operation": op, **wait, "longest_request_s": seen["longest_wait_s"],
           "engine_s": round(engine, 3) if engine else None,
           "failed": seen["failed"], "failed_kinds": seen["failed_kinds"], "requests": seen["requests"],
           "command_s": round(end - start, 3), "load1": round((load + os.getloadavg()[0]) / 2, 2),
           "steps": steps_of(node)}
    log(f"{code} {op}: {got}")
    return got


OPS = [("switch", ["switch", "alpha", "--yes"], False), ("rollback", ["rollback", "--yes"], False),
       ("failed switch", ["switch", "crash", "--yes"], True)]
BOUND = {"switch": 1.0, "rollback": None, "failed switch": 1.0}  # seconds beyond the engine's; rollback: 1.5 in all


def run(args: argparse.Namespace) -> dict[str, Any]:
    codes = {"baseline": args.baseline.resolve(), "this": REPO}
    nodes: dict[str, Node] = {}
    try:
        for side in codes:
            nodes[side] = standby_node(sleep=True, boot=args.boot, hold=args.hold)
            cfg = yaml.safe_load(nodes[side].bench.config.read_text())
            cfg["stack_overlay"].pop("settle_seconds", None)  # the stacks' default window (5 s), as in the field
            cfg["stack_overlay"]["env"]["B70SIM_WAKE_SECONDS"] = f"{args.wake:g}"
            nodes[side].bench.config.write_text(yaml.safe_dump(cfg))
        for side, node in nodes.items():
            for stack in ("alpha", "beta"):  # warm-up, not counted: alpha then sleeps
                r = cli(node, codes[side], "switch", stack, "--yes")
                if r.returncode != 0:
                    raise RuntimeError(f"{side}: warm-up switch to {stack} failed:\n{r.stdout}\n{r.stderr}")
        got: dict[str, dict[str, list[dict[str, Any]]]] = {s: {op: [] for op, _, _ in OPS} for s in codes}
        for i in range(args.runs):
            for op, argv, must_fail in OPS:
                for side in (list(codes) if i % 2 == 0 else list(reversed(codes))):
                    got[side][op].append(measure(nodes[side], codes[side], op, argv, must_fail=must_fail,
                                                 clients=args.clients, streaming=args.streaming, wake=args.wake))
        summary = {side: {op: {"longest_wait_s": stats([m["longest_wait_s"] for m in ms]),
                               "longest_first_token_s": stats([m["longest_first_token_s"] for m in ms]),
                               "longest_answer_s": stats([m["longest_answer_s"] for m in ms]),
                               "longest_request_s": stats([m["longest_request_s"] for m in ms]),
                               "beyond_usual_s": stats([m["beyond_usual_s"] for m in ms]),
                               "engine_s": stats([m["engine_s"] for m in ms]),
                               "beyond_engine_s": stats([m["longest_wait_s"] - m["engine_s"] for m in ms
                                                         if m["engine_s"] is not None]),
                               "command_s": stats([m["command_s"] for m in ms]),
                               "load1": stats([m["load1"] for m in ms]),
                               "failed": sum(m["failed"] for m in ms),
                               "steps": {k: stats([m["steps"][k] for m in ms if k in m["steps"]])
                                         for k in dict.fromkeys(k for m in ms for k in m["steps"])}}
                          for op, ms in ops.items()} for side, ops in got.items()}
        return {"machine": machine(), "boot_seconds": args.boot, "wake_seconds": args.wake, "runs": args.runs,
                "clients": args.clients, "streaming": args.streaming,
                "baseline": str(codes["baseline"]), "summary": summary, "measurements": got}
    finally:
        for node in nodes.values():
            remove_node(node)


def table(result: dict[str, Any]) -> str:
    def fmt(st: dict[str, Any]) -> str:
        if not st.get("n"):
            return "-"
        return f"{st['median']:.2f} (min {st['min']:.2f}, max {st['max']:.2f})"

    streaming = result.get("streaming", result["clients"])
    cols = [("longest wait", "longest_wait_s"), ("first token", "longest_first_token_s"),
            ("whole answer", "longest_answer_s"), ("longest request", "longest_request_s"),
            ("beyond usual", "beyond_usual_s"), ("engine", "engine_s"), ("wait - engine", "beyond_engine_s"),
            ("command", "command_s"), ("load (1 min)", "load1")]
    lines = [f"sim boot {result['boot_seconds']:g} s, wake {result['wake_seconds']:g} s; {result['clients']} clients "
             f"through the door, {streaming} streaming; "
             f"medians of {result['runs']} with min and max, seconds; baseline: {result['baseline']}",
             f"{'operation':<14} {'code':<9} " + " ".join(f"{c:<26}" for c, _ in cols) + " failed"]
    for op, _, _ in OPS:
        for side, ops in result["summary"].items():
            st = ops[op]
            lines.append(f"{op:<14} {side:<9} " + " ".join(f"{fmt(st.get(k, {})):<26}" for _, k in cols)
                         + f" {st['failed']}")
    lines.append("longest wait: of the requests that overlapped the command (to 1 s after it), the longest a client "
                 "waited: to its first token when it streams, its whole answer when not (first token, whole "
                 "answer: the longest of each kind); longest request: the "
                 "longest any of them took, its own stream included; beyond usual: the most a request's wait "
                 "exceeded the median wait of its kind before the command; engine: the new slot's boot, the wake, "
                 "or the crashed boot plus the wake")
    lines.append("steps (medians, seconds; from the journal):")
    for op, _, _ in OPS:
        for side, ops in result["summary"].items():
            got = ops[op].get("steps", {})
            lines.append(f"  {op:<14} {side:<9} " + ", ".join(f"{k} {v['median']:.2f}" for k, v in got.items()
                                                              if v.get("n")))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    door_flags(p, boot=2.0)
    p.set_defaults(clients=4)
    p.add_argument("--streaming", type=int, help="clients that stream (default half the clients; all of them is "
                   "the mix of the runs before issue 35's fourth stop)")
    p.add_argument("--wake", type=float, default=WAKE, help=f"the sim's wake, B70SIM_WAKE_SECONDS (default {WAKE:g}, "
                   "the issue's)")
    p.add_argument("--runs", type=int, default=5, help="rounds of the three operations per node (default 5)")
    p.add_argument("--baseline", type=Path, required=True, help="a checkout of the code to compare with (main)")
    p.add_argument("--json", type=Path, help="write every measurement and the summary here")
    args = p.parse_args()
    if args.streaming is None:
        args.streaming = args.clients // 2
    if not 0 <= args.streaming <= args.clients:
        p.error(f"--streaming {args.streaming}: between 0 and --clients ({args.clients})")
    return report(run, table, args)


if __name__ == "__main__":
    sys.exit(main())
