"""An operator's private file keeps its mode through the tool, on the real engine (issue 34): a
companion binds a private key the operator keeps 0600 (naptha-node's `.pem`, tests/fixtures/layouts)
and runs a start script of the project folder (0755). `import` stores both as they are, a rollback
to the import writes them into the deploy dir as they are (the key rotated, the script gone from
the folder meanwhile), and fsck finds and closes a copy opened since. The test asks the node: the
files' modes, the key inside the companion, the companion answering."""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import simkit
import yaml
from kit import ports
from kit.simnode import docker, service_box

from b70deploy.sim.box import write_models
from b70deploy.sim.vllm_tree import MARLIN_REL, VARIANTS

pytestmark = pytest.mark.docker

MODEL = "qwen3-30b-a3b-w4a16"
KEY_FILE = "keys/node.pem"
SCRIPT = "start.sh"
# The operator's fix of the Marlin check on XPU (the field report's fix 4), which this image needs to boot.
MARLIN_TARGET = next(f"{v.site_packages}/vllm/{MARLIN_REL}" for v in VARIANTS if v.name == "bash-c")


def key(n: int) -> str:
    return f"-----BEGIN PRIVATE KEY-----\nkey{n}-{os.urandom(8).hex()}\n-----END PRIVATE KEY-----\n"


def compose_file(flag: str = "") -> str:
    vllm = {"image": "${VLLM_IMAGE}", "profiles": ["gpu"], "environment": {"B70SIM_BOOT_SECONDS": "1"},
            "command": ["vllm", "serve", "/models/Qwen/Qwen3-30B-A3B-W4A16", "--served-model-name", MODEL,
                        "--host", "0.0.0.0", "--port", "8000", "--max-model-len", "32768", *([flag] if flag else [])],
            "ports": ["127.0.0.1:${VLLM_PORT}:8000"],
            "volumes": ["${MODELS_DIR}:/models:ro", f"./vllm-patches/marlin_utils.py:{MARLIN_TARGET}:ro"]}
    webui = {"image": "${VLLM_IMAGE}", "profiles": ["gpu"], "entrypoint": ["/run/start.sh"],
             "ports": ["127.0.0.1:${WEBUI_PORT}:8080"],
             "volumes": [f"./{SCRIPT}:/run/start.sh:ro", f"./{KEY_FILE}:/run/keys/node.pem:ro"]}
    return yaml.safe_dump({"services": {"vllm": vllm, "webui": webui}}, sort_keys=False)


@dataclass
class Node:
    root: Path
    folder: Path   # the hand-made project's folder: the deploy dir
    saved: Path    # a saved copy, with the key rotated: import's source
    config: Path
    state: Path
    project: str
    webui_port: int

    def cli(self, *args: str, code: int = 0, config: bool = True) -> str:
        r = simkit.run_cli(self.config if config else None, *args, timeout=300)
        assert r.returncode == code, (args, r.stdout + r.stderr)
        return r.stdout


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def node(tmp_path: Path, sim_images: dict[str, str]) -> Iterator[Node]:
    project = simkit.unique("priv")
    folder, saved = tmp_path / project, tmp_path / "saved"
    for sub in ("keys", "vllm-patches"):
        (folder / sub).mkdir(parents=True)
    tag = f"{project}/vllm:bash-c"
    docker("tag", sim_images["bash-c"], tag)
    port, webui = ports.free_port(), ports.free_port()
    files = {"docker-compose.yml": (compose_file(), 0o644), SCRIPT: ("#!/bin/sh\nexec sim-webui --port 8080\n", 0o755),
             KEY_FILE: (key(1), 0o600),
             ".env": (f"VLLM_IMAGE={tag}\nVLLM_PORT={port}\nWEBUI_PORT={webui}\n"
                      f"MODELS_DIR={write_models(tmp_path / 'models')}\n", 0o644),
             "vllm-patches/marlin_utils.py": (simkit.image_file(tag, MARLIN_TARGET).decode().replace(
                 "if current_platform.is_rocm():", "if current_platform.is_rocm() or current_platform.is_xpu():"),
                 0o644)}
    for name, (text, m) in files.items():
        (folder / name).write_text(text)
        os.chmod(folder / name, m)
    shutil.copytree(folder, saved)  # modes kept, as `cp -a` keeps them
    (saved / "docker-compose.yml").write_text(compose_file("--enable-prefix-caching"))
    (saved / KEY_FILE).write_text(key(2))
    n = Node(root=tmp_path, folder=folder, saved=saved, config=tmp_path / "etc" / "node.yaml",
             state=tmp_path / "state", project=project, webui_port=webui)
    n.config.parent.mkdir()
    with simkit.running_by_hand(folder, f"http://127.0.0.1:{port}/health", project, tag):
        yield n


