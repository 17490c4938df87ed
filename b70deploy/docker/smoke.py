"""Smoke tests against a served stack over real HTTP: is it serving, and serving sense?

/health only says the engine is up; the post's Qwen3.6 was "healthy" and spoke word-salad.

Thinking models: a Qwen3 reply starts with a reasoning trace that counts against max_tokens,
so a 128-token tool-call budget can end in finish_reason "length" on a healthy stack. Every
chat check therefore asks for `chat_template_kwargs: {"enable_thinking": false}` (the switch
Qwen3's template reads, vllm/reasoning/qwen3_reasoning_parser.py; other templates ignore an
unknown variable). A model that thinks anyway (a family not known to honour the switch, or a
thinking-only checkpoint) gets room to think before its call: at once when the stack's
model_family is not a Qwen3 one, else on a second try when the first ran out while thinking.
The reply's `reasoning` field (vLLM 0.21; older `reasoning_content`) is read too: the
coherence check judges whatever text came back. The completion check uses /v1/completions,
where no chat template runs and nothing thinks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from ..config.schema import Stack
from .garbage import degenerate_reason, garbage_reason

Probe = Callable[[str, Stack, float, str | None], tuple[bool, str]]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_TOKENS = 128
# Room to reason before the call when thinking cannot be switched off (Qwen3.5 traces run long).
THINKING_ALLOWANCE = 2048
# Families whose chat template honours enable_thinking: false (Qwen3, Qwen3.5, Qwen3.6).
THINKING_SWITCH = re.compile(r"^qwen3", re.IGNORECASE)
NO_THINKING = {"enable_thinking": False}
# The report's second check: ~40 tokens of free text, judged without an expected answer.
COHERENCE_PROMPT = "In two or three plain sentences, describe a quiet morning by the sea."
COHERENCE_TOKENS = 40


def thinking_switchable(stack: Stack) -> bool:
    return stack.model_family is not None and THINKING_SWITCH.match(stack.model_family) is not None


def thinking_budget(stack: Stack) -> int:
    """TOOL_TOKENS plus the allowance, within half the context (the rest holds the prompt and
    the tools: vLLM refuses a request whose prompt plus max_tokens exceeds max_model_len)."""
    if stack.max_model_len is None:  # vLLM's length from the model's config: no smaller cap known here
        return TOOL_TOKENS + THINKING_ALLOWANCE
    return min(TOOL_TOKENS + THINKING_ALLOWANCE, max(TOOL_TOKENS, stack.max_model_len // 2))


def tool_call_body(stack: Stack, model: str | None = None) -> dict[str, Any]:
    budget = TOOL_TOKENS if thinking_switchable(stack) else thinking_budget(stack)
    return {"model": model or stack.aliases[0], "temperature": 0, "max_tokens": budget,
            "tools": [WEATHER_TOOL], "tool_choice": "auto", "chat_template_kwargs": NO_THINKING,
            "messages": [{"role": "user", "content": "What is the weather in Paris right now?"}]}


def coherence_body(stack: Stack, model: str | None = None) -> dict[str, Any]:
    return {"model": model or stack.aliases[0], "temperature": 0, "max_tokens": COHERENCE_TOKENS,
            "chat_template_kwargs": NO_THINKING, "messages": [{"role": "user", "content": COHERENCE_PROMPT}]}


def reasoning_of(message: dict[str, Any]) -> str:
    """The reasoning trace a reasoning parser split off (`reasoning`, or `reasoning_content` before 0.21)."""
    value = message.get("reasoning") or message.get("reasoning_content")
    return value if isinstance(value, str) else ""


def bearer(key: str | None) -> dict[str, str]:
    """The header a vLLM started with --api-key (or VLLM_API_KEY) asks every /v1 request for; without
    it the answer is 401 (AuthenticationMiddleware, vllm/entrypoints/openai/server_utils.py:32-77,
    387dcddc). The key goes in this header only: never into a message or a log line."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def _post(url: str, body: dict[str, Any], timeout: float, key: str | None) -> dict[str, Any]:
    resp = requests.post(url, json=body, timeout=timeout, headers=bearer(key))
    if resp.status_code != 200:
        raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
    data: dict[str, Any] = resp.json()
    return data


