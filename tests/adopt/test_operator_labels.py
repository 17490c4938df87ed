"""An operator's files are theirs (issue 33's promise), on the real engine: a hand-made project whose
vllm service and companion carry the operator's own labels (a Traefik router's rule, a host from `.env`,
a basic-auth middleware's users written inline, `$$` and all) and bind files that live beside the compose
file. Through init, adopt, `switch --dry-run`, switch and rollback, the containers keep every label the
operator gave them (docker inspect), the tool's `b70deploy.*` beside them; the basic-auth value is never in
the 0644 compose file; and the dry run's diff names exactly what the switch then wrote and removed: the
operator's bound files are kept, not shown as removed."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import simkit
import yaml
from kit import ports
from kit.simnode import completion, docker, service_box

from b70deploy.sim.box import write_models
from b70deploy.sim.vllm_tree import MARLIN_REL, VARIANTS

pytestmark = pytest.mark.docker

MODEL = "qwen3-30b-a3b-w4a16"
HTPASSWD = "admin:$apr1$H6uskkkW$IgXLP6ewTrSuBkTrqE8wj/"  # what the container gets; the file writes `$$`
BOUND = {"ui-conf/ui.conf": "listen 8080\n", "operator/notes.txt": "tuned by hand\n"}
# The operator's fix of the Marlin check on XPU (the field report's fix 4), bound over the image's file.
MARLIN = "vllm-patches/marlin_utils.py"
MARLIN_TARGET = next(f"{v.site_packages}/vllm/{MARLIN_REL}" for v in VARIANTS if v.name == "bash-c")
# service -> the labels as the engine holds them on the hand-made containers
LABELS = {
    "vllm": {"traefik.enable": "true", "traefik.http.routers.llm.rule": "Host(`llm.example.org`)",
             "traefik.http.middlewares.llm.basicauth.users": HTPASSWD, "com.example.team": "inference"},
    "open-webui": {"traefik.http.routers.ui.rule": "Host(`chat.example.org`)"},
}


def compose_file() -> str:
    vllm = {"image": "${VLLM_IMAGE}", "profiles": ["gpu"],
            "command": ["vllm", "serve", "/models/Qwen/Qwen3-30B-A3B-W4A16", "--served-model-name", MODEL,
                        "--host", "0.0.0.0", "--port", "8000", "--max-model-len", "32768"],
            "environment": {"B70SIM_BOOT_SECONDS": "1"}, "ports": ["127.0.0.1:${VLLM_PORT}:8000"],
            "labels": ["traefik.enable=true", "traefik.http.routers.llm.rule=Host(`${API_HOST}`)",
                       "traefik.http.middlewares.llm.basicauth.users=" + HTPASSWD.replace("$", "$$"),
                       "com.example.team=inference"],
            "volumes": ["${MODELS_DIR}:/models:ro", "./operator/notes.txt:/etc/operator/notes.txt:ro",
                        f"./{MARLIN}:{MARLIN_TARGET}:ro"]}
    webui = {"image": "${VLLM_IMAGE}", "profiles": ["gpu"], "command": ["sim-webui", "--port", "8080"],
             "ports": ["127.0.0.1:${WEBUI_PORT}:8080"], "volumes": ["./ui-conf/ui.conf:/etc/ui.conf:ro"],
             "labels": {"traefik.http.routers.ui.rule": "Host(`${UI_HOST}`)"}}
    return yaml.safe_dump({"services": {"vllm": vllm, "open-webui": webui}}, sort_keys=False)


@dataclass
class Node:
    folder: Path
    config: Path
    state: Path
    project: str
    port: int

    def cli(self, *args: str, config: bool = True) -> str:
        r = simkit.run_cli(self.config if config else None, *args, timeout=300)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        assert HTPASSWD not in r.stdout + r.stderr, args
        return r.stdout


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, sim_images: dict[str, str]) -> Iterator[Node]:
    root = tmp_path_factory.mktemp("labels")
    project = simkit.unique("lbl")
    folder = root / project
    folder.mkdir()
    tag = f"{project}/vllm:bash-c"
    docker("tag", sim_images["bash-c"], tag)
    models = write_models(root / "models")
    port = ports.free_port()
    files = {"docker-compose.yml": compose_file(), **BOUND,
             ".env": f"VLLM_IMAGE={tag}\nVLLM_PORT={port}\nMODELS_DIR={models}\nWEBUI_PORT={ports.free_port()}\n"
                     "API_HOST=llm.example.org\nUI_HOST=chat.example.org\n"}
    marlin = simkit.image_file(tag, MARLIN_TARGET).decode()
    files[MARLIN] = marlin.replace("if current_platform.is_rocm():",
                                   "if current_platform.is_rocm() or current_platform.is_xpu():")
    assert files[MARLIN] != marlin
    for name, text in files.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(text)
    n = Node(folder=folder, config=root / "etc" / "node.yaml", state=root / "state", project=project, port=port)
    n.config.parent.mkdir()
    with simkit.running_by_hand(folder, f"http://127.0.0.1:{port}/health", project, tag):
        yield n


def assert_labels(n: Node, stack: str | None) -> None:
    """From outside: each container's labels as the engine holds them."""
    for service, labels in LABELS.items():
        got = service_box(n.project, service)["Config"]["Labels"]
        assert {k: got.get(k) for k in labels} == labels, service
        if stack is not None and service == "vllm":
            assert got["b70deploy.stack"] == stack and got["b70deploy.role"] == "vllm"
    assert completion(n.port, MODEL)["model"] == MODEL


