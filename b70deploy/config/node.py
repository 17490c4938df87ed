"""The node config: host facts, found through --config, $B70DEPLOY_CONFIG, ./b70deploy.yaml,
then /etc/b70deploy/node.yaml; with none, defaults that work without root.

The schema (pydantic) is imported only to validate a config this code has not validated
before, word for word (node_cache.py), or when a command reads more than its settings."""

from __future__ import annotations

import functools
import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError
from .node_cache import NodeCache, Settings
from .resources import data_dir
from .yamlfile import parse_yaml, read_yaml, yaml_text

if TYPE_CHECKING:
    from .catalogue import Catalogue
    from .schema import NodeConfig

ENV_CONFIG = "B70DEPLOY_CONFIG"
ENV_STACKS = "B70DEPLOY_STACKS"
CWD_NAME = "b70deploy.yaml"
SYSTEM_PATH = Path("/etc/b70deploy/node.yaml")


def find_config(explicit: str | None) -> Path | None:
    """The config file to use, in the documented order; None means built-in defaults. The path
    is absolute: the config's relative paths are relative to its folder, and Compose would
    resolve a relative one against the deploy dir instead."""
    given = explicit or os.environ.get(ENV_CONFIG)
    if given:
        return Path(os.path.expanduser(given)).absolute()
    for local in (Path.cwd() / CWD_NAME, Path.cwd() / CWD_NAME.replace(".yaml", ".yml")):
        if local.is_file():
            return local
    if SYSTEM_PATH.is_file():
        return SYSTEM_PATH
    return None


