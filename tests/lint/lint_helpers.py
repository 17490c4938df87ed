"""Helpers for lint tests: the box's model files simulated in a temp models dir, and a node
config whose image_map points at the sim images."""

from __future__ import annotations

import socket
from pathlib import Path

import yaml

SIM_BASH_C = "b70sim/vllm:bash-c"
SIM_SERVE = "b70sim/vllm:serve"
SIM_DRIFT = "b70sim/vllm:bash-c-drift"

# Plausible Qwen3-30B-A3B values: 48 layers, 4 KV heads of 128 dims (49,152 fp8 bytes per token).
QWEN3_30B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
             "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
             "num_experts": 128, "num_experts_per_tok": 8, "max_position_embeddings": 262144,
             "torch_dtype": "bfloat16"}
HYBRID_35B = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
              "text_config": {"hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
                              "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
                              "num_experts": 256, "max_position_embeddings": 262144},
              "torch_dtype": "bfloat16"}
EAGLE3_DRAFT = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 2048, "num_hidden_layers": 1,
                "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}

MODELS = {
    "Qwen/Qwen3-30B-A3B-W4A16": {**QWEN3_30B, "quantization_config": {"quant_method": "compressed-tensors"}},
    "Qwen/Qwen3-30B-A3B-GPTQ-Int4": {**QWEN3_30B, "torch_dtype": "float16",
                                     "quantization_config": {"quant_method": "gptq", "bits": 4}},
    "Qwen/Qwen3-30B-A3B-EAGLE3": EAGLE3_DRAFT,
    "Qwen/Qwen3.5-35B-A3B-GPTQ-Int4": {**HYBRID_35B, "quantization_config": {"quant_method": "gptq"}},
    "community/Qwen3.6-35B-A3B-CT-INT4": {**HYBRID_35B,
                                          "quantization_config": {"quant_method": "compressed-tensors"}},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_node(tmp_path: Path, models_dir: Path, **extra: object) -> Path:
    cfg: dict[str, object] = {
        "project": f"b70lint{free_port()}",
        "deploy_dir": str(tmp_path / "deploy"), "state_dir": str(tmp_path / "state"),
        "models_dir": str(models_dir), "device_dir": None, "bind_address": "127.0.0.1",
        "ports": {"prod": free_port(), "dark": free_port()},
        "image_map": {"intel/vllm:latest": SIM_BASH_C, "vllm-xpu:0.19.0-tr5": SIM_SERVE},
        "peak_concurrency": 4, "kv_memory_gib": 12.39,
    }
    cfg.update(extra)
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def sim_images_present() -> bool:
    try:
        import docker

        client = docker.from_env()
        for tag in (SIM_BASH_C, SIM_SERVE, SIM_DRIFT):
            client.images.get(tag)
        return True
    except Exception:
        return False
