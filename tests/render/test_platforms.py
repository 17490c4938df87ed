"""Render per platform (issue 28): each platform's compose file is valid against the Compose
Specification's JSON schema (vendored, tests/fixtures/compose-spec/SOURCE.md) and to `docker
compose config`, and render -> from-compose -> render gives back the same GPU access, field by field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kit.scratch import MINIMAL_STACK, SHIPPED_STACKS, Scratch, make_gpu_nodes
from simkit import unavailable

from b70deploy.config.node import Node, load_node
from b70deploy.render.files import COMPOSE_FILE, render
from b70deploy.render.from_compose import stack_from_compose
from b70deploy.render.gpu import access_for
from b70deploy.state.fsio import write_tree

SCHEMA = json.loads((Path(__file__).parents[1] / "fixtures/compose-spec/compose-spec.json").read_text())
GPU_KEYS = ("devices", "group_add", "cap_add", "security_opt", "deploy", "ipc", "environment", "command")
KFD_GID, RENDER_GID = 4242, 4343


def devices(root: Path) -> tuple[Path, Path]:
    """A /dev/dri with one render node and a /dev/kfd, as a ROCm host has them."""
    try:
        return make_gpu_nodes(root, RENDER_GID, KFD_GID)
    except PermissionError as e:
        unavailable(str(e))


PLATFORMS: dict[str, dict[str, Any]] = {
    "cuda": {"platform": "cuda", "device_dir": None},
    "cuda-ids": {"platform": "cuda", "device_dir": None, "gpus": ["0", "1"]},
    "cuda-count": {"platform": "cuda", "device_dir": None, "gpus": 2},
    "cuda-cdi": {"platform": "cuda", "device_dir": None, "nvidia_cdi": True, "gpus": ["1"]},
    "rocm": {"platform": "rocm"},
    "rocm-ids": {"platform": "rocm", "gpus": ["0"]},
    "xpu": {"platform": "xpu"},
    "xpu-ids": {"platform": "xpu", "gpus": ["0"]},
    "cpu": {"platform": "cpu", "device_dir": None},
}


def _node(scratch: Scratch, cfg: dict[str, Any]) -> Node:
    dri, kfd = devices(scratch.root)
    scratch.write_stack("s", {**MINIMAL_STACK, "name": "s"})
    scratch.write_config({"device_dir": str(dri), "kfd_device": str(kfd), **cfg})
    return load_node(str(scratch.config))


def _render(node: Node, folder: Path) -> dict[str, Any]:
    stack = node.catalogue().load("s")
    files = render(stack, node, access_for(node, stack)).files
    write_tree(folder, files)
    doc: dict[str, Any] = yaml.safe_load(files[COMPOSE_FILE])
    return doc


@pytest.mark.parametrize("name", sorted(PLATFORMS))
def test_each_platform_is_valid_compose(scratch: Scratch, compose: Any, name: str) -> None:
    node = _node(scratch, PLATFORMS[name])
    doc = _render(node, scratch.root / "r")
    jsonschema.Draft7Validator(SCHEMA).validate(doc)  # the Compose Specification's own schema (draft-07)
    svc = compose(scratch.root / "r")["services"]["vllm"]  # and the engine's Compose
    assert svc["ipc"] == "host"
    platform = PLATFORMS[name]["platform"]
    if platform == "cuda" and not PLATFORMS[name].get("nvidia_cdi"):
        [req] = svc["deploy"]["resources"]["reservations"]["devices"]
        assert req["driver"] == "nvidia" and req["capabilities"] == ["gpu"]
        assert req.get("device_ids") == PLATFORMS[name].get("gpus") if name == "cuda-ids" else True
        assert req.get("count") == {"cuda": -1, "cuda-count": 2}.get(name, req.get("count"))  # compose: all = -1
    elif platform == "cuda":
        assert [d["source"] for d in svc["devices"]] == ["nvidia.com/gpu=1"]
    elif platform == "rocm":
        assert {d["target"] for d in svc["devices"]} == {"/dev/kfd", str(scratch.root / "dri")}
        assert set(svc["group_add"]) == {str(KFD_GID), str(RENDER_GID)}
        assert svc["cap_add"] == ["SYS_PTRACE"] and svc["security_opt"] == ["seccomp=unconfined"]
    elif platform == "xpu":
        assert svc["group_add"] == [str(RENDER_GID)] and "cap_add" not in svc
        by_path = str(scratch.root / "dri" / "by-path")
        assert {"type": "bind", "source": by_path, "target": by_path, "read_only": True} in svc["volumes"]
    else:
        assert "devices" not in svc and svc["cap_add"] == ["SYS_NICE"]
        assert svc["security_opt"] == ["seccomp=unconfined"]
    mask = {"rocm-ids": ("CUDA_VISIBLE_DEVICES", "0"), "xpu-ids": ("ZE_AFFINITY_MASK", "0")}.get(name)
    if mask:
        assert svc["environment"][mask[0]] == mask[1]


@pytest.mark.parametrize("name", sorted(PLATFORMS))
def test_round_trip_gives_the_same_gpu_access(scratch: Scratch, compose: Any, name: str) -> None:
    """render -> `docker compose config` -> from-compose (stack + node values) -> render again."""
    node = _node(scratch, PLATFORMS[name])
    _render(node, scratch.root / "a")
    first = compose(scratch.root / "a")["services"]["vllm"]
    back = stack_from_compose(first)
    node_cfg = {**PLATFORMS[name], **back.node}
    node_cfg.pop("gpus", None)  # the selection comes back on the stack
    node_cfg.pop("ports", None)
    node_cfg.pop("models_dir", None)
    scratch.write_stack("s", {**back.doc, "name": "s", "served_model_names": MINIMAL_STACK["served_model_names"]})
    scratch.write_config({"device_dir": str(scratch.root / "dri"), "kfd_device": str(scratch.root / "kfd"),
                          **node_cfg})
    node2 = load_node(str(scratch.config))
    assert node2.config.platform == PLATFORMS[name]["platform"]
    _render(node2, scratch.root / "b")
    second = compose(scratch.root / "b")["services"]["vllm"]
    for key in GPU_KEYS:
        assert second.get(key) == first.get(key), key
    binds = sorted(v["target"] for v in first["volumes"] if v["target"].endswith("/by-path"))
    assert binds == sorted(v["target"] for v in second["volumes"] if v["target"].endswith("/by-path"))
    assert len(binds) == (1 if PLATFORMS[name]["platform"] == "xpu" else 0)


def _comment_blocks(text: str) -> list[list[str]]:
    """Runs of consecutive comment lines of a YAML text, each as its lines."""
    blocks: list[list[str]] = []
    previous = False
    for line in text.splitlines():
        comment = line.lstrip().startswith("#")
        if comment and previous:
            blocks[-1].append(line)
        elif comment:
            blocks.append([line])
        previous = comment
    return blocks


@pytest.mark.parametrize("name", sorted(PLATFORMS))
def test_no_rendered_comment_is_cut_mid_sentence(scratch: Scratch, name: str) -> None:
    """Issue 39: a comment cut mid-sentence above `cap_add`. A merged key (the hub cache's environment, the
    node's compose:) took only the last line of a two-line comment with it. Every catalogue stack and a hub
    stack, with warm caches (a pinned id), the node's cap_add/security_opt/environment and the stack's
    cap_add: each comment ends a sentence."""
    node = _node(scratch, {**PLATFORMS[name], "hf_cache": str(scratch.root / "hf"), "compose": {
        "cap_add": ["SYS_NICE"], "security_opt": ["seccomp=unconfined"], "environment": {"NODE_WIDE": "1"}}})
    scratch.copy_shipped()
    scratch.write_stack("hub", {**MINIMAL_STACK, "model": {"path": "Qwen/Qwen3-8B", "hub": True},
                                "compose": {"cap_add": ["IPC_LOCK"]}})
    catalogue = node.catalogue()
    for stack_name in [*SHIPPED_STACKS, "hub"]:
        stack = catalogue.load(stack_name)
        text = render(stack, node, access_for(node, stack), image="sha256:" + "ab" * 32).files[COMPOSE_FILE].decode()
        assert "# Warm boots:" in text or name == "cpu", (stack_name, text)  # the two-line comment was rendered
        for block in _comment_blocks(text):
            assert block[-1].rstrip().endswith((".", ".)")), (stack_name, block)
