"""Helpers for lint tests: a node config whose image_map points at the sim images (the box's
model files come from b70deploy.sim.box)."""

from __future__ import annotations

import socket
from pathlib import Path

import yaml
from simkit import unique

from b70deploy.sim.image import TAGS as SIM_TAGS

SIM_BASH_C = SIM_TAGS["bash-c"]
SIM_SERVE = SIM_TAGS["serve"]
SIM_DRIFT = SIM_TAGS["bash-c-drift"]



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_node(tmp_path: Path, models_dir: Path, **extra: object) -> Path:
    cfg: dict[str, object] = {
        "project": unique("lint"),  # the session's prefix: the end-of-suite leak check sees it
        "deploy_dir": str(tmp_path / "deploy"), "state_dir": str(tmp_path / "state"),
        "models_dir": str(models_dir), "device_dir": None, "bind_address": "127.0.0.1",
        "ports": {"prod": free_port(), "dark": free_port()},
        "image_map": {"intel/vllm:latest": SIM_BASH_C, "vllm-xpu:0.19.0-tr5": SIM_SERVE},
        "peak_concurrency": 4, "kv_memory_gib": 12.39,
    }
    cfg.update(extra)
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def sim_images_present() -> bool:
    try:
        import docker

        client = docker.from_env()
        for tag in (SIM_BASH_C, SIM_SERVE, SIM_DRIFT):
            client.images.get(tag)
        return True
    except Exception:
        return False
