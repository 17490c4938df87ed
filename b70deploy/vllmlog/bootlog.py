"""Boot facts read from a vLLM container log, and the stack's expectations checked against them.

Pure: lines in, a dataclass out. vLLM's wording moves between releases (0.14 .. 0.33), so
every pattern is a loose regex on the stable part of the message, never a whole line. Each one is
tested against the real logs of every version the real lane runs (tests/fixtures/vllm-*-cpu/).
A fact the log does not state stays None: never a default.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config.schema import Expect


@dataclass
class BootFacts:
    vllm_version: str | None = None
    kv_cache_dtype: str | None = None            # "fp8" when vLLM says it stores KV in fp8
    attention_backend: str | None = None         # FLASH_ATTN, TRITON_ATTN, ...
    attention_fallback: str | None = None        # the log line that announced a fallback
    flash_attn_version: int | None = None
    moe_method: str | None = None                # e.g. CompressedTensorsWNA16MoEMethod
    moe_backend: str | None = None               # the WNA16 MoE oracle's choice (0.23+): XPU, MARLIN, CPU, ...
    available_kv_gib: float | None = None
    model_weights_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None       # the tokens-per-request the concurrency is for
    compile_seconds: float | None = None
    warmup_seconds: float | None = None
    init_engine_seconds: float | None = None
    async_scheduling_disabled: bool | None = None  # None: the log does not say (0.32 prints nothing)
    api_server_started: bool | None = None
    warnings: list[str] = field(default_factory=list)  # known-harmless or noteworthy lines

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(text: str) -> int:
    return int(text.replace(",", "").replace("_", ""))


_VERSION = [
    # 0.21's banner, printed by the API server before anything can fail (so a crash still has a
    # version; tests/fixtures/vllm-0.21.0-cpu/boot.log): `[utils.py:306]  ▄▄ ▄█ █ ... █  version 0.21.0`
    re.compile(r"[\u2580-\u259f]\s+version\s+v?([0-9][\w.+-]*)"),
    re.compile(r"vLLM API server version (\S+)"),
    re.compile(r"Initializing a V\d LLM engine \(v([0-9][\w.+-]*)\)"),
    re.compile(r"\bvLLM version[:= ]+v?([0-9][\w.+-]*)", re.IGNORECASE),
]
_KV_DTYPE = re.compile(r"Using (\w+) data type to store kv cache", re.IGNORECASE)
# Names the XPU platform prints, mapped to the --attention-backend spelling.
_XPU_BACKENDS = [
    (re.compile(r"Falling back to Triton Attention backend", re.IGNORECASE), "TRITON_ATTN", True),
    (re.compile(r"Using Flash Attention backend", re.IGNORECASE), "FLASH_ATTN", False),
    (re.compile(r"Using Triton (?:Attention )?backend", re.IGNORECASE), "TRITON_ATTN", False),
]
# CUDA/ROCm and newer releases: "Using FLASH_ATTN backend", "Using AttentionBackendEnum.X backend".
_ENUM_BACKEND = re.compile(r"Using (?:AttentionBackendEnum\.|_Backend\.)?([A-Z0-9_]*"
                           r"(?:ATTN|ATTENTION|MLA|SDPA|FLASHINFER|XFORMERS)[A-Z0-9_]*) (?:attention )?backend")
_FA_VERSION = re.compile(r"Using FlashAttention version (\d+)", re.IGNORECASE)
_MOE = re.compile(r"Using (\w+MoEMethod)\b")
# vllm/model_executor/layers/fused_moe/oracle/int_wna16.py (0.23+), select_wna16_moe_backend:
# logger.info_once(f"Using '{backend.value}' WNA16 MoE backend.")
_MOE_BACKEND = re.compile(r"Using '(\w+)' WNA16 MoE backend")
# 0.21 vllm/v1/core/kv_cache_utils.py:1710 `GPU KV cache size: %s tokens` (GPU on every platform);
# 0.32 kv_cache_utils.py:2328 `%s KV cache size: %s tokens, Maximum concurrency for %s tokens per
# request: %.2fx` on one line, %s the device (CPU, XPU, GPU; "+ host" with a host tier).
_KV_TOKENS = re.compile(r"\b\w* ?(?:\+ host )?KV cache size: ([\d,_]+) tokens", re.IGNORECASE)
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,_]+) tokens per request: ([\d.]+)x", re.IGNORECASE)
_AVAIL_KV = [
    re.compile(r"Available KV cache memory: ([\d.]+) ?GiB", re.IGNORECASE),
    # The CPU worker's KV budget (VLLM_CPU_KVCACHE_SPACE): `Explicitly set (1.0/15.59) GiB for KV cache on node 0.`
    re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) ?GiB for KV cache", re.IGNORECASE),
]
_WEIGHTS = re.compile(r"Model loading took ([\d.]+) ?GiB", re.IGNORECASE)
# vllm/compilation/monitor.py: 0.21 `torch.compile took %.2f s in total`; 0.32 `%storch.compile took
# %.2f s in total` with a `[backbone] ` tag; older releases (monitor.py's end_monitoring_torch_compile)
# said `takes`.
_COMPILE = [
    re.compile(r"torch\.compile (?:took|takes) ([\d.]+) ?s in total"),
    re.compile(r"Compilation finished in ([\d.]+) ?s", re.IGNORECASE),
    # 0.32 vllm/v1/engine/core.py:395: `init engine (...) took %.2f s (compilation: %.2f s)`
    re.compile(r"took [\d.]+ s \(compilation: ([\d.]+) s"),
]
# vllm/compilation/monitor.py (monitor_profiling_run), 0.21 and 0.32: `%sInitial profiling/warmup
# run took %.2f s`.
_WARMUP = re.compile(r"Initial profiling/warmup run took ([\d.]+) ?s\b")
_INIT_ENGINE = re.compile(r"init engine \([^)]*\) took ([\d.]+) ?s", re.IGNORECASE)
# A speculative method (or executor) that turns it off warns `Async scheduling not supported with ...
# will be disabled`; vllm/config/vllm.py then states the outcome, `Asynchronous scheduling is
# enabled|disabled.` The API server and the engine core each print that line (0.21 CPU: enabled
# in the API server's config, disabled in the engine's), so the last statement wins.
_ASYNC_OFF = re.compile(r"Async scheduling (?:not supported with .* will be disabled|will be disabled)|"
                        r"Asynchronous scheduling is disabled", re.IGNORECASE)
_ASYNC_ON = re.compile(r"Asynchronous scheduling is enabled", re.IGNORECASE)
_SERVER = re.compile(r"Starting vLLM (?:API )?server|Application startup complete", re.IGNORECASE)
_NOTEWORTHY = [
    # vllm/model_executor/layers/quantization/gptq.py: "Currently, the 4-bit gptq_gemm kernel for GPTQ is buggy."
    re.compile(r"gptq_gemm kernel (?:for GPTQ )?is buggy", re.IGNORECASE),
    re.compile(r"max_num_scheduled_tokens is set to \d+", re.IGNORECASE),
]


def server_starting(line: str) -> bool:
    """The API server starts (or has started) serving: /health answers within moments."""
    return _SERVER.search(line) is not None


def parse_boot_facts(lines: Iterable[str]) -> BootFacts:
    """Read the facts a boot log states. The first mention wins (the target model logs before a draft)."""
    f = BootFacts()
    for raw in lines:
        line = raw.rstrip("\n")
        if f.vllm_version is None:
            for pat in _VERSION:
                m = pat.search(line)
                if m:
                    f.vllm_version = m.group(1).rstrip(".,)")
                    break
        if f.kv_cache_dtype is None and (m := _KV_DTYPE.search(line)):
            f.kv_cache_dtype = m.group(1).lower()
        if f.attention_backend is None:
            for pat, name, fallback in _XPU_BACKENDS:
                if pat.search(line):
                    f.attention_backend = name
                    if fallback:
                        f.attention_fallback = _message(line)
                    break
            else:
                if (m := _ENUM_BACKEND.search(line)) and not _MOE.search(line):
                    f.attention_backend = m.group(1)
        elif f.attention_fallback is None and _XPU_BACKENDS[0][0].search(line):
            f.attention_backend, f.attention_fallback = "TRITON_ATTN", _message(line)
        if f.flash_attn_version is None and (m := _FA_VERSION.search(line)):
            f.flash_attn_version = int(m.group(1))
        if f.moe_method is None and (m := _MOE.search(line)):
            f.moe_method = m.group(1)
        if f.moe_backend is None and (m := _MOE_BACKEND.search(line)):
            f.moe_backend = m.group(1)
        if f.kv_cache_tokens is None and (m := _KV_TOKENS.search(line)):
            f.kv_cache_tokens = _int(m.group(1))
        if f.max_concurrency is None and (m := _CONCURRENCY.search(line)):
            f.max_concurrency_len, f.max_concurrency = _int(m.group(1)), float(m.group(2))
        if f.available_kv_gib is None:
            for pat in _AVAIL_KV:
                if m := pat.search(line):
                    f.available_kv_gib = float(m.group(1))
                    break
        if f.model_weights_gib is None and (m := _WEIGHTS.search(line)):
            f.model_weights_gib = float(m.group(1))
        if f.compile_seconds is None:
            for pat in _COMPILE:
                if m := pat.search(line):
                    f.compile_seconds = float(m.group(1))
                    break
        if f.warmup_seconds is None and (m := _WARMUP.search(line)):
            f.warmup_seconds = float(m.group(1))
        if f.init_engine_seconds is None and (m := _INIT_ENGINE.search(line)):
            f.init_engine_seconds = float(m.group(1))
        if _ASYNC_OFF.search(line):
            f.async_scheduling_disabled = True
        elif _ASYNC_ON.search(line):
            f.async_scheduling_disabled = False
        if _SERVER.search(line):
            f.api_server_started = True
        for pat in _NOTEWORTHY:
            if pat.search(line):
                msg = _message(line)
                if msg not in f.warnings:
                    f.warnings.append(msg)
    return f


_PREFIX = re.compile(r"^.*?\[[\w./-]+:\d+\]\s*")


def _message(line: str) -> str:
    """The log message without vLLM's `INFO 07-04 12:00:00 [file.py:96]` prefix."""
    return _PREFIX.sub("", line.strip(), count=1)


