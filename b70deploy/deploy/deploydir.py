"""The deploy dir: the files Compose reads, which of them are ours, reading and writing them.

Plain files the tool owns, like the state dir, and no Docker: the drain step writes the new
revision's files here (the real node's half of the seam, which `docker.node.DockerNode`
inherits), and `status`, watch and fsck compare them with a revision without importing the
switch machinery of docker/node.py."""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.compose_folder import own_files
from ..render.filenames import COMPANION_SECRETS_SUFFIX, COMPANIONS_DIR, COMPOSE_FILE, DOTENV_FILE, RUNTIME_ENV_FILE
from ..render.masking import private_mode
from ..state.fsio import fsync_dir, sweep_temp, write_atomic

if TYPE_CHECKING:
    from ..config.node import Node
    from ..state.revisions import Revision

OURS = (COMPOSE_FILE, DOTENV_FILE, RUNTIME_ENV_FILE)
WORKING_DIR = "com.docker.compose.project.working_dir"  # the label of where compose ran: ours is the deploy dir


def deployed_names(deploy_dir: Path, compose_files: Sequence[str] = (COMPOSE_FILE,)) -> list[str]:
    """Files of ours in a deploy dir: compose, env files, patched files and companion files, the project's other
    compose files (`compose_files`: an override file), and every file a compose file reads from
    the folder (an adopted hand-made deployment's env_file and bind-mounted files)."""
    names = [n for n in OURS if (deploy_dir / n).is_file()]
    names += [n for n in compose_files if n not in names and (deploy_dir / n).is_file()]
    for folder in (deploy_dir / "patches", deploy_dir / COMPANIONS_DIR):
        if folder.is_dir():
            names += sorted(p.relative_to(deploy_dir).as_posix() for p in folder.rglob("*") if p.is_file())
    for name in [COMPOSE_FILE, *compose_files]:
        compose = deploy_dir / name
        if compose.is_file():
            names += [n for n in own_files(compose.read_bytes(), lambda n: (deploy_dir / n).is_file())
                      if n not in names]
    return names


def strays(deploy_dir: Path, files: Mapping[str, bytes], compose_files: Sequence[str] = (COMPOSE_FILE,)) -> list[str]:
    """The files a write of `files` removes (write_deployed's rule; a dry run's diff lists the same): the
    tool's own files the old deployment had (a companion's secrets file the new one no longer reads),
    and what the deploy dir holds of ours once `files` are written (an override file of `compose_files`:
    Compose would merge it), less `files`. Never the operator's files an adopted compose file read
    (a bound key, a patched file), which companions may still bind: those stay, unmanaged."""
    before = [n for n in deployed_names(deploy_dir, compose_files)
              if n in OURS or n in compose_files or n.endswith(COMPANION_SECRETS_SUFFIX)
              or n.startswith(("patches/", f"{COMPANIONS_DIR}/"))]

    def there(name: str) -> bool:  # once `files` are written
        return name in files or (deploy_dir / name).is_file()

    after = [n for n in (*OURS, *compose_files) if there(n)]
    for folder in (deploy_dir / "patches", deploy_dir / COMPANIONS_DIR):
        if folder.is_dir():
            after += sorted(p.relative_to(deploy_dir).as_posix() for p in folder.rglob("*") if p.is_file())
    for name in dict.fromkeys([COMPOSE_FILE, *compose_files]):
        if name in files:  # a stray compose file's own files are the operator's: they stay
            after += own_files(files[name], there)
    return [n for n in dict.fromkeys([*before, *after]) if n not in files and (deploy_dir / n).is_file()]


def compose_names(files: Iterable[str], compose_files: Sequence[str]) -> tuple[str, ...]:
    """The project's compose files (in -f order) that a deployment's file set holds: an adopted
    base + override pair is both, a rendered deployment its one docker-compose.yml."""
    held = set(files)
    return tuple(n for n in compose_files if n in held) or (COMPOSE_FILE,)


def read_deployed(deploy_dir: Path, compose_files: Sequence[str] = (COMPOSE_FILE,)) -> dict[str, bytes]:
    return {n: (deploy_dir / n).read_bytes() for n in deployed_names(deploy_dir, compose_files)}


