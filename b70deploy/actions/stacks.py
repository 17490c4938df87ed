"""`stacks` and `show`: the catalogue as data."""

from __future__ import annotations

from typing import Any

from ..config.node import Node
from ..config.schema import Stack
from ..errors import UserError


def summaries(node: Node) -> tuple[list[dict[str, Any]], list[UserError]]:
    """A row per stack that loads, and the error of each stack file that does not."""
    out = []
    stacks, broken = node.catalogue().load_each()
    for stack in stacks:
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
    return out, broken


def merged_document(node: Node, name: str) -> dict[str, Any]:
    stack = node.catalogue().load(name)
    check_patches(node, stack)
    doc = stack.model_dump(mode="json", exclude_defaults=False)
    if stack.model.architecture is None:  # not stated: no fact about the model (a dense one was shown as moe)
        del doc["model"]["architecture"]
    return doc


def check_patches(node: Node, stack: Stack) -> None:
    """Every patch the stack names exists and loads, else a UserError naming the file that
    listed it: for show, render and diff (lint reports the same as patch-unknown, and a
    switch's preflight refuses it)."""
    from ..render.patches import find_patch  # brings the renderer (jinja2): `stacks` does without

    where = ""
    for name in stack.patches:
        if not where and not (node.patches_dir / f"{name}.yaml").is_file():
            where = node.catalogue().resolve_doc(stack.name).file_for("patches")
        find_patch(node.patches_dir, name, where=where)
