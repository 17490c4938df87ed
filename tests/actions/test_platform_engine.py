"""GPU platforms on the real engine with the sim (issue 28's must-shows): ROCm and XPU renders boot
with device nodes made for the test (mknod, /dev/null's numbers) and the gids they carry, and an
NVIDIA stack on this engine (no nvidia runtime, no CDI) is refused at preflight while the old
stack keeps serving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.scratch import make_gpu_nodes
from kit.simnode import SimNode, docker, service_box
from simkit import unavailable

pytestmark = pytest.mark.docker
KFD_GID, RENDER_GID = 4242, 4343


def _reconfigure(node: SimNode, **cfg: Any) -> None:
    doc = yaml.safe_load(node.config.read_text())
    node.config.write_text(yaml.safe_dump({**doc, **cfg}))


def _devices(node: SimNode) -> tuple[Path, Path]:
    try:
        return make_gpu_nodes(node.root, RENDER_GID, KFD_GID)
    except PermissionError as e:
        unavailable(str(e))


def _inside(box: dict[str, Any], *argv: str) -> str:
    return docker("exec", box["Id"], *argv).stdout.strip()


def test_rocm_render_boots_with_kfd_dri_and_their_gids(node: SimNode) -> None:
    dri, kfd = _devices(node)
    _reconfigure(node, platform="rocm", device_dir=str(dri), kfd_device=str(kfd))
    r = node.cli("switch", "alpha", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert node.answers() == "alpha"
    box = service_box(node.project)
    host = box["HostConfig"]
    mapped = {(d["PathOnHost"], d["PathInContainer"]) for d in host["Devices"]}
    assert (str(kfd), "/dev/kfd") in mapped and (str(dri), str(dri)) in mapped
    assert {str(KFD_GID), str(RENDER_GID)} <= set(host["GroupAdd"])
    assert host["CapAdd"] == ["CAP_SYS_PTRACE"] and "seccomp=unconfined" in host["SecurityOpt"]
    assert host["IpcMode"] == "host"
    groups = _inside(box, "id", "-G").split()
    assert str(KFD_GID) in groups and str(RENDER_GID) in groups
    assert _inside(box, "stat", "-c", "%F %t:%T %g", "/dev/kfd") == f"character special file 1:3 {KFD_GID}"
    assert _inside(box, "stat", "-c", "%g", str(dri / "renderD128")) == str(RENDER_GID)


def test_xpu_render_boots_with_dri_and_its_gid(node: SimNode) -> None:
    dri, _kfd = _devices(node)
    _reconfigure(node, platform="xpu", device_dir=str(dri))
    r = node.cli("switch", "alpha", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert node.answers() == "alpha"
    box = service_box(node.project)
    assert [(d["PathOnHost"], d["PathInContainer"]) for d in box["HostConfig"]["Devices"]] == [(str(dri), str(dri))]
    assert str(RENDER_GID) in _inside(box, "id", "-G").split()
    by_path = str(dri / "by-path")
    assert any(m["Source"] == by_path and m["Destination"] == by_path and not m["RW"] for m in box["Mounts"])
    assert not box["HostConfig"]["CapAdd"]
    env = dict(e.split("=", 1) for e in box["Config"]["Env"])
    assert "SYCL_CACHE_DIR" not in env or env["SYCL_CACHE_DIR"].startswith("/var/cache/b70deploy")


def test_nvidia_stack_is_refused_at_preflight_and_the_old_one_keeps_serving(node: SimNode) -> None:
    info = json.loads(docker("info", "--format", "{{json .}}").stdout)
    if "nvidia" in (info.get("Runtimes") or {}):
        unavailable("this engine has the nvidia runtime: the refusal cannot be shown here")
    r = node.cli("switch", "alpha", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    before = service_box(node.project)["Id"]
    _reconfigure(node, platform="cuda")
    refused = node.cli("switch", "beta", "--yes")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = [ln for ln in (refused.stdout + refused.stderr).splitlines() if "no nvidia runtime" in ln]
    assert len(lines) == 1 and "docker info Runtimes: " in lines[0], refused.stdout + refused.stderr
    assert "nothing was changed" in refused.stdout + refused.stderr
    # Asked from outside: the old stack still answers a completion, in the same container.
    assert node.answers() == "alpha"
    assert service_box(node.project)["Id"] == before
    assert [h["stack"] for h in node.json("history")] == ["alpha"]
