"""Chaos: `b70deploy switch` killed at random moments, recovered by `status`'s advice, checked from outside.

Each trial starts `b70deploy switch STACK --yes` (alternating between two stacks, `alpha` and
`beta`, with a webui companion so drain and restore run), waits a random delay drawn uniformly
over the switch's typical duration (measured first, on clean switches), and sends one signal:

    SIGKILL  to the switch process (`kill -9 PID`): nothing of it runs after
    SIGTERM  to the switch process (`kill PID`)
    SIGINT   to its process group (Ctrl-C at a terminal: the `docker compose` children get it too)

It waits for the process to exit and for anything it left running in its process group (an
orphaned `docker compose` after a SIGKILL) to end, then follows the advice of
`b70deploy status --json` (`interrupted.fix`, else `fix`) one command at a time until status
shows nothing that differs. Where the advice offers two commands ("resume (finish it) or
rollback (undo it)") the trial's RNG picks one, and the pick is recorded.

The outcome is checked from outside the tool, not from its report:
  - the vllm container's `b70deploy.stack` label is the stack of the revision in
    state_dir/revisions/current, and that revision's status.json says "deployed";
  - over HTTP: /v1/models lists exactly that stack's served names with its max_model_len (alpha
    and beta differ in both), and a completion on its first name answers 200 naming that model;
  - the deploy dir holds byte for byte the files of the current revision (nothing more);
  - no leftover temp entries: state_dir/revisions holds only NNNNNN dirs, index.json,
    index.lock and current (a killed writer's index.dirty is gone once the store is written
    again), and no `*.tmp` file is anywhere under the state or deploy dir;
  - every container of the project is named `<project>-<service>-1` (none renamed), vllm and
    webui are running, nothing of the dark project exists;
  - every revision's files hash to what its meta.json lists (no extra file), and no meta.json
    changed since it was first seen;
  - `status --json` shows no `differs`, no `fix`, no `interrupted` and no lock.

A trial's RNG is `random.Random(f"{seed}:{trial}")`; `--replay SEED:TRIAL --typical SECONDS`
runs that one trial again with the same signal, direction, delay and pick. Bounded by
`--trials` and `--max-minutes`; everything it creates (temp dirs, compose projects, image tag)
carries a random suffix and is removed in a `finally`, also on Ctrl-C or SIGTERM.

    python benchmarks/chaos.py --trials 60 --json benchmarks/results/chaos.json

Two more trial kinds (issue 22), each with its own count (`--disk-full N`, `--damaged N`):

  disk-full  the state dir is a tmpfs of the benchmark's own (root: mounted in setup, unmounted
             in the `finally`). The trial fills it before `switch` (to the last byte, or leaving
             a random 0-600 KiB), or to the last byte at a random moment during it. Right after
             the switch exits (the disk still full) the node must already serve what `current`
             names (the outside check below, less the leftovers), and a run that met the full
             disk must say "is full"; then the filler goes and status's advice is followed to
             agreement.
  damaged    one record of the store is damaged at random (a flipped byte in a stored file, a
             truncated or empty meta.json or status.json, a deleted stored file or meta.json,
             garbage in index.json; of the current revision or an older one), then one command
             runs (rollback N, rollback, rollback STACK, switch STACK, status, history). It must
             not print a traceback, a refusal must be one line, the node must serve what the
             records name, and nothing may run bytes that differ from their revision's hashes;
             then `fsck --repair` and status's advice bring it to agreement.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from switch_bench import remove_keep_tags  # noqa: E402  (benchmarks/ is on sys.path)

from b70deploy.deploy import interrupts  # noqa: E402
from b70deploy.sim.box import write_models  # noqa: E402
from b70deploy.sim.image import TAGS as SIM_TAGS  # noqa: E402

SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
STACKS = {  # name -> (served names, max_model_len): what /v1/models tells apart
    "alpha": (["chaos-alpha", "alias-a"], 131072),
    "beta": (["chaos-beta", "alias-b"], 262144),
}
REVISION_ENTRY = re.compile(r"^(\d{6}|index\.json|index\.lock|current|damaged)$")  # damaged/: fsck --repair
FULL_FS_KIB = 4096  # the disk-full trials' state dir


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(root: Path) -> dict[str, bytes]:
    if not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def stats(values: Sequence[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "min": min(values), "median": statistics.median(values), "max": max(values)}


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 10) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None
    except (OSError, ValueError) as e:
        return 0, str(e)


# ---------------------------------------------------------------- the node


@dataclass
class ChaosNode:
    root: Path
    suffix: str
    boot: float
    small_state: bool = False  # the state dir on a tmpfs of FULL_FS_KIB (disk-full trials)
    project: str = ""
    tag: str = ""
    prod: int = 0
    seen_meta: dict[str, str] = field(default_factory=dict)  # revision dir -> sha256 of meta.json

    def __post_init__(self) -> None:
        self.project = f"chaos-{self.suffix}"
        self.tag = f"chaos-{self.suffix}/vllm:bash-c"

    @property
    def config(self) -> Path:
        return self.root / "node.yaml"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def deploy(self) -> Path:
        return self.root / "deploy"

    def setup(self) -> None:
        r = subprocess.run([sys.executable, "-m", "b70deploy.cli", "sim", "build"], capture_output=True, text=True,
                           env=self.env(), timeout=900, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"sim build failed:\n{r.stdout}\n{r.stderr}")
        docker("tag", SIM_TAGS["bash-c"], self.tag)  # our own copy: other work may rebuild the shared tag
        if self.small_state:
            self.state.mkdir(parents=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FULL_FS_KIB}k,mode=0755", "tmpfs", str(self.state)],
                           check=True, capture_output=True, text=True)
        write_models(self.root / "models")
        self.write_stacks()
        self.prod = free_port()
        cfg = {
            "project": self.project, "deploy_dir": str(self.deploy), "state_dir": str(self.state),
            "stacks_dir": str(self.root / "stacks"), "models_dir": str(self.root / "models"), "device_dir": None,
            "bind_address": "127.0.0.1", "ports": {"prod": self.prod, "dark": free_port()}, "load_threshold": 1000,
            "image_map": {"intel/vllm:latest": self.tag},
            "stack_overlay": {"env": {"B70SIM_BOOT_SECONDS": f"{self.boot:g}", "B70SIM_DECODE_TPS": "500"},
                              "settle_seconds": 0.5},
            "timeouts": {"health": 40, "rollback": 40, "poll_interval": 0.2},
            "companions": [{"name": "webui", "image": self.tag, "command": ["sim-webui", "--port", "8080"]}],
        }
        self.config.write_text(yaml.safe_dump(cfg))

    def write_stacks(self) -> None:
        folder = self.root / "stacks"
        folder.mkdir(parents=True)
        names, max_len = STACKS["alpha"]
        alpha = {"image": "intel/vllm:latest", "entrypoint_style": "bash-c",
                 "model": {"path": "Qwen/Qwen3-30B-A3B-W4A16", "quantization": "compressed-tensors"},
                 "served_model_names": names, "dtype": "float16", "max_model_len": max_len,
                 "kv_cache_dtype": "fp8", "tool_calling": {"parser": "hermes", "auto_tool_choice": True},
                 "patches": ["marlin-xpu-carveout"],
                 "expect": {"attention_backend": "FLASH_ATTN", "kv_cache_dtype": "fp8", "min_kv_tokens": 270000},
                 "smoke": {"completion": {"prompt": "The capital of France is", "expect": "Paris", "max_tokens": 4},
                           "tool_call": True, "aliases": True}}
        beta_names, beta_len = STACKS["beta"]
        docs = {"alpha": alpha, "beta": {"extends": "alpha", "served_model_names": beta_names,
                                         "max_model_len": beta_len}}
        for name, doc in docs.items():
            (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc))

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("DOCKER_HOST", "DOCKER_CONTEXT", "B70DEPLOY_NODE", "B70DEPLOY_STACKS", "B70DEPLOY_FAULT")}
        return {**env, "PYTHONPATH": str(REPO), "B70DEPLOY_CONFIG": str(self.config)}

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "b70deploy.cli", *args]

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), capture_output=True, text=True, env=self.env(), timeout=timeout,
                              check=False)

    def status(self) -> dict[str, Any]:
        r = self.cli("status", "--json", timeout=60)
        try:
            return dict(json.loads(r.stdout))
        except ValueError:
            return {"error": f"status exited {r.returncode}: {r.stderr.strip()[-300:]}"}

    def containers(self, project: str | None = None) -> list[dict[str, str]]:
        fmt = ('{{.Names}}\t{{.Label "com.docker.compose.service"}}\t{{.State}}\t{{.Label "b70deploy.stack"}}')
        out = docker("ps", "-a", "--filter", f"label=com.docker.compose.project={project or self.project}",
                     "--format", fmt).stdout
        rows = []
        for line in out.splitlines():
            name, service, state, stack = [*line.split("\t"), "", "", ""][:4]
            rows.append({"name": name, "service": service, "state": state, "stack": stack})
        return rows

    def serving(self) -> str | None:
        """The stack the running vllm container is labelled with (None: none running)."""
        got = [c["stack"] for c in self.containers() if c["service"] == "vllm" and c["state"] == "running"]
        return got[0] if len(got) == 1 else None

    # ---------------------------------------------------------- the outside check

    def check(self, st: dict[str, Any]) -> list[str]:
        """Everything that is not in agreement, looked at from outside the tool (a record the
        check itself cannot read is a disagreement, not the benchmark's crash)."""
        try:
            return self._check(st)
        except (OSError, ValueError, KeyError) as e:
            return [f"the outside check could not read the records: {e}"]

    def _check(self, st: dict[str, Any]) -> list[str]:
        bad: list[str] = []
        if "error" in st:
            return [str(st["error"])]
        if st.get("differs"):
            bad.append(f"status differs: {st['differs']}")
        if st.get("fix"):
            bad.append(f"status advises: {st['fix']}")
        if st.get("interrupted"):
            bad.append(f"status interrupted: {st['interrupted']}")
        if st.get("lock"):
            bad.append(f"lock held: {st['lock']}")
        revs = self.state / "revisions"
        cur_text = (revs / "current").read_text().strip() if (revs / "current").is_file() else ""
        if not cur_text.isdigit():
            return [*bad, f"no current revision ({cur_text!r})"]
        cur = revs / f"{int(cur_text):06d}"
        meta = json.loads((cur / "meta.json").read_text())
        outcome = json.loads((cur / "status.json").read_text()).get("outcome")
        stack = str(meta["stack"])
        if (st.get("current") or {}).get("number") != int(cur_text):
            bad.append(f"status names revision {(st.get('current') or {}).get('number')}, current is {cur_text}")
        if outcome != "deployed":
            bad.append(f"current revision {cur_text} is {outcome}, not deployed")
        # containers: names, states, the stack label
        for c in self.containers():
            if c["name"] != f"{self.project}-{c['service']}-1":
                bad.append(f"renamed container {c['name']} ({c['service']}, {c['state']})")
        vllm = [c for c in self.containers() if c["service"] == "vllm"]
        if len(vllm) != 1 or vllm[0]["state"] != "running":
            bad.append(f"vllm containers: {vllm}")
        elif vllm[0]["stack"] != stack:
            bad.append(f"vllm container serves stack {vllm[0]['stack']}, current revision {cur_text} is {stack}")
        webui = [c for c in self.containers() if c["service"] == "webui"]
        if len(webui) != 1 or webui[0]["state"] != "running":
            bad.append(f"webui containers: {webui}")
        if self.containers(f"{self.project}-dark"):
            bad.append(f"dark project containers: {self.containers(f'{self.project}-dark')}")
        # over HTTP: which stack answers
        if stack in STACKS:
            names, max_len = STACKS[stack]
            code, body = http(f"http://127.0.0.1:{self.prod}/v1/models")
            cards = body.get("data", []) if code == 200 and isinstance(body, dict) else []
            ids = [c.get("id") for c in cards]
            lens = {c.get("max_model_len") for c in cards}
            if code != 200 or ids != names or lens != {max_len}:
                bad.append(f"/v1/models {code}: ids {ids}, max_model_len {sorted(lens, key=str)}; "
                           f"{stack} serves {names} at {max_len}")
            code, body = http(f"http://127.0.0.1:{self.prod}/v1/completions",
                              {"model": names[0], "prompt": "The capital of France is", "max_tokens": 2})
            if code != 200 or not isinstance(body, dict) or body.get("model") != names[0]:
                bad.append(f"completion on {names[0]}: {code} {str(body)[:120]}")
        else:
            bad.append(f"current revision {cur_text} is stack {stack!r}, not one the benchmark switches to")
        # the deploy dir is the current revision's bytes
        live, want = tree(self.deploy), tree(cur / "files")
        if live != want:
            differ = sorted(n for n in set(live) | set(want) if live.get(n) != want.get(n))
            bad.append(f"deploy dir differs from revision {cur_text}: {differ}")
        # leftovers
        stray = sorted(p.name for p in revs.iterdir() if not REVISION_ENTRY.match(p.name))
        if stray:
            bad.append(f"leftovers in state/revisions: {stray}")
        tmps = sorted(str(p.relative_to(self.root)) for base in (self.state, self.deploy)
                      for p in base.rglob("*.tmp"))
        if tmps:
            bad.append(f"temp files left: {tmps}")
        bad += self.check_hashes()
        return bad

    def check_hashes(self) -> list[str]:
        bad: list[str] = []
        for d in sorted((self.state / "revisions").iterdir()):
            if not (d.is_dir() and d.name.isdigit()):
                continue
            meta_bytes = (d / "meta.json").read_bytes()
            digest = sha256(meta_bytes)
            if self.seen_meta.setdefault(d.name, digest) != digest:
                bad.append(f"revision {d.name}: meta.json changed")
            want = json.loads(meta_bytes)["files"]
            got = {n: sha256(b) for n, b in tree(d / "files").items()}
            if got != want:
                bad.append(f"revision {d.name}: files {sorted(set(got) ^ set(want)) or 'hash mismatch'}")
        return bad

    def cleanup(self) -> None:
        for proj in (self.project, f"{self.project}-dark"):
            with contextlib.suppress(Exception):
                ids = docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={proj}",
                             check=False).stdout.split()
                if ids:
                    docker("rm", "-f", *ids, check=False)
                nets = docker("network", "ls", "-q", "--filter", f"label=com.docker.compose.project={proj}",
                              check=False).stdout.split()
                if nets:
                    docker("network", "rm", *nets, check=False)
        with contextlib.suppress(Exception):
            remove_keep_tags(self.project)
            docker("rmi", self.tag, check=False)
        if self.small_state:
            subprocess.run(["umount", "-l", str(self.state)], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def reset(self) -> str:
        """After a trial that did not end in agreement: a fresh node (containers, state, deploy dir)."""
        for proj in (self.project, f"{self.project}-dark"):
            ids = docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={proj}",
                         check=False).stdout.split()
            if ids:
                docker("rm", "-f", *ids, check=False)
        if self.small_state:  # the mount point stays: empty it
            for p in self.state.iterdir():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        else:
            shutil.rmtree(self.state, ignore_errors=True)
        shutil.rmtree(self.deploy, ignore_errors=True)
        self.seen_meta.clear()
        r = self.cli("switch", "alpha", "--yes")
        return f"reset: fresh node, switch alpha exited {r.returncode}"


