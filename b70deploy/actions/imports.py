"""`import COMPOSE`: a saved copy of a hand-made deployment becomes a revision (kind import).

The report kept its rollbacks as copies beside the live file (docker-compose.yml.tq-rollback
with .env.tq-rollback, docker-compose.yml.pre-ngram). An import stores such a copy, the .env
saved with it and the files it reads from its folder, after the same preflight a rollback
runs (handmade.check_files), pinned to the image id its tag names now. It never ran under
the tool, so it is "unproven" until `rollback STACK` runs it healthy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.names import check_name
from ..config.node import Node
from ..deploy.steps import keep
from ..docker.image_inspect import ImageInspector
from ..docker.node import DockerNode
from ..errors import UserError
from ..render.files import COMPOSE_FILE, DOTENV_FILE
from ..render.masking import modes
from ..state.stamps import now_iso, operator
from .handmade import check_files, clear_secrets, env_summary, folder_files, folder_modes, image_patches
from .mutating import mutating

_STACK_LABEL = re.compile(rb'b70deploy\.stack: "([a-z0-9][a-z0-9._-]*)"')


def saved_env(compose: Path) -> Path | None:
    """The .env saved with a copy: `.env.SUFFIX` beside `docker-compose.yml.SUFFIX`, else the
    folder's `.env` (the report saved none with its .pre-ngram copy), else none."""
    suffix = compose.name.removeprefix(f"{COMPOSE_FILE}.") if compose.name.startswith(f"{COMPOSE_FILE}.") else None
    for candidate in ([compose.parent / f"{DOTENV_FILE}.{suffix}"] if suffix else []) + [compose.parent / DOTENV_FILE]:
        if candidate.is_file():
            return candidate
    return None


def stack_name(compose: Path, text: bytes) -> str:
    """The stack an unnamed copy is kept as: its b70deploy label, else the copy's suffix."""
    m = _STACK_LABEL.search(text)
    if m:
        return m.group(1).decode()
    if not compose.name.startswith(f"{COMPOSE_FILE}.") or compose.name == f"{COMPOSE_FILE}.":
        raise UserError(f"{compose.name} names no stack (no b70deploy label, no .SUFFIX after {COMPOSE_FILE})",
                        where=str(compose), fix="say which stack it is: --as STACK")
    return compose.name.removeprefix(f"{COMPOSE_FILE}.").lower()


@dataclass
class Imported:
    revision: int
    stack: str
    created: bool
    image_ref: str
    image_id: str
    env_file: str | None
    files: list[str]
    patches: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class Import:
    node: Node
    compose: Path
    env: Path | None = None
    stack: str | None = None
    message: str = ""
    more: tuple[Path, ...] = ()   # the files Compose reads after it (-f a -f b), as the node's compose_files
    profiles: tuple[str, ...] = ()  # the profiles the copy runs with (--profile): each one the node runs

    def run(self) -> Imported:
        env = self.env or saved_env(self.compose)
        names = self.node.config.compose_files
        # A rollback runs every revision with the node's profiles (it is read with them below, as it will
        # run): a copy that runs with another would be checked as one thing and started as another.
        others = [p for p in self.profiles if p not in self.node.config.profiles]
        if others:
            raise UserError(f"--profile {', '.join(others)}: the node runs profiles "
                            f"[{', '.join(self.node.config.profiles)}], which a rollback runs the copy with",
                            where=str(self.node.source or "node config"),
                            fix=f"add {', '.join(others)} to profiles: in the node config (the profiles the project "
                                "runs with), or drop --profile")
        if len(self.more) > len(names) - 1:
            raise UserError(f"{1 + len(self.more)} compose files given, the node config names {len(names)} "
                            f"({', '.join(names)})", where=str(self.node.source or "node config"),
                            fix="set compose_files: to the project's files in -f order (b70deploy init writes it)")
        # With the files Compose reads after it, the first is the project's own first file (compose.yaml):
        # Compose then reads them in the node's -f order. Alone, it is the deploy dir's docker-compose.yml.
        base = names[0] if self.more else COMPOSE_FILE
        more = list(zip(self.more, names[1:], strict=False))
        files = folder_files(self.compose, env, more, base)
        name = check_name(self.stack or stack_name(self.compose, files[base]), what="stack name (--as)")
        with mutating(self.node, f"import {self.compose.name}") as m:
            store = m.state.revisions
            for entry in reversed(store.index()):
                if entry["kind"] == "import" and entry["stack"] == name:
                    rev = store.get(entry["number"])
                    if rev.read_files() == files:
                        m.ended("ok", revision=rev.number, summary=f"already imported as revision {rev.number}")
                        return Imported(revision=rev.number, stack=name, created=False, image_ref=rev.meta.image_ref,
                                        image_id=str(rev.meta.image_id), env_file=str(env) if env else None,
                                        files=sorted(files), patches=list(rev.meta.patches or []),
                                        warnings=[f"already imported as revision {rev.number}: nothing to do"],
                                        env=env_summary(files))
            with ImageInspector(self.node.state_dir) as inspector:
                checked = check_files(self.node, files, name=name, where=str(self.compose), inspector=inspector)
                records, notes = image_patches(files, checked.image.id, inspector, self.node.service, names)
            patches = [r.to_dict() for r in records] + checked.mounts
            rev = store.create(stack=name, kind="import", files=files, image_ref=checked.image.ref,
                               image_id=checked.image.id, repo_digest=checked.image.repo_digest, operator=operator(),
                               message=self.message or f"imported from {self.compose}", created=now_iso(),
                               patches=patches, outcome="unproven",
                               modes=modes(files, folder_modes(files, self.compose, env, more, base)))
            keep(DockerNode.production(self.node), rev)  # `docker image prune` must not take it
            m.ended("ok", revision=rev.number, summary=f"imported as revision {rev.number} ({name})")
        return Imported(revision=rev.number, stack=name, created=True, image_ref=checked.image.ref,
                        image_id=checked.image.id, env_file=str(env) if env else None, files=sorted(files),
                        patches=patches, warnings=checked.warnings + notes + clear_secrets(files),
                        env=env_summary(files))