def _norm_backend(name: str) -> str:
    n = name.upper().removeprefix("ATTENTIONBACKENDENUM.").removeprefix("_BACKEND.")
    return {"FLASH_ATTENTION": "FLASH_ATTN", "FLASHATTENTION": "FLASH_ATTN", "TRITON": "TRITON_ATTN"}.get(n, n)


def _oracle_route(method: str, backend: str | None, expected: str) -> bool:
    """0.23-0.26 log the Marlin-named method for W4A16 MoE, but it runs the backend the WNA16 MoE
    oracle chose (compressed_tensors_moe_wna16_marlin.py:92, select_wna16_moe_backend): with a
    non-Marlin backend (XPU) the layer is what the portable method's expectation asks for."""
    return (backend is not None and "MARLIN" not in backend.upper() and method.endswith("MarlinMoEMethod")
            and method.replace("MarlinMoEMethod", "MoEMethod") == expected)


def check_expectations(facts: BootFacts, expect: Expect) -> list[str]:
    """One message per expectation the boot log does not meet; empty when all hold."""
    out: list[str] = []
    if expect.attention_backend:
        want = _norm_backend(expect.attention_backend)
        got = facts.attention_backend
        if got is None:
            out.append(f"attention backend not stated in the boot log, expected {want}: "
                       "check the image's vLLM version and the log")
        elif _norm_backend(got) != want:
            why = f" ({facts.attention_fallback})" if facts.attention_fallback else ""
            out.append(f"attention backend is {got}, expected {want}: silent fallback{why}; "
                       "check dtype/kv_cache_dtype against the backend, or pin --attention-backend")
    if expect.flash_attn_version is not None and facts.flash_attn_version != expect.flash_attn_version:
        got_v = "not stated" if facts.flash_attn_version is None else f"version {facts.flash_attn_version}"
        out.append(f"FlashAttention {got_v}, expected version {expect.flash_attn_version}")
    if expect.kv_cache_dtype and expect.kv_cache_dtype != "auto":
        want_kv = expect.kv_cache_dtype.lower()
        got_kv = facts.kv_cache_dtype
        if got_kv is None:
            out.append(f"KV cache dtype: no 'Using {want_kv} data type to store kv cache' line, expected "
                       f"{want_kv}: the KV cache is probably at the model dtype (half the tokens)")
        elif not (got_kv == want_kv or got_kv.startswith(want_kv)):
            out.append(f"KV cache dtype is {got_kv}, expected {want_kv}")
    if expect.moe_method:
        got_m = facts.moe_method
        if got_m is None:
            out.append(f"MoE method not stated in the boot log, expected {expect.moe_method}")
        elif got_m != expect.moe_method and not _oracle_route(got_m, facts.moe_backend, expect.moe_method):
            # The carve-out patch covers compressed-tensors MoE only (CompressedTensorsWNA16MarlinMoEMethod).
            hint = ("" if "Marlin" not in got_m else
                    ": the CUDA-only Marlin path (add patches: [marlin-xpu-carveout])" if "CompressedTensors" in got_m
                    else ": the CUDA-only Marlin path")
            out.append(f"MoE method is {got_m}, expected {expect.moe_method}{hint}")
    if expect.min_kv_tokens is not None:
        if facts.kv_cache_tokens is None:
            out.append(f"KV cache size not stated in the boot log, expected at least {expect.min_kv_tokens:,} tokens")
        elif facts.kv_cache_tokens < expect.min_kv_tokens:
            out.append(f"KV cache holds {facts.kv_cache_tokens:,} tokens, expected at least "
                       f"{expect.min_kv_tokens:,}: less memory for KV than planned (weights, draft, "
                       "gpu_memory_utilization or KV dtype changed)")
    return out
