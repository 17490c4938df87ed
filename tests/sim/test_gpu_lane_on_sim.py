"""scripts/gpu_lane.py, the GPU lane's driver, run whole against the simulator as vLLM 0.24.0 on CUDA:
the same code the lent GPU machine runs, on any machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
