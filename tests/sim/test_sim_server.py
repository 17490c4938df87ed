"""The sim server's pure parts, and the server itself on loopback: no Docker."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from b70deploy.config.catalogue import Catalogue
from b70deploy.config.resources import data_dir
from b70deploy.render.vllm_args import container_command
from b70deploy.sim import server as sim
from b70deploy.vllmlog.diagnosis import diagnose

PREFIX_RE = re.compile(r"^(INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] ")


def stack_argv(name: str) -> list[str]:
    """The `vllm serve` arguments b70deploy renders for a shipped stack (model path filled in)."""
    stack = Catalogue(data_dir("stacks")).load(name)
    cmd = container_command(stack, model=f"/models/{stack.model.path}")
    return cmd[2:] if cmd[:2] == ["vllm", "serve"] else cmd


# ---------------------------------------------------------------- flags


@pytest.mark.parametrize("name", Catalogue(data_dir("stacks")).names())
def test_every_shipped_stack_parses(name: str) -> None:
    stack = Catalogue(data_dir("stacks")).load(name)
    cfg = sim.parse_serve_args(stack_argv(name))
    assert cfg.model == f"/models/{stack.model.path}"
    assert list(cfg.served_names) == stack.served_model_names
    assert cfg.max_model_len == stack.max_model_len
    assert cfg.port == 8000 and cfg.host == "0.0.0.0"
    assert cfg.kv_cache_dtype == stack.kv_cache_dtype
    assert cfg.prefix_caching == stack.prefix_caching
    assert cfg.enforce_eager == stack.enforce_eager
    assert cfg.auto_tool_choice == stack.tool_calling.auto_tool_choice
    if stack.speculative is not None:
        assert cfg.speculative is not None and cfg.speculative["method"] == stack.speculative.method


def test_all_flags() -> None:
    cfg = sim.parse_serve_args([
        "m", "--served-model-name", "a", "b", "--dtype", "float16", "--max-model-len", "128K",
        "--kv-cache-dtype", "fp8", "--no-enable-prefix-caching", "--enforce-eager",
        "--speculative-config", '{"method":"ngram","num_speculative_tokens":5}', "--tool-call-parser", "hermes",
        "--enable-auto-tool-choice", "--gpu-memory-utilization", "0.9", "--attention-backend", "FLASH_ATTN",
        "--max-num-seqs", "8", "--max-num-batched-tokens", "4096"])
    assert cfg.served_names == ("a", "b") and cfg.max_model_len == 131072 and not cfg.prefix_caching
    assert cfg.speculative == {"method": "ngram", "num_speculative_tokens": 5}
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.attention_backend) == (8, 4096, "FLASH_ATTN")


def test_flags_that_change_nothing_in_the_sim_are_accepted_as_vllm_accepts_them() -> None:
    # naptha-node's vllm-models/*.yml (tests/fixtures/operators/napthaai-naptha-node-vllm)
    cfg = sim.parse_serve_args(["Qwen/Qwen2.5-7B-Instruct", "--enable-prefix-caching", "--enable-chunked-prefill",
                                "--gpu-memory-utilization", "0.98", "--max-model-len", "32768",
                                "--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    assert cfg.model == "Qwen/Qwen2.5-7B-Instruct" and cfg.max_model_len == 32768


@pytest.mark.parametrize("argv", [["m", "--no-such-flag"], ["m", "--speculative-config", "{bad"],
                                  ["m", "--max-model-len", "lots"]])
def test_bad_flags_exit_2_with_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        sim.parse_serve_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: vllm serve") and "error:" in err


def test_auto_tool_choice_without_a_parser_dies_with_vllms_type_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert sim.serve(["m", "--enable-auto-tool-choice"], {}) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1].endswith(") TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser")
    assert err[-1].startswith("(APIServer pid=")
    d = diagnose(err)
    assert d is not None and d.id == "tool-parser-missing"


@pytest.mark.parametrize(("raw", "want"), [("131072", 131072), ("1k", 1000), ("1K", 1024), ("256K", 262144),
                                           ("auto", -1), ("-1", -1)])
def test_max_model_len_forms(raw: str, want: int) -> None:
    assert sim.parse_max_model_len(raw) == want


def test_model_defaults_to_served_name() -> None:
    cfg = sim.parse_serve_args(["--model", "/models/x"])
    assert cfg.served_names == ("/models/x",) and cfg.max_model_len is None


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_is_words_and_punctuation() -> None:
    assert sim.tokenize("The capital of France is") == ["The", "capital", "of", "France", "is"]
    assert sim.count_tokens("Hello, world!") == 4
    assert sim.count_tokens("") == 0
    assert sim.count_tokens("garò prezi") == 2  # unicode words are one token


def test_pieces_are_one_token_each_and_rejoin() -> None:
    text = " Paris. It is, in fact, big!"
    parts = sim.pieces(text)
    assert "".join(parts) == text
    assert all(sim.count_tokens(p) == 1 for p in parts)


def test_chat_prompt_counts_chatml() -> None:
    text = sim.chat_prompt_text([{"role": "user", "content": "Hi"}])
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert sim.count_tokens(text) == 18  # <|im_start|> is 5 tokens: < | im_start | >


# ---------------------------------------------------------------- log lines and boot plan


def test_log_prefix_like_vllm() -> None:
    line = sim.log_line("INFO", "kv_cache_utils.py:1710", "GPU KV cache size: 270,592 tokens", now=0)
    assert PREFIX_RE.match(line) and line.endswith("] GPU KV cache size: 270,592 tokens")


@pytest.mark.parametrize(("kv", "max_len", "conc"), [(270592, 131072, "2.06x"), (270592, 262144, "1.03x"),
                                                       (453184, 262144, "1.73x")])
def test_kv_lines_match_the_post(kv: int, max_len: int, conc: str) -> None:
    size, line = sim.kv_lines(kv, max_len)
    assert size == f"GPU KV cache size: {kv:,} tokens"
    assert line == f"Maximum concurrency for {max_len:,} tokens per request: {conc}"


def test_kv_defaults() -> None:
    assert sim.default_kv_tokens("fp8", None) == 270592
    assert sim.default_kv_tokens("fp8", {"method": "eagle3"}) == 265664
    assert sim.default_kv_tokens("k3v4_nc", {"method": "suffix"}) == 453184
    assert sim.default_kv_tokens("auto", None) == 135296


def test_kv_too_small_names_estimate() -> None:
    msg = sim.kv_too_small_message(262144, 251200, "fp8")
    assert msg.startswith("ValueError: To serve at least one request with the models's max seq len (262144)")
    assert re.search(r"estimated maximum model length is (\d+)", msg).group(1) == "251200"  # type: ignore[union-attr]


def plan(argv: list[str], *, fail: str = "", marlin: bool | None = False, arctic: bool = False,
         env: dict[str, str] | None = None) -> sim.BootPlan:
    knobs = sim.Knobs.from_env({"B70SIM_FAIL": fail, **(env or {})})
    image = sim.ImageFacts("0.21.1.dev17+g0a4756bb5", arctic, marlin)
    return sim.plan_boot(sim.parse_serve_args(argv), knobs, image, None)


def messages(p: sim.BootPlan) -> list[str]:
    return [m for _, _, m, _, _ in p.lines]


def test_w4a16_boot_facts() -> None:
    p = plan(stack_argv("w4a16-131k"))
    msgs = messages(p)
    assert p.outcome == "serve" and p.kv_tokens == 270592
    for want in ("Using fp8 data type to store kv cache", "Using Flash Attention backend.",
                 "Using FlashAttention version 2", "Using CompressedTensorsWNA16MoEMethod",
                 "GPU KV cache size: 270,592 tokens", "Maximum concurrency for 131,072 tokens per request: 2.06x",
                 "torch.compile took 82.14 s in total", "Initial profiling/warmup run took 24.09 s"):
        assert any(want in m for m in msgs), want


def test_marlin_crash_after_loading_weights() -> None:
    p = plan(stack_argv("w4a16-131k"), marlin=True)
    assert p.outcome == "crash" and sim.MARLIN_ERROR in p.traceback
    assert messages(p)[-1].startswith("Loading weights took")
    assert any("WNA16MarlinMoEMethod" in m for m in messages(p))


def test_suffix_needs_arctic() -> None:
    assert plan(stack_argv("tq-256k"), arctic=False).traceback[-1] == sim.ARCTIC_ERROR
    ok = plan(stack_argv("tq-256k"), arctic=True)
    assert ok.outcome == "serve" and ok.kv_tokens == 453184


def test_kv_budget_below_max_len_crashes() -> None:
    p = plan(stack_argv("w4a16"), env={"B70SIM_KV_TOKENS": "251200"})
    assert p.outcome == "crash" and "estimated maximum model length is 251200" in p.traceback[-2]
    forced = plan(stack_argv("w4a16-131k"), fail="kv-too-small")
    assert forced.outcome == "crash"


def test_eagle3_trims_kv_and_enforce_eager_skips_compile() -> None:
    p = plan(stack_argv("eagle3"))
    assert p.kv_tokens == 265664
    assert not any("torch.compile" in m for m in messages(p))


@pytest.mark.parametrize(("fail", "outcome"), [("hang", "hang"), ("arctic", "crash"), ("marlin", "crash"),
                                               ("attn-fallback", "serve"), ("garbage", "serve")])
def test_forced_failures(fail: str, outcome: str) -> None:
    p = plan(stack_argv("w4a16-131k"), fail=fail)
    assert p.outcome == outcome
    if fail == "attn-fallback":
        assert "Using Triton backend." in messages(p)
        assert "Using Flash Attention backend." not in messages(p)


def test_knob_errors() -> None:
    with pytest.raises(ValueError, match="B70SIM_FAIL=nope"):
        sim.Knobs.from_env({"B70SIM_FAIL": "nope"})
    with pytest.raises(ValueError, match="B70SIM_DECODE_TPS"):
        sim.Knobs.from_env({"B70SIM_DECODE_TPS": "0"})
    with pytest.raises(ValueError, match="B70SIM_KV_TOKENS"):
        sim.Knobs.from_env({"B70SIM_KV_TOKENS": "-3"})


def test_quantization_inference() -> None:
    assert sim.infer_quantization("/models/Qwen/Qwen3-30B-A3B-W4A16", None) == "compressed-tensors"
    assert sim.infer_quantization("/models/community/Qwen3.6-35B-A3B-CT-INT4", None) == "compressed-tensors"
    assert sim.infer_quantization("/models/Qwen/Qwen3-30B-A3B-GPTQ-Int4", None) == "gptq"
    assert sim.infer_quantization("/models/x", {"quantization_config": {"quant_method": "awq"}}) == "awq"


# ---------------------------------------------------------------- timing model and generation


def test_timing_model() -> None:
    assert sim.ttft_seconds(8000, 40000) == pytest.approx(0.2)
    assert sim.token_delay(1, 13.0, 0.04) == pytest.approx(1 / 13)
    assert sim.aggregate_tps(12, 13.06, 0.04) / 13.06 == pytest.approx(12 / 1.44)


def test_generation() -> None:
    toks, reason = sim.generate("The capital of France is", 4, chat=False)
    assert "".join(toks) == " Paris. It is" and reason == "length"
    toks, reason = sim.generate("What is the capital of France?", 64, chat=True)
    assert "".join(toks) == "Paris is the capital of France." and reason == "stop"
    toks, reason = sim.generate("Tell me a story", 50, chat=True)
    assert len(toks) == 50 and reason == "length"
    assert sim.count_tokens("".join(toks)) == 50
    salad, _ = sim.generate("The capital of France is", 8, chat=False, garbage=True)
    assert "garò" in "".join(salad) and "Paris" not in "".join(salad)


def test_spec_counts_mean_acceptance() -> None:
    steps = sim.spec_step_counts(1000, 3, 0.27)
    assert 1 + sum(steps) / len(steps) == pytest.approx(1.81, abs=0.02)
    assert sum(steps) + len(steps) + 1 == 1000
    assert sim.spec_step_counts(1, 3, 0.27) == []


# ---------------------------------------------------------------- the server on loopback


@pytest.fixture
def host_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """The server in a thread on 127.0.0.1 (boot 0, fast decode) with its argv recorded."""
    info: dict[str, Any] = {}
    ready = threading.Event()

    def on_ready(httpd: sim.Server) -> None:
        info["httpd"] = httpd
        ready.set()

    env = {"B70SIM_BOOT_SECONDS": "0", "B70SIM_DECODE_TPS": "100", "B70SIM_PREFILL_TPS": "1000",
           "B70SIM_BATCH_ALPHA": "0"}
    argv = [*stack_argv("ngram"), "--host", "127.0.0.1", "--port", "0"]
    thread = threading.Thread(target=sim.serve, args=(argv, env, on_ready), daemon=True)
    thread.start()
    assert ready.wait(10)
    port = info["httpd"].server_address[1]
    yield f"http://127.0.0.1:{port}", info
    info["httpd"].shutdown()
    thread.join(5)


def test_host_server_api(host_server: tuple[str, dict[str, Any]]) -> None:
    url, _ = host_server
    assert requests.get(f"{url}/health", timeout=5).status_code == 200
    models = requests.get(f"{url}/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["qwen3-30b-a3b-w4a16", "qwen3-30b-tq-256k"]
    assert models["data"][0]["owned_by"] == "vllm" and models["data"][0]["max_model_len"] == 262144
    prompt = "The capital of France is"
    r = requests.post(f"{url}/v1/completions", json={"model": "qwen3-30b-tq-256k", "prompt": prompt,
                                                     "max_tokens": 4}, timeout=10).json()
    # vLLM 0.21 names the first served name whichever alias was asked (the real chat-stream.sse).
    assert "Paris" in r["choices"][0]["text"] and r["model"] == "qwen3-30b-a3b-w4a16"
    assert r["usage"] == {"prompt_tokens": sim.count_tokens(prompt), "completion_tokens": 4, "total_tokens": 9}
    bad = requests.post(f"{url}/v1/completions", json={"model": "nope", "prompt": "x"}, timeout=5)
    assert bad.status_code == 404
    metrics = requests.get(f"{url}/metrics", timeout=5).text
    assert 'vllm:prompt_tokens_total{engine="0",model_name="qwen3-30b-a3b-w4a16"} 5.0' in metrics
    assert "vllm:spec_decode_num_drafts_total" in metrics
    assert requests.get(f"{url}/version", timeout=5).json()["version"]


def test_host_server_stream_and_tools(host_server: tuple[str, dict[str, Any]]) -> None:
    url, _ = host_server
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    body = {"model": "qwen3-30b-a3b-w4a16", "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "tools": tools, "stream": True, "stream_options": {"include_usage": True}}
    with requests.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=10) as r:
        events = [line[6:] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    args = "".join(c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                   for c in chunks if c["choices"] and "tool_calls" in c["choices"][0]["delta"])
    assert json.loads(args) == {"city": "Oslo"}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == sim.count_tokens(args)


def test_host_server_timing_and_overlap(host_server: tuple[str, dict[str, Any]]) -> None:
    url, _ = host_server
    prompt = " ".join(["word"] * 200)  # 200 tokens: TTFT 0.2 s at 1000 tok/s

    def one(max_tokens: int) -> tuple[float, float, float]:
        """(start, first chunk, end) on this process's clock."""
        body = {"model": "qwen3-30b-a3b-w4a16", "prompt": prompt, "max_tokens": max_tokens, "stream": True}
        start = time.monotonic()
        first = 0.0
        with requests.post(f"{url}/v1/completions", json=body, stream=True, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith(b"data: {") and not first:
                    first = time.monotonic()
        return start, first, time.monotonic()

    # The model's times are floors (a sleep never ends early); how close a loaded machine comes to
    # them is benchmarks/bench_accuracy.py's to measure, not a test's to assert.
    start, first, end = one(21)
    assert first - start >= 0.2 and end - start >= 0.4  # then 20 more tokens at 100 tok/s
    # Overlap by order, not by a wall-clock bound: served one after another, no two requests
    # stream at the same time (the next one's first chunk comes after the last one's end); served
    # together, some two 2 s streams overlap however late a loaded machine starts a client.
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda _: one(201), range(4)))
    assert any(fa < eb and fb < ea for i, (_, fa, ea) in enumerate(runs) for _, fb, eb in runs[i + 1:])


