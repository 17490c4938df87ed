"""The GPU preflight of a switch (docker/platform.py `missing_for`, issue 28): one line naming
what the engine or host lacks, from `docker info` (a stand-in client answers it here; the real
engine's refusal is tests/actions/test_platform_engine.py) and this host's device nodes."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from kit.lintnode import write_node
from simkit import unavailable

from b70deploy.config.node import Node, load_node
from b70deploy.docker.platform import missing_for


class Engine:
    """What the SDK's DockerClient.info() returns, and nothing else."""

    def __init__(self, **info: Any) -> None:
        self._info = {"Runtimes": {"runc": {"path": "runc"}}, **info}

    def info(self) -> dict[str, Any]:
        return self._info


def _node(tmp_path: Path, models_dir: Path, **cfg: object) -> Node:
    return load_node(str(write_node(tmp_path, models_dir, **cfg)))


def _missing(node: Node, engine: Engine, **stack: object) -> list[str]:
    s = node.catalogue().load("w4a16").model_copy(update=stack)
    return missing_for(node, s, engine)


def test_cuda_without_the_nvidia_runtime(tmp_path: Path, models_dir: Path) -> None:
    node = _node(tmp_path, models_dir, platform="cuda")
    [line] = _missing(node, Engine())
    assert "has no nvidia runtime (docker info Runtimes: runc)" in line
    with_runtime = Engine(Runtimes={"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}})
    assert _missing(node, with_runtime) == []
    if not Path("/dev/nvidia7").exists():
        assert _missing(node, with_runtime, gpus=["7"]) == ["GPU 7 is not on this host (no /dev/nvidia7)"]


def test_cuda_cdi_off_or_device_absent(tmp_path: Path, models_dir: Path) -> None:
    node = _node(tmp_path, models_dir, platform="cuda", nvidia_cdi=True)
    [off] = _missing(node, Engine())
    assert "CDI off" in off and "CDISpecDirs" in off
    known = Engine(CDISpecDirs=["/etc/cdi"], DiscoveredDevices=[{"Source": "cdi", "ID": "nvidia.com/gpu=0"}])
    [absent] = _missing(node, known, gpus=["1"])
    assert absent.startswith("CDI device nvidia.com/gpu=1 is not on the engine") and "nvidia.com/gpu=0" in absent
    assert _missing(node, known, gpus=["0"]) == []


def _char(path: Path) -> None:
    if os.geteuid() != 0:
        unavailable("mknod of a character device needs root")
    os.mknod(path, 0o660 | stat.S_IFCHR, os.makedev(1, 3))


def test_rocm_without_kfd_and_ids_beyond_the_render_nodes(tmp_path: Path, models_dir: Path) -> None:
    dri = tmp_path / "dri"
    dri.mkdir()
    node = _node(tmp_path, models_dir, platform="rocm", device_dir=str(dri), kfd_device=str(tmp_path / "kfd"))
    [line] = _missing(node, Engine())
    assert line.startswith(f"{tmp_path / 'kfd'} is not a device node on this host")
    _char(tmp_path / "kfd")
    _char(dri / "renderD128")
    assert _missing(node, Engine(), gpus=["0"]) == []
    assert _missing(node, Engine(), gpus=2) == [f"GPU 1 is not on this host ({dri} has 1 render node(s))"]


def test_cpu_and_plain_xpu_need_nothing(tmp_path: Path, models_dir: Path) -> None:
    assert _missing(_node(tmp_path, models_dir, platform="cpu"), Engine()) == []
    assert _missing(_node(tmp_path, models_dir), Engine()) == []  # xpu, device_dir none: as before
