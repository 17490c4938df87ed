"""A project Compose ran from a file not named docker-compose.yml (issue 33): compose.yaml,
compose.yml and docker-compose.yaml, which Compose finds by itself in the folder (the Compose
Specification's file names; `docker compose` looks for compose.yaml first), and a file given with
`-f`, which the container's com.docker.compose.project.config_files label names. Brought up by
hand on the real engine, then init, adopt, status, a switch to the stack from-compose writes and a
rollback to the adopted bytes, each checked from outside (`docker inspect`, the deploy dir's bytes,
a completion); and adopt of a deploy dir whose compose file is gone refused in one line."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import simkit
import yaml
from kit.simnode import completion, service_box

from b70deploy.sim.box import MODELS

pytestmark = pytest.mark.docker

SIM_ENV = {"B70SIM_BOOT_SECONDS": "0.5", "B70SIM_DECODE_TPS": "500"}
MODEL = "/models/Qwen/Qwen3-0.6B"
# A small unquantized model's config: the sim reads its sizes (with no --max-model-len, the whole context).
SMALL = {**{k: v for k, v in MODELS["Qwen/Qwen3-30B-A3B-W4A16"].items() if k != "quantization_config"},
         "max_position_embeddings": 8192}
CONFIG_FILES = "com.docker.compose.project.config_files"


@dataclass
class Project:
    name: str         # the compose file's name in the folder
    given: bool       # started with -f NAME (else Compose found it by itself)
    root: Path
    folder: Path
    project: str
    port: int
    config: Path

    def cli(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        r = simkit.run_cli(self.config, *args, timeout=240)
        assert r.returncode == code, (args, r.stdout, r.stderr)
        return r


@pytest.fixture(params=["compose.yaml", "compose.yml", "docker-compose.yaml", "-f serve.yml"])
def project(request: pytest.FixtureRequest, tmp_path: Path, sim_images: dict[str, str],
            free_port: Callable[[], int]) -> Iterator[Project]:
    given = str(request.param).startswith("-f ")
    name = str(request.param).removeprefix("-f ")
    project = simkit.unique("names")
    root = tmp_path / project
    folder = root / "app"
    folder.mkdir(parents=True)
    (root / "models" / "Qwen" / "Qwen3-0.6B").mkdir(parents=True)
    (root / "models" / "Qwen" / "Qwen3-0.6B" / "config.json").write_text(json.dumps(SMALL))
    (root / "stacks").mkdir()
    port = free_port()
    doc = {"services": {"vllm": {
        "image": sim_images["serve"], "command": [MODEL, "--max-model-len", "4096"], "environment": SIM_ENV,
        "volumes": [f"{root / 'models'}:/models:ro"], "ports": [f"127.0.0.1:{port}:8000"], "ipc": "host"}}}
    (folder / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    p = Project(name, given, root, folder, project, port, root / "node.yaml")
    try:
        up = subprocess.run(["docker", "compose", *(["-f", name] if given else []), "-p", project, "up", "-d"],
                            cwd=folder, capture_output=True, text=True, timeout=180, check=False)
        assert up.returncode == 0, up.stderr
        simkit.wait_status(f"http://127.0.0.1:{port}/health", 200, timeout=60)
        yield p
    finally:
        simkit.remove_by_project(project)
        simkit.remove_by_project(f"{project}-dark")
        simkit.remove_keep_tags(project)


def _argv(box: dict[str, Any]) -> list[str]:
    return [str(box["Path"]), *map(str, box["Args"])]


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.is_file()}


def test_a_project_run_from_any_compose_file_name_is_adopted_switched_and_rolled_back(project: Project) -> None:
    p = project
    written = (p.folder / p.name).read_bytes()
    before = service_box(p.project)
    assert before["Config"]["Labels"][CONFIG_FILES] == str(p.folder / p.name)  # as Compose ran it

    # ---- init: the file Compose ran the project from
    out = simkit.run_cli(None, "init", "--config", str(p.config), "--project", p.project,
                         "--state-dir", str(p.root / "state"), timeout=120)
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(p.config.read_text())
    assert cfg["compose_files"] == [p.name] and cfg["deploy_dir"] == str(p.folder)
    cfg.update({"stacks_dir": str(p.root / "stacks"), "device_dir": None, "load_threshold": 1000,
                "timeouts": {"health": 60, "rollback": 60, "poll_interval": 0.2},
                "stack_overlay": {"settle_seconds": 0.5}})  # test environment: short waits, no GPU here
    p.config.write_text(yaml.safe_dump(cfg))

    # ---- adopt: the operator's file is the revision, under its own name; nothing restarted
    adopted = json.loads(p.cli("adopt", "--as", "hand", "--json").stdout)
    assert adopted["created"] and p.name in adopted["files"] and "docker-compose.yml" not in adopted["files"]
    assert service_box(p.project)["Id"] == before["Id"]
    assert json.loads(p.cli("status", "--json").stdout)["differs"] == []

    # ---- a switch: the rendered docker-compose.yml in its place, the operator's file put away
    p.cli("stack", "from-compose", str(p.folder / p.name), "--name", "mine")
    p.cli("switch", "mine", "--yes")
    after = service_box(p.project)
    assert after["Id"] != before["Id"]
    assert after["Config"]["Labels"][CONFIG_FILES] == str(p.folder / "docker-compose.yml")
    assert p.name not in _files(p.folder) and "docker-compose.yml" in _files(p.folder)
    assert completion(p.port, MODEL)["model"] == MODEL

    # ---- rollback by name: the operator's file again, byte for byte, and the container as they ran it
    p.cli("rollback", "hand", "--yes")
    back = service_box(p.project)
    assert (p.folder / p.name).read_bytes() == written and "docker-compose.yml" not in _files(p.folder)
    assert _argv(back) == _argv(before) and back["Config"]["Labels"][CONFIG_FILES] == str(p.folder / p.name)
    assert completion(p.port, MODEL)["model"] == MODEL
    assert json.loads(p.cli("status", "--json").stdout)["differs"] == []

    # ---- the file gone from the deploy dir: adopt refuses in one line naming it and the key, nothing changed
    (p.folder / p.name).rename(p.root / "moved.yml")
    r = p.cli("adopt", "--as", "again", code=2)
    assert f"no {p.name} in deploy_dir {p.folder}" in r.stderr and "compose_files" in r.stderr
    assert "Traceback" not in r.stderr and service_box(p.project)["Id"] == back["Id"]