@dataclass(frozen=True)
class Node:
    """A validated node config with every path made absolute. `settings` locate the node and
    its engine; `config`, the whole validated config, is built on first use."""

    settings: Settings
    load_config: Callable[[], NodeConfig] = field(repr=False, compare=False)
    source: Path | None
    deploy_dir: Path
    state_dir: Path
    stacks_dir: Path
    patches_dir: Path
    models_dir: Path
    device_dir: Path | None
    secrets_env_file: Path | None
    name: str | None = None   # the inventory name; None for a config without `nodes:`
    cache_dir: Path = Path()  # the warm-boot caches' root (state/caches.py); default <state_dir>/caches
    # Caches the settings (node_cache.py) if they are not yet and the state dir now exists: the
    # CLI calls it as a command ends, for the first command on a node, which makes the state dir.
    remember: Callable[[], None] = field(default=lambda: None, repr=False, compare=False)

    @cached_property
    def config(self) -> NodeConfig:
        return self.load_config()

    @property
    def label(self) -> str:
        return self.name or "node"

    @property
    def address(self) -> str:
        return self.settings.address

    @property
    def on_this_host(self) -> bool:
        """Whether the node's ports are on this machine (its socket table is ours to read)."""
        try:
            return ipaddress.ip_address(self.address).is_loopback
        except ValueError:
            return self.address == "localhost"

    @property
    def docker_env(self) -> dict[str, str]:
        """What points Docker (SDK and CLI) at this node's engine; empty for the local default."""
        cfg = self.settings
        if cfg.docker_context:
            return {"DOCKER_CONTEXT": cfg.docker_context}
        if not cfg.docker_host:
            return {}
        env = {"DOCKER_HOST": cfg.docker_host}
        if cfg.tls_dir:
            env |= {"DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(self.tls_dir)}
        return env

    @property
    def tls_dir(self) -> Path | None:
        if not self.settings.tls_dir:
            return None
        p = Path(os.path.expanduser(self.settings.tls_dir))
        return p if p.is_absolute() or self.source is None else self.source.parent / p

    @property
    def endpoint(self) -> str:
        cfg = self.settings
        return cfg.docker_host or (f"context {cfg.docker_context}" if cfg.docker_context else "local engine")

    @property
    def project(self) -> str:
        return self.settings.project

    @property
    def service(self) -> str:
        """The vLLM service's name in the compose files (node config `service:`)."""
        return self.settings.service

    @property
    def compose_files(self) -> tuple[str, ...]:
        """The project's compose files in the deploy dir, in -f order (node config `compose_files`)."""
        return self.settings.compose_files

    @property
    def dark_project(self) -> str:
        return f"{self.settings.project}-dark"

    @property
    def companions(self) -> tuple[str, ...]:
        """Services sharing the project: stopped with vllm by a drain, started after it."""
        return tuple(c.name for c in self.config.companions)

    def catalogue(self) -> Catalogue:
        from .catalogue import Catalogue
        from .doc_cache import DocCache

        return Catalogue(self.stacks_dir, overlay=self.config.stack_overlay,
                         overlay_source=f"{self.source or 'node config'}: stack_overlay",
                         image_map=self.config.image_map, cache=DocCache(self.state_dir))


def load_node(explicit: str | None = None, *, stacks_dir: str | None = None, name: str | None = None) -> Node:
    """The node of a config; with an inventory (`nodes:`), the entry `name`."""
    path = find_config(explicit)
    text = yaml_text(path) if path is not None else ""
    raw = parse_yaml(text, path) if path is not None else {}
    where = str(path or "built-in node defaults")
    member_where = where if name is None else f"{where}: nodes.{name}"
    cache = NodeCache(_top_state_dir(raw, path), path, name, text)
    settings = cache.get()
    if settings is not None:  # this text passed this code before: validated when first asked for
        load = functools.partial(_node_config, raw, path, name, where)
        return _build(settings, load, path, stacks_dir, member_where, name=name)
    node = _validated(_node_config(raw, path, name, where), path, stacks_dir, member_where, name, cache)
    node.remember()
    return node


def _node_config(raw: dict[str, Any], path: Path | None, name: str | None, where: str) -> NodeConfig:
    """The validated config of node `name` (None: the config has no inventory)."""
    from .schema import NodeConfig
    from .validation import validate

    cfg = validate(NodeConfig, raw, where=where)
    if cfg.nodes is None:
        if name is not None:
            raise UserError(f"there is no inventory, so no node {name!r}", where=where,
                            fix="add a `nodes:` mapping to the node config, or drop --node/--nodes")
        _check_image_map(cfg, where)
        return cfg
    if name is None:
        raise UserError(f"the node config has an inventory ({', '.join(cfg.nodes)})", where=where,
                        fix="say which node: --node NAME (or --nodes all for switch, rollback and status)")
    return _member_config(cfg, raw, path, name, where)


def load_nodes(explicit: str | None = None, *, select: str = "all", stacks_dir: str | None = None) -> list[Node]:
    """The inventory's nodes named by `select` ("all" or "a,b"), in the given order
    (inventory order for "all")."""
    from .schema import NodeConfig
    from .validation import validate

    path = find_config(explicit)
    raw = read_yaml(path) if path is not None else {}
    where = str(path or "built-in node defaults")
    cfg = validate(NodeConfig, raw, where=where)
    if cfg.nodes is None:
        raise UserError("the node config has no inventory", where=where,
                        fix="add `nodes: {name: {docker_host: ..., ports: ...}}`, or drop --nodes")
    names = list(cfg.nodes) if select.strip() == "all" else [n.strip() for n in select.split(",") if n.strip()]
    unknown = [n for n in names if n not in cfg.nodes]
    if unknown or not names or len(set(names)) != len(names):
        raise UserError(f"--nodes {select!r} names " + (f"unknown nodes {', '.join(unknown)}" if unknown
                                                         else "no node, or one twice"),
                        where=where, fix=f"use all or a comma list of: {', '.join(cfg.nodes)}")
    members = {n: _validated(_member_config(cfg, raw, path, n, where), path, stacks_dir, f"{where}: nodes.{n}", n)
               for n in cfg.nodes}
    _check_distinct(list(members.values()), where)
    return [members[n] for n in names]


def _check_distinct(nodes: list[Node], where: str) -> None:
    """Two nodes must not share a state dir, a deploy dir, or a port on one address."""
    seen: dict[object, str] = {}
    for node in nodes:
        assert node.name is not None
        keys: list[tuple[object, str]] = [
            (("state", node.state_dir.resolve()), "state_dir"), (("deploy", node.deploy_dir.resolve()), "deploy_dir"),
            *((((node.address, port)), f"port {port} on {node.address}")
              for port in (node.config.ports.prod, node.config.ports.dark))]
        for key, what in keys:
            other = seen.get(key)
            if other is not None and other != node.name:
                raise UserError(f"nodes {other} and {node.name} share {what}", where=where,
                                fix=f"give nodes.{node.name} its own {what.split(' ')[0]}")
            seen[key] = node.name


def _member_config(cfg: NodeConfig, raw: dict[str, Any], path: Path | None, name: str, where: str) -> NodeConfig:
    """One inventory entry: the top-level keys with the entry's overrides, its own dirs."""
    from .schema import NodeConfig
    from .validation import validate

    assert cfg.nodes is not None
    entry = cfg.nodes[name]
    merged = {k: v for k, v in raw.items() if k != "nodes"} | entry
    # The state store of every node, remote or not, lives here on the operator's machine
    # (we run nothing on the hosts): <state_dir>/nodes/<name>, and likewise the deploy dir.
    base = path.parent if path is not None else Path.cwd()
    for key, default in (("state_dir", default_state_dir()), ("deploy_dir", _default_deploy())):
        if key not in entry:
            top = raw.get(key)
            root = default if not isinstance(top, str) else _absolute(top, base)
            merged[key] = str(root / "nodes" / name)
    member_where = f"{where}: nodes.{name}"
    node_cfg = validate(NodeConfig, merged, where=member_where)
    _check_image_map(node_cfg, member_where)
    return node_cfg


def _check_image_map(cfg: NodeConfig, where: str) -> None:
    from .schema import IMAGE_RE

    for src, dst in cfg.image_map.items():
        if not IMAGE_RE.match(src) or not IMAGE_RE.match(dst):
            raise UserError(f"image_map: {src!r} -> {dst!r} is not an image reference",
                            where=where,
                            fix="map an image reference to another, e.g. intel/vllm:latest: b70sim/vllm:bash-c")


def _top_state_dir(raw: dict[str, Any], path: Path | None) -> Path:
    """The state dir the config names at its top level (an inventory's root), as written:
    where its node cache is, found before validation."""
    top = raw.get("state_dir")
    base = path.parent if path is not None else Path.cwd()
    return _absolute(top, base) if isinstance(top, str) else default_state_dir()


def default_state_dir() -> Path:
    import platformdirs  # here: with the tempfile and shutil it imports, 9 ms of a `history` that names its dirs

    return Path(platformdirs.user_state_dir("b70deploy"))


def _default_deploy() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("b70deploy")) / "deploy"


