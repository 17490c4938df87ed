"""A rough KV budget from a model's config.json: bytes per token of KV cache.

vLLM's own pre-flight is the truth; this is for a warning before a 4-minute boot.
For Qwen3-30B-A3B (48 layers, 4 KV heads, head_dim 128) in fp8 it gives 49,152 bytes per
token: the post's 12.39 GiB holds 270,663 tokens, vLLM reported 270,592.
"""

from __future__ import annotations

from typing import Any

GIB = 1024**3


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
