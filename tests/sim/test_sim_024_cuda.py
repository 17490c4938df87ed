"""The sim as vLLM 0.24.0 on CUDA, held against the real logs of that version (tests/fixtures/
vllm-0.24.0-cuda/): every line it prints must be one the real server printed (numbers aside), and its
level 2 behaves as the real one on the GPU lane: token id 0 after a bare /wake_up, served right after the
documented wake (docker/sleepmode.py)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from b70deploy.config.schema import Stack
from b70deploy.docker import sleepmode
from b70deploy.docker.garbage import garbage_reason
from b70deploy.docker.smoke import one_completion, run_smoke
from b70deploy.sim import server as sim

REAL = Path(__file__).parents[1] / "fixtures" / "vllm-0.24.0-cuda"
ENV = {"B70SIM_VERSION": "0.24.0", "B70SIM_PLATFORM": "cuda", "VLLM_SERVER_DEV_MODE": "1",
       "B70SIM_BOOT_SECONDS": "0", "B70SIM_DECODE_TPS": "500", "B70SIM_PREFILL_TPS": "100000",
       "B70SIM_SLEEP_SECONDS": "0", "B70SIM_WAKE_SECONDS": "0", "B70SIM_RELOAD_SECONDS": "0",
       "B70SIM_KV_TOKENS": "814512"}
MODEL = "/tmp/model"  # the path the H200 run served; the lane's /tmp/gl/model is read as the same
LONG = " ".join(["The tool stops the old stack, starts the new one, and waits for health."] * 4)


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Any]:
    """A sim server in a thread on loopback, as vLLM 0.24.0 on CUDA; shut down at the end."""
    started: list[tuple[Any, threading.Thread]] = []

    def start(*extra: str) -> str:
        ready = threading.Event()
        box: dict[str, Any] = {}
        argv = [MODEL, "--host", "127.0.0.1", "--port", "0", "--enable-sleep-mode", *extra]
        env = {**ENV, "HOME": str(tmp_path)}
        thread = threading.Thread(target=lambda: sim.serve(argv, env, lambda h: (box.update(h=h), ready.set())),
                                  daemon=True)
        thread.start()
        assert ready.wait(30), "the sim did not start"
        started.append((box["h"], thread))
        return f"http://127.0.0.1:{box['h'].server_address[1]}"

    yield start
    for httpd, thread in started:
        httpd.shutdown()
        thread.join(10)


def norm(line: str) -> str:
    """A log line without what varies between runs: pids, stamps, the model path, hashes, numbers."""
    line = re.sub(r"\((\w+) pid=\d+\)", r"(\1)", line)
    line = re.sub(r"\d\d-\d\d \d\d:\d\d:\d\d ", "", line)
    line = line.replace("/tmp/gl/model", "MODEL").replace(MODEL, "MODEL")
    line = re.sub(r"\S*/torch_compile_cache/", "CACHE/", line)  # the cache's folder is the host's
    line = re.sub(r"[0-9a-f]{10,}", "H", line)
    return re.sub(r"\d[\d,.]*", "#", line).rstrip()


def real_lines() -> set[str]:
    return {norm(ln) for name in ("sleep-h200.log", "lane-h100.log", "boot-h100.log")
            for ln in (REAL / name).read_text().splitlines()}


def _complete(url: str, prompt: str, n: int = 8) -> str:
    r = requests.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": n, "temperature": 0}, timeout=30)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def _stack() -> Stack:
    return Stack.model_validate({
        "name": "sim024", "image": "vllm/vllm-openai:v0.24.0", "model": {"path": "m", "architecture": "dense"},
        "served_model_names": ["lane"], "max_model_len": 4096,
        "smoke": {"completion": {"prompt": "The capital of France is", "expect": "Paris"}, "aliases": False}})


def test_every_line_the_sim_prints_as_024_on_cuda_is_a_line_of_the_real_logs(
        serving: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url = serving()
    serving("--served-model-name", "lane")  # the lane's arguments line
    _complete(url, "The capital of France is")
    sleepmode.sleep(url, 1)
    sleepmode.wake(url)
    sleepmode.sleep(url, 2)
    assert sleepmode.wake(url) == 2
    _complete(url, "The capital of France is")
    printed = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert len(printed) > 40
    real = real_lines()
    unseen = [ln for ln in printed if norm(ln) not in real]
    assert unseen == [], "lines the real vLLM 0.24.0 CUDA logs never print:\n" + "\n".join(unseen)


def test_level_2_on_the_sim_fails_its_smoke_test_after_a_bare_wake_and_passes_after_the_documented_one(
        serving: Any) -> None:
    url, stack = serving("--served-model-name", "lane"), _stack()
    assert run_smoke(url, stack)[1] == []
    reference = _complete(url, LONG)

    sleepmode.sleep(url, 2)
    assert sleepmode.sleep_level(url) == 2
    sleepmode.post(url, "/wake_up")  # what the tool did before: memory back, weights not
    sleepmode.until(url, False)
    passed, failed = run_smoke(url, stack)
    assert passed == [] and failed[0].startswith("completion 'The capital of France is' returned '!!!!!!!!'")
    assert garbage_reason(_complete(url, "The capital of France is")) == "a run of '!!!!!!!!'"
    assert _complete(url, LONG) == "!" * 8  # computed by no weights, and kept in the prefix cache
    sleepmode.post(url, "/collective_rpc", sleepmode.RELOAD)
    assert run_smoke(url, stack)[1] == []
    assert _complete(url, LONG) != reference  # the stale prefix, until the cache is reset
    sleepmode.post(url, "/reset_prefix_cache")
    assert _complete(url, LONG) == reference

    sleepmode.sleep(url, 2)
    assert sleepmode.wake(url) == 2
    assert run_smoke(url, stack)[1] == []
    assert _complete(url, LONG) == reference


def test_a_woken_standbys_one_completion_fails_on_token_id_0_and_passes_after_the_documented_wake(
        serving: Any) -> None:
    """The check a woken standby gets instead of the whole smoke set (docker/smoke.one_completion), for a
    stack that declares no completion test: a bare level-2 wake answers token id 0 over and over."""
    url = serving("--served-model-name", "lane")
    stack = _stack().model_copy(update={"smoke": _stack().smoke.model_copy(update={"completion": None})})
    assert one_completion(url, stack)[1] == []
    sleepmode.sleep(url, 2)
    sleepmode.post(url, "/wake_up")
    sleepmode.until(url, False)
    passed, failed = one_completion(url, stack)
    assert passed == [] and "a run of '!!!!" in failed[0], failed
    sleepmode.sleep(url, 2)
    assert sleepmode.wake(url) == 2
    passed, failed = one_completion(url, stack)
    assert failed == [] and passed[0].startswith("one completion on lane"), passed


def test_engine_sleep_state_and_collective_rpc_as_vllm_024(serving: Any) -> None:
    url = serving()
    assert sleepmode.sleep_level(url) == 0
    sleepmode.sleep(url, 1)
    assert sleepmode.sleep_level(url) == 1
    sleepmode.post(url, "/wake_up?tags=weights")  # any wake records awake (async_llm.py:940-943)
    assert sleepmode.sleep_level(url) == 0 and sleepmode.is_sleeping(url) is True  # kv_cache still asleep
    sleepmode.post(url, "/wake_up?tags=kv_cache")
    assert sleepmode.is_sleeping(url) is False
    assert requests.post(f"{url}/collective_rpc", json={}, timeout=10).status_code == 400
    assert requests.post(f"{url}/collective_rpc", json={"method": "no_such"}, timeout=10).status_code == 500
    assert requests.post(f"{url}/collective_rpc", json={"method": "reload_weights"}, timeout=10).status_code == 200
