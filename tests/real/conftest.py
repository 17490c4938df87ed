"""The real-vLLM lane: a vLLM CPU build (B70_REAL_VLLM_VERSION, default 0.21.0) serving a tiny
random model, deployed by the tool under Compose on the real engine (`make test-real` runs it
for each version; scripts/real_vllm.sh builds it).

`lane` reads what the build script left in its cache (lane.env); `real_node` is one node for
the whole module: a sim stack as the fast-booting baseline every failed real switch rolls
back to, and real stacks for each case, with the lane's venv and Python bind-mounted."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import simkit
import yaml
from kit.simnode import SimNode, docker

from b70deploy.sim.box import write_models
from b70deploy.sim.door_image import build as build_door

# The version `make test-real` runs this pass for (its REAL_VERSIONS, one pass each).
VERSION = os.environ.get("B70_REAL_VLLM_VERSION", "0.21.0")
CACHE = Path(os.environ.get("B70_REAL_CACHE", f"/var/cache/b70deploy/real-vllm-{VERSION}"))


@dataclass(frozen=True)
class Lane:
    image: str
    venv: Path
    python_base: Path
    models: Path
    vllm_version: str


@pytest.fixture(scope="session")
def lane() -> Lane:
    env_file = CACHE / "lane.env"
    if not (CACHE / "complete").is_file() or not env_file.is_file():
        simkit.unavailable(f"the real-vLLM lane is not built in {CACHE}: run `make test-real` "
                           "(scripts/real_vllm.sh builds it, about 8 GB)")
    values = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    lane = Lane(image=values["B70_REAL_IMAGE"], venv=Path(values["B70_REAL_VENV"]),
                python_base=Path(values["B70_REAL_PYTHON_BASE"]), models=Path(values["B70_REAL_MODELS"]),
                vllm_version=values["B70_REAL_VLLM_VERSION"])
    if simkit.docker("image", "inspect", lane.image).returncode != 0:
        simkit.unavailable(f"image {lane.image} is missing: run scripts/real_vllm.sh")
    return lane


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def real_stacks(lane: Lane, sim_image: str) -> dict[str, dict[str, object]]:
    """The baseline sim stack and one real stack per case."""
    mounts = [{"source": str(p), "target": str(p)} for p in (lane.python_base, lane.venv)]
    real = {"image": lane.image, "entrypoint_style": "bash-c", "model": {"path": "tiny"},
            "served_model_names": ["tiny-a", "tiny-b"], "dtype": "float32", "max_model_len": 512,
            "enforce_eager": True, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "mounts": mounts,
            "expect": {"min_kv_tokens": 1_000_000}, "settle_seconds": 2,
            "smoke": {"tool_call": False, "aliases": True}}
    return {
        "sim-base": {"image": sim_image, "entrypoint_style": "bash-c", "model": {"path": "Qwen/Qwen3-30B-A3B-W4A16",
                     "quantization": "compressed-tensors"},
                     "model_family": "qwen3-30b-a3b", "served_model_names": ["qwen3-30b-a3b-w4a16"],
                     "dtype": "float16", "max_model_len": 131072, "patches": ["marlin-xpu-carveout"],
                     "env": {"B70SIM_BOOT_SECONDS": "0.5"}, "settle_seconds": 0.5,
                     "smoke": {"completion": {"prompt": "The capital of France is", "expect": "Paris",
                                              "max_tokens": 4}, "tool_call": False, "aliases": True}},
        # healthy, no text expectation: random weights pass the aliases check only
        "real-tiny": real,
        # the report's Qwen3.6 case with a real engine: healthy, speaking noise
        "real-noise": {**real, "smoke": {"completion": {"prompt": "The capital of France is", "expect": "Paris",
                                                         "max_tokens": 8}, "tool_call": False, "aliases": True}},
        # a flag vLLM's argument parser rejects: a real crash before ready
        "real-badflag": {**real, "extra_args": ["--no-such-flag"]},
        # a model folder that is there for the host (lint) but not inside the container: a
        # symlink out of models_dir dangles behind the bind mount
        "real-elsewhere": {**real, "model": {"path": "tiny-elsewhere"}},
        # the thinking-model smoke requests (chat_template_kwargs, tools, the qwen3 reasoning
        # parser) against the real server: accepted, and its noise fails the coherence check
        "real-think": {**real, "tool_calling": {"parser": "hermes", "auto_tool_choice": True},
                       "extra_args": ["--reasoning-parser", "qwen3"],
                       "smoke": {"tool_call": True, "aliases": True, "coherence": True}},
        # head_dim 16: /health 200, then the first completion kills the engine
        "real-die": {**real, "model": {"path": "tiny-hd16"},
                     "smoke": {"completion": {"prompt": "Hello", "expect": "anything", "max_tokens": 4},
                               "tool_call": False, "aliases": True}},
    }


@contextmanager
def _real_node(lane: Lane, sim_image: str, root: Path, *, door_image: str | None = None,
               more: dict[str, dict[str, object]] | None = None) -> Iterator[SimNode]:
    """A node of the lane's: the sim baseline and the real stacks (and `more`), a door in front
    when `door_image` is given; removed on the way out."""
    project = simkit.unique("real")
    tag = f"{project}/vllm:bash-c"
    tags = {"bash-c": tag}
    docker("tag", sim_image, tag)
    if door_image is not None:
        tags["door"] = f"{project}/door:caddy"
        docker("tag", door_image, tags["door"])
    models = root / "models"
    write_models(models)
    for name in ("tiny", "tiny-hd16"):
        shutil.copytree(lane.models / name, models / name)
    shutil.copytree(lane.models / "tiny", root / "outside" / "tiny")
    (models / "tiny-elsewhere").symlink_to(root / "outside" / "tiny")
    (root / "stacks").mkdir()
    for name, doc in {**real_stacks(lane, tag), **(more or {})}.items():
        (root / "stacks" / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    prod, dark = _port(), _port()
    cfg: dict[str, object] = {
        "project": project, "deploy_dir": str(root / "deploy"), "state_dir": str(root / "state"),
        "stacks_dir": str(root / "stacks"), "models_dir": str(models), "device_dir": None,
        # vLLM's CPU build: the CPU platform's access (SYS_NICE, seccomp=unconfined; issue 28)
        "platform": "cpu",
        "bind_address": "127.0.0.1", "ports": {"prod": prod, "dark": dark}, "load_threshold": 1000,
        "timeouts": {"health": 600, "rollback": 600, "poll_interval": 0.5, "smoke": 60}}
    if door_image is not None:
        cfg["door"] = {"enabled": True, "image": tags["door"], "probe_port": _port()}
    # A limit, not a speed: a quiet machine boots 0.21 in ~30 s and 0.32 in ~60 s; on a shared
    # 2-core box under other jobs' load, 0.32's imports alone took over 4 minutes.
    config = root / "node.yaml"
    config.write_text(yaml.safe_dump(cfg))
    node = SimNode(root=root, project=project, prod=prod, dark=dark, tags=tags, config=config)
    try:
        yield node
    finally:
        for proj in (project, f"{project}-dark"):
            simkit.remove_by_project(proj)
        simkit.remove_keep_tags(project)
        for t in tags.values():
            docker("rmi", t, check=False)


@pytest.fixture(scope="module")
def real_node(lane: Lane, sim_images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimNode]:
    with _real_node(lane, sim_images["bash-c"], tmp_path_factory.mktemp("real")) as node:
        yield node


@pytest.fixture(scope="module")
def real_door_node(lane: Lane, sim_images: dict[str, str],
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimNode]:
    """A lane node with the front door, and two stacks of hot standby's (issue 24) on vLLM's CPU build:
    `real-sleep` asks to sleep; `real-sleep-forced` carries --enable-sleep-mode itself."""
    real = real_stacks(lane, "unused")["real-tiny"]
    more = {"real-sleep": {**real, "standby": "sleep"},
            "real-sleep-forced": {**real, "extra_args": ["--enable-sleep-mode"]}}
    with _real_node(lane, sim_images["bash-c"], tmp_path_factory.mktemp("real-door"), door_image=build_door().tag,
                    more=more) as node:
        yield node
