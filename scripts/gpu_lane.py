"""The GPU lane's driver, run on the lent GPU machine (scripts/gpu_lane.sh): real vLLM serving a
random-weights Qwen3 model, and the tool's own code against it.

    python scripts/gpu_lane.py cycle --model DIR --out DIR      # boot, sleep/wake, smoke, bench, capture/replay
    python scripts/gpu_lane.py boots --model DIR --out DIR -n 2 # more cold boots (empty compile cache)

Everything measured goes through b70deploy's functions: docker/sleepmode.py (sleep, the wake its level
needs, the /is_sleeping wait: what hot standby runs on a slot's port), docker/smoke.py (the completion
smoke test, which also judges the text), docker/garbage.py, docker/probe.py (GET /health),
vllmlog/bootlog.py and vllmlog/diagnosis.py (the server's own log), and the `b70deploy bench`,
`capture` and `replay` commands. Results go to OUT/results-<phase>.json, the server logs beside them.

B70_GPU_SERVE replaces the server's command (default: this Python's `-m vllm.entrypoints.cli.main`):
`B70_GPU_SERVE="python3 -m b70deploy.sim.server" B70SIM_PLATFORM=cuda` runs the same lane on the
simulator, on any machine (tests/sim/test_gpu_lane_on_sim.py).

A "good completion" is the model's answer to the smoke prompt before any sleep: the weights are
random, so the text is nonsense, but the same nonsense every time (temperature 0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from b70deploy.config.schema import Stack
from b70deploy.docker import sleepmode
from b70deploy.docker.garbage import garbage_reason
from b70deploy.docker.probe import probe_health
from b70deploy.docker.smoke import run_smoke
from b70deploy.vllmlog.bootlog import parse_boot_facts
from b70deploy.vllmlog.diagnosis import diagnose

PORT = 8000
URL = f"http://127.0.0.1:{PORT}"
NAME = "lane"
PROMPTS = ["The capital of France is", "Once upon a time", "def main():", "Quiet mornings by the sea"]
# Longer than one KV block (16 tokens): vLLM caches full blocks only, so this one is what a stale prefix
# cache can serve back.
LONG = " ".join(["The tool stops the old stack, starts the new one, and waits for health."] * 4)
COMPILE_CACHE = Path.home() / ".cache" / "vllm"
BOOT_WAIT = 600.0
CYCLES = 3


def log(msg: str) -> None:
    print(f"[gpu-lane {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- the server

class Server:
    def __init__(self, model: Path, log_path: Path, extra: list[str] | None = None) -> None:
        self.model, self.log_path, self.extra = model, log_path, extra or []
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start vLLM and wait for GET /health 200; seconds from the exec to that answer."""
        serve = os.environ.get("B70_GPU_SERVE", "").split() or [sys.executable, "-m", "vllm.entrypoints.cli.main"]
        argv = [*serve, "serve", str(self.model), "--port", str(PORT),
                "--served-model-name", NAME, "--enable-sleep-mode", *self.extra]
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0",
               "PYTHONUNBUFFERED": "1"}
        out = self.log_path.open("ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,  # noqa: S603 - argv list
                                     start_new_session=True)
        while time.monotonic() - t0 < BOOT_WAIT:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited {self.proc.returncode} during boot; see {self.log_path}")
            if probe_health(f"{URL}/health", timeout=2.0) == 200:
                return time.monotonic() - t0
            time.sleep(0.2)
        raise RuntimeError(f"vLLM did not answer /health within {BOOT_WAIT:g} s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def gpu_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return int(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def complete(prompt: str, max_tokens: int = 12) -> str:
    r = requests.post(f"{URL}/v1/completions", json={"model": NAME, "prompt": prompt, "max_tokens": max_tokens,
                                                      "temperature": 0}, timeout=120)
    r.raise_for_status()
    return str(r.json()["choices"][0]["text"])


def detokenize(ids: list[int]) -> str | None:
    """The text of these token ids (vLLM's POST /detokenize), None where the server has no such route."""
    r = requests.post(f"{URL}/detokenize", json={"model": NAME, "tokens": ids}, timeout=30)
    return str(r.json()["prompt"]) if r.status_code == 200 else None


def smoke_stack(prompt: str, expect: str) -> Stack:
    return Stack.model_validate({
        "name": "gpu-lane", "image": "vllm/vllm-openai:v0.24.0", "model": {"path": "model", "architecture": "dense"},
        "served_model_names": [NAME], "max_model_len": 4096,
        "smoke": {"completion": {"prompt": prompt, "expect": expect, "max_tokens": 12}, "aliases": True}})


def first_good(stack: Stack, t0: float, wait: float = 120.0) -> tuple[float, list[str]]:
    """Seconds from t0 to the first smoke pass (the completion the model gave before any sleep)."""
    failed: list[str] = []
    while time.monotonic() - t0 < wait:
        passed, failed = run_smoke(URL, stack, timeout=60)
        if not failed:
            return time.monotonic() - t0, passed
        time.sleep(0.05)
    raise RuntimeError(f"no good completion within {wait:g} s: {failed}")


def summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def b70(args: list[str], out: Path, name: str) -> dict[str, Any]:
    """One `b70deploy` command (the tool's own CLI), its output kept; the JSON document it prints."""
    proc = subprocess.run([sys.executable, "-m", "b70deploy.cli", *args],  # noqa: S603 - argv list
                          capture_output=True, text=True, timeout=600)
    (out / f"{name}.txt").write_text(f"$ b70deploy {' '.join(args)}\nexit {proc.returncode}\n"
                                     f"{proc.stdout}\n{proc.stderr}")
    try:
        doc: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = {}
    return {"exit": proc.returncode, "doc": doc}


# ---------------------------------------------------------------- phases

def cycle(model: Path, out: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"gpu": gpu_name(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    shutil.rmtree(COMPILE_CACHE, ignore_errors=True)
    server = Server(model, out / "vllm-cycle.log")
    try:
        res["boot_s"] = server.start()
        log(f"cold boot (empty compile cache): {res['boot_s']:.1f} s")
        res["version"] = requests.get(f"{URL}/version", timeout=10).json().get("version")
        res["token_0"] = detokenize([0])
        res["gpu_mib_awake"] = gpu_mib()
        # The smoke prompt: one whose answer is not the token-0 text (that would pass a broken server).
        prompt, ref = next((p, t) for p in PROMPTS if (t := complete(p)).strip()
                           and t.strip(res["token_0"] or "") != "" and complete(p) == t)
        res["smoke_prompt"], res["reference"] = prompt, ref
        res["reference_long"] = ref_long = complete(LONG)
        stack = smoke_stack(prompt, ref)
        passed, failed = run_smoke(URL, stack)
        res["smoke_awake"] = {"passed": passed, "failed": failed}
        log(f"reference completion {ref!r}; smoke {passed} {failed}")

        for level in (1, 2):
            rows = []
            for i in range(CYCLES):
                t = time.monotonic()
                sleepmode.sleep(URL, level)
                slept = time.monotonic() - t
                asleep_mib = gpu_mib()
                said = sleepmode.sleep_level(URL)
                t0 = time.monotonic()
                found = sleepmode.wake(URL)
                woken = time.monotonic() - t0
                good, passed = first_good(stack, t0)
                rows.append({"sleep_s": slept, "asleep_gpu_mib": asleep_mib, "metrics_level": said,
                             "wake_level": found, "wake_s": woken, "first_good_s": good, "smoke": passed})
                log(f"level {level} #{i + 1}: sleep {slept:.2f} s, asleep {asleep_mib} MiB, metrics level {said}, "
                    f"woken as level {found} in {woken:.2f} s, first good completion {good:.2f} s")
            res[f"level{level}"] = {"cycles": rows, "wake_s": summary([r["wake_s"] for r in rows]),
                                    "first_good_s": summary([r["first_good_s"] for r in rows]),
                                    "sleep_s": summary([r["sleep_s"] for r in rows])}

        res["level2_bare_wake"] = bare_wake(stack, prompt, ref_long)
        res["asleep_request"] = asleep_request(prompt, ref)
        res["gpu_mib_awake_end"] = gpu_mib()
        res["bench"] = bench(out)
    finally:
        server.stop()
    lines = (out / "vllm-cycle.log").read_text(errors="replace").splitlines()
    res["boot_facts"] = parse_boot_facts(lines).to_dict()
    found = diagnose(lines)
    res["diagnosis"] = None if found is None else found.one_line()
    return res


def bare_wake(stack: Stack, prompt: str, ref_long: str) -> dict[str, Any]:
    """Level 2 woken with one POST /wake_up: what the tool did before; the smoke test must fail it.
    Then reload_weights alone, then the prefix cache reset: which of them brings the answers back."""
    sleepmode.sleep(URL, 2)
    t0 = time.monotonic()
    sleepmode.post(URL, "/wake_up")
    sleepmode.until(URL, False)
    got: dict[str, Any] = {"wake_s": time.monotonic() - t0, "health": probe_health(f"{URL}/health")}
    passed, failed = run_smoke(URL, stack)
    text = complete(prompt)
    got.update(smoke_passed=passed, smoke_failed=failed, text=text, judge=garbage_reason(text),
               only_token_0=text != "" and text.strip(res_token_0 := detokenize([0]) or "!") == "",
               token_0=res_token_0)
    got["long_broken"] = complete(LONG)  # its full blocks now sit in the prefix cache, computed by no weights
    sleepmode.post(URL, "/collective_rpc", sleepmode.RELOAD)
    got["after_reload"] = complete(prompt)
    got["after_reload_long"] = complete(LONG)
    got["after_reload_long_matches_reference"] = got["after_reload_long"] == ref_long
    sleepmode.post(URL, "/reset_prefix_cache")
    got["after_reset_long"] = complete(LONG)
    got["after_reset_long_matches_reference"] = got["after_reset_long"] == ref_long
    got["smoke_after_reset"] = run_smoke(URL, stack)
    log(f"level 2, bare /wake_up: {text!r} judged {got['judge']!r}; smoke failed {failed}; after reload "
        f"{got['after_reload']!r}, long prompt as before: {got['after_reload_long_matches_reference']}; "
        f"after the prefix reset: {got['after_reset_long_matches_reference']}")
    return got


def asleep_request(prompt: str, ref: str) -> dict[str, Any]:
    """A completion sent while the server sleeps (level 1): refused, or held until the wake?"""
    import threading
    sleepmode.sleep(URL, 1)
    box: dict[str, Any] = {}

    def send() -> None:
        t = time.monotonic()
        try:
            box["text"] = complete(prompt)
        except requests.RequestException as e:
            box["error"] = str(e)
        box["done_at"] = time.monotonic() - t

    th = threading.Thread(target=send)
    th.start()
    time.sleep(2.0)
    metrics = requests.get(f"{URL}/metrics", timeout=10).text
    waiting = [ln for ln in metrics.splitlines() if ln.startswith(("vllm:num_requests_waiting{",
                                                                    "vllm:engine_sleep_state{"))]
    health = probe_health(f"{URL}/health")
    t0 = time.monotonic()
    sleepmode.wake(URL)
    th.join(timeout=120)
    return {"health_asleep": health, "metrics_asleep": waiting, "finished_s_after_send": box.get("done_at"),
            "wake_started_s_after_send": 2.0, "text_matches_reference": box.get("text") == ref,
            "error": box.get("error"), "wake_s": time.monotonic() - t0}


def bench(out: Path) -> dict[str, Any]:
    common = ["--endpoint", URL, "--ctx", "1024", "--n-prompts", "3", "--json", "-q"]
    got: dict[str, Any] = {}
    for metric, extra in (("prefill", []), ("decode", ["--max-tokens", "64"]),
                          ("aggregate", ["-c", "8", "--max-tokens", "64"])):
        run = b70(["bench", "--metric", metric, *extra, *common, "--output", str(out / f"bench-{metric}.json")],
                  out, f"bench-{metric}")
        got[metric] = {"exit": run["exit"], "result": run["doc"].get("result")}
    cap = out / "capture"
    proxy = subprocess.Popen([sys.executable, "-m", "b70deploy.cli", "capture",  # noqa: S603 - argv list
                              "--listen", "127.0.0.1:8010", "--upstream", URL, "--dir", str(cap)],
                             stdout=subprocess.DEVNULL, stderr=(out / "capture.txt").open("w"))
    try:
        for _ in range(100):
            if probe_health("http://127.0.0.1:8010/health") is not None:
                break
            time.sleep(0.1)
        through = b70(["bench", "--metric", "decode", "--max-tokens", "32", "--endpoint", "http://127.0.0.1:8010",
                       "--ctx", "512", "--n-prompts", "3", "--json", "-q",
                       "--output", str(out / "bench-through-capture.json")], out, "bench-through-capture")
    finally:
        proxy.send_signal(signal.SIGINT)
        proxy.wait(timeout=30)
    replay = b70(["replay", str(cap), "--endpoint", URL, "--json", "-q", "--output", str(out / "replay.json")],
                 out, "replay")
    got["capture"] = {"bench_exit": through["exit"], "records": sum(1 for f in cap.glob("*") for _ in f.open())
                      if cap.exists() else 0}
    got["replay"] = {"exit": replay["exit"], "outcomes": replay["doc"].get("outcomes"),
                     "result": replay["doc"].get("result")}
    return got


def boots(model: Path, out: Path, n: int) -> dict[str, Any]:
    rows = []
    for i in range(n):
        shutil.rmtree(COMPILE_CACHE, ignore_errors=True)
        server = Server(model, out / f"vllm-boot{i + 2}.log")
        try:
            took = server.start()
        finally:
            server.stop()
        rows.append(took)
        log(f"cold boot {i + 2} (empty compile cache): {took:.1f} s")
    return {"boot_s": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("phase", choices=["cycle", "boots"])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("-n", type=int, default=2)
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    res = cycle(a.model, a.out) if a.phase == "cycle" else boots(a.model, a.out, a.n)
    (a.out / f"results-{a.phase}.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    log(f"wrote {a.out / f'results-{a.phase}.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
