"""`init` finds the node's GPU platform and says where (issue 28): NVIDIA device nodes, the engine's
runtimes and CDI devices (`docker info`), /dev/kfd, the PCI vendor of each /dev/dri card; a running
vllm service's own GPU access comes first."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from simkit import unavailable

from b70deploy.actions.init import Discovery, plan
from b70deploy.config.schema import NodeConfig
from b70deploy.docker.platform import Found, choose, discover
from b70deploy.render.devices import DeviceAccess


def _char(path: Path) -> None:
    if os.geteuid() != 0:
        unavailable("mknod of a character device needs root")
    os.mknod(path, 0o660 | stat.S_IFCHR, os.makedev(1, 3))


def _card(drm: Path, n: int, vendor: str) -> None:
    (drm / f"card{n}" / "device").mkdir(parents=True)
    (drm / f"card{n}" / "device" / "vendor").write_text(vendor + "\n")
    (drm / f"card{n}-DP-1").mkdir()  # a connector: never read as a GPU


@pytest.mark.parametrize(("make", "info", "want", "source"), [
    ("nvidia0", {}, "cuda", "NVIDIA device nodes"),
    (None, {"Runtimes": {"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}}}, "cuda", "nvidia runtime"),
    (None, {"DiscoveredDevices": [{"Source": "cdi", "ID": "nvidia.com/gpu=0"}]}, "cuda",
     "CDI devices nvidia.com/gpu=0"),
    ("kfd", {}, "rocm", "ROCm compute node"),
    ("0x1002", {}, "rocm", "vendor 0x1002 (AMD)"),
    ("0x8086", {}, "xpu", "vendor 0x8086 (Intel)"),
    ("0x10de", {}, "cuda", "vendor 0x10de (NVIDIA)"),
    (None, {"Runtimes": {"runc": {}}}, "cpu", "no NVIDIA device"),
])
def test_discover_names_the_platform_and_its_source(tmp_path: Path, make: str | None, info: dict[str, object],
                                                     want: str, source: str) -> None:
    dev, drm = tmp_path / "dev", tmp_path / "drm"
    dev.mkdir()
    drm.mkdir()
    if make and make.startswith("0x"):
        _card(drm, 0, make)
    elif make:
        _char(dev / make)
    found = choose(discover(info, dev=dev, drm=drm))
    assert found.platform == want and source in found.source, found


def test_cdi_names_come_from_the_spec_dirs_on_an_older_engine(tmp_path: Path) -> None:
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n"
                                          "devices:\n  - name: '0'\n  - name: all\n")
    found = discover({"CDISpecDirs": [str(tmp_path)]}, dev=tmp_path / "none", drm=tmp_path / "none")
    assert found == [Found("cuda", "docker info: CDI devices nvidia.com/gpu=0, nvidia.com/gpu=all")]


def _discovery(signs: list[Found], services: dict[str, object] | None = None) -> Discovery:
    return Discovery(compose={"services": services} if services else None, compose_text=b"", chosen=None,
                     access=DeviceAccess(None), device_dir=Path("/dev/dri"), signs=signs)


def test_init_writes_the_platform_with_its_source() -> None:
    out = plan(_discovery([Found("rocm", "/dev/kfd (the ROCm compute node)")]))
    assert out.config["platform"] == "rocm"
    assert "#   platform: /dev/kfd (the ROCm compute node)" in out.text()
    assert NodeConfig.model_validate(out.config).platform == "rocm"
    assert plan(_discovery([])).config["platform"] == "cpu"


def test_a_running_service_s_gpu_access_wins() -> None:
    vllm = {"image": "vllm/vllm-openai:latest",
            "deploy": {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "device_ids": ["0", "1"], "capabilities": ["gpu"]}]}}}}
    out = plan(_discovery([Found("xpu", "/sys/class/drm/card0/device/vendor 0x8086 (Intel)")], {"vllm": vllm}))
    assert out.config["platform"] == "cuda" and out.config["gpus"] == ["0", "1"]
    assert {f.key: f.source for f in out.facts}["platform"] == "the GPU access of the running service vllm"
    assert "platform xpu: /sys/class/drm/card0/device/vendor 0x8086 (Intel)" in out.notes
