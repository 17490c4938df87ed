"""The sim's sleep mode and GPU memory model, against vLLM's source (cited in b70deploy/sim/server.py)
and the real CPU builds' crash logs."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from b70deploy.sim import server as sim
from b70deploy.vllmlog.diagnosis import diagnose

FIXTURES = Path(__file__).parents[1] / "fixtures"
FAST = {"B70SIM_BOOT_SECONDS": "0", "B70SIM_DECODE_TPS": "200", "B70SIM_PREFILL_TPS": "10000",
        "B70SIM_BATCH_ALPHA": "0", "B70SIM_SLEEP_SECONDS": "0", "B70SIM_WAKE_SECONDS": "0"}
ARGV = ["/models/Qwen3-0.6B", "--max-model-len", "4096", "--enforce-eager", "--host", "127.0.0.1"]


def plan(argv: list[str], env: dict[str, str], version: str = "0.21.1.dev17+g0a4756bb5",
         gpu_free: tuple[int, int] | None = None) -> sim.BootPlan:
    knobs = sim.Knobs.from_env(env)
    return sim.plan_boot(sim.parse_serve_args(argv), knobs, sim.ImageFacts(version, False, False), None,
                         gpu_free=gpu_free)


@pytest.mark.parametrize(("platform", "version", "ok"), [
    ("cuda", "0.21.0", True), ("rocm", "0.21.0", True), ("xpu", "0.21.1.dev17+g0a4756bb5", False),
    ("xpu", "0.32.0", True), ("xpu", "0.23.0", True), ("xpu", "0.22.1", False), ("cpu", "0.32.0", False),
    ("cpu", "0.21.0", False)])
def test_sleep_mode_availability_follows_the_platform_rule(platform: str, version: str, ok: bool) -> None:
    assert sim.sleep_mode_available(platform, version) is ok
    p = plan([*ARGV, "--enable-sleep-mode"], {"B70SIM_PLATFORM": platform}, version)
    assert (p.outcome == "serve") is ok


@pytest.mark.parametrize("release", ["0.21.0", "0.32.0"])
def test_refusal_reads_like_the_real_cpu_crash(release: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The sim's start-up refusal ends as the real CPU build's log does, and the diagnosis reads both alike."""
    env = {**FAST, "B70SIM_PLATFORM": "cpu", "B70SIM_VERSION": release}
    assert sim.serve([*ARGV, "--port", "0", "--enable-sleep-mode"], env) == 1
    out = capsys.readouterr()
    lines = (out.out + out.err).splitlines()
    real = (FIXTURES / f"vllm-{release}-cpu" / "crash-sleep-mode.log").read_text().splitlines()
    tail = [ln for ln in real if "ValidationError" in ln or "Value error" in ln or "For further" in ln]
    ours = [ln for ln in lines if "ValidationError" in ln or "Value error" in ln or "For further" in ln]
    strip = re.compile(r"input_value=.*?, input_type|pid=\d+")
    assert [strip.sub("", x) for x in ours] == [strip.sub("", x) for x in tail]
    assert any("'enable_sleep_mode': True" in ln for ln in lines)
    d_sim, d_real = diagnose(lines), diagnose(real)
    assert d_sim is not None and d_real is not None
    assert d_sim.data["value_errors"] == d_real.data["value_errors"] == [sim.SLEEP_MODE_ERROR]
    assert d_sim.data["flag"] == "--enable-sleep-mode"


def test_bad_platform_knob_is_refused() -> None:
    with pytest.raises(ValueError, match="B70SIM_PLATFORM='tpu' is unknown"):
        sim.Knobs.from_env({"B70SIM_PLATFORM": "tpu"})


def test_memory_message_is_request_memorys() -> None:
    total = 32 * sim.GIB
    assert sim.memory_error("xpu:0", total, total, 0.92) is None
    msg = sim.memory_error("xpu:0", 3 * sim.GIB, total, 0.9)
    assert msg == ("ValueError: Free memory on device xpu:0 (3.0/32.0 GiB) on startup is less than desired GPU "
                   "memory utilization (0.9, 28.8 GiB). Decrease GPU memory utilization or reduce GPU memory "
                   "used by other processes.")
    p = plan(ARGV, {"B70SIM_PLATFORM": "cuda"}, gpu_free=(3 * sim.GIB, total))
    assert p.outcome == "crash" and p.engine_crash and "device cuda:0 (3.0/32.0 GiB)" in p.traceback[-2]
    assert "Starting to load model" not in " ".join(m for _, _, m, _, _ in p.lines)  # init_device comes first


