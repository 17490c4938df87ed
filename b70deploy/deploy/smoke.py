"""Smoke tests against a served stack over real HTTP: is it serving, and serving sense?

/health only says the engine is up; the post's Qwen3.6 was "healthy" and spoke word-salad.
"""

from __future__ import annotations

import json
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
    """(passed, failed) descriptions for the stack's declared smoke tests."""
    passed: list[str] = []
    failed: list[str] = []
    smoke = stack.smoke
    model = stack.served_model_names[0]
    if smoke.aliases:
        try:
            resp = requests.get(f"{base_url}/v1/models", timeout=timeout)
            ids = [card.get("id") for card in resp.json().get("data", [])]
            missing = [a for a in stack.served_model_names if a not in ids]
            if missing:
                failed.append(f"/v1/models lacks aliases {missing} (lists {ids})")
            else:
                passed.append(f"/v1/models lists every alias ({', '.join(ids)})")
        except (requests.RequestException, ValueError, AttributeError) as e:
            failed.append(f"/v1/models: {e}")
    if smoke.completion is not None:
        c = smoke.completion
        try:
            data = _post(f"{base_url}/v1/completions",
                         {"model": model, "prompt": c.prompt, "max_tokens": c.max_tokens, "temperature": 0}, timeout)
            text = data["choices"][0]["text"]
            if c.expect.lower() in text.lower():
                passed.append(f"completion {c.prompt!r} -> {text.strip()[:40]!r}")
            else:
                failed.append(f"completion {c.prompt!r} returned {text.strip()[:80]!r}, expected {c.expect!r} "
                              "(garbage output: a bad checkpoint or a numeric fault)")
        except (requests.RequestException, RuntimeError, KeyError, IndexError, ValueError) as e:
            failed.append(f"completion: {e}")
    if smoke.tool_call:
        try:
            data = _post(f"{base_url}/v1/chat/completions", {
                "model": model, "temperature": 0, "max_tokens": 128, "tools": [WEATHER_TOOL], "tool_choice": "auto",
                "messages": [{"role": "user", "content": "What is the weather in Paris right now?"}]}, timeout)
            choice = data["choices"][0]
            calls = choice["message"].get("tool_calls") or []
            if choice.get("finish_reason") != "tool_calls" or not calls:
                failed.append(f"tool call: finish_reason {choice.get('finish_reason')!r}, {len(calls)} tool calls")
            else:
                json.loads(calls[0]["function"]["arguments"])
                passed.append(f"tool call {calls[0]['function']['name']} with finish_reason tool_calls")
        except (requests.RequestException, RuntimeError, KeyError, IndexError, ValueError) as e:
            failed.append(f"tool call: {e}")
    return passed, failed


def served_version(base_url: str, *, timeout: float = 5.0) -> str | None:
    try:
        version = requests.get(f"{base_url}/version", timeout=timeout).json().get("version")
        return str(version) if version else None
    except (requests.RequestException, ValueError, AttributeError):
        return None
