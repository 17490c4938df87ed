"""The smoke tests against the simulated vLLM on loopback (a real HTTP server, no engine): they
hold for a thinking model, still fail on garbage, and say why when a trace eats the budget."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kit.simthread import Serve, loopback_sims

from b70deploy.config.schema import Stack
from b70deploy.docker.smoke import THINKING_ALLOWANCE, TOOL_TOKENS, run_smoke, tool_call_body


@pytest.fixture
def serve() -> Iterator[Serve]:
    with loopback_sims("20000") as start:
        yield start


def stack(family: str | None, max_model_len: int = 8192) -> Stack:
    doc: dict[str, Any] = {
        "name": "t", "image": "intel/vllm:latest", "model": {"path": "Qwen/Qwen3-30B-A3B"},
        "served_model_names": ["m"], "max_model_len": max_model_len, "model_family": family,
        "smoke": {"completion": {"prompt": "The capital of France is", "expect": "Paris", "max_tokens": 4},
                  "tool_call": True, "aliases": True, "coherence": True}}
    return Stack.model_validate(doc)


@pytest.mark.parametrize("family", ["qwen3-30b-a3b", "qwen3.5-35b-a3b", None])
def test_a_healthy_thinking_model_passes_every_check(serve: Serve, family: str | None) -> None:
    url = serve("--reasoning-parser", "qwen3", B70SIM_THINK_TOKENS="300")
    passed, failed = run_smoke(url, stack(family), timeout=10)
    assert failed == [] and len(passed) == 4, (passed, failed)
    assert any(p.startswith("tool call get_weather") for p in passed)
    assert any(p.startswith("coherence: 40 free tokens read as language") for p in passed)


def test_the_budget_leaves_room_to_think_only_where_thinking_cannot_be_switched_off() -> None:
    assert tool_call_body(stack("qwen3-30b-a3b"))["max_tokens"] == TOOL_TOKENS
    assert tool_call_body(stack("llama-3.1-8b"))["max_tokens"] == TOOL_TOKENS + THINKING_ALLOWANCE
    assert tool_call_body(stack(None))["chat_template_kwargs"] == {"enable_thinking": False}
    # a short context keeps room for the prompt: vLLM refuses prompt + max_tokens > max_model_len
    assert tool_call_body(stack(None, max_model_len=512))["max_tokens"] == 256
    assert tool_call_body(stack(None, max_model_len=256))["max_tokens"] == TOOL_TOKENS


def test_without_a_reasoning_parser_the_trace_in_content_still_passes(serve: Serve) -> None:
    url = serve(B70SIM_THINK_TOKENS="300")  # the report's Qwen3.5: a visible trace, no parser
    passed, failed = run_smoke(url, stack("qwen3.5-35b-a3b"), timeout=10)
    assert failed == [] and len(passed) == 4, (passed, failed)


def test_garbage_still_fails_the_completion_the_tool_call_and_the_coherence_check(serve: Serve) -> None:
    url = serve("--reasoning-parser", "qwen3", B70SIM_THINK_TOKENS="300", B70SIM_FAIL="garbage")
    passed, failed = run_smoke(url, stack("qwen3-30b-a3b"), timeout=10)
    assert passed == ["/v1/models lists every alias (m)"]
    assert [f.split(" ", 1)[0] for f in failed] == ["completion", "tool", "coherence:"]
    assert "word-salad" in failed[2] and "garò" in failed[2]


def test_a_model_that_thinks_in_spite_of_the_switch_gets_room_on_a_second_try(serve: Serve) -> None:
    # a thinking-only checkpoint (Qwen3-*-Thinking-2507): the template ignores enable_thinking
    url = serve("--reasoning-parser", "qwen3", B70SIM_THINK_TOKENS="300", B70SIM_THINK_ALWAYS="1")
    passed, failed = run_smoke(url, stack("qwen3-30b-a3b"), timeout=10)
    assert failed == [] and any(p.startswith("tool call get_weather") for p in passed), (passed, failed)


def test_a_trace_longer_than_the_allowance_fails_and_says_so(serve: Serve) -> None:
    url = serve("--reasoning-parser", "qwen3", B70SIM_THINK_TOKENS=str(TOOL_TOKENS + THINKING_ALLOWANCE + 10),
                B70SIM_THINK_ALWAYS="1")
    _, failed = run_smoke(url, stack("qwen3-30b-a3b"), timeout=30)
    assert failed == [f"tool call: the model was still thinking when its {TOOL_TOKENS + THINKING_ALLOWANCE} tokens "
                      "ran out (finish_reason length, no call): a trace that long is a model stuck thinking"]
