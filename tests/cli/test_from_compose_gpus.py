"""`stack from-compose` of the GPU access operators write (issue 28): an NVIDIA device request,
`gpus:`, CDI names, a ROCm service with /dev/kfd; the stack and node values it prints render the
same GPU access back (compared field by field after `docker compose config`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.scratch import Scratch, make_gpu_nodes
from simkit import run_cli, unavailable

from b70deploy.config.node import load_node
from b70deploy.render.files import render
from b70deploy.render.gpu import access_for
from b70deploy.state.fsio import write_tree

Config = Callable[[Path], dict[str, Any]]
COMMAND = ["--model", "/models/Qwen/Qwen3-30B-A3B-W4A16", "--served-model-name", "qwen3-30b-a3b-w4a16",
           "--max-model-len", "32768"]
BASE = {"image": "vllm/vllm-openai:latest", "command": COMMAND, "ipc": "host",
        "ports": ["8000:8000"], "volumes": ["/srv/models:/models:ro"]}
REQUEST = {"deploy": {"resources": {"reservations": {"devices": [
    {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]}, "limits": {"memory": "64g"}}}}
ACCESS = ("devices", "group_add", "cap_add", "security_opt", "deploy", "ipc", "environment")


def _rocm(root: Path) -> dict[str, Any]:
    try:
        dri, kfd = make_gpu_nodes(root, 4343, 4242)
    except PermissionError as e:
        unavailable(str(e))
    return {"image": "vllm/vllm-openai-rocm:latest", "devices": [f"{kfd}:/dev/kfd", f"{dri}:{dri}"],
            "group_add": ["4242", "4343"], "cap_add": ["SYS_PTRACE"], "security_opt": ["seccomp=unconfined"]}


CASES: dict[str, tuple[dict[str, Any], dict[str, Any], Any]] = {
    # name: (service keys, node values the tool must print, the stack's gpus)
    "nvidia-request": (REQUEST, {"platform": "cuda"}, 1),
    "nvidia-gpus-all": ({"gpus": "all"}, {"platform": "cuda"}, None),
    "nvidia-gpus-ids": ({"gpus": [{"driver": "nvidia", "device_ids": ["1"], "capabilities": ["gpu"]}]},
                        {"platform": "cuda"}, ["1"]),
    "nvidia-cdi": ({"devices": ["nvidia.com/gpu=all"]}, {"platform": "cuda", "nvidia_cdi": True}, None),
    "rocm-kfd": ({}, {"platform": "rocm"}, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_operator_gpu_access_comes_back(scratch: Scratch, compose: Config, name: str) -> None:
    keys, want_node, want_gpus = CASES[name]
    svc = {**BASE, **(_rocm(scratch.root) if name.startswith("rocm") else {}), **keys}
    folder = scratch.root / "theirs"
    folder.mkdir()
    (folder / "docker-compose.yml").write_text(yaml.safe_dump({"services": {"vllm": svc}}))
    r = run_cli(scratch.config, "stack", "from-compose", str(folder / "docker-compose.yml"), "--name", "s",
                "--json", in_process=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    node_values = out["node"]
    if name == "nvidia-request":  # never dropped without a word
        assert any("deploy.resources.limits" in n for n in out["notes"]), out["notes"]
    assert want_node.items() <= node_values.items(), node_values
    stack = load_node(str(scratch.config)).catalogue().load("s")
    assert stack.gpus == want_gpus
    # The node config as the printed values say, then render: the same access as theirs.
    scratch.write_config({k: v for k, v in node_values.items() if k not in ("ports", "models_dir")}
                         | {"models_dir": "/srv/models"})
    node = load_node(str(scratch.config))
    write_tree(scratch.root / "ours", render(stack, node, access_for(node, stack)).files)
    ours = compose(scratch.root / "ours")["services"]["vllm"]
    theirs = compose(folder)["services"]["vllm"]
    for key in ACCESS:
        if key == "deploy" and "gpus" in theirs:  # `gpus:` is the short form of the same device request
            assert ours["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
            continue
        if key == "environment":
            continue  # ours adds no mask without a selection; theirs has none
        if key == "deploy" and theirs.get(key):  # the GPU reservation; the rest is named in a note
            assert ours[key]["resources"]["reservations"] == theirs[key]["resources"]["reservations"]
            continue
        assert ours.get(key) == theirs.get(key), key
