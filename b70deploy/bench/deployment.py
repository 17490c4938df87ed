"""What is being benchmarked: the node's current deployment by default, or an explicit endpoint.

`current_deployment_info` is the one place the bench asks the node what runs; everything
else in b70deploy.bench uses it (or an explicit --endpoint) and nothing more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..state.revisions import RevisionStore
from .client import Endpoint, get_json

if TYPE_CHECKING:
    from ..config.node import Node

INFO_KEYS = ("endpoint", "stack", "revision", "image_id", "vllm_version", "kv_tokens")


def current_deployment_info(node: Node) -> dict[str, Any]:
    """What is known about the deployment serving on the node's production port.

    Keys: endpoint, stack, revision, image_id, vllm_version, kv_tokens (None when unknown), and
    speculative (the stack's speculative block, for bench.guards; not written to results).
    """
    current = RevisionStore(node.state_dir).current()
    info: dict[str, Any] = {"endpoint": f"http://127.0.0.1:{node.config.ports.prod}", "stack": None,
                            "revision": None, "image_id": None, "vllm_version": None, "kv_tokens": None}
    if current is not None:
        info.update(stack=current.meta.stack, revision=current.number, image_id=current.meta.image_id,
                    vllm_version=current.status.vllm_version, kv_tokens=current.status.facts.get("kv_cache_tokens"),
                    speculative=(current.meta.stack_doc or {}).get("speculative"))
    return info


def deployment_key(node: Node) -> str | None:
    """The key the node's serving vllm asks /v1 requests for (its --api-key or VLLM_API_KEY), from its container."""
    from ..docker.node import DockerNode  # the engine's SDK: only when the node's deployment is benched

    return DockerNode.production(node).api_key()


def server_facts(endpoint: Endpoint) -> dict[str, Any]:
    """What the server says about itself: vLLM version (/version) and served models (/v1/models)."""
    facts: dict[str, Any] = {"vllm_version": None, "models": [], "max_model_len": {}}
    version = get_json(endpoint, "/version")
    if isinstance(version, dict) and isinstance(version.get("version"), str):
        facts["vllm_version"] = version["version"]
    models = get_json(endpoint, "/v1/models")
    if isinstance(models, dict):
        facts["models"] = [m.get("id") for m in models.get("data") or [] if isinstance(m, dict) and m.get("id")]
        # vLLM's model card carries max_model_len (vllm/entrypoints/openai/protocol.py, ModelCard)
        facts["max_model_len"] = {m["id"]: m["max_model_len"] for m in models.get("data") or []
                                  if isinstance(m, dict) and m.get("id") and isinstance(m.get("max_model_len"), int)}
    return facts


def environment(endpoint: Endpoint, known: dict[str, Any] | None, *, model: str | None, note: str | None,
                date: str) -> dict[str, Any]:
    """The environment block of a results file.

    `known` is current_deployment_info() when the endpoint is the current deployment, else
    None (an explicit endpoint says nothing about stack or revision).
    """
    env: dict[str, Any] = {k: None for k in INFO_KEYS}
    if known:
        env.update({k: known.get(k) for k in INFO_KEYS})
    env["endpoint"] = endpoint.url
    facts = server_facts(endpoint)
    if facts["vllm_version"]:
        env["vllm_version"] = facts["vllm_version"]
    env["served_models"] = facts["models"]
    env["model"] = model
    env["date"] = date
    env["note"] = note
    return env
