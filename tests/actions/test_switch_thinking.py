"""A switch to a thinking stack on the real engine (the sim with a 300-token Qwen3-style trace
and vLLM's reasoning parser): its smoke tests pass and it serves; the same stack speaking
word-salad fails them and the node goes back. Checked by asking the node, not the tool."""

from __future__ import annotations

import pytest
import requests
from kit.simnode import SimNode, docker

pytestmark = pytest.mark.docker


def ask(node: SimNode, **extra: object) -> dict[str, object]:
    body = {"model": "qwen3-30b-a3b-w4a16", "max_tokens": 400, "temperature": 0,
            "messages": [{"role": "user", "content": "The capital of France is?"}], **extra}
    r = requests.post(f"http://127.0.0.1:{node.prod}/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 200, r.text
    doc: dict[str, object] = r.json()
    return doc


def test_a_thinking_stack_passes_its_smoke_tests_and_serves_reasoning(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    r = node.cli("switch", "thinking", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "node on revision 2 (thinking)" in r.stdout
    # from outside: the served model thinks (trace in `reasoning`), and answers once told not to
    message = ask(node)["choices"][0]["message"]  # type: ignore[index]
    assert message["reasoning"] and message["content"] == "Paris is the capital of France."
    plain = ask(node, chat_template_kwargs={"enable_thinking": False})["choices"][0]["message"]  # type: ignore[index]
    assert plain["reasoning"] is None and plain["content"] == "Paris is the capital of France."
    out = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={node.project}",
                 "--filter", "label=com.docker.compose.service=vllm").stdout.split()
    assert len(out) == 1
    cmd = docker("inspect", "-f", "{{json .Config.Cmd}}", out[0]).stdout
    assert "--reasoning-parser" in cmd
    assert b"--reasoning-parser" in (node.deploy / "docker-compose.yml").read_bytes()


def test_a_thinking_stack_speaking_garbage_fails_its_smoke_tests_and_rolls_back(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    r = node.cli("switch", "thinking-garbage", "--yes")
    assert r.returncode == 1
    assert "failed at check" in r.stderr and "expected 'Paris'" in r.stderr, r.stderr
    assert "word-salad" in r.stderr, r.stderr  # the coherence check, no exact answer needed
    assert "node back on revision 1 (alpha)" in r.stdout
    # from outside: alpha answers again, and it does not think
    message = ask(node)["choices"][0]["message"]  # type: ignore[index]
    assert message["reasoning"] is None and message["content"] == "Paris is the capital of France."