def test_held_bytes_model() -> None:
    req, asleep = 29 * sim.GIB, sim.GIB
    assert sim.held_bytes(req, asleep, frozenset()) == req
    assert sim.held_bytes(req, asleep, sim.SLEEP_TAGS) == asleep
    weights_back = sim.held_bytes(req, asleep, frozenset({"kv_cache"}))
    assert weights_back == asleep + int(sim.WEIGHTS_GIB * sim.GIB)


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Any]:
    """Start sim servers in threads on loopback; every one is shut down at the end."""
    started: list[tuple[Any, threading.Thread]] = []

    def start(env: dict[str, str], *extra: str) -> tuple[str, list[int]]:
        ready = threading.Event()
        box: dict[str, Any] = {}
        result: list[int] = []

        def on_ready(httpd: sim.Server) -> None:
            box["httpd"] = httpd
            ready.set()

        argv = [*ARGV, "--port", "0", *extra]
        thread = threading.Thread(target=lambda: result.append(sim.serve(argv, {**FAST, **env}, on_ready)),
                                  daemon=True)
        thread.start()
        while not ready.wait(0.1):
            if not thread.is_alive():
                return "", result  # it exited during start-up
        started.append((box["httpd"], thread))
        return f"http://127.0.0.1:{box['httpd'].server_address[1]}", result

    yield start
    for httpd, thread in started:
        httpd.shutdown()
        thread.join(10)


def _complete(url: str, timeout: float = 10) -> requests.Response:
    return requests.post(f"{url}/v1/completions", timeout=timeout,
                         json={"prompt": "The capital of France is", "max_tokens": 4})


