"""The node config's validated settings kept between runs, so `status` and `history` start
without the schema: pydantic, its models and its plugin scan cost ~130 ms of their 300 ms
(issue 13).

A node config that validated (and passed load_node's own checks) is stored by its path and
node name with the SHA-256 of its text; the whole store is tied to a hash of the code that
judged it (schema.py, names.py, node.py, this module, pydantic's version). A run whose text and
code hash the same takes the settings that locate the node and its engine from here, and the
whole config is validated only when something asks for it (Node.config). Any other text, a
config that failed, or other code is validated as before: a bad config gives the same error
on every run.

The store is `<state_dir>/node-cache.json` in the state dir the config names at its top level
(an inventory's root), written only into one that exists, replaced atomically; a store that
cannot be read or written is not used.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..state.fsio import write_atomic

if TYPE_CHECKING:
    from .schema import NodeConfig

VERSION = 1
FILE_NAME = "node-cache.json"
_TEXT = ("project", "address", "models_dir", "service")
_OPTIONAL = ("docker_host", "docker_context", "tls_dir", "deploy_dir", "state_dir", "stacks_dir", "patches_dir",
             "device_dir", "secrets_env_file", "cache_dir")
# The code a cached verdict depends on (the raw YAML is still read by yamlfile.py on every run).
_JUDGES = ("schema.py", "names.py", "node.py", "node_cache.py")


@dataclass(frozen=True)
class Settings:
    """The validated values that locate a node, its files and its engine, as written (paths not
    yet made absolute: config/node.py does that on every run)."""

    project: str
    address: str
    prod_port: int
    models_dir: str
    service: str
    docker_host: str | None
    docker_context: str | None
    tls_dir: str | None
    deploy_dir: str | None
    state_dir: str | None
    stacks_dir: str | None
    patches_dir: str | None
    device_dir: str | None
    secrets_env_file: str | None
    cache_dir: str | None
    compose_files: tuple[str, ...]   # the project's compose files: `status` reads the deploy dir by them
    # Whether a companion has environment values: the CLI's masking (ui/notice.node_secrets)
    # then reads the whole config; without, status and history start without the schema.
    companion_env: bool = False
    secret_variables: tuple[str, ...] = ()  # the node config's: masked by ui/notice.node_secrets

    @classmethod
    def of(cls, cfg: NodeConfig) -> Settings:
        optional: dict[str, str | None] = {k: getattr(cfg, k) for k in _OPTIONAL}
        return cls(project=cfg.project, address=cfg.address, prod_port=cfg.ports.prod, models_dir=cfg.models_dir,
                   service=cfg.service, compose_files=tuple(cfg.compose_files), **optional,
                   companion_env=any(c.environment for c in cfg.companions),
                   secret_variables=tuple(cfg.secret_variables))

    @classmethod
    def from_json(cls, d: object) -> Settings | None:
        """Settings as `asdict` stored them; None for anything else."""
        if not isinstance(d, dict) or set(d) != {f.name for f in fields(cls)}:
            return None
        names = ("compose_files", "secret_variables")
        if not all(isinstance(d[k], str) for k in _TEXT) or type(d["prod_port"]) is not int \
                or not all(d[k] is None or isinstance(d[k], str) for k in _OPTIONAL) \
                or not all(isinstance(d[k], list) and all(isinstance(n, str) for n in d[k]) for k in names) \
                or type(d["companion_env"]) is not bool:
            return None
        return cls(**{**d, **{k: tuple(d[k]) for k in names}})


class NodeCache:
    """The stored settings of one config file (`source`, None for the built-in defaults) and
    node `name` (None without an inventory), whose text is `text`."""

    def __init__(self, state_dir: Path, source: Path | None, name: str | None, text: str) -> None:
        self.path = state_dir / FILE_NAME
        self.key = f"{source.absolute() if source is not None else ''}\n{name or ''}"
        self.sha = hashlib.sha256(text.encode()).hexdigest()
        self.stored = False

    def get(self) -> Settings | None:
        entry = self._entries().get(self.key)
        if not isinstance(entry, dict) or entry.get("sha") != self.sha:
            return None
        return Settings.from_json(entry.get("settings"))

    def put(self, settings: Settings) -> None:
        """Store `settings` for this file and name (once), dropping entries of config files that
        are gone; nothing while the state dir does not exist (a read-only command creates none)."""
        if self.stored or not self.path.parent.is_dir():
            return
        with contextlib.suppress(OSError):
            kept = {k: v for k, v in self._entries().items() if _source_exists(k)}
            kept[self.key] = {"sha": self.sha, "settings": asdict(settings)}
            data = {"version": VERSION, "code": code_hash(), "nodes": kept}
            write_atomic(self.path, json.dumps(data).encode(), mode=0o600)
            self.stored = True

    def _entries(self) -> dict[str, Any]:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self.path.read_bytes())
            if isinstance(data, dict) and data.get("version") == VERSION and isinstance(data.get("nodes"), dict) \
                    and data.get("code") == code_hash():
                return dict(data["nodes"])
        return {}


def _source_exists(key: str) -> bool:
    source = key.split("\n")[0]
    return not source or Path(source).is_file()


@functools.cache
def code_hash() -> str:
    """A hash of the code whose verdict is cached, pydantic's version read from its files
    (importing it is what the cache saves)."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in _JUDGES:
        h.update((here / name).read_bytes())
    spec = importlib.util.find_spec("pydantic")
    if spec is None or spec.origin is None:
        raise OSError("pydantic is not installed")  # then nothing is cached: validation says why
    h.update(Path(spec.origin).with_name("version.py").read_bytes())
    return h.hexdigest()
