"""A hand-made compose file in the field report's shape becomes a stack, and a switch to that
stack serves on the real engine: the model, the flags, the env and the corrected marlin_utils.py
the hand-made file mounted (without it the sim's W4A16 MoE boot crashes in Marlin)."""

from __future__ import annotations

import json

import pytest
import requests
import yaml
from kit.simnode import SimNode, docker
from simkit import image_file

from b70deploy.sim.vllm_tree import MARLIN_REL, VARIANTS

pytestmark = pytest.mark.docker

SITE = next(v.site_packages for v in VARIANTS if v.name == "bash-c")
TARGET = f"{SITE}/vllm/{MARLIN_REL}"
CANARY = "hf_canary_5e1d0"


def test_hand_made_compose_becomes_a_stack_that_switches_in(node: SimNode) -> None:
    hand = node.root / "b70-vllm"
    (hand / "vllm-patches").mkdir(parents=True)
    fixed = image_file(node.tags["bash-c"], TARGET).replace(
        b"if current_platform.is_rocm():", b"if current_platform.is_rocm() or current_platform.is_xpu():")
    (hand / "vllm-patches" / "marlin_utils.py").write_bytes(fixed)
    (hand / ".env").write_text("VLLM023_MODEL=/models/Qwen/Qwen3-30B-A3B-W4A16\n")
    (hand / "vllm023.env").write_text(f"HF_TOKEN={CANARY}\nZE_AFFINITY_MASK=0\n")
    command = ('vllm serve --model "${VLLM023_MODEL}" --served-model-name qwen3-30b-a3b-w4a16 alias-b '
               "--max_model_len 131072 --dtype float16 --kv-cache-dtype fp8 --enable-auto-tool-choice "
               "--tool-call-parser hermes --block-size 64")
    (hand / "docker-compose.yml").write_text(yaml.safe_dump({"services": {"vllm": {
        "image": node.tags["bash-c"], "profiles": ["gpu"],
        "entrypoint": ["/bin/bash", "-c", 'source /opt/intel/oneapi/setvars.sh --force && exec "$$@"', "--"],
        "command": command, "env_file": ["vllm023.env"], "ports": ["127.0.0.1:18000:8000"],
        "volumes": [f"{node.root / 'models'}:/models:ro", f"./vllm-patches/marlin_utils.py:{TARGET}:ro"]}}}))

    made = node.cli("stack", "from-compose", str(hand / "docker-compose.yml"), "--name", "hand", "--json",
                    check=True)
    out = json.loads(made.stdout)
    assert out["sources"]["entrypoint_style"].startswith(f"image {node.tags['bash-c']}")
    assert out["withheld_env"] == ["HF_TOKEN"] and out["node"]["models_dir"] == str(node.root / "models")
    assert CANARY not in made.stdout + made.stderr + (node.root / "stacks" / "hand.yaml").read_text()

    r = node.cli("switch", "hand", "--yes", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert CANARY not in r.stdout + r.stderr
    ids = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={node.project}",
                 "--filter", "label=com.docker.compose.service=vllm").stdout.split()
    assert len(ids) == 1
    assert docker("inspect", "-f", '{{index .Config.Labels "b70deploy.stack"}}', ids[0]).stdout.strip() == "hand"
    assert docker("exec", ids[0], "cat", TARGET).stdout.encode() == fixed
    env = docker("inspect", "-f", "{{json .Config.Env}}", ids[0]).stdout
    assert "ZE_AFFINITY_MASK=0" in env and CANARY not in env
    cmd = json.loads(docker("inspect", "-f", "{{json .Config.Cmd}}", ids[0]).stdout)
    assert cmd[:3] == ["vllm", "serve", "/models/Qwen/Qwen3-30B-A3B-W4A16"] and cmd[-2:] == ["--block-size", "64"]
    reply = requests.post(f"http://127.0.0.1:{node.prod}/v1/completions", timeout=10,
                          json={"model": "alias-b", "prompt": "The capital of France is", "max_tokens": 4}).json()
    assert "Paris" in reply["choices"][0]["text"]
