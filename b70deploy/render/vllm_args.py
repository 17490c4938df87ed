"""The `vllm serve` argument list for a stack (pure: no files, no Docker)."""

from __future__ import annotations

import json
from typing import Any

from ..config.schema import Stack

CONTAINER_PORT = 8000
CONTAINER_MODELS = "/models"
MODEL_REF = "${VLLM_MODEL}"  # interpolated by Compose from .env (the post's pitfall 2)


def container_model_path(rel: str) -> str:
    return f"{CONTAINER_MODELS}/{rel}"


def speculative_json(stack: Stack, *, draft_path: str | None = None) -> str | None:
    """The --speculative-config value: compact JSON with sorted keys, as the post wrote it."""
    spec = stack.speculative
    if spec is None:
        return None
    conf: dict[str, Any] = {"method": spec.method}
    if spec.num_speculative_tokens is not None:
        conf["num_speculative_tokens"] = spec.num_speculative_tokens
    if spec.prompt_lookup_min is not None:
        conf["prompt_lookup_min"] = spec.prompt_lookup_min
    if spec.prompt_lookup_max is not None:
        conf["prompt_lookup_max"] = spec.prompt_lookup_max
    if spec.model is not None:
        conf["model"] = draft_path or container_model_path(spec.model)
    conf.update(spec.tuning)
    return json.dumps(conf, sort_keys=True, separators=(",", ":"))


def serve_flags(stack: Stack, *, draft_path: str | None = None) -> list[str]:
    """Every flag after the model argument."""
    args: list[str] = ["--served-model-name", *stack.served_model_names,
                       "--host", "0.0.0.0", "--port", str(CONTAINER_PORT)]
    if stack.dtype != "auto":
        args += ["--dtype", stack.dtype]
    args += ["--max-model-len", str(stack.max_model_len)]
    if stack.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", stack.kv_cache_dtype]
    if stack.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", f"{stack.gpu_memory_utilization:g}"]
    args.append("--enable-prefix-caching" if stack.prefix_caching else "--no-enable-prefix-caching")
    if stack.enforce_eager:
        args.append("--enforce-eager")
    if stack.attention_backend:
        args += ["--attention-backend", stack.attention_backend]
    if stack.max_num_seqs is not None:
        args += ["--max-num-seqs", str(stack.max_num_seqs)]
    if stack.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(stack.max_num_batched_tokens)]
    if stack.tool_calling.parser:
        args += ["--tool-call-parser", stack.tool_calling.parser]
    if stack.tool_calling.auto_tool_choice:
        args.append("--enable-auto-tool-choice")
    spec = speculative_json(stack, draft_path=draft_path)
    if spec is not None:
        args += ["--speculative-config", spec]
    return args + list(stack.extra_args)


def container_command(stack: Stack, *, model: str = MODEL_REF, draft_path: str | None = None) -> list[str]:
    """The compose `command:` list, shaped by the image's entrypoint style.

    A `bash -c '... exec "$@"' --` entrypoint runs the command verbatim, so it must name the
    program; an `ENTRYPOINT ["vllm","serve"]` image takes the model and flags only.
    """
    head = ["vllm", "serve"] if stack.entrypoint_style == "bash-c" else []
    return [*head, model, *serve_flags(stack, draft_path=draft_path)]
