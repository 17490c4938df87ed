"""A rough KV budget from a model's config.json: bytes per token of KV cache.

vLLM's own pre-flight is the truth; this is for a warning before a 4-minute boot.
For Qwen3-30B-A3B (48 layers, 4 KV heads, head_dim 128) in fp8 it gives 49,152 bytes per
token: the post's 12.39 GiB holds 270,663 tokens, vLLM reported 270,592.

An EAGLE draft brings KV layers of its own (the draft's config.json: one layer for the
Qwen3-30B-A3B EAGLE-3 head), allocated in the same pool: 49 layers give 50,176 bytes per
token, so 262,144 tokens need 12.25 GiB and the post's 11.74 GiB holds 251,230 tokens, 251,200
in whole 64-token blocks: vLLM's refusal of the first EAGLE-3 boot, both numbers exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GIB = 1024**3
# vllm/platforms/xpu.py check_and_update_config: "in V1(or with ipex chunked prefill) block_size
# is 64". vLLM's estimate_max_model_len (v1/core/kv_cache_utils.py) binary-searches a length
# whose whole blocks fit, so its "estimated maximum model length" is a multiple of this.
XPU_BLOCK_SIZE = 64
# The report's two EAGLE-3 boots on one node: 11.74 GiB free for KV compiled, 12.41 GiB (a
# measured pool of 265,664 tokens x 50,176 bytes) with --enforce-eager. The node's
# kv_memory_gib is read off a compiled boot (the post's 12.39 GiB), so an eager stack's
# estimate gets this much back.
EAGER_CREDIT_GIB = 0.67


@dataclass(frozen=True)
class MeasuredKV:
    """What a previous boot of the same model, draft and image (and enforce-eager and memory
    share, which move the memory left for KV) recorded: read from its revision's facts, or
    from its saved log when vLLM refused to start before the facts were taken."""

    revision: int
    available_kv_gib: float | None     # `Available KV cache memory: N GiB`
    kv_cache_tokens: int | None        # `GPU KV cache size: N tokens`: only a boot that fit has it
    kv_cache_dtype: str                # the pool in tokens is only comparable for the same KV dtype


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def attention_layers(cfg: dict[str, Any]) -> int | None:
    layers = cfg.get("num_hidden_layers")
    if not isinstance(layers, int):
        return None
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return sum(1 for t in types if isinstance(t, str) and "attention" in t and "linear" not in t)
    interval = cfg.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0:  # hybrid: one full-attention layer per interval
        return layers // interval
    return layers


def element_bytes(kv_cache_dtype: str, dtype: str, config: dict[str, Any]) -> float | None:
    kv = kv_cache_dtype.lower()
    if kv.startswith("fp8"):
        return 1
    if kv in ("auto", "float16", "bfloat16", "half"):
        model_dtype = dtype if dtype != "auto" else str(config.get("torch_dtype", "float16"))
        return 4 if model_dtype == "float32" else 2
    return None  # e.g. TurboQuant presets: unknown packing, no estimate


def kv_bytes_per_token(config: dict[str, Any], kv_cache_dtype: str, dtype: str) -> int | None:
    cfg = _text_config(config)
    layers = attention_layers(cfg)
    heads = cfg.get("num_key_value_heads") or cfg.get("num_attention_heads")
    head_dim = cfg.get("head_dim")
    if head_dim is None and isinstance(cfg.get("hidden_size"), int) and isinstance(cfg.get("num_attention_heads"), int):
        head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    elem = element_bytes(kv_cache_dtype, dtype, cfg)
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(head_dim, int)) or elem is None:
        return None
    return int(2 * layers * heads * head_dim * elem)  # K and V


def tokens_for(budget_bytes: float, per_token: int) -> int:
    return int(budget_bytes // per_token)


def per_token_with_draft(config: dict[str, Any], draft_config: dict[str, Any] | None, kv_cache_dtype: str,
                         dtype: str) -> tuple[int, int] | None:
    """(bytes per token of the model and its draft together, the draft's share). The draft's KV
    layers come from its own config.json; a draft whose config gives no estimate counts as none."""
    base = kv_bytes_per_token(config, kv_cache_dtype, dtype)
    if base is None:
        return None
    extra = kv_bytes_per_token(draft_config, kv_cache_dtype, dtype) if draft_config else None
    return base + (extra or 0), extra or 0


def gib_needed(tokens: int, per_token: int) -> float:
    return tokens * per_token / GIB


def fit_tokens(budget_bytes: float, per_token: int, block: int = XPU_BLOCK_SIZE) -> int:
    """The longest request the budget holds in whole blocks, as vLLM estimates it."""
    return tokens_for(budget_bytes, per_token) // block * block
