"""A node config named by a relative path (`--config node.yaml` from its folder): the paths it
gives relative to itself are made absolute against its folder, so the container mounts the
folders the config names (Compose would resolve a relative `.env` value against the deploy
dir). Checked from outside: the running container's mounts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import simkit
import yaml
from kit.simnode import SimNode, docker

pytestmark = pytest.mark.docker


def test_a_relative_config_deploys_the_folders_it_names(node: SimNode) -> None:
    cfg = yaml.safe_load(node.config.read_text())
    root = node.config.parent
    for key in ("deploy_dir", "state_dir", "stacks_dir", "models_dir"):  # as the operator writes them
        cfg[key] = str(Path(cfg[key]).relative_to(root))
    (root / "relative.yaml").write_text(yaml.safe_dump(cfg))
    r = simkit.run_cli(None, "--config", "relative.yaml", "switch", "alpha", "--yes", cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert node.answers() == "alpha"
    mounts = json.loads(docker("inspect", "-f", "{{json .Mounts}}", node.containers("vllm")[0]).stdout)
    sources = {m["Destination"]: m["Source"] for m in mounts if m["Type"] == "bind"}
    assert sources["/models"] == str(root / "models")
    assert all(Path(src).is_absolute() and src.startswith(str(root)) for src in sources.values()), sources
    env = (root / "deploy" / ".env").read_text()
    assert f"MODELS_DIR='{root / 'models'}'" in env or f"MODELS_DIR={root / 'models'}" in env, env
    st = json.loads(simkit.run_cli(None, "--config", "relative.yaml", "status", "--json", cwd=root,
                                   check=True).stdout)
    assert st["deploy_dir"] == str(root / "deploy")