def test_a_private_key_and_a_script_keep_their_modes_from_import_to_the_deploy_dir_and_fsck(node: Node) -> None:
    n = node
    n.cli("init", "--config", str(n.config), "--project", n.project, "--state-dir", str(n.state), config=False)
    with n.config.open("a") as fh:  # test environment only: short waits
        fh.write(yaml.safe_dump({"load_threshold": 1000, "timeouts": {"health": 60, "rollback": 60,
                                                                      "poll_interval": 0.2}}))
    n.cli("adopt", "--as", "hand")
    imported = json.loads(n.cli("import", str(n.saved / "docker-compose.yml"), "--as", "saved", "--json"))
    stored = n.state / "revisions" / f"{imported['revision']:06d}"
    assert mode(stored / "files" / KEY_FILE) == 0o600 and mode(stored / "files" / SCRIPT) == 0o755
    recorded = json.loads((stored / "meta.json").read_text())["modes"]
    assert recorded[KEY_FILE] == 0o600 and recorded[SCRIPT] == 0o755 and recorded["docker-compose.yml"] == 0o644

    # ---- the rollback writes the rotated key 0600 and the script (gone from the folder) 0755
    (n.folder / SCRIPT).unlink()
    dry = n.cli("rollback", "saved", "--dry-run")
    assert "key2-" not in dry and "key1-" not in dry and f"revision-{imported['revision']}/{KEY_FILE}" in dry
    n.cli("rollback", "saved", "--yes")
    assert (n.folder / KEY_FILE).read_text() == (n.saved / KEY_FILE).read_text()
    assert mode(n.folder / KEY_FILE) == 0o600 and mode(n.folder / SCRIPT) == 0o755
    box = service_box(n.project, "webui")["Id"]
    assert docker("exec", box, "cat", "/run/keys/node.pem").stdout == (n.saved / KEY_FILE).read_text()
    simkit.wait_status(f"http://127.0.0.1:{n.webui_port}/health", 200, timeout=30)
    assert requests.get(f"http://127.0.0.1:{n.webui_port}/health", timeout=10).status_code == 200
    current = n.state / "revisions" / f"{int((n.state / 'revisions' / 'current').read_text()):06d}"
    assert current != stored and mode(current / "files" / KEY_FILE) == 0o600

    # ---- fsck: a copy opened since is found, and --repair closes it
    os.chmod(current / "files" / KEY_FILE, 0o644)
    os.chmod(n.folder / KEY_FILE, 0o644)
    n.cli("fsck", code=1)
    found = json.loads(n.cli("fsck", "--json", code=1))["findings"]
    assert sorted(f["path"] for f in found) == sorted([str(current / "files" / KEY_FILE), str(n.folder / KEY_FILE)])
    assert all("others can read it" in f["what"] and f["mend"] == "chmod" for f in found), found
    n.cli("fsck", "--repair")
    assert mode(current / "files" / KEY_FILE) == 0o600 and mode(n.folder / KEY_FILE) == 0o600
    n.cli("fsck")

    # ---- a damaged stored key is put back from the deploy dir, with the recorded mode
    os.chmod(current / "files", 0o755)
    (current / "files" / KEY_FILE).unlink()
    n.cli("fsck", "--repair")
    assert (current / "files" / KEY_FILE).read_text() == (n.saved / KEY_FILE).read_text()
    assert mode(current / "files" / KEY_FILE) == 0o600
