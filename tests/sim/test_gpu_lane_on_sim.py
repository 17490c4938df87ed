"""scripts/gpu_lane.py, the GPU lane's driver, run whole against the simulator as vLLM 0.24.0 on CUDA:
the same code the lent GPU machine runs, on any machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).parents[2]


def test_the_gpu_lane_runs_on_the_sim_and_wakes_level_2_as_vllm_documents(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    env = {**os.environ, "B70_GPU_SERVE": f"{sys.executable} -m b70deploy.sim.server", "PYTHONPATH": str(REPO),
           "B70SIM_PLATFORM": "cuda", "B70SIM_VERSION": "0.24.0", "B70SIM_BOOT_SECONDS": "0.5",
           "B70SIM_DECODE_TPS": "2000", "B70SIM_PREFILL_TPS": "200000", "B70SIM_SLEEP_SECONDS": "0.05",
           "B70SIM_WAKE_SECONDS": "0.05", "B70SIM_RELOAD_SECONDS": "0.05", "HOME": str(tmp_path)}
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_lane.py"), "cycle", "--model", str(model),
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads((out / "results-cycle.json").read_text())
    assert res["version"] == "0.24.0"
    for level in (1, 2):
        assert [r["wake_level"] for r in res[f"level{level}"]["cycles"]] == [level] * 3
    bare = res["level2_bare_wake"]
    assert bare["text"] == "!" * 12 and bare["judge"] == "a run of '!!!!!!!!'" and bare["smoke_failed"]
    assert not bare["after_reload_long_matches_reference"] and bare["after_reset_long_matches_reference"]
    assert all(v["exit"] == 0 for k, v in res["bench"].items() if k != "capture")
    assert res["boot_facts"]["vllm_version"] == "0.24.0" and res["diagnosis"] is None


def _toolkit() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_toolkit", REPO / "scripts" / "gpu_toolkit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_toolkit_stand_in_gives_the_gpu_nodes_to_a_device_request_and_binds_the_images_host_folders(
        tmp_path: Path) -> None:
    """scripts/gpu_toolkit.py edits the OCI spec as the NVIDIA toolkit's runtime does: only a container whose
    environment has NVIDIA_VISIBLE_DEVICES (what dockerd's nvidia driver sets for a device request) gets the
    device nodes, each with its cgroup rule, and dockerd's prestart hook is dropped; B70GPU_HOST_FILES binds
    folders read-only before Docker's own mounts."""
    toolkit = _toolkit()
    node = Path("/dev/null")  # a character device standing in for /dev/nvidia0
    rdev = node.stat().st_rdev
    hook = {"path": "/tmp/gl/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]}
    env = ["PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all", f"B70GPU_HOST_FILES=/usr:{tmp_path}:/absent"]
    gpu = {"process": {"env": env},
           "mounts": [{"destination": "/etc/hosts", "type": "bind", "source": "/x/hosts", "options": ["rbind"]}],
           "hooks": {"prestart": [hook]}, "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}}}
    assert toolkit.edit(gpu, [node])
    assert gpu["linux"]["devices"] == [{"path": "/dev/null", "type": "c", "major": os.major(rdev),
                                        "minor": os.minor(rdev), "fileMode": 0o666, "uid": 0, "gid": 0}]
    assert gpu["linux"]["resources"]["devices"][1] == {"allow": True, "type": "c", "major": os.major(rdev),
                                                       "minor": os.minor(rdev), "access": "rwm"}
    assert gpu["hooks"]["prestart"] == []
    assert [m["destination"] for m in gpu["mounts"]] == ["/usr", str(tmp_path), "/etc/hosts"]
    assert gpu["mounts"][0]["options"] == ["rbind", "ro", "rprivate"]
    door = {"process": {"env": ["PATH=/usr/bin"]}, "mounts": [], "hooks": {"prestart": [hook]}}
    assert not toolkit.edit(door, [node])
    assert door == {"process": {"env": ["PATH=/usr/bin"]}, "mounts": [], "hooks": {"prestart": [hook]}}