def read_modes(deploy_dir: Path, compose_files: Sequence[str] = (COMPOSE_FILE,)) -> dict[str, int]:
    """The permission bits of each file read_deployed reads."""
    return {n: stat.S_IMODE((deploy_dir / n).stat().st_mode) for n in deployed_names(deploy_dir, compose_files)}


def write_deployed(deploy_dir: Path, files: Mapping[str, bytes],
                   compose_files: Sequence[str] = (COMPOSE_FILE,), modes: Mapping[str, int] | None = None) -> None:
    """Make `deploy_dir` hold exactly `files`: each written atomically, strays removed (an
    override file of `compose_files` a rendered deployment does not have, too: Compose would
    merge it). A file's mode is private_mode's, from `modes` (the revision's record) where it has
    one; a file others cannot read now is never opened up by writing its own bytes again (the
    operator's key, chmod 600 since the revision recorded it)."""
    deploy_dir.mkdir(parents=True, exist_ok=True)
    gone = strays(deploy_dir, files, compose_files)
    for name, data in files.items():
        source = (modes or {}).get(name)
        with contextlib.suppress(OSError):
            now = stat.S_IMODE((deploy_dir / name).stat().st_mode)
            if not now & 0o004 and (deploy_dir / name).read_bytes() == data:
                source = now  # the operator closed these very bytes (chmod 600 since they were recorded)
        write_atomic(deploy_dir / name, data, mode=private_mode(name, data, source))
    for name in gone:
        with contextlib.suppress(FileNotFoundError):
            (deploy_dir / name).unlink()
    for folder in {(deploy_dir / name).parent for name in files} | {deploy_dir}:
        sweep_temp(folder, time.time())  # a killed write's temp files (we hold the deploy lock)
    fsync_dir(deploy_dir)


@dataclass(frozen=True)
class DeployDir:
    """The deploy-dir half of the NodeIO seam (deploy/nodeio.py) for a real node: one folder on
    this host. The test fake keeps its files in memory instead."""

    deploy_dir: Path

    def compose_files(self) -> tuple[str, ...]:
        """The project's compose files, in -f order (a node's config names its own)."""
        return (COMPOSE_FILE,)

    def read_deployed(self) -> dict[str, bytes]:
        return read_deployed(self.deploy_dir, self.compose_files())

    def read_modes(self) -> dict[str, int]:
        return read_modes(self.deploy_dir, self.compose_files())

    def write_deployed(self, files: Mapping[str, bytes], modes: Mapping[str, int] | None = None) -> None:
        write_deployed(self.deploy_dir, files, self.compose_files(), modes)

    def has_compose_file(self) -> bool:
        """A deployment is here: a rendered docker-compose.yml, or the project's own first file (compose.yaml)."""
        return any((self.deploy_dir / n).is_file() for n in dict.fromkeys((COMPOSE_FILE, *self.compose_files())))


def drift(node: Node, cur: Revision, box: dict[str, Any]) -> list[str]:
    """How the deploy dir and the vllm container (`box`: its stack label, image id and compose
    working dir) differ from revision `cur`: a hand-run compose, another tool, a hand edit."""
    from ..state.revisions import sha256

    found: list[str] = []
    live = {name: sha256(data) for name, data in read_deployed(node.deploy_dir, node.compose_files).items()}
    want = cur.meta.files  # the hashes it recorded: its stored copy may be what is damaged
    changed = sorted(n for n in set(live) | set(want) if live.get(n) != want.get(n))
    if changed:
        found.append(f"deploy dir differs from revision {cur.number}: {', '.join(changed)}")
    if box.get("stack") not in (None, cur.meta.stack):
        found.append(f"the vllm container runs stack {box['stack']}, revision {cur.number} is {cur.meta.stack}")
    if cur.meta.image_id and box.get("image_id") not in (None, cur.meta.image_id):
        found.append(f"the vllm container runs image {str(box['image_id'])[:19]}, revision {cur.number} pins "
                     f"{cur.meta.image_id[:19]}")
    where = box.get("working_dir")
    if where and os.path.realpath(where) != os.path.realpath(node.deploy_dir):
        found.append(f"the vllm container was started by compose from {where}, not from the deploy dir")
    return found
