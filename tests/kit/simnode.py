"""A node of our own on the real engine (the `node` fixture in tests/actions/conftest.py): temp
state/deploy/models dirs, free loopback ports, a unique compose project, test-only image tags,
and a teardown that removes all of it."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import simkit
import yaml

from b70deploy.sim.image import TAGS as SIM_TAGS

OWN_LABEL = "b70test.node"  # on the images SimNode.own_image builds: the project that owns them


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = simkit.docker(*args)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {result.stderr}")
    return result


def completion(port: int, model: str) -> dict[str, Any]:
    """A completion from the node's port, as a client asks it (200 required)."""
    r = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                      json={"model": model, "prompt": "The capital of France is", "max_tokens": 4})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def service_box(project: str, service: str = "vllm") -> dict[str, Any]:
    """`docker inspect` of the one running container of a compose project's service."""
    ids = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={project}",
                 "--filter", f"label=com.docker.compose.service={service}").stdout.split()
    assert len(ids) == 1, ids
    got: dict[str, Any] = json.loads(docker("inspect", ids[0]).stdout)[0]
    return got


@dataclass
class SimNode:
    root: Path
    project: str
    prod: int
    dark: int
    tags: dict[str, str]
    config: Path
    extra_env: dict[str, str] = field(default_factory=dict)

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120,
            check: bool = False) -> subprocess.CompletedProcess[str]:
        return simkit.run_cli(self.config, *args, env={**self.extra_env, **(env or {})}, timeout=timeout,
                              check=check)

    def json(self, *args: str) -> Any:
        return simkit.run_json(self.config, *args, env=self.extra_env)

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def deploy(self) -> Path:
        return self.root / "deploy"

    def own_image(self, name: str) -> str:
        """An image only this node's test names (the sim image plus a label): `docker image prune`
        can delete it once nothing tags it, unlike the shared sim images. Tagged
        `<project>/own:<name>`; the `node` fixture removes every image labelled with the project."""
        tag = f"{self.project}/own:{name}"
        # FROM the shared sim image, never from one of ours: an image with children is never pruned.
        dockerfile = f"FROM {SIM_TAGS['bash-c']}\nLABEL {OWN_LABEL}={self.project} b70test.own={name}\n"
        built = subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=dockerfile, capture_output=True,
                               text=True, timeout=120, check=False)
        assert built.returncode == 0, built.stderr
        return docker("image", "inspect", "-f", "{{.Id}}", tag).stdout.strip()

    def containers(self, service: str) -> list[str]:
        return docker("ps", "-q", "--filter", f"label=com.docker.compose.project={self.project}",
                      "--filter", f"label=com.docker.compose.service={service}").stdout.split()

    def running_image(self) -> str:
        out = self.containers("vllm")
        assert len(out) == 1, out
        return docker("inspect", "-f", "{{.Image}}", out[0]).stdout.strip()

    def answers(self, service: str = "vllm") -> str:
        """Asked of the node from outside: /health, a completion that says Paris, and the stack
        label of the one container of `service` (the vLLM service) that serves it."""
        url = f"http://127.0.0.1:{self.prod}"
        assert requests.get(f"{url}/health", timeout=5).status_code == 200
        model = requests.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"]
        done = requests.post(f"{url}/v1/completions", timeout=10,
                             json={"model": model, "prompt": "The capital of France is", "max_tokens": 4}).json()
        assert "Paris" in done["choices"][0]["text"], done
        ids = self.containers(service)
        assert len(ids) == 1, ids
        return docker("inspect", "-f", '{{index .Config.Labels "b70deploy.stack"}}', ids[0]).stdout.strip()


def write_stacks(folder: Path, image: str) -> None:
    """Small stacks for the deploy tests: healthy ones and one per failure mode."""
    folder.mkdir(parents=True)
    base = {"image": image, "entrypoint_style": "bash-c", "model": {"path": "Qwen/Qwen3-30B-A3B-W4A16",
            "quantization": "compressed-tensors"},
            "model_family": "qwen3-30b-a3b", "served_model_names": ["qwen3-30b-a3b-w4a16", "alias-b"],
            "dtype": "float16", "max_model_len": 131072, "kv_cache_dtype": "fp8",
            "tool_calling": {"parser": "hermes", "auto_tool_choice": True}, "patches": ["marlin-xpu-carveout"],
            "expect": {"attention_backend": "FLASH_ATTN", "kv_cache_dtype": "fp8", "min_kv_tokens": 270000},
            "smoke": {"completion": {"prompt": "The capital of France is", "expect": "Paris", "max_tokens": 4},
                      "tool_call": True, "aliases": True}}
    docs = {
        "alpha": base,
        "beta": {"extends": "alpha", "max_model_len": 262144},
        "crash": {"extends": "alpha", "env": {"B70SIM_FAIL": "marlin"}},
        "garbage": {"extends": "alpha", "env": {"B70SIM_FAIL": "garbage"}},
        "fallback": {"extends": "alpha", "env": {"B70SIM_FAIL": "attn-fallback"}},
        # Boots until the test writes models/.release (HELD_RELEASE): a switch stays in wait-healthy.
        "held": {"extends": "alpha", "env": {"B70SIM_HOLD_UNTIL": "/models/.release"}},
        # A Qwen3-style thinking model: a 300-token trace before every chat answer, in `reasoning`.
        "thinking": {"extends": "alpha", "env": {"B70SIM_THINK_TOKENS": "300"},
                     "extra_args": ["--reasoning-parser", "qwen3"],
                     "smoke": {**base["smoke"], "coherence": True}},
        "thinking-garbage": {"extends": "thinking", "env": {"B70SIM_FAIL": "garbage"}},
    }
    for name, doc in docs.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc))
