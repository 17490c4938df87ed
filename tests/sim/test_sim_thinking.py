"""The sim's thinking mode and grouped chunks, against a server on loopback: a Qwen3-style trace
spends the token budget before the answer or the tool call, `enable_thinking: false` turns it
off, a reasoning parser moves it to `reasoning`, and under speculative decoding a step's tokens
come out in one chunk while usage still counts tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from kit.simthread import Serve, loopback_sims

from b70deploy.sim import server as sim
from b70deploy.sim.box import write_models

WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
OFF = {"enable_thinking": False}

@pytest.fixture
def serve() -> Iterator[Serve]:
    with loopback_sims("2000") as start:
        yield start


def chat(url: str, **body: Any) -> dict[str, Any]:
    r = requests.post(f"{url}/v1/chat/completions", json={"model": "m", "temperature": 0, **body}, timeout=10)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def stream(url: str, path: str, **body: Any) -> list[dict[str, Any]]:
    body = {"model": "m", "stream": True, "stream_options": {"include_usage": True}, **body}
    with requests.post(f"{url}{path}", json=body, stream=True, timeout=10) as r:
        events = [line[6:] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_a_tool_call_budget_of_128_ends_in_length_while_a_qwen3_model_thinks(serve: Serve) -> None:
    url = serve("--reasoning-parser", "qwen3", B70SIM_THINK_TOKENS="200")
    doc = chat(url, max_tokens=128, tools=WEATHER, messages=ASK)
    choice = doc["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["tool_calls"] == []
    # a trace cut short is all reasoning, no content (qwen3_reasoning_parser.extract_reasoning)
    assert choice["message"]["content"] is None and choice["message"]["reasoning"]
    assert "<think>" not in choice["message"]["reasoning"]
    assert doc["usage"]["completion_tokens"] == 128


def test_enable_thinking_false_calls_the_tool_at_once(serve: Serve) -> None:
    url = serve("--reasoning-parser", "qwen3", B70SIM_THINK_TOKENS="200")
    doc = chat(url, max_tokens=128, tools=WEATHER, messages=ASK, chat_template_kwargs=OFF)
    choice = doc["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["reasoning"] is None
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    assert doc["usage"]["completion_tokens"] == sim.count_tokens(call["arguments"])


def test_a_budget_that_fits_the_trace_gets_reasoning_then_the_call(serve: Serve) -> None:
    url = serve("--reasoning-parser", "qwen3", B70SIM_THINK_TOKENS="200")
    doc = chat(url, max_tokens=400, tools=WEATHER, messages=ASK)
    msg = doc["choices"][0]["message"]
    assert doc["choices"][0]["finish_reason"] == "tool_calls" and msg["content"] is None
    assert msg["reasoning"].startswith("Okay, the user") and msg["tool_calls"]
    args = msg["tool_calls"][0]["function"]["arguments"]
    assert doc["usage"]["completion_tokens"] == 200 + sim.count_tokens(args)


def test_without_a_reasoning_parser_the_trace_is_content_with_its_tags(serve: Serve) -> None:
    url = serve(B70SIM_THINK_TOKENS="20")
    msg = chat(url, max_tokens=64, messages=[{"role": "user", "content": "The capital of France is?"}])
    text = msg["choices"][0]["message"]["content"]
    assert text.startswith("<think>\n") and "\n</think>\n\n" in text
    assert text.split("</think>")[1].strip() == sim.PARIS_CHAT
    assert msg["choices"][0]["message"]["reasoning"] is None


def test_streamed_reasoning_comes_before_the_tool_call_and_usage_counts_both(serve: Serve) -> None:
    url = serve("--reasoning-parser", "qwen3", B70SIM_THINK_TOKENS="30")
    chunks = stream(url, "/v1/chat/completions", max_tokens=128, tools=WEATHER, messages=ASK)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]][1:]  # after the role chunk
    kinds = ["reasoning" if "reasoning" in d else "tool" if "tool_calls" in d else "other" for d in deltas]
    assert kinds == sorted(kinds, key=["reasoning", "tool"].index) and "other" not in kinds
    reasoning = "".join(d["reasoning"] for d in deltas if "reasoning" in d)
    args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d)
    assert "think>" not in reasoning and json.loads(args) == {"city": "Paris"}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == 30 + sim.count_tokens(args)


def test_completions_never_think(serve: Serve) -> None:
    url = serve("--reasoning-parser", "qwen3", B70SIM_THINK_TOKENS="200")
    r = requests.post(f"{url}/v1/completions", json={"model": "m", "prompt": "The capital of France is",
                                                     "max_tokens": 8}, timeout=10).json()
    assert r["choices"][0]["text"].startswith(" Paris") and r["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_speculative_steps_come_out_grouped_and_usage_counts_tokens(serve: Serve, path: str) -> None:
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4})
    url = serve("--speculative-config", spec, B70SIM_SPEC_ACCEPT_RATE="0.6")
    body: dict[str, Any] = {"max_tokens": 200, "ignore_eos": True}
    body.update({"prompt": "Tell me a story"} if path == "/v1/completions"
                else {"messages": [{"role": "user", "content": "Tell me a story"}]})
    chunks = stream(url, path, **body)
    texts = [c["choices"][0].get("text", c["choices"][0].get("delta", {}).get("content"))
             for c in chunks if c["choices"]]
    texts = [t for t in texts if t]  # the chat role chunk carries ""
    sizes = [sim.count_tokens(t) for t in texts]
    assert sizes == sim.step_sizes(200, 4, 0.6) and max(sizes) > 1
    assert chunks[-1]["usage"]["completion_tokens"] == 200 == sum(sizes)
    assert len(texts) < 200 * 0.6  # one chunk per step, not per token
    metrics = requests.get(f"{url}/metrics", timeout=5).text
    drafts = next(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("vllm:spec_decode_num_drafts_total{"))
    assert drafts == len(texts) - 1  # every chunk after the first is one decode step


def test_the_qwen35_weights_think_like_the_reports_model(serve: Serve, tmp_path: Path) -> None:
    models = write_models(tmp_path / "models")
    url = serve(model="/models/Qwen/Qwen3.5-35B-A3B-GPTQ-Int4", B70SIM_MODELS_DIR=str(models))
    text = chat(url, max_tokens=64, messages=[{"role": "user", "content": "Hello"}])["choices"][0]["message"]["content"]
    assert text.startswith("<think>\n")  # a visible trace: no reasoning parser on the shipped stack
    off = chat(url, max_tokens=64, messages=[{"role": "user", "content": "Hello"}], chat_template_kwargs=OFF)
    assert "<think>" not in off["choices"][0]["message"]["content"]
