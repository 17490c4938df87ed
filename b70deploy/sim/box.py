"""The post's box as files: a models dir with the config.json of every shipped stack's
weights (plausible Qwen layer/head values, the EAGLE-3 draft capped at 2048 positions),
so lint, the demo and the tests see what the real node would have. Weights are sparse files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Qwen3-30B-A3B: 48 layers, 4 KV heads of 128 dims (49,152 fp8 bytes of KV per token).
QWEN3_30B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 128, "num_experts_per_tok": 8, "max_position_embeddings": 262144, "torch_dtype": "bfloat16"}
# Qwen3.5/3.6-35B-A3B: hybrid Gated-DeltaNet, full attention every 4th layer.
HYBRID_35B: dict[str, Any] = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
    "text_config": {"hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
                    "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
                    "num_experts": 256, "max_position_embeddings": 262144},
    "torch_dtype": "bfloat16"}
# The EAGLE-3 head as shipped: its config caps positions at 2048 (the post's bug).
EAGLE3_DRAFT: dict[str, Any] = {
    "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 2048, "num_hidden_layers": 1,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16"}

MODELS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-30B-A3B-W4A16": {**QWEN3_30B, "quantization_config": {"quant_method": "compressed-tensors"}},
    "Qwen/Qwen3-30B-A3B-GPTQ-Int4": {**QWEN3_30B, "torch_dtype": "float16",
                                     "quantization_config": {"quant_method": "gptq", "bits": 4}},
    "Qwen/Qwen3-30B-A3B-EAGLE3": EAGLE3_DRAFT,
    # A thinking model ("emits a visible reasoning trace before answering"): the sim reads the marker
    # (the trace's length is ours; the report gives none).
    "Qwen/Qwen3.5-35B-A3B-GPTQ-Int4": {**HYBRID_35B, "quantization_config": {"quant_method": "gptq"},
                                       "b70sim_think_tokens": 300},
    # Boots and runs fast, but this community quant speaks word-salad: the sim reads the marker.
    "community/Qwen3.6-35B-A3B-CT-INT4": {**HYBRID_35B, "quantization_config": {"quant_method": "compressed-tensors"},
                                          "b70sim_fail": "garbage"},
}
DRAFT_HEAD_BYTES = 366_000_000  # the post's 366 MB head; sparse, so it costs no disk


def write_models(root: Path) -> Path:
    """Create (or refresh) the simulated models dir under `root`; returns `root`."""
    for rel, cfg in MODELS.items():
        folder = root / rel
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        with open(folder / "model.safetensors", "wb") as fh:
            fh.truncate(DRAFT_HEAD_BYTES if "EAGLE" in rel else 1024)
    return root
