"""The first user's node keeps its node-wide settings through every switch (issue 33, item 6), on
the real engine: the report's hand-run layout (ngram by hand, the bash -c image, /models, an
env_file, open-webui) with what every hand-made run of that box had beside the command: the
/dev/dri device map, numeric group_add, a security_opt, and a project network with a fixed
name. init writes them into the node config (the device folder from the service's own device
map), adopt keeps the hand-made bytes, `switch ngram` renders the catalogue stack, and the
container asked with docker inspect has every one of them; `rollback 1` brings back a container
equal to the hand-made one in each."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import simkit
import yaml
from kit.scratch import make_gpu_nodes
from kit.simnode import completion, docker, service_box
from simkit import unavailable

from b70deploy.sim.box import write_models
from b70deploy.sim.vllm_tree import MARLIN_REL, VARIANTS

pytestmark = pytest.mark.docker

RENDER_GID, VIDEO_GID = 4343, 4444
MARLIN_TARGET = f"{next(v.site_packages for v in VARIANTS if v.name == 'bash-c')}/vllm/{MARLIN_REL}"
NGRAM = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}'
SERVE = ["vllm", "serve", "/models/Qwen/Qwen3-30B-A3B-W4A16", "--served-model-name", "qwen3-30b-a3b-w4a16",
         "qwen3-30b-tq-256k", "--host", "0.0.0.0", "--port", "8000", "--dtype", "float16", "--max-model-len",
         "262144", "--enable-prefix-caching", "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
         "--kv-cache-dtype", "fp8", "--speculative-config", NGRAM]


@dataclass
class WideNode:
    root: Path
    folder: Path
    project: str
    network: str
    dri: Path
    port: int
    config: Path

    def cli(self, *args: str, config: bool = True) -> subprocess.CompletedProcess[str]:
        r = simkit.run_cli(self.config if config else None, *args, timeout=300)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r

    def box(self, service: str = "vllm") -> dict[str, Any]:
        return service_box(self.project, service)


def node_wide(box: dict[str, Any]) -> dict[str, Any]:
    """What docker inspect says of the settings that are the node's, not a stack's."""
    host = box["HostConfig"]
    return {"security_opt": sorted(host["SecurityOpt"] or []), "groups": sorted(host["GroupAdd"] or []),
            "devices": sorted((d["PathOnHost"], d["PathInContainer"]) for d in host["Devices"] or []),
            "networks": sorted(box["NetworkSettings"]["Networks"]), "ipc": host["IpcMode"]}


@pytest.fixture
def wide_node(tmp_path: Path, sim_images: dict[str, str], free_port: Callable[[], int]) -> Iterator[WideNode]:
    try:
        dri, _kfd = make_gpu_nodes(tmp_path / "dev", RENDER_GID, VIDEO_GID)
    except PermissionError as e:
        unavailable(str(e))
    project = simkit.unique("wide")
    folder = tmp_path / project
    folder.mkdir()
    tag = f"{project}/vllm:latest"
    docker("tag", sim_images["bash-c"], tag)
    models = write_models(tmp_path / "models")
    port, webui_port = free_port(), free_port()
    network = f"{project}-llm"
    vllm = {"image": tag, "profiles": ["gpu"], "command": SERVE, "env_file": "vllm023.env",
            "entrypoint": ["/bin/bash", "-c", 'source /opt/intel/oneapi/setvars.sh --force && exec "$@"', "--"],
            "ports": [f"127.0.0.1:{port}:8000"], "shm_size": "16g",
            "volumes": [f"{models}:/models:ro", f"./vllm-patches/marlin_utils.py:{MARLIN_TARGET}:ro"],
            "ipc": "host", "devices": [f"{dri}:/dev/dri"], "group_add": [str(RENDER_GID), str(VIDEO_GID)],
            "security_opt": ["seccomp=unconfined"], "networks": ["llm"]}
    webui = {"image": tag, "profiles": ["gpu"], "command": ["sim-webui", "--port", "8080"],
             "ports": [f"127.0.0.1:{webui_port}:8080"], "networks": ["llm"],
             "environment": {"OPENAI_API_BASE_URL": "http://vllm:8000/v1", "WEBUI_NAME": "${WEBUI_NAME:-b70}"}}
    doc = {"services": {"vllm": vllm, "open-webui": webui}, "networks": {"llm": {"name": network}}}
    (folder / "docker-compose.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    marlin = simkit.image_file(tag, MARLIN_TARGET).decode()  # the report's fix 4, mounted by hand
    (folder / "vllm-patches").mkdir()
    (folder / "vllm-patches" / "marlin_utils.py").write_text(marlin.replace(
        "if current_platform.is_rocm():", "if current_platform.is_rocm() or current_platform.is_xpu():"))
    (folder / "vllm023.env").write_text("B70SIM_BOOT_SECONDS=1\nB70SIM_DECODE_TPS=500\n")
    os.chmod(folder / "vllm023.env", 0o600)
    node = WideNode(root=tmp_path, folder=folder, project=project, network=network, dri=dri, port=port,
                    config=tmp_path / "node.yaml")
    try:
        simkit.up_by_hand(folder, f"http://127.0.0.1:{port}/health")
        yield node
    finally:
        simkit.remove_by_project(project)
        docker("network", "rm", network, check=False)
        simkit.remove_keep_tags(project)
        docker("rmi", tag, check=False)


def test_switch_ngram_keeps_the_hand_made_runs_node_wide_settings(wide_node: WideNode) -> None:
    node = wide_node
    hand, hand_webui = node.box(), node.box("open-webui")
    before = node_wide(hand)
    assert "seccomp=unconfined" in before["security_opt"] and before["networks"] == [node.network]

    node.cli("init", "--config", str(node.config), "--project", node.project, "--state-dir",
             str(node.root / "state"), config=False)
    cfg = yaml.safe_load(node.config.read_text())
    assert cfg["device_dir"] == str(node.dri)              # from the service's own device map, not /dev/dri
    assert RENDER_GID in cfg["gids"].values()
    assert cfg["compose"]["security_opt"] == ["seccomp=unconfined"]
    assert cfg["compose"]["group_add"] == [str(RENDER_GID), str(VIDEO_GID)]
    assert cfg["compose"]["devices"] == [f"{node.dri}:/dev/dri"]
    assert cfg["networks"] == {"llm": {"name": node.network}}
    [webui] = cfg["companions"]
    assert webui["environment"] == {"OPENAI_API_BASE_URL": "http://vllm:8000/v1", "WEBUI_NAME": "${WEBUI_NAME:-b70}"}
    # Test environment only: the catalogue's image names this test's sim tag; short waits.
    with node.config.open("a") as fh:
        fh.write(yaml.safe_dump({
            "image_map": {"intel/vllm:latest": str(hand["Config"]["Image"])},
            "stack_overlay": {"settle_seconds": 0.5}, "load_threshold": 1000,
            "timeouts": {"health": 60, "rollback": 60, "poll_interval": 0.2}}))
    assert json.loads(node.cli("adopt", "--as", "hand", "--json").stdout)["revision"] == 1

    node.cli("switch", "ngram", "--yes")
    box = node.box()
    assert box["Config"]["Labels"]["b70deploy.stack"] == "ngram"
    assert completion(node.port, "qwen3-30b-a3b-w4a16")["model"] == "qwen3-30b-a3b-w4a16"
    after = node_wide(box)
    assert after["security_opt"] == before["security_opt"]
    assert set(before["groups"]) <= set(after["groups"])           # the rendered gids are the same numbers
    assert set(before["devices"]) <= set(after["devices"])
    assert after["networks"] == before["networks"] and after["ipc"] == "host"
    webui_now = node.box("open-webui")
    # Nothing added, the ${VAR} default resolved as before (the engine keeps no order of its own).
    assert sorted(webui_now["Config"]["Env"]) == sorted(hand_webui["Config"]["Env"])
    assert node_wide(webui_now)["networks"] == [node.network]

    node.cli("rollback", "1", "--yes")
    back = node.box()
    assert node_wide(back) == before
    assert back["Args"] == hand["Args"] and back["Image"] == hand["Image"]
    assert completion(node.port, "qwen3-30b-a3b-w4a16")["choices"]
