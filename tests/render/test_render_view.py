"""`render` shows what a switch writes: with the image on the engine, exactly the switch's files
(pinned image, patch files and mounts, the draft copy); without it, the plain render and a
plain list of what it could not resolve."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kit.lintnode import sim_images_present, write_node
from kit.scratch import Scratch
from simkit import build_sim_images, run_cli

from b70deploy.actions.prepare import prepare_deploy, switch_view
from b70deploy.config.node import load_node
from b70deploy.render.files import COMPOSE_FILE, DOTENV_FILE
from b70deploy.sim.box import write_models
from b70deploy.sim.image import TAGS as SIM_TAGS

DRAFT_COPY = "/models/Qwen/Qwen3-30B-A3B-EAGLE3.b70-mpe262144"


def test_plain_render_has_the_draft_copy_and_names_what_it_could_not_resolve(scratch: Scratch) -> None:
    scratch.copy_shipped()
    scratch.without_engine()  # the plain render whatever images this machine has
    res = run_cli(None, "--config", str(scratch.config), "render", "eagle3", "--no-docker", in_process=True)
    assert res.returncode == 0, res.stderr
    compose = yaml.safe_load(res.stdout.split("# ---- docker-compose.yml\n", 1)[1].split("# ---- ", 1)[0])
    cmd = compose["services"]["vllm"]["command"]
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec["model"] == DRAFT_COPY  # the patched draft, never the 2048-position original
    assert "note: draft: the command serves the copy " + DRAFT_COPY in res.stderr
    assert "warning: not resolved: image: .env names the tag intel/vllm:latest, not the image id" in res.stderr
    assert "warning: not resolved: patch marlin-xpu-carveout: no edited file and no mount" in res.stderr
    data = json.loads(run_cli(None, "--config", str(scratch.config), "render", "eagle3", "--json",
                              in_process=True).stdout)
    assert data["exact"] is False and len(data["unresolved"]) == 2 and DRAFT_COPY in json.dumps(data["command"])


def test_diff_says_what_it_could_not_resolve(scratch: Scratch) -> None:
    scratch.copy_shipped()
    scratch.without_engine()
    res = run_cli(None, "--config", str(scratch.config), "diff", "eagle3", in_process=True)
    assert res.returncode == 0 and "not resolved: image: .env names the tag intel/vllm:latest" in res.stderr
    assert DRAFT_COPY in res.stdout


@pytest.mark.docker
def test_with_the_image_render_is_exactly_what_a_switch_writes(tmp_path: Path) -> None:
    if not sim_images_present():
        build_sim_images()
    node_path = write_node(tmp_path, write_models(tmp_path / "models"))
    node = load_node(str(node_path))
    view = switch_view(node, "eagle3")
    assert view.exact and not view.unresolved and view.lint_errors == 0
    assert view.files == prepare_deploy(node, "eagle3").files  # the switch's own bytes
    patch_files = [n for n in view.files if n.startswith("patches/")]
    assert patch_files, sorted(view.files)
    env = view.files[DOTENV_FILE].decode()
    assert "VLLM_IMAGE_ID='sha256:" in env and "VLLM_IMAGE='b70deploy/keep:" in env
    vllm = yaml.safe_load(view.files[COMPOSE_FILE])["services"]["vllm"]
    mounts = " ".join(str(v) for v in vllm.get("volumes") or [])
    assert "marlin_utils.py" in mounts and DRAFT_COPY in json.dumps(vllm["command"])
    res = run_cli(None, "--config", str(node_path), "render", "eagle3", in_process=True)
    assert res.returncode == 0 and "not resolved" not in res.stderr, res.stderr
    assert f"note: image: {SIM_TAGS['bash-c']} pinned to sha256:" in res.stderr
    assert "# ---- patches/" in res.stdout


@pytest.mark.docker
def test_plain_render_does_not_depend_on_the_machines_images(scratch: Scratch) -> None:
    """Issue 39, point 9: every B70 node has intel/vllm:latest. Here the catalogue's tag names an image the
    engine has (the sim's, through image_map); a node without an engine still renders plain, and the node
    with one resolves it: the test of the plain render holds on any machine."""
    if not sim_images_present():
        build_sim_images()
    scratch.copy_shipped()
    scratch.write_config({"image_map": {"intel/vllm:latest": SIM_TAGS["bash-c"]}})
    present = run_cli(None, "--config", str(scratch.config), "render", "ngram", "--json", in_process=True)
    assert json.loads(present.stdout)["exact"] is True, present.stderr
    scratch.write_config({"image_map": {"intel/vllm:latest": SIM_TAGS["bash-c"]},
                          "docker_host": f"unix://{scratch.root / 'no-engine.sock'}"})
    plain = json.loads(run_cli(None, "--config", str(scratch.config), "render", "ngram", "--json",
                               in_process=True).stdout)
    assert plain["exact"] is False and set(plain["files"]) == {"docker-compose.yml", ".env", "vllm.env"}


@pytest.mark.docker
def test_a_missing_secrets_file_is_refused_before_the_engine_is_asked(scratch: Scratch) -> None:
    """Found with intel/vllm:latest present (issue 39, point 9): with the image on the engine, `render` asked
    the engine first, and its image facts cache made the state dir before the missing secrets file was
    refused. Bad input changes nothing, whatever images the machine has."""
    if not sim_images_present():
        build_sim_images()
    scratch.copy_shipped()
    scratch.write_config({"image_map": {"intel/vllm:latest": SIM_TAGS["bash-c"]}, "secrets_env_file": "absent.env"})
    r = run_cli(None, "--config", str(scratch.config), "render", "ngram", in_process=True)
    assert r.returncode == 2 and "absent.env" in r.stderr and "not found" in r.stderr, r.stderr
    assert not (scratch.root / "state").exists()