# ---------------------------------------------------------------- one trial


def wait_group(pgid: int, timeout: float) -> float:
    """Wait until no process of the group is left (an orphaned `docker compose` after SIGKILL)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return time.monotonic() - t0
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    return time.monotonic() - t0


def sigint_ignored(pid: int) -> bool:
    """Whether the process ignores SIGINT (SigIgn in /proc/PID/status): SIG_IGN inherited from
    a background shell, where Python installs no KeyboardInterrupt handler."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False  # not on Linux, or gone: cannot tell


def journal_steps(state: Path, since: int, at: float) -> tuple[str, list[str]]:
    """The step the run was in at epoch `at` (its last step-start or undo-start before it; "before
    the steps" while the CLI starts, renders, lints and takes the lock) and its events."""
    path = state / "journal.jsonl"
    if not path.is_file():
        return "before the steps", []
    with path.open("rb") as fh:
        fh.seek(since)
        events = [json.loads(ln) for ln in fh.read().splitlines() if ln.strip()]
    names = [f"{e['event']}:{e.get('step', '')}".rstrip(":") for e in events]
    last = "before the steps"
    for e in events:
        if e["event"] in ("step-start", "undo-start") and float(e["ts"]) <= at:
            last = ("undo " if e["event"] == "undo-start" else "") + str(e["step"])
    return last, names