def test_compile_hang_goes_quiet_once_torch_compile_starts_unless_eager() -> None:
    p = plan(stack_argv("w4a16-131k"), fail="compile-hang")
    assert p.outcome == "hang" and messages(p)[-1].startswith("Dynamo bytecode transform time")
    assert plan(stack_argv("eagle3"), fail="compile-hang").outcome == "serve"  # enforce_eager: no compile


# ---------------------------------------------------------------- faithful to vLLM 0.21.0 (tests/fixtures)


def test_chat_stream_puts_finish_reason_on_the_last_content_chunk(host_server: tuple[str, dict[str, Any]]) -> None:
    url, _ = host_server
    body = {"model": "qwen3-30b-tq-256k", "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    with requests.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=10) as r:
        events = [line[6:] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["model"] for c in chunks} == {"qwen3-30b-a3b-w4a16"}  # the first served name, as 0.21 answers
    content = [c for c in chunks if c["choices"] and "content" in c["choices"][0]["delta"]][1:]  # after the role
    # ngram speculation: a step's accepted draft tokens come out in one chunk, as vLLM streams them
    steps = sim.step_sizes(5, 5, 0.27)
    assert steps == [1, 2, 2]
    assert [sim.count_tokens(c["choices"][0]["delta"]["content"]) for c in content] == steps
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * (len(steps) - 1) + ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


def test_metrics_shape_like_vllm_021(host_server: tuple[str, dict[str, Any]]) -> None:
    url, _ = host_server
    text = requests.get(f"{url}/metrics", timeout=5).text
    for line in text.splitlines():
        if "{" in line and not line.startswith("#"):
            labels = re.findall(r'(\w+)="', line.split("{", 1)[1])
            assert labels == sorted(labels), line  # engine, finished_reason, model_name: name order
    assert "# TYPE vllm:prompt_tokens_total counter" in text  # _total kept in HELP/TYPE
    assert "# TYPE vllm:prompt_tokens_created gauge" in text
    assert re.search(r'^vllm:prompt_tokens_created\{engine="0",model_name="qwen3-30b-a3b-w4a16"\} \d', text, re.M)
    reasons = re.findall(r'^vllm:request_success_total\{engine="0",finished_reason="(\w+)"', text, re.M)
    assert reasons == ["stop", "length", "abort", "error", "repetition"]


def test_die_after_ready_dies_on_the_first_request() -> None:
    info: dict[str, Any] = {}
    ready = threading.Event()

    def on_ready(httpd: sim.Server) -> None:
        info["httpd"] = httpd
        ready.set()

    env = {"B70SIM_BOOT_SECONDS": "0", "B70SIM_FAIL": "die-after-ready"}
    argv = [*stack_argv("w4a16-131k"), "--host", "127.0.0.1", "--port", "0"]
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(sim.serve(argv, env, on_ready)), daemon=True)
    thread.start()
    assert ready.wait(10)
    url = f"http://127.0.0.1:{info['httpd'].server_address[1]}"
    time.sleep(0.5)
    assert requests.get(f"{url}/health", timeout=5).status_code == 200  # no timer
    r = requests.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=5)
    real = json.loads((Path(__file__).parents[1] / "fixtures" / "vllm-0.21.0-cpu" /
                       "die-after-ready.response.json").read_text())
    assert r.status_code == 500 and r.json() == real
    thread.join(10)
    assert result == [0]  # the server stopped by itself; the process exits 0 like vLLM's


