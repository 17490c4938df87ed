"""The node config: host facts, found through --config, $B70DEPLOY_CONFIG, ./b70deploy.yaml,
then /etc/b70deploy/node.yaml; with none, defaults that work without root."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from .catalogue import Catalogue
from .errors import UserError
from .resources import data_dir
from .schema import IMAGE_RE, NodeConfig
from .validation import read_yaml, validate

ENV_CONFIG = "B70DEPLOY_CONFIG"
ENV_STACKS = "B70DEPLOY_STACKS"
CWD_NAME = "b70deploy.yaml"
SYSTEM_PATH = Path("/etc/b70deploy/node.yaml")


def find_config(explicit: str | None) -> Path | None:
    """The config file to use, in the documented order; None means built-in defaults."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(ENV_CONFIG)
    if env:
        return Path(env)
    local = Path.cwd() / CWD_NAME
    if local.is_file():
        return local
    if SYSTEM_PATH.is_file():
        return SYSTEM_PATH
    return None


@dataclass(frozen=True)
class Node:
    """A validated node config with every path made absolute."""

    config: NodeConfig
    source: Path | None
    deploy_dir: Path
    state_dir: Path
    stacks_dir: Path
    patches_dir: Path
    models_dir: Path
    device_dir: Path | None
    secrets_env_file: Path | None

    @property
    def project(self) -> str:
        return self.config.project

    @property
    def dark_project(self) -> str:
        return f"{self.config.project}-dark"

    def catalogue(self) -> Catalogue:
        return Catalogue(self.stacks_dir, overlay=self.config.stack_overlay,
                         overlay_source=f"{self.source or 'node config'}: stack_overlay",
                         image_map=self.config.image_map)


def load_node(explicit: str | None = None, *, stacks_dir: str | None = None) -> Node:
    path = find_config(explicit)
    raw = read_yaml(path) if path is not None else {}
    cfg = validate(NodeConfig, raw, where=str(path or "built-in node defaults"))
    where = str(path or "built-in node defaults")
    for src, dst in cfg.image_map.items():
        if not IMAGE_RE.match(src) or not IMAGE_RE.match(dst):
            raise UserError(f"image_map: {src!r} -> {dst!r} is not an image reference",
                            where=where,
                            fix="map an image reference to another, e.g. intel/vllm:latest: b70sim/vllm:bash-c")
    base = path.parent if path is not None else Path.cwd()

    def absolute(value: str | None, default: Path) -> Path:
        if value is None:
            return default
        p = Path(os.path.expanduser(value))
        return p if p.is_absolute() else (base / p)

    state = absolute(cfg.state_dir, Path(platformdirs.user_state_dir("b70deploy")))
    deploy = absolute(cfg.deploy_dir, Path(platformdirs.user_data_dir("b70deploy")) / "deploy")
    if deploy.resolve() == state.resolve():
        raise UserError("deploy_dir and state_dir are the same folder", where=where,
                        fix="give each its own folder")
    stacks_override = stacks_dir or os.environ.get(ENV_STACKS)
    stacks = Path(stacks_override).absolute() if stacks_override else absolute(cfg.stacks_dir, data_dir("stacks"))
    return Node(
        config=cfg,
        source=path,
        deploy_dir=deploy,
        state_dir=state,
        stacks_dir=stacks,
        patches_dir=absolute(cfg.patches_dir, data_dir("patches")),
        models_dir=absolute(cfg.models_dir, Path("/models")),
        device_dir=absolute(cfg.device_dir, Path("/dev/dri")) if cfg.device_dir else None,
        secrets_env_file=absolute(cfg.secrets_env_file, Path()) if cfg.secrets_env_file else None,
    )