def test_dev_routes_only_in_dev_mode(serving: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = serving({"B70SIM_PLATFORM": "cuda"}, "--enable-sleep-mode")
    for method, path in (("GET", "/is_sleeping"), ("POST", "/sleep"), ("POST", "/wake_up")):
        assert requests.request(method, url + path, timeout=5).status_code == 404
    assert "SECURITY WARNING" not in capsys.readouterr().out


def test_sleep_and_wake_as_vllm_021(serving: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = serving({"B70SIM_PLATFORM": "cuda", "VLLM_SERVER_DEV_MODE": "1"}, "--enable-sleep-mode")
    boot = capsys.readouterr().out
    assert ("WARNING" in boot and "[__init__.py:14] SECURITY WARNING: Development endpoints are enabled! This should "
            "NOT be used in production!" in boot)
    assert "Route: /sleep, Methods: POST" in boot and "Route: /is_sleeping, Methods: GET" in boot
    assert requests.get(f"{url}/is_sleeping", timeout=5).json() == {"is_sleeping": False}
    r = requests.post(f"{url}/sleep?level=1&mode=abort", timeout=10)
    assert r.status_code == 200 and r.content == b""
    assert requests.get(f"{url}/is_sleeping", timeout=5).json() == {"is_sleeping": True}
    log = capsys.readouterr().out
    assert re.search(r"\(Worker pid=\d+\) INFO .* \[gpu_worker\.py:178\] Sleep mode freed 27\.47 GiB memory, 1\.97 GiB "
                     r"memory is still in use\.", log), log
    assert re.search(r"\(EngineCore pid=\d+\) INFO .* \[abstract\.py:331\] It took \d+\.\d{6} seconds to fall "
                     r"asleep\.", log)
    assert requests.post(f"{url}/sleep?level=1", timeout=10).status_code == 200
    assert "[abstract.py:324] Executor is already sleeping." in capsys.readouterr().out
    # Asleep, a completion waits in the queue; it runs once the engine wakes.
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_complete, url, 30)
        metrics = ""
        for _ in range(100):
            metrics = requests.get(f"{url}/metrics", timeout=5).text
            if re.search(r"vllm:num_requests_waiting\{[^}]*\} 1\.0", metrics):
                break
            threading.Event().wait(0.05)
        assert re.search(r"vllm:num_requests_waiting\{[^}]*\} 1\.0", metrics)
        assert not waiting.done()
        r = requests.post(f"{url}/wake_up", timeout=10)
        assert r.status_code == 200 and r.content == b""
        done = waiting.result(30)
    assert done.status_code == 200 and "Paris" in done.json()["choices"][0]["text"]
    log = capsys.readouterr().out
    assert "[api_router.py:39] wake up the engine with tags: None" in log
    assert re.search(r"\[abstract\.py:349\] It took \d+\.\d{6} seconds to wake up tags \{'(weights|kv_cache)', "
                     r"'(weights|kv_cache)'\}\.", log)
    assert requests.get(f"{url}/is_sleeping", timeout=5).json() == {"is_sleeping": False}
    assert requests.post(f"{url}/wake_up", timeout=10).status_code == 200
    assert "[abstract.py:337] Executor is not sleeping." in capsys.readouterr().out


def test_wake_by_tags_and_level_0(serving: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = serving({"B70SIM_PLATFORM": "rocm", "VLLM_SERVER_DEV_MODE": "1"}, "--enable-sleep-mode")
    assert requests.post(f"{url}/sleep?level=0", timeout=10).status_code == 200
    assert requests.get(f"{url}/is_sleeping", timeout=5).json() == {"is_sleeping": True}  # paused only
    assert "fall asleep" not in capsys.readouterr().out
    assert requests.post(f"{url}/wake_up?tags=scheduling", timeout=10).status_code == 200
    assert requests.get(f"{url}/is_sleeping", timeout=5).json() == {"is_sleeping": False}
    requests.post(f"{url}/sleep", timeout=10)
    requests.post(f"{url}/wake_up?tags=weights", timeout=10)
    assert "wake up tags ['weights']." in capsys.readouterr().out
    assert requests.get(f"{url}/is_sleeping", timeout=5).json() == {"is_sleeping": True}  # kv_cache still asleep
    requests.post(f"{url}/wake_up?tags=weights", timeout=10)
    assert "Tag weights is not in sleeping tags {'kv_cache'}" in capsys.readouterr().out
    requests.post(f"{url}/wake_up?tags=kv_cache", timeout=10)
    assert requests.get(f"{url}/is_sleeping", timeout=5).json() == {"is_sleeping": False}


def test_level_2_wake_without_weights_generates_token_id_0(serving: Any) -> None:
    """As real vLLM 0.24.0 did on the GPU lane (tests/fixtures/vllm-0.24.0-cuda/results-cycle-h100.json)."""
    url, _ = serving({"B70SIM_PLATFORM": "cuda", "VLLM_SERVER_DEV_MODE": "1"}, "--enable-sleep-mode")
    assert "Paris" in _complete(url).json()["choices"][0]["text"]
    requests.post(f"{url}/sleep?level=2", timeout=10)
    requests.post(f"{url}/wake_up", timeout=10)
    r = _complete(url)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "!!!!"


def test_032_answers_json_and_checks_the_level(serving: Any) -> None:
    url, _ = serving({"B70SIM_PLATFORM": "xpu", "B70SIM_VERSION": "0.32.0", "VLLM_SERVER_DEV_MODE": "1"},
                     "--enable-sleep-mode")
    assert requests.post(f"{url}/sleep?level=3", timeout=10).status_code == 422
    assert requests.post(f"{url}/sleep?level=1", timeout=10).json() == {"status": "sleeping", "level": 1}
    assert requests.post(f"{url}/wake_up?tags=weights", timeout=10).json() == {"status": "sleeping",
                                                                               "tags": ["weights"]}
    assert requests.post(f"{url}/wake_up", timeout=10).json() == {"status": "awake", "tags": None}


def test_a_second_stack_that_does_not_fit_fails_like_vllm(serving: Any, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Two processes on one ledger: the second fails vLLM's start-up check while the first is awake and
    boots once the first sleeps; each one's line goes when it stops."""
    ledger = tmp_path / "gpu" / "ledger.json"
    env = {"B70SIM_PLATFORM": "xpu", "B70SIM_VERSION": "0.32.0", "VLLM_SERVER_DEV_MODE": "1",
           "B70SIM_GPU_LEDGER": str(ledger), "B70SIM_GPU_MEMORY_GIB": "32", "B70SIM_ASLEEP_GIB": "1.5"}
    first, _ = serving(env, "--enable-sleep-mode", "--gpu-memory-utilization", "0.6")
    held = json.loads(ledger.read_text())["holders"]
    assert list(held.values()) == [sim.requested_bytes(32 * sim.GIB, 0.6)]
    capsys.readouterr()
    url, result = serving(env, "--gpu-memory-utilization", "0.6")
    assert url == "" and result == [1]
    out = capsys.readouterr()
    log = out.out + out.err
    assert ("ValueError: Free memory on device xpu:0 (12.8/32.0 GiB) on startup is less than desired GPU memory "
            "utilization (0.6, 19.2 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
            "processes.") in log
    assert "EngineCore failed to start." in log
    assert len(json.loads(ledger.read_text())["holders"]) == 1  # the failed one registered nothing
    requests.post(f"{first}/sleep?level=1", timeout=10)
    assert list(json.loads(ledger.read_text())["holders"].values()) == [int(1.5 * sim.GIB)]
    second, _ = serving(env, "--gpu-memory-utilization", "0.6")
    assert second and "Paris" in _complete(second).json()["choices"][0]["text"]
    assert sorted(json.loads(ledger.read_text())["holders"].values()) == sorted(
        [int(1.5 * sim.GIB), sim.requested_bytes(32 * sim.GIB, 0.6)])