def test_the_operators_labels_and_bound_files_survive_a_switch_and_its_dry_run_says_so(node: Node) -> None:
    n = node
    assert_labels(n, None)
    n.cli("init", "--config", str(n.config), "--project", n.project, "--state-dir", str(n.state), config=False)
    assert stat.S_IMODE(n.config.stat().st_mode) == 0o600  # it keeps the basic-auth value for the .env
    with n.config.open("a") as fh:  # test environment only: the sim image, short waits
        fh.write(yaml.safe_dump({
            "image_map": {"intel/vllm:latest": f"{n.project}/vllm:bash-c"}, "load_threshold": 1000,
            "stack_overlay": {"settle_seconds": 0.5},
            "timeouts": {"health": 60, "rollback": 60, "poll_interval": 0.2}}))
    n.cli("adopt", "--as", "hand")
    before = {p.relative_to(n.folder).as_posix(): p.read_bytes() for p in n.folder.rglob("*") if p.is_file()}

    # ---- the dry run, then the switch it describes
    preview = n.cli("switch", "eagle3", "--dry-run")
    written = set(re.findall(r"^\+\+\+ switch-eagle3/(\S+)", preview, re.M))
    removed = set(re.findall(r"^--- deployed/(\S+)\n\+\+\+ /dev/null", preview, re.M))
    assert not removed & {*BOUND, MARLIN}, preview  # a switch keeps them: the diff must not say otherwise
    kept = next(line for line in preview.splitlines() if "kept as they are" in line)
    assert all(name in kept for name in (*BOUND, MARLIN)), preview
    n.cli("switch", "eagle3", "--yes")
    after = {p.relative_to(n.folder).as_posix(): p.read_bytes() for p in n.folder.rglob("*") if p.is_file()}
    assert removed == set(before) - set(after), preview
    assert written == {k for k in after if after[k] != before.get(k)}, preview
    assert {k: after[k] for k in (*BOUND, MARLIN)} == {k: before[k] for k in (*BOUND, MARLIN)}
    assert_labels(n, "eagle3")
    compose = (n.folder / "docker-compose.yml").read_text()
    assert "apr1" not in compose and stat.S_IMODE((n.folder / "docker-compose.yml").stat().st_mode) == 0o644
    assert stat.S_IMODE((n.folder / ".env").stat().st_mode) == 0o600
    # ---- the way back: the operator's bytes, their labels on the containers they start; its dry run
    # names what it writes and removes, as the switch's did
    preview = n.cli("rollback", "--dry-run")
    written = set(re.findall(r"^\+\+\+ revision-1/(\S+)", preview, re.M))
    removed = set(re.findall(r"^--- deployed/(\S+)\n\+\+\+ /dev/null", preview, re.M))
    n.cli("rollback", "--yes")
    back = {p.relative_to(n.folder).as_posix(): p.read_bytes() for p in n.folder.rglob("*") if p.is_file()}
    assert removed == set(after) - set(back) and removed, preview
    assert written == {k for k in back if back[k] != after.get(k)}, preview
    assert (n.folder / "docker-compose.yml").read_text() == compose_file()
    assert_labels(n, None)
    # ---- and forward again from the adopted bytes: the labels from the node config once more
    n.cli("rollback", "eagle3", "--yes")
    assert_labels(n, "eagle3")
    assert os.path.isfile(n.folder / "operator" / "notes.txt")
