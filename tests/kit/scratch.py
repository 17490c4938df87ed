"""A scratch node for tests without an engine: config file, stacks folder, the shipped stack names,
the smallest stack that loads, a fake /dev/dri. Its fixtures (scratch, compose, dri) are in
tests/conftest.py."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from b70deploy.config.resources import data_dir

SHIPPED_STACKS = sorted(p.stem for p in data_dir("stacks").glob("*.yaml"))

# The smallest stack that loads: the tests add to it or break it.
MINIMAL_STACK: dict[str, Any] = {
    "image": "intel/vllm:latest",
    "model": {"path": "Qwen/Qwen3-30B-A3B-W4A16"},
    "served_model_names": ["qwen3-30b-a3b-w4a16"],
    "max_model_len": 131072,
}


@dataclass
class Scratch:
    """A temp node: config file, stacks folder, deploy/state dirs that must stay untouched."""

    root: Path
    config: Path
    stacks: Path

    def write_stack(self, name: str, doc: dict[str, Any] | str) -> Path:
        path = self.stacks / f"{name}.yaml"
        path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
        return path

    def write_config(self, doc: dict[str, Any] | str) -> Path:
        if isinstance(doc, dict):
            doc = {**self.base_config(), **doc}
            self.config.write_text(yaml.safe_dump(doc, sort_keys=False))
        else:
            self.config.write_text(doc)
        return self.config

    def base_config(self) -> dict[str, Any]:
        return {
            "deploy_dir": str(self.root / "deploy"),
            "state_dir": str(self.root / "state"),
            "stacks_dir": str(self.stacks),
            "models_dir": str(self.root / "models"),
            "device_dir": None,
        }

    def copy_shipped(self) -> None:
        for path in data_dir("stacks").glob("*.yaml"):
            shutil.copy(path, self.stacks / path.name)

    def without_engine(self) -> None:
        """Point the node at a socket nothing listens on: a test of the plain render (no image on the
        engine) then says the same on a machine that has the catalogue's tags (intel/vllm:latest is
        on every B70 node: issue 39)."""
        self.write_config({"docker_host": f"unix://{self.root / 'no-engine.sock'}"})


def compose_available() -> bool:
    try:
        return subprocess.run(["docker", "compose", "version"], capture_output=True,
                              timeout=30, check=False).returncode == 0 \
            and subprocess.run(["docker", "info"], capture_output=True,
                               timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _mknod(path: Path, gid: int) -> None:
    os.mknod(path, 0o660 | stat.S_IFCHR, os.makedev(226, 128))
    os.chown(path, 0, gid)


def make_gpu_nodes(root: Path, render_gid: int, kfd_gid: int) -> tuple[Path, Path]:
    """A GPU host's nodes made for a test: root/dri/renderD128, root/dri/by-path/ and root/kfd, character devices
    with /dev/null's numbers (a container may open them) owned by the given gids. Raises
    PermissionError where this user may not mknod."""
    if os.geteuid() != 0:
        raise PermissionError("mknod of a character device needs root")
    dri = root / "dri"
    (dri / "by-path").mkdir(parents=True)  # the PCI path links an Intel host has (vLLM's XPU docs mount it)
    for path, gid in ((dri / "renderD128", render_gid), (root / "kfd", kfd_gid)):
        os.mknod(path, 0o660 | stat.S_IFCHR, os.makedev(1, 3))
        os.chown(path, 0, gid)
    return dri, root / "kfd"


def make_dri(parent: Path) -> Path:
    """A fake /dev/dri: character devices owned by gids 992 and 44, plus entries to ignore.
    Raises PermissionError where this user may not mknod."""
    if os.geteuid() != 0:
        raise PermissionError("mknod of a character device needs root")
    d = parent / "dri"
    d.mkdir()
    _mknod(d / "renderD128", 992)
    _mknod(d / "card0", 44)
    _mknod(d / "card1", 44)
    (d / "by-path").mkdir()
    (d / "not-a-device").write_text("regular file: ignored")
    return d