def _serve_in_thread(env: dict[str, str]) -> tuple[Any, threading.Thread, list[int]]:
    info: dict[str, Any] = {}
    ready = threading.Event()

    def on_ready(httpd: sim.Server) -> None:
        info["httpd"] = httpd
        ready.set()

    argv = [*stack_argv("w4a16-131k"), "--host", "127.0.0.1", "--port", "0"]
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(sim.serve(argv, env, on_ready)), daemon=True)
    thread.start()
    assert ready.wait(10)
    return info["httpd"], thread, result


def _url(httpd: Any) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}"


def _complete(url: str) -> requests.Response:
    return requests.post(f"{url}/v1/completions", timeout=5,
                         json={"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})


def test_fail_after_dies_by_itself_that_long_after_ready() -> None:
    # 4 s: room for the first request on a loaded machine before the timer ends the server
    env = {"B70SIM_BOOT_SECONDS": "0", "B70SIM_FAIL": "die-after-ready", "B70SIM_FAIL_AFTER": "4"}
    httpd, thread, result = _serve_in_thread(env)
    url = _url(httpd)
    start = time.monotonic()
    r = _complete(url)  # before the timer: requests are served
    assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["text"]
    thread.join(60)
    assert not thread.is_alive() and result == [0]  # no request needed: it died on its own
    assert time.monotonic() - start > 1.0  # by its timer, not at once


def test_fail_after_turns_completions_to_word_salad_later() -> None:
    env = {"B70SIM_BOOT_SECONDS": "0", "B70SIM_FAIL": "garbage", "B70SIM_FAIL_AFTER": "3"}
    httpd, thread, _ = _serve_in_thread(env)
    url = _url(httpd)
    try:
        assert "Paris" in _complete(url).json()["choices"][0]["text"]
        deadline = time.monotonic() + 60
        while "Paris" in (later := _complete(url)).json()["choices"][0]["text"]:  # until the timer has fired
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert later.status_code == 200
        assert requests.get(f"{url}/health", timeout=5).status_code == 200  # still "healthy"
    finally:
        httpd.shutdown()
        thread.join(10)
