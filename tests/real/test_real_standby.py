"""Hot standby on vLLM's CPU build (issue 24, the real lane's must-show): vLLM has no sleep mode on the
CPU platform (Platform.is_sleep_mode_available() is true for CUDA and ROCm only,
vllm/platforms/interface.py:191-196 in 0.21.0), so a stack with `standby: sleep` is told so at preflight
in one line, renders without --enable-sleep-mode, and its switch stops the live stack first and serves.

The fact is asked of the real engine first: forced with --enable-sleep-mode, vLLM's CPU build exits at
start-up with "Sleep mode is not supported on current platform." (vllm/config/model.py:508 in 0.21.0),
which is why the tool renders the flag away.

The node has the door (standby needs it) in front of the sim stack `sim-base`, the live stack each
switch replaces. Asked from outside: a completion through the door, the container's labels, command
and environment from the engine.
"""

from __future__ import annotations

from typing import Any

import pytest
import requests
from kit.simnode import SimNode, docker, service_box

pytestmark = [pytest.mark.real, pytest.mark.docker]


def served_stack(node: SimNode) -> str:
    labels: dict[str, str] = service_box(node.project)["Config"]["Labels"]
    return labels["b70deploy.stack"]


def complete(node: SimNode, model: str) -> dict[str, Any]:
    r = requests.post(f"http://127.0.0.1:{node.prod}/v1/completions", timeout=60,
                      json={"model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def on_baseline(node: SimNode) -> None:
    if docker("ps", "-q", "--filter", f"label=com.docker.compose.project={node.project}", "--filter",
              "label=b70deploy.stack=sim-base").stdout.split():
        return
    node.cli("switch", "sim-base", "--yes", check=True, timeout=300)


def test_real_standby_cpu_vllm_exits_on_the_sleep_flag(real_door_node: SimNode) -> None:
    node = real_door_node
    on_baseline(node)
    r = node.cli("switch", "real-sleep-forced", "--yes", timeout=900)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "node back on revision" in r.stdout and "(sim-base)" in r.stdout, r.stdout
    failed = node.json("history")[-1]
    assert failed["stack"] == "real-sleep-forced" and failed["outcome"] == "failed"
    log = node.cli("logs", str(failed["number"]), check=True).stdout
    assert "Sleep mode is not supported on current platform." in log, log[-3000:]
    assert served_stack(node) == "sim-base"
    assert "Paris" in complete(node, "qwen3-30b-a3b-w4a16")["choices"][0]["text"]


def test_real_standby_sleep_on_cpu_is_refused_at_preflight_and_the_switch_stops_first(
        real_door_node: SimNode) -> None:
    node = real_door_node
    on_baseline(node)
    r = node.cli("switch", "real-sleep", "--yes", timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    said = [ln for ln in (r.stdout + r.stderr).splitlines() if "no sleep mode" in ln]
    assert len(said) == 1 and "platform cpu" in said[0] and "standby-cannot-sleep" in said[0], said
    # stop-first: one vllm container, the new one, without the flag vLLM would exit on
    box = service_box(node.project)
    assert box["Config"]["Labels"]["b70deploy.stack"] == "real-sleep"
    assert "--enable-sleep-mode" not in " ".join(box["Config"]["Cmd"] or [])
    assert "VLLM_SERVER_DEV_MODE=1" not in (box["Config"]["Env"] or [])
    answer = complete(node, "tiny-a")  # through the door: the node's port is the door's
    assert answer["model"] == "tiny-a" and answer["usage"]["completion_tokens"] == 8
