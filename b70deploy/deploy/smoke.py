"""Smoke tests against a served stack over real HTTP: is it serving, and serving sense?

/health only says the engine is up; the post's Qwen3.6 was "healthy" and spoke word-salad.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from ..config.schema import Stack

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    resp = requests.post(url, json=body, timeout=timeout)
    if resp.status_code != 200:
        raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
    data: dict[str, Any] = resp.json()
    return data


def run_smoke(base_url: str, stack: Stack, *, timeout: float = 120.0) -> tuple[list[str], list[str]]:
    """(passed, failed) descriptions for the stack's declared smoke tests. The probes run at
    once (vLLM batches them), so the check costs the slowest one, not their sum; results
    keep the declared order."""
    probes = [p for p, on in ((_aliases, stack.smoke.aliases), (_completion, stack.smoke.completion is not None),
                              (_tool_call, stack.smoke.tool_call)) if on]
    passed: list[str] = []
    failed: list[str] = []
    if not probes:
        return passed, failed
    with ThreadPoolExecutor(max_workers=len(probes), thread_name_prefix="smoke") as pool:
        for ok, text in pool.map(lambda probe: probe(base_url, stack, timeout), probes):
            (passed if ok else failed).append(text)
    return passed, failed


def _aliases(base_url: str, stack: Stack, timeout: float) -> tuple[bool, str]:
    try:
        resp = requests.get(f"{base_url}/v1/models", timeout=timeout)
        ids = [card.get("id") for card in resp.json().get("data", [])]
    except (requests.RequestException, ValueError, AttributeError) as e:
        return False, f"/v1/models: {e}"
    missing = [a for a in stack.served_model_names if a not in ids]
    if missing:
        return False, f"/v1/models lacks aliases {missing} (lists {ids})"
    return True, f"/v1/models lists every alias ({', '.join(ids)})"


def _completion(base_url: str, stack: Stack, timeout: float) -> tuple[bool, str]:
    c = stack.smoke.completion
    assert c is not None  # only run when declared
    try:
        data = _post(f"{base_url}/v1/completions", {"model": stack.served_model_names[0], "prompt": c.prompt,
                                                    "max_tokens": c.max_tokens, "temperature": 0}, timeout)
        text = data["choices"][0]["text"]
    except (requests.RequestException, RuntimeError, KeyError, IndexError, ValueError) as e:
        return False, f"completion: {e}"
    if c.expect.lower() in text.lower():
        return True, f"completion {c.prompt!r} -> {text.strip()[:40]!r}"
    return False, (f"completion {c.prompt!r} returned {text.strip()[:80]!r}, expected {c.expect!r} "
                   "(garbage output: a bad checkpoint or a numeric fault)")


def _tool_call(base_url: str, stack: Stack, timeout: float) -> tuple[bool, str]:
    try:
        ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
        data = _post(f"{base_url}/v1/chat/completions", {
            "model": stack.served_model_names[0], "temperature": 0, "max_tokens": 128, "tools": [WEATHER_TOOL],
            "tool_choice": "auto", "messages": ask}, timeout)
        choice = data["choices"][0]
        calls = choice["message"].get("tool_calls") or []
        if choice.get("finish_reason") != "tool_calls" or not calls:
            return False, f"tool call: finish_reason {choice.get('finish_reason')!r}, {len(calls)} tool calls"
        json.loads(calls[0]["function"]["arguments"])
    except (requests.RequestException, RuntimeError, KeyError, IndexError, ValueError) as e:
        return False, f"tool call: {e}"
    return True, f"tool call {calls[0]['function']['name']} with finish_reason tool_calls"


def served_version(base_url: str, *, timeout: float = 5.0) -> str | None:
    try:
        version = requests.get(f"{base_url}/version", timeout=timeout).json().get("version")
        return str(version) if version else None
    except (requests.RequestException, ValueError, AttributeError):
        return None
