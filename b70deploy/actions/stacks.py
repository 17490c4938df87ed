"""`stacks` and `show`: the catalogue as data."""

from __future__ import annotations

from typing import Any

from ..config.node import Node


def summaries(node: Node) -> list[dict[str, Any]]:
    out = []
    for stack in node.catalogue().load_all():
        out.append({
            "name": stack.name,
            "extends": stack.extends,
            "image": stack.image,
            "model": stack.model.path,
            "max_model_len": stack.max_model_len,
            "kv_cache_dtype": stack.kv_cache_dtype,
            "speculative": stack.speculative.method if stack.speculative else None,
            "served_model_names": stack.served_model_names,
            "description": stack.description,
        })
    return out


def merged_document(node: Node, name: str) -> dict[str, Any]:
    stack = node.catalogue().load(name)
    return stack.model_dump(mode="json", exclude_defaults=False)