def _out_of_budget_thinking(choice: dict[str, Any]) -> bool:
    message = choice["message"]
    thought = reasoning_of(message) or "<think>" in (message.get("content") or "")
    return choice.get("finish_reason") == "length" and bool(thought) and not message.get("tool_calls")


def _tool_call(base_url: str, stack: Stack, timeout: float, key: str | None) -> tuple[bool, str]:
    body = tool_call_body(stack, _model(base_url, stack, timeout, key))
    choice = _post(f"{base_url}/v1/chat/completions", body, timeout, key)["choices"][0]
    if _out_of_budget_thinking(choice) and body["max_tokens"] == TOOL_TOKENS:
        body["max_tokens"] = thinking_budget(stack)  # it thinks in spite of the switch
        choice = _post(f"{base_url}/v1/chat/completions", body, timeout, key)["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    reason = choice.get("finish_reason")
    if reason == "tool_calls" and calls:
        json.loads(calls[0]["function"]["arguments"])
        return True, f"tool call {calls[0]['function']['name']} with finish_reason tool_calls"
    if _out_of_budget_thinking(choice):
        return False, (f"tool call: the model was still thinking when its {body['max_tokens']} tokens ran out "
                       "(finish_reason length, no call): a trace that long is a model stuck thinking")
    return False, f"tool call: finish_reason {reason!r}, {len(calls)} tool calls"


def _coherence(base_url: str, stack: Stack, timeout: float, key: str | None) -> tuple[bool, str]:
    body = coherence_body(stack, _model(base_url, stack, timeout, key))
    message = _post(f"{base_url}/v1/chat/completions", body, timeout, key)["choices"][0]["message"]
    text = " ".join(t for t in (reasoning_of(message), message.get("content") or "") if t)
    why = garbage_reason(text)
    if why is None:
        return True, f"coherence: {COHERENCE_TOKENS} free tokens read as language ({text.strip()[:40]!r})"
    return False, (f"coherence: {why}: {text.strip()[:80]!r} (garbage output: a bad checkpoint or a numeric "
                   "fault)")


def run_smoke(base_url: str, stack: Stack, *, timeout: float = 120.0,
              key: str | None = None) -> tuple[list[str], list[str]]:
    """(passed, failed) descriptions for the stack's declared smoke tests. The probes run at
    once (vLLM batches them), so the check costs the slowest one, not their sum; results
    keep the declared order."""
    smoke = stack.smoke
    probes = [(name, probe) for name, probe, on in (
        ("/v1/models", _aliases, smoke.aliases), ("completion", _completion, smoke.completion is not None),
        ("tool call", _tool_call, smoke.tool_call), ("coherence", _coherence, smoke.coherence)) if on]
    passed: list[str] = []
    failed: list[str] = []
    if not probes:
        return passed, failed

    def attempt(named: tuple[str, Probe]) -> tuple[bool, str]:
        name, probe = named
        try:
            return probe(base_url, stack, timeout, key)
        except (requests.RequestException, RuntimeError, KeyError, IndexError, TypeError, ValueError) as e:
            return False, f"{name}: {e}"

    with ThreadPoolExecutor(max_workers=len(probes), thread_name_prefix="smoke") as pool:
        for ok, text in pool.map(attempt, probes):
            (passed if ok else failed).append(text)
    return passed, failed


WAKE_TOKENS = 8  # enough for a run of one punctuation mark (garbage.degenerate_reason) to show


def one_completion(base_url: str, stack: Stack, *, timeout: float = 120.0,
                   key: str | None = None) -> tuple[list[str], list[str]]:
    """A woken standby's check (deploy/steps.py): its declared completion test, else a few tokens
    judged for what a broken engine emits. It passed every smoke test when it went to sleep; what a
    wake can still get wrong is the answer (a level-2 wake without its weights reloaded answers token
    id 0 over and over: reference/gpu-lane.md)."""
    try:
        if stack.smoke.completion is not None:
            ok, text = _completion(base_url, stack, timeout, key)
        else:
            model = _model(base_url, stack, timeout, key)
            data = _post(f"{base_url}/v1/completions", {"model": model, "prompt": "Hello",
                                                        "max_tokens": WAKE_TOKENS, "temperature": 0}, timeout, key)
            answer = str(data["choices"][0]["text"])
            why = degenerate_reason(answer)
            ok = why is None
            text = (f"one completion on {model} ({answer.strip()[:40]!r})" if ok else
                    f"completion on {model}: {why}: {answer.strip()[:40]!r} (a wake that did not restore the weights?)")
    except (requests.RequestException, RuntimeError, KeyError, IndexError, TypeError, ValueError) as e:
        ok, text = False, f"completion: {e}"
    return ([text], []) if ok else ([], [text])


def _listed(base_url: str, timeout: float, key: str | None) -> list[str]:
    resp = requests.get(f"{base_url}/v1/models", timeout=timeout, headers=bearer(key))
    if resp.status_code != 200:
        raise RuntimeError(f"/v1/models: HTTP {resp.status_code}: {resp.text[:200]}")
    try:
        return [str(card.get("id")) for card in resp.json().get("data", [])]
    except AttributeError as e:
        raise ValueError(f"not a model list: {e}") from None


def _model(base_url: str, stack: Stack, timeout: float, key: str | None) -> str:
    """The name a request asks for: the stack's first alias, else (no --served-model-name: vLLM serves
    under the model argument) the one /v1/models lists."""
    if stack.aliases:
        return stack.aliases[0]
    ids = _listed(base_url, timeout, key)
    if not ids:
        raise ValueError("/v1/models lists no model")
    return ids[0]


def _aliases(base_url: str, stack: Stack, timeout: float, key: str | None) -> tuple[bool, str]:
    ids = _listed(base_url, timeout, key)
    if not stack.aliases:
        return bool(ids), (f"/v1/models lists {', '.join(ids)} (no --served-model-name: the model argument)" if ids
                           else "/v1/models lists no model")
    missing = [a for a in stack.aliases if a not in ids]
    if missing:
        return False, f"/v1/models lacks aliases {missing} (lists {ids})"
    return True, f"/v1/models lists every alias ({', '.join(ids)})"


def _completion(base_url: str, stack: Stack, timeout: float, key: str | None) -> tuple[bool, str]:
    """The declared completion, streamed and read until its expected text shows: the verdict is the one the
    whole answer gives (the text is in the answer once it is in a prefix of it), and the clients the door
    holds wait for no token after the one that decides (closing the stream aborts the rest in vLLM). An
    answer without it is read to its end."""
    c = stack.smoke.completion
    assert c is not None  # only run when declared
    body = {"model": _model(base_url, stack, timeout, key), "prompt": c.prompt, "max_tokens": c.max_tokens,
            "temperature": 0, "stream": True}
    with requests.post(f"{base_url}/v1/completions", json=body, timeout=timeout, headers=bearer(key),
                       stream=True) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        text = streamed_until(resp.iter_lines(), c.expect)
    if c.expect.lower() in text.lower():
        return True, f"completion {c.prompt!r} -> {text.strip()[:40]!r}"
    return False, (f"completion {c.prompt!r} returned {text.strip()[:80]!r}, expected {c.expect!r} "
                   "(garbage output: a bad checkpoint or a numeric fault)")


def streamed_until(lines: Iterable[bytes], expect: str) -> str:
    """Pure: the text of a streamed /v1/completions answer (vLLM's `data: {...}` lines, then `data: [DONE]`:
    tests/fixtures/vllm-0.21.0-cpu/completion-stream.sse), up to the chunk where `expect` shows (case aside),
    else all of it. An error vLLM sends inside the stream (`data: {"error": ...}`) raises."""
    text = ""
    for raw in lines:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:  # vLLM's ErrorResponse inside a 200 stream: its code is the HTTP status it means
            error = chunk["error"]
            code = error.get("code") if isinstance(error, dict) else None
            what = str(error.get("message") if isinstance(error, dict) else error)[:200]
            raise RuntimeError(f"HTTP {code} in the stream: {what}" if code else f"error in the stream: {what}")
        text += "".join(str(choice.get("text") or "") for choice in chunk.get("choices") or [])
        if expect.lower() in text.lower():
            break
    return text


def served_version(base_url: str, *, timeout: float = 5.0) -> str | None:
    try:
        version = requests.get(f"{base_url}/version", timeout=timeout).json().get("version")
        return str(version) if version else None
    except (requests.RequestException, ValueError, AttributeError):
        return None
