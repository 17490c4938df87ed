"""On the real engine: a stack whose model is a Hugging Face hub id, on a node whose hf_cache holds
it in the hub's layout (refs/main naming the snapshot). The container gets the cache as its
HF_HOME and loads the model's config.json from the snapshot (a thinking model's: its chat replies
carry a reasoning trace), with no models folder bound."""

from __future__ import annotations

import json

import pytest
import requests
import yaml
from kit.simnode import SimNode, docker

pytestmark = pytest.mark.docker
HUB_ID = "Qwen/Qwen3-30B-A3B-W4A16"


def test_a_hub_model_boots_from_the_nodes_hub_cache(node: SimNode) -> None:
    local = json.loads((node.root / "models" / HUB_ID / "config.json").read_text())
    snap = node.root / "hf" / "hub" / f"models--{HUB_ID.replace('/', '--')}" / "snapshots" / "9f3c2a1"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({**local, "b70sim_think_tokens": 300}))
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("9f3c2a1")
    cfg = yaml.safe_load(node.config.read_text())
    node.config.write_text(yaml.safe_dump({**cfg, "hf_cache": str(node.root / "hf")}))
    (node.root / "stacks" / "hub.yaml").write_text(yaml.safe_dump({
        "extends": "thinking", "env": {"B70SIM_THINK_TOKENS": "0"},
        "model": {"path": HUB_ID, "hub": True, "quantization": "compressed-tensors"}}))

    r = node.cli("switch", "hub", "--yes", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    ids = node.containers("vllm")
    attrs = json.loads(docker("inspect", ids[0]).stdout)[0]
    assert attrs["Config"]["Cmd"][2] == HUB_ID
    assert "HF_HOME=/root/.cache/huggingface" in attrs["Config"]["Env"]
    assert "B70SIM_THINK_TOKENS=0" in attrs["Config"]["Env"]  # the stack's own env does not make it think
    assert [(m["Source"], m["Destination"]) for m in attrs["Mounts"] if m["Destination"].startswith("/root")] == \
        [(str(node.root / "hf"), "/root/.cache/huggingface")]
    assert not [m for m in attrs["Mounts"] if m["Destination"] == "/models"]
    reply = requests.post(f"http://127.0.0.1:{node.prod}/v1/chat/completions", timeout=10, json={
        "model": "qwen3-30b-a3b-w4a16", "max_tokens": 400, "temperature": 0,
        "messages": [{"role": "user", "content": "The capital of France is?"}]}).json()
    assert reply["choices"][0]["message"]["reasoning"]  # the snapshot's config.json made it a thinking model
