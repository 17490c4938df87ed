"""Chaos on a hot-standby node (issue 35): a switch or a rollback killed at random moments, recovered by
`status`'s advice, checked from outside.

chaos.py's trials (its node, its signal and recovery machinery) on a node with the front door and `standby:
sleep` (the sim reporting vLLM 0.32.0 on XPU, where vLLM has sleep mode; bench_standby.py's image). Each trial
runs, by its index, `b70deploy switch` to the stack that does not serve (a new slot boots beside the live one,
which sleeps) or `b70deploy rollback` (the sleeping revision is woken), sends SIGKILL after a delay drawn
uniformly over that operation's typical duration (measured first on clean runs; `--start` and `--window`
narrow it to where the node changes: the CLI's start and plan come first), then follows `status
--json`'s advice (chaos.py `follow_advice`) until it advises nothing.

The outside check, beyond the tool's report:
  - exactly one slot container runs awake on the door's network (GET /is_sleeping on its own port), and its
    `b70deploy.stack` label is the stack of the revision in state_dir/revisions/current, deployed;
  - its compose project is `P-r<slot>` of the slot `status` names as serving, as the current revision;
  - at most `standby.count` (1) slots asleep; no other slot container left (stopped, or awake off the door);
    the project's own vllm container absent;
  - through the door: /v1/models lists that stack's names and max_model_len; a completion answers 200;
  - the deploy dir holds the current revision's bytes; every revision's files hash to its meta.json;
  - `status --json`: no differs, fix, interrupted or lock.

    python benchmarks/chaos_standby.py --trials 30 --json benchmarks/results/chaos_standby.json
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import chaos
import yaml
from bench_standby import image_032
from chaos import STACKS, ChaosNode, docker, follow_advice, http, journal_steps, log, tree, wait_group

from b70deploy.deploy import interrupts

COUNT = 1  # standby.count: at most this many slots asleep


class StandbyNode(ChaosNode):
    def setup(self) -> None:
        super().setup()
        from b70deploy.sim.door_image import build

        self.door = f"{self.project}/door:caddy"
        docker("tag", build().tag, self.door)
        v032 = f"{self.project}/vllm:v032"
        image_032(v032, self.root / "image")
        self.images = [v032, self.door]
        cfg = yaml.safe_load(self.config.read_text())
        cfg["image_map"]["intel/vllm:latest"] = v032
        cfg["door"] = {"enabled": True, "image": self.door, "hold_seconds": 120, "probe_port": chaos.free_port()}
        cfg["standby"] = {"mode": "sleep", "count": COUNT}
        cfg["companions"] = []
        cfg["stack_overlay"]["env"]["B70SIM_WAKE_SECONDS"] = "0.5"
        self.config.write_text(yaml.safe_dump(cfg))

    def slot_boxes(self) -> list[dict[str, Any]]:
        rows = docker("ps", "-a", "--no-trunc", "--filter", "label=b70deploy.role=vllm", "--format",
                      '{{.ID}} {{.Label "com.docker.compose.project"}}').stdout.splitlines()
        ids = [i for i, _, p in (r.partition(" ") for r in rows) if p.startswith(f"{self.project}-r")]
        return [json.loads(docker("inspect", i).stdout)[0] for i in ids] if ids else []

    @staticmethod
    def asleep(box: dict[str, Any]) -> bool | None:
        bound = (box["NetworkSettings"].get("Ports") or {}).get("8000/tcp") or []
        if not box["State"]["Running"] or not bound:
            return None
        code, body = http(f"http://127.0.0.1:{bound[0]['HostPort']}/is_sleeping", timeout=5)
        return bool(body.get("is_sleeping")) if code == 200 and isinstance(body, dict) else None

    def serving(self) -> str | None:
        on = [b for b in self.slot_boxes() if b["State"]["Running"]
              and f"{self.project}_default" in b["NetworkSettings"]["Networks"] and self.asleep(b) is False]
        return str(on[0]["Config"]["Labels"].get("b70deploy.stack")) if len(on) == 1 else None

    def _check(self, st: dict[str, Any]) -> list[str]:
        bad: list[str] = []
        if "error" in st:
            return [str(st["error"])]
        for key in ("differs", "fix", "interrupted", "lock"):
            if st.get(key):
                bad.append(f"status {key}: {st[key]}")
        revs = self.state / "revisions"
        cur_text = (revs / "current").read_text().strip() if (revs / "current").is_file() else ""
        if not cur_text.isdigit():
            return [*bad, f"no current revision ({cur_text!r})"]
        cur = revs / f"{int(cur_text):06d}"
        stack = str(json.loads((cur / "meta.json").read_text())["stack"])
        outcome = json.loads((cur / "status.json").read_text()).get("outcome")
        if outcome != "deployed":
            bad.append(f"current revision {cur_text} is {outcome}, not deployed")
        boxes = self.slot_boxes()
        states = {b["Config"]["Labels"]["com.docker.compose.project"]: (b, self.asleep(b)) for b in boxes}
        on = [(p, b) for p, (b, sleeping) in states.items() if b["State"]["Running"] and sleeping is False
              and f"{self.project}_default" in b["NetworkSettings"]["Networks"]]
        if len(on) != 1:
            bad.append(f"slots awake on the door's network: {[p for p, _ in on]}")
        else:
            project, box = on[0]
            if box["Config"]["Labels"].get("b70deploy.stack") != stack:
                bad.append(f"{project} serves {box['Config']['Labels'].get('b70deploy.stack')}, "
                           f"revision {cur_text} is {stack}")
            named = st.get("serving_slot") or {}
            if project != f"{self.project}-r{named.get('slot')}" or named.get("revision") != int(cur_text):
                bad.append(f"{project} serves; status names {named} with current {cur_text}")
        sleeping = [p for p, (_, s) in states.items() if s is True]
        if len(sleeping) > COUNT:
            bad.append(f"{len(sleeping)} slots asleep (count {COUNT}): {sleeping}")
        others = [p for p, (b, s) in states.items() if s is not True and (p, b) not in on]
        if others:
            bad.append(f"slots left neither serving nor asleep: {others}")
        if [c for c in self.containers() if c["service"] == "vllm"]:
            bad.append("the project's own vllm container exists beside the slots")
        if stack in STACKS:
            names, max_len = STACKS[stack]
            code, body = http(f"http://127.0.0.1:{self.prod}/v1/models")
            cards = body.get("data", []) if code == 200 and isinstance(body, dict) else []
            if code != 200 or [c.get("id") for c in cards] != names or {c.get("max_model_len") for c in cards} != {
                    max_len}:
                bad.append(f"/v1/models through the door {code}: {cards}")
            code, body = http(f"http://127.0.0.1:{self.prod}/v1/completions",
                              {"model": names[0], "prompt": "The capital of France is", "max_tokens": 2}, timeout=30)
            if code != 200:
                bad.append(f"completion through the door: {code} {str(body)[:120]}")
        if tree(self.deploy) != tree(cur / "files"):
            bad.append(f"deploy dir differs from revision {cur_text}")
        return bad + self.check_hashes()

    def reset(self) -> str:
        for box in self.slot_boxes():
            docker("rm", "-f", box["Id"], check=False)
        return super().reset()

    def cleanup(self) -> None:
        for box in self.slot_boxes():
            docker("rm", "-f", box["Id"], check=False)
        for net in docker("network", "ls", "-q", "--filter", f"name={self.project}-r", check=False).stdout.split():
            docker("network", "rm", net, check=False)
        super().cleanup()
        for tag in getattr(self, "images", []):
            docker("rmi", tag, check=False)


def operation(node: StandbyNode, index: int) -> list[str]:
    if index % 2:
        return ["rollback", "--yes"]
    return ["switch", "beta" if node.serving() == "alpha" else "alpha", "--yes"]


def trial(node: StandbyNode, seed: int, index: int, typical: dict[str, float],
          window: tuple[float, float]) -> dict[str, Any]:
    rng = random.Random(f"{seed}:{index}")
    argv = operation(node, index)
    delay = rng.uniform(*window) * typical[argv[0]]
    journal = node.state / "journal.jsonl"
    offset = journal.stat().st_size if journal.exists() else 0
    proc = subprocess.Popen(node.argv(*argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=node.env(), start_new_session=True)
    time.sleep(delay)
    before = proc.poll() is not None
    at = time.time()
    if not before:
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=300)
    wait_group(proc.pid, 120)
    step, _ = journal_steps(node.state, offset, at)
    t0 = time.monotonic()
    advised, picks, ran, st = follow_advice(node, rng)
    problems = node.check(st)
    return {"trial": index, "replay": f"{seed}:{index}", "operation": " ".join(argv[:2]), "delay": round(delay, 3),
            "finished_before_signal": before, "killed_in": step, "advised": advised, "picked": picks,
            "commands": ran, "recovery_seconds": round(time.monotonic() - t0, 3), "agreement": not problems,
            "problems": problems}


def run(args: argparse.Namespace) -> dict[str, Any]:
    node = StandbyNode(Path(tempfile.mkdtemp(prefix="b70chaos-standby-")), uuid.uuid4().hex[:8], args.boot)
    result: dict[str, Any] = {"seed": args.seed, "trials": []}
    try:
        node.setup()
        for stack in ("alpha", "beta"):
            r = node.cli("switch", stack, "--yes")
            if r.returncode != 0:
                raise RuntimeError(f"warm-up switch {stack}: {r.stdout}\n{r.stderr}")
        walls: dict[str, list[float]] = {"switch": [], "rollback": []}
        for i in range(4):  # clean runs: switch, rollback, switch, rollback
            argv = operation(node, i)
            t0 = time.monotonic()
            r = node.cli(*argv)
            walls[argv[0]].append(time.monotonic() - t0)
            if r.returncode != 0:
                raise RuntimeError(f"clean {' '.join(argv)}: {r.stdout}\n{r.stderr}")
        typical = {k: statistics.median(v) for k, v in walls.items()}
        result["typical_seconds"] = typical
        log(f"typical: {typical}")
        for i in range(args.trials):
            t = trial(node, args.seed, i, typical, (args.start, args.window))
            result["trials"].append(t)
            log(f"trial {i} {t['operation']} killed at {t['delay']:.2f} s in {t['killed_in']}: advised "
                f"{t['advised'] or 'nothing'} picked {t['picked']}; "
                + ("agreement" if t["agreement"] else f"NOT IN AGREEMENT: {t['problems']}"))
            if not t["agreement"]:
                t["reset"] = node.reset()
    finally:
        node.cleanup()
    trials = result["trials"]
    result["summary"] = {"trials": len(trials), "agreement": sum(t["agreement"] for t in trials),
                         "killed_mid_run": sum(not t["finished_before_signal"] for t in trials),
                         "killed_in": {s: sum(t["killed_in"] == s for t in trials)
                                       for s in sorted({t["killed_in"] for t in trials})},
                         "recovery_seconds": chaos.stats([t["recovery_seconds"] for t in trials])}
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--seed", type=int, default=None, help="RNG seed (default: random, printed)")
    p.add_argument("--boot", type=float, default=1.0, help="sim boot delay, B70SIM_BOOT_SECONDS (default 1)")
    p.add_argument("--start", type=float, default=0.0,
                   help="delays drawn over [START, WINDOW) x the typical duration (default 0: from the start)")
    p.add_argument("--window", type=float, default=1.0, help="see --start (default 1: to the typical end)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    try:
        with interrupts.installed():
            result = run(args)
    except KeyboardInterrupt:
        log("interrupted; everything created was removed")
        return 130
    print(json.dumps(result["summary"], indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["summary"]["agreement"] == result["summary"]["trials"] else 1


if __name__ == "__main__":
    sys.exit(main())