def _absolute(value: str, base: Path) -> Path:
    p = Path(os.path.expanduser(value))
    return p if p.is_absolute() else (base / p)


def _validated(cfg: NodeConfig, path: Path | None, stacks_dir: str | None, where: str, name: str | None,
               cache: NodeCache | None = None) -> Node:
    settings = Settings.of(cfg)
    return _build(settings, lambda: cfg, path, stacks_dir, where, name=name,
                  remember=functools.partial(cache.put, settings) if cache is not None else lambda: None)


def _build(cfg: Settings, load_config: Callable[[], NodeConfig], path: Path | None, stacks_dir: str | None,
           where: str, *, name: str | None = None, remember: Callable[[], None] = lambda: None) -> Node:
    base = path.parent if path is not None else Path.cwd()

    def absolute(value: str | None, default: Path) -> Path:
        return default if value is None else _absolute(value, base)

    state = default_state_dir() if cfg.state_dir is None else _absolute(cfg.state_dir, base)
    deploy = _default_deploy() if cfg.deploy_dir is None else _absolute(cfg.deploy_dir, base)
    if deploy.resolve() == state.resolve():
        raise UserError("deploy_dir and state_dir are the same folder", where=where,
                        fix="give each its own folder")
    stacks_override = stacks_dir or os.environ.get(ENV_STACKS)
    stacks = Path(stacks_override).absolute() if stacks_override else absolute(cfg.stacks_dir, data_dir("stacks"))
    return Node(
        settings=cfg,
        load_config=load_config,
        source=path,
        deploy_dir=deploy,
        state_dir=state,
        stacks_dir=stacks,
        patches_dir=absolute(cfg.patches_dir, data_dir("patches")),
        models_dir=absolute(cfg.models_dir, Path("/models")),
        device_dir=absolute(cfg.device_dir, Path("/dev/dri")) if cfg.device_dir else None,
        secrets_env_file=absolute(cfg.secrets_env_file, Path()) if cfg.secrets_env_file else None,
        name=name,
        cache_dir=absolute(cfg.cache_dir, state / "caches"),
        remember=remember,
    )
