"""vLLM's sleep mode over HTTP, by URL: put a server to sleep, wake it the way its level needs, wait.

No Docker here: hot standby (standby.py) calls these on a slot's loopback port, and the GPU lane
(scripts/gpu_lane.py) on a bare vLLM process. The routes, as vLLM 0.24.0 defines them (all under
VLLM_SERVER_DEV_MODE=1, vllm/entrypoints/openai/api_server.py:197-200):

- POST /sleep?level=N (vllm/entrypoints/serve/dev/sleep/api_router.py:21-29): level 1 offloads the
  weights to host RAM and discards the KV cache, level 2 discards both (vllm/v1/engine/core.py:761-797).
- POST /wake_up[?tags=T] (api_router.py:32-42): no tag wakes every allocation; the scheduler stays
  paused until the last tag is awake (core.py:799-815).
- GET /is_sleeping (api_router.py:45-48), and the gauge vllm:engine_sleep_state on /metrics with
  sleep_state awake / weights_offloaded (level 1) / discard_all (level 2) (vllm/v1/metrics/loggers.py:
  498-522, 1224-1241; 0.21.0 prints it too, tests/fixtures/vllm-0.21.0-cpu/metrics.txt).

Level 2 kept no weights: a bare /wake_up brings back memory, not values, and the real server then answers
200 to everything and generates token id 0 only (tests/fixtures/vllm-0.24.0-cuda/README.md). vLLM's
wake of a level-2 sleeper, as its sleep-mode page gives it (docs.vllm.ai/en/latest/features/sleep_mode/;
shared/reference/gpu-lane.md ran it on an H200), wakes the weights' memory, reloads them
(POST /collective_rpc {"method": "reload_weights"}: vllm/entrypoints/serve/dev/rpc/api_router.py:23-54
-> vllm/v1/worker/gpu_worker.py:396-397), then
wakes the KV cache. The prefix cache is reset last (POST /reset_prefix_cache,
vllm/entrypoints/serve/dev/cache/api_router.py:20-43): on the GPU lane a prefix computed before the
reload was served after it, wrong (llama-swap's wake sequence ends the same way).
"""

from __future__ import annotations

import re
import time
from typing import Any

import requests

from ..errors import OperationError

SLEEP_WAIT = 300.0   # seconds a /sleep or a wake may take to show on /is_sleeping (level 1 copies the weights)
RELOAD = {"method": "reload_weights"}
_STATE = re.compile(r'^vllm:engine_sleep_state\{[^}]*sleep_state="(\w+)"[^}]*\}\s+([0-9.eE+-]+)', re.MULTILINE)
LEVEL_OF_STATE = {"weights_offloaded": 1, "discard_all": 2}

Step = tuple[str, dict[str, Any] | None]


def wake_steps(level: int) -> list[Step]:
    """The POSTs that wake a sleeper of that level, in order (path, JSON body or None)."""
    if level >= 2:
        return [("/wake_up?tags=weights", None), ("/collective_rpc", RELOAD),
                ("/wake_up?tags=kv_cache", None), ("/reset_prefix_cache", None)]
    return [("/wake_up", None)]


def level_in(metrics_text: str) -> int | None:
    """The sleep level vllm:engine_sleep_state says (1 or 2), 0 when awake, None when it says nothing."""
    states = {name: float(value) for name, value in _STATE.findall(metrics_text)}
    if not states:
        return None
    for name, level in LEVEL_OF_STATE.items():
        if states.get(name, 0.0) >= 1.0:
            return level
    return 0


def sleep_level(url: str, *, timeout: float = 5.0) -> int | None:
    """The server's own word on how it sleeps (GET /metrics), None when it cannot say."""
    try:
        r = requests.get(f"{url}/metrics", timeout=timeout)
    except requests.RequestException:
        return None
    return level_in(r.text) if r.status_code == 200 else None


def is_sleeping(url: str, *, timeout: float = 5.0) -> bool | None:
    try:
        r = requests.get(f"{url}/is_sleeping", timeout=timeout)
        return bool(r.json().get("is_sleeping")) if r.status_code == 200 else None
    except (requests.RequestException, ValueError, AttributeError):
        return None


def post(url: str, path: str, body: dict[str, Any] | None = None, *, who: str = "vLLM") -> None:
    try:
        r = requests.post(f"{url}{path}", json=body, timeout=SLEEP_WAIT)
    except requests.RequestException as e:
        raise OperationError(f"{who}: POST {path} failed: {e}") from e
    if r.status_code != 200:
        raise OperationError(f"{who}: POST {path} answered HTTP {r.status_code}: {r.text[:200]}",
                             fix="the stack must run with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 "
                                 "(render/standby.py)")


def until(url: str, asleep: bool, *, who: str = "vLLM", wait: float = SLEEP_WAIT) -> None:
    deadline = time.monotonic() + wait
    while is_sleeping(url) is not asleep:
        if time.monotonic() >= deadline:
            raise OperationError(f"{who}: /is_sleeping did not turn {asleep} within {wait:g} s")
        time.sleep(0.05)


def sleep(url: str, level: int, *, who: str = "vLLM") -> None:
    """POST /sleep?level=N, then wait for /is_sleeping (vLLM answers before it is done in some versions)."""
    post(url, f"/sleep?level={int(level)}", who=who)
    until(url, True, who=who)


def wake(url: str, *, level: int | None = None, who: str = "vLLM") -> int:
    """Wake a sleeping server with the steps its level needs; returns that level. The level is the
    server's own (/metrics), else `level`, else 1."""
    said = sleep_level(url)
    found = said if said else (level or 1)
    for path, body in wake_steps(found):
        post(url, path, body, who=who)
    until(url, False, who=who)
    return found