def advice_of(st: dict[str, Any]) -> str | None:
    inter = st.get("interrupted") or {}
    fix = inter.get("fix") or st.get("fix")
    return str(fix) if fix else None


def commands_in(advice: str) -> list[str]:
    return [m.strip() for m in re.findall(r"b70deploy ((?:resume|rollback|restore|unlock|fsck --repair)(?: \d+)?)",
                                          advice)]


@dataclass(frozen=True)
class Trial:
    seed: int
    index: int

    @property
    def rng(self) -> random.Random:
        return random.Random(f"{self.seed}:{self.index}")

    @property
    def sig(self) -> signal.Signals:
        return SIGNALS[self.index % len(SIGNALS)]

    @property
    def target(self) -> str:
        return "beta" if self.index % 2 == 0 else "alpha"


def run_trial(node: ChaosNode, trial: Trial, typical: float, max_steps: int = 5) -> dict[str, Any]:
    rng = trial.rng
    fraction = rng.random()
    delay = fraction * typical
    source = "alpha" if trial.target == "beta" else "beta"
    prep = None
    if node.serving() != source:  # the trial's direction is fixed by its index (for --replay)
        r = node.cli("switch", source, "--yes")
        prep = f"switch {source} first (exit {r.returncode})"
    journal = node.state / "journal.jsonl"
    offset = journal.stat().st_size if journal.exists() else 0
    proc = subprocess.Popen(node.argv("switch", trial.target, "--yes"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=node.env(), start_new_session=True)
    t0 = time.monotonic()
    time.sleep(max(0.0, delay - (time.monotonic() - t0)))
    exited_before = proc.poll() is not None
    if trial.sig == signal.SIGINT and not exited_before and sigint_ignored(proc.pid):
        raise RuntimeError("the switch ignores SIGINT: the SIGINT trial would not be a Ctrl-C")
    t_sig, epoch_sig = time.monotonic(), time.time()
    if not exited_before:
        if trial.sig == signal.SIGINT:
            os.killpg(proc.pid, trial.sig)  # Ctrl-C: the whole foreground group
        else:
            os.kill(proc.pid, trial.sig)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += "\n[chaos: the switch did not exit within 300 s of the signal; killed]"
    t_exit = time.monotonic()
    orphans = wait_group(proc.pid, 120)
    t_quiet = time.monotonic()
    at_step, events = journal_steps(node.state, offset, epoch_sig)
    summary = next((ln for ln in reversed((out + err).splitlines()) if ln.strip()), "")
    advised, picks, ran, st = follow_advice(node, rng, max_steps)
    t_done = time.monotonic()
    problems = node.check(st)
    if advised and advice_of(st) is not None:
        problems.append(f"still advising after {max_steps} commands: {advice_of(st)}")
    return {
        "seed": trial.seed, "trial": trial.index, "replay": f"{trial.seed}:{trial.index}",
        "signal": trial.sig.name, "from": source, "to": trial.target, "prep": prep,
        "fraction": round(fraction, 4), "delay": round(delay, 3), "typical": round(typical, 3),
        "finished_before_signal": exited_before, "switch_rc": proc.returncode, "switch_said": summary[:300],
        "killed_in": at_step, "journal": events,
        "signal_to_exit": round(t_exit - t_sig, 3), "orphans_waited": round(orphans, 3),
        "advised": advised, "picked": picks, "commands": ran,
        "recovery_seconds": round(t_done - t_quiet, 3), "signal_to_agreement": round(t_done - t_sig, 3),
        "agreement": not problems, "problems": problems,
        "serving_after": node.serving(),
    }


# ---------------------------------------------------------------- disk-full and damaged-store trials


def free_kib(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize // 1024


def fill_to(path: Path, leave_kib: int) -> Path:
    """A filler file under `path` leaving `leave_kib` KiB free (0: to the last byte)."""
    filler = path / f"chaos-filler-{uuid.uuid4().hex[:6]}"
    chunk = bytes(1 << 16)
    with filler.open("wb", buffering=0) as fh:
        while (room := free_kib(path) * 1024 - leave_kib * 1024) > 0:
            try:
                fh.write(chunk[:min(len(chunk), room)])
            except OSError:
                break
    return filler


def follow_advice(node: ChaosNode, rng: random.Random,
                  max_steps: int = 5) -> tuple[list[str], list[str], list[dict[str, Any]], dict[str, Any]]:
    """Run what `status --json` advises, one command at a time, until it advises nothing; where
    it offers two ("resume (finish it) or rollback (undo it)") the trial's RNG picks one.
    Returns the advice, the picks, the commands run and the last status."""
    advised: list[str] = []
    picks: list[str] = []
    ran: list[dict[str, Any]] = []
    st = node.status()
    for _ in range(max_steps):
        advice = advice_of(st)
        if advice is None:
            break
        advised.append(advice)
        options = commands_in(advice)
        if not options:
            break
        cmd = options[0] if len(options) == 1 else rng.choice(options)
        if len(options) > 1:
            picks.append(cmd.split()[0])
        args = cmd.split() + (["--yes"] if cmd.startswith("rollback") else [])
        c0 = time.monotonic()
        r = node.cli(*args)
        ran.append({"command": f"b70deploy {' '.join(args)}", "rc": r.returncode,
                    "seconds": round(time.monotonic() - c0, 3), "said": last_line(r)})
        st = node.status()
    return advised, picks, ran, st


def last_line(r: subprocess.CompletedProcess[str]) -> str:
    return next((ln for ln in reversed((r.stdout + r.stderr).splitlines()) if ln.strip()), "")[:300]


def records_agree(node: ChaosNode, st: dict[str, Any]) -> list[str]:
    """The outside check, less what needs room or a mended store: the node serves what `current`
    names (label, /v1/models, a completion, the deploy dir's bytes by the recorded hashes)."""
    revs = node.state / "revisions"
    cur_text = (revs / "current").read_text().strip() if (revs / "current").is_file() else ""
    if not cur_text.isdigit():
        return [f"no current revision ({cur_text!r})"]
    cur = revs / f"{int(cur_text):06d}"
    try:
        meta = json.loads((cur / "meta.json").read_text())
    except (OSError, ValueError):
        return []  # the trial damaged it: the records name nothing readable to compare with
    stack = str(meta["stack"])
    bad = []
    if node.serving() != stack:
        bad.append(f"vllm serves {node.serving()}, current revision {cur_text} is {stack}")
    elif stack in STACKS:
        names = STACKS[stack][0]
        code, body = http(f"http://127.0.0.1:{node.prod}/v1/models")
        ids = [c.get("id") for c in body.get("data", [])] if code == 200 and isinstance(body, dict) else []
        if ids != names:
            bad.append(f"/v1/models {code}: {ids}, revision {cur_text} serves {names}")
    live = {n: sha256(b) for n, b in tree(node.deploy).items()}
    if live != meta["files"]:
        bad.append(f"deploy dir is not revision {cur_text}'s recorded bytes")
    return bad


def said_full(text: str) -> bool:
    return "is full" in text


def run_disk_trial(node: ChaosNode, index: int, seed: int, typical: float) -> dict[str, Any]:
    rng = random.Random(f"{seed}:disk:{index}")
    during = rng.random() < 0.6
    # Before: a level around what a run needs (about 290 KiB beside the reserve). During: to the
    # last byte, after the CLI's start and plan (~a quarter of a switch), so it lands mid-run.
    leave = 0 if during or rng.random() < 0.3 else rng.randrange(0, 600)
    delay = (0.25 + 0.75 * rng.random()) * typical if during else 0.0
    target = "beta" if node.serving() == "alpha" else "alpha"
    filler: Path | None = None
    t0 = time.monotonic()
    try:
        if not during:
            filler = fill_to(node.state, leave)
        proc = subprocess.Popen(node.argv("switch", target, "--yes"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=node.env(), start_new_session=True)
        if during:
            time.sleep(delay)
            filler = fill_to(node.state, leave)
        out, err = proc.communicate(timeout=300)
        full_at = free_kib(node.state)
        st = node.status()
        immediate = records_agree(node, st)
        ended_pending = [d.name for d in sorted((node.state / "revisions").glob("0*"))
                         if (d / "status.json").is_file() and '"pending"' in (d / "status.json").read_text()]
    finally:
        if filler is not None:
            filler.unlink(missing_ok=True)
    met_full = "No space left" in out + err or "is full" in out + err
    advised, _, ran, st = follow_advice(node, rng)
    problems = node.check(st)
    return {"kind": "disk-full", "trial": index, "replay": f"{seed}:disk:{index}", "to": target,
            "when": "during" if during else "before", "delay": round(delay, 3), "leave_kib": leave,
            "free_kib_after": full_at, "switch_rc": proc.returncode, "switch_said": last_line(
                subprocess.CompletedProcess([], proc.returncode, out, err)),
            "traceback": "Traceback" in out + err, "met_full": met_full,
            "said_full": said_full(out + err), "committed": proc.returncode == 0,
            "serves_records_immediately": not immediate, "immediate_problems": immediate,
            "pending_left": ended_pending, "advised": advised, "commands": ran,
            "agreement": not problems, "problems": problems, "seconds": round(time.monotonic() - t0, 2)}


DAMAGES = ("flip-byte", "truncate-meta", "empty-meta", "truncate-status", "delete-file", "delete-meta",
           "garbage-index")
COMMANDS = ("rollback N", "rollback", "rollback STACK", "switch STACK", "status", "history")


def damage(node: ChaosNode, rng: random.Random, what: str) -> str:
    revs = node.state / "revisions"
    numbers = sorted(int(p.name) for p in revs.iterdir() if p.name.isdigit())
    cur = int((revs / "current").read_text())
    n = cur if rng.random() < 0.5 else rng.choice([x for x in numbers if x != cur] or [cur])
    folder = revs / f"{n:06d}"
    if what == "garbage-index":
        (revs / "index.json").write_bytes(b'{"columns": {"number": [1, 2')
        return "index.json"
    if what in ("flip-byte", "delete-file"):
        files = sorted(p for p in (folder / "files").rglob("*") if p.is_file())
        victim = rng.choice(files)
        if what == "delete-file":
            victim.unlink()
        else:
            data = bytearray(victim.read_bytes())
            at = rng.randrange(len(data))
            data[at] = ord("#") if data[at] != ord("#") else ord("$")
            victim.write_bytes(bytes(data))
        return f"revision {n} ({'current' if n == cur else 'older'}): {what} {victim.relative_to(folder)}"
    record = folder / ("status.json" if what == "truncate-status" else "meta.json")
    if what == "delete-meta":
        record.unlink()
    else:
        head = record.read_bytes()
        record.write_bytes(b"" if what == "empty-meta" else head[:rng.randrange(1, len(head) - 1)])
    return f"revision {n} ({'current' if n == cur else 'older'}): {what}"


def run_damage_trial(node: ChaosNode, index: int, seed: int) -> dict[str, Any]:
    rng = random.Random(f"{seed}:damaged:{index}")
    what, command = rng.choice(DAMAGES), rng.choice(COMMANDS)
    revs = node.state / "revisions"
    if len([p for p in revs.iterdir() if p.name.isdigit()]) < 3:  # an older revision of each stack to aim at
        for stack in ("beta", "alpha"):
            node.cli("switch", stack, "--yes")
    numbers = sorted(int(p.name) for p in revs.iterdir() if p.name.isdigit())
    cur = int((revs / "current").read_text())
    before = {"serving": node.serving(), "live": {n: sha256(b) for n, b in tree(node.deploy).items()}}
    hashes = {n: json.loads((revs / f"{n:06d}" / "meta.json").read_text())["files"] for n in numbers}
    where = damage(node, rng, what)
    other = rng.choice([x for x in numbers if x != cur])
    stack = "alpha" if node.serving() == "beta" else "beta"
    args = {"rollback N": ["rollback", str(other), "--yes"], "rollback": ["rollback", "--yes"],
            "rollback STACK": ["rollback", stack, "--yes"], "switch STACK": ["switch", stack, "--yes"],
            "status": ["status"], "history": ["history"]}[command]
    r = node.cli(*args)
    text = r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    live = {n: sha256(b) for n, b in tree(node.deploy).items()}
    # Wrong deployed: the deploy dir changed to bytes that no revision recorded before the damage.
    wrong = live != before["live"] and live not in hashes.values()
    serving_after = node.serving()
    advised_before = advice_of(node.status())
    rep = node.cli("fsck", "--repair")
    advised, _, ran, st = follow_advice(node, rng)
    problems = node.check(st)
    return {"kind": "damaged", "trial": index, "replay": f"{seed}:damaged:{index}", "damage": where,
            "command": " ".join(args), "rc": r.returncode, "said": last_line(r),
            "traceback": "Traceback" in text, "one_line": r.returncode == 0 or (len(errors) == 1 and "; fix: " in
                                                                                  errors[0]),
            "refused": r.returncode == 2, "wrong_deployed": wrong, "serving_before": before["serving"],
            "serving_after": serving_after, "status_advised": advised_before,
            "damage_kind": what,
            "advised_damaged": where.startswith("revision") and f"rollback {where.split()[1].rstrip(':')} " in
            f"{advised_before or ''} ",
            "fsck_rc": rep.returncode, "fsck_said": last_line(rep), "advised": advised, "commands": ran,
            "agreement": not problems, "problems": problems}


def summarize_kinds(trials: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    disk = [t for t in trials if t.get("kind") == "disk-full"]
    if disk:
        out["disk-full"] = {
            "trials": len(disk), "before": sum(t["when"] == "before" for t in disk),
            "during": sum(t["when"] == "during" for t in disk),
            "committed": sum(t["committed"] for t in disk), "met_full": sum(t["met_full"] for t in disk),
            "said_full_when_met": sum(t["said_full"] for t in disk if t["met_full"]),
            "serves_records_immediately": sum(t["serves_records_immediately"] for t in disk),
            "pending_left": sum(bool(t["pending_left"]) for t in disk),
            "tracebacks": sum(t["traceback"] for t in disk), "agreement": sum(t["agreement"] for t in disk),
            "failures": [{"replay": t["replay"], "problems": t["problems"] or t["immediate_problems"]}
                         for t in disk if not t["agreement"] or not t["serves_records_immediately"]]}
    bad = [t for t in trials if t.get("kind") == "damaged"]
    if bad:
        out["damaged"] = {
            "trials": len(bad), "refused": sum(t["refused"] for t in bad),
            "tracebacks": sum(t["traceback"] for t in bad), "one_line": sum(t["one_line"] for t in bad),
            "wrong_deployed": sum(t["wrong_deployed"] for t in bad),
            "advised_damaged": sum(t["advised_damaged"] for t in bad),
            "agreement": sum(t["agreement"] for t in bad),
            "damages": {d: sum(t["damage_kind"] == d for t in bad) for d in DAMAGES},
            "failures": [{"replay": t["replay"], "damage": t["damage"], "command": t["command"],
                          "problems": t["problems"]} for t in bad if not t["agreement"] or t["traceback"]
                         or not t["one_line"] or t["wrong_deployed"]]}
    return out


def table_kinds(summary: dict[str, Any]) -> str:
    lines = []
    d = summary.get("disk-full")
    if d:
        lines += ["| disk-full trials | filled before / during | committed | met the full disk | said \"is full\" "
                  "(of those) | served what the records name, right after | revision left pending | tracebacks | "
                  "agreement after the advice |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
                  f"| {d['trials']} | {d['before']} / {d['during']} | {d['committed']} | {d['met_full']} | "
                  f"{d['said_full_when_met']} | {d['serves_records_immediately']} | {d['pending_left']} | "
                  f"{d['tracebacks']} | {d['agreement']} |", ""]
    b = summary.get("damaged")
    if b:
        lines += ["| damaged-store trials | refused (exit 2) | one-line output | tracebacks | wrong bytes deployed | "
                  "status advised the damaged revision | agreement after fsck --repair and the advice |",
                  "|---:|---:|---:|---:|---:|---:|---:|",
                  f"| {b['trials']} | {b['refused']} | {b['one_line']} | {b['tracebacks']} | {b['wrong_deployed']} | "
                  f"{b['advised_damaged']} | {b['agreement']} |"]
    return "\n".join(lines)


# ---------------------------------------------------------------- the run


def advice_kind(advice: str) -> str:
    if " or " in advice:
        return "resume or rollback"
    cmds = commands_in(advice)
    return re.sub(r" \d+$", " N", cmds[0]) if cmds else f"other: {advice[:60]}"


STEP_ORDER = ["before the steps", "preflight", "record", "snapshot", "drain", "verify", "activate", "wait-healthy",
              "check", "commit", "companions"]


def step_order(item: tuple[str, int]) -> int:
    name = item[0].removeprefix("undo ")
    return STEP_ORDER.index(name) if name in STEP_ORDER else len(STEP_ORDER)


def summarize(trials: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sig in [s.name for s in SIGNALS]:
        rows = [t for t in trials if t["signal"] == sig]
        advised: dict[str, int] = {}
        for t in rows:
            if not t["advised"]:
                advised["none"] = advised.get("none", 0) + 1
            for a in t["advised"]:
                advised[advice_kind(a)] = advised.get(advice_kind(a), 0) + 1
        picked: dict[str, int] = {}
        for t in rows:
            for p in t["picked"]:
                picked[p] = picked.get(p, 0) + 1
        steps: dict[str, int] = {}
        for t in rows:
            key = "finished before the signal" if t["finished_before_signal"] else str(t["killed_in"])
            steps[key] = steps.get(key, 0) + 1
        agreed = sum(t["agreement"] for t in rows)
        out[sig] = {
            "trials": len(rows), "agreement": agreed,
            "agreement_pct": round(100.0 * agreed / len(rows), 1) if rows else None,
            "finished_before_signal": sum(t["finished_before_signal"] for t in rows),
            "advised": advised, "picked": picked, "killed_in": dict(sorted(steps.items(), key=step_order)),
            "recovery_seconds": stats([t["recovery_seconds"] for t in rows]),
            "signal_to_agreement": stats([t["signal_to_agreement"] for t in rows if t["agreement"]]),
            "failures": [{"replay": t["replay"], "delay": t["delay"], "killed_in": t["killed_in"],
                          "problems": t["problems"]} for t in rows if not t["agreement"]],
        }
    return out


def fmt_stats(s: dict[str, float | int]) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})" if s.get("n") else "–"


def table(summary: dict[str, Any]) -> str:
    lines = ["| signal | trials | landed mid-switch (in step ×n) | recovered to agreement | status advised (count) | "
             "resume / rollback picked | recovery: status + advised commands, s, median (min–max) | "
             "signal → agreement, s |",
             "|---|---:|---|---:|---|---|---:|---:|"]
    for sig, s in summary.items():
        if not s["trials"]:
            continue
        adv = ", ".join(f"{k} ×{v}" for k, v in sorted(s["advised"].items(), key=lambda kv: -kv[1]))
        pick = ", ".join(f"{k} ×{v}" for k, v in sorted(s["picked"].items())) or "–"
        mid = s["trials"] - s["finished_before_signal"]
        where = ", ".join(f"{k} ×{v}" for k, v in s["killed_in"].items() if k != "finished before the signal")
        lines.append(f"| {sig} | {s['trials']} | {mid} ({where}) | {s['agreement']} ({s['agreement_pct']:g} %) | "
                     f"{adv} | {pick} | {fmt_stats(s['recovery_seconds'])} | "
                     f"{fmt_stats(s['signal_to_agreement'])} |")
    return "\n".join(lines)


def measure_typical(node: ChaosNode, runs: int) -> tuple[float, list[float]]:
    walls: list[float] = []
    for i in range(runs):
        stack = "beta" if node.serving() == "alpha" else "alpha"
        t0 = time.monotonic()
        r = node.cli("switch", stack, "--yes")
        walls.append(time.monotonic() - t0)
        if r.returncode != 0:
            raise RuntimeError(f"clean switch {stack} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        log(f"clean switch {i + 1}/{runs} to {stack}: {walls[-1]:.2f} s")
    return statistics.median(walls), walls


def run(args: argparse.Namespace, result: dict[str, Any]) -> None:
    node = ChaosNode(Path(tempfile.mkdtemp(prefix="b70chaos-")), uuid.uuid4().hex[:8], args.boot,
                     small_state=args.disk_full > 0)
    started = time.monotonic()
    try:
        node.setup()
        log(f"node {node.project} in {node.root}; seed {args.seed}")
        r = node.cli("switch", "alpha", "--yes")
        if r.returncode != 0:
            raise RuntimeError(f"warm-up switch failed:\n{r.stdout}\n{r.stderr}")
        walls: list[float] = []
        if args.typical:
            typical = float(args.typical)
        else:
            typical, walls = measure_typical(node, args.measure)
        result.update(typical_seconds=round(typical, 3), clean_switches=[round(w, 3) for w in walls])
        log(f"typical switch: {typical:.2f} s; delays uniform over [0, {typical:.2f}) s")
        indices = [args.replay[1]] if args.replay else list(range(args.trials))
        for i in indices:
            if time.monotonic() - started > args.max_minutes * 60:
                log(f"--max-minutes {args.max_minutes:g} reached after {len(result['trials'])} trials")
                result["stopped_early"] = True
                break
            t = run_trial(node, Trial(args.seed, i), typical)
            result["trials"].append(t)
            where = "before the signal" if t["finished_before_signal"] else f"in {t['killed_in']}"
            log(f"trial {i} {t['signal']} at {t['delay']:.2f} s ({where}), {t['from']}->{t['to']}: "
                f"advised {[advice_kind(a) for a in t['advised']] or 'nothing'}"
                f"{' picked ' + ','.join(t['picked']) if t['picked'] else ''}; "
                + ("agreement" if t["agreement"] else f"NOT IN AGREEMENT: {t['problems']}")
                + f" (recovery {t['recovery_seconds']:.1f} s)")
            if not t["agreement"]:
                t["reset"] = node.reset()
                log(t["reset"])
        for kind, count in (("disk-full", args.disk_full), ("damaged", args.damaged)):
            for i in range(count):
                if time.monotonic() - started > args.max_minutes * 60:
                    result["stopped_early"] = True
                    break
                t = run_disk_trial(node, i, args.seed, typical) if kind == "disk-full" else \
                    run_damage_trial(node, i, args.seed)
                result["trials"].append(t)
                log(f"{kind} trial {i}: " + json.dumps({k: t[k] for k in t if k not in ("commands", "advised")})[:400])
                if not t["agreement"]:
                    t["reset"] = node.reset()
                    log(t["reset"])
    finally:
        log("cleaning up")
        node.cleanup()
        result["minutes"] = round((time.monotonic() - started) / 60, 2)


def replay_spec(text: str) -> tuple[int, int]:
    seed, _, trial = text.partition(":")
    return int(seed), int(trial)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--trials", type=int, default=60, help="trials; signals cycle KILL, TERM, INT (default 60)")
    p.add_argument("--seed", type=int, default=None, help="RNG seed (default: random, printed)")
    p.add_argument("--replay", type=replay_spec, metavar="SEED:TRIAL", help="run one trial of an earlier run again")
    p.add_argument("--typical", type=float, help="the typical switch duration to draw delays over (default: measure)")
    p.add_argument("--measure", type=int, default=3, help="clean switches to measure the typical duration (default 3)")
    p.add_argument("--boot", type=float, default=0.6, help="sim boot delay, B70SIM_BOOT_SECONDS (default 0.6)")
    p.add_argument("--max-minutes", type=float, default=45, help="stop starting trials after this (default 45)")
    p.add_argument("--disk-full", type=int, default=0, metavar="N",
                   help="disk-full trials after the signal ones (the state dir on a tmpfs: root)")
    p.add_argument("--damaged", type=int, default=0, metavar="N", help="damaged-store trials after those")
    p.add_argument("--json", type=Path, help="write every trial and the summary here")
    p.add_argument("--table", type=Path, metavar="JSON", help="print the table of an earlier results file, and exit")
    args = p.parse_args(argv)
    if args.table:
        trials = json.loads(args.table.read_text())["trials"]
        print(table(summarize([t for t in trials if "kind" not in t])))
        print(table_kinds(summarize_kinds(trials)))
        return 0
    # Started in the background by a shell without job control, this process (and so every
    # switch it starts) would ignore SIGINT, and Python installs no KeyboardInterrupt handler
    # for an ignored SIGINT: the SIGINT trials would then only reach the `docker compose`
    # children. A handler (not SIG_IGN) here is reset to the default at exec, so each switch
    # gets Python's own Ctrl-C handling.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.replay:
        args.seed = args.replay[0]
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 2**31)
    log(f"seed {args.seed}")
    result: dict[str, Any] = {"seed": args.seed, "argv": sys.argv[1:], "boot_seconds": args.boot,
                              "signals": {"SIGKILL": "kill -9 PID", "SIGTERM": "kill PID",
                                          "SIGINT": "killpg (Ctrl-C: the group)"},
                              "trials": []}
    code = 0
    try:
        with interrupts.installed():
            run(args, result)
    except KeyboardInterrupt:
        log("interrupted; everything created was removed")
        code = 130
    result["summary"] = summarize([t for t in result["trials"] if "kind" not in t])
    result["summary_kinds"] = summarize_kinds(result["trials"])
    print(f"seed {args.seed}; {len(result['trials'])} trials")
    if any(s["trials"] for s in result["summary"].values()):
        print(table(result["summary"]))
    print(table_kinds(result["summary_kinds"]))
    for s in result["summary"].values():
        for f in s["failures"]:
            print(f"FAILED {f['replay']} (delay {f['delay']} s, in {f['killed_in']}): {f['problems']}")
    for s in result["summary_kinds"].values():
        for f in s["failures"]:
            print(f"FAILED {json.dumps(f)[:600]}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        log(f"wrote {args.json}")
    return code


if __name__ == "__main__":
    sys.exit(main())
