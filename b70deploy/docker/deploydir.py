"""Which files of a deploy dir are ours, and reading them: plain file work, no Docker, so that
`status` (and watch) compare the deploy dir with a revision without importing the switch
machinery of docker/node.py."""

from __future__ import annotations

from pathlib import Path

from ..config.compose_folder import own_files
from ..render.filenames import COMPOSE_FILE, DOTENV_FILE, RUNTIME_ENV_FILE

OURS = (COMPOSE_FILE, DOTENV_FILE, RUNTIME_ENV_FILE)


def deployed_names(deploy_dir: Path) -> list[str]:
    """Files of ours in a deploy dir: compose, env files and patched files, and every file the
    compose file reads from the folder (an adopted hand-made deployment's env_file and
    bind-mounted files)."""
    names = [n for n in OURS if (deploy_dir / n).is_file()]
    patches = deploy_dir / "patches"
    if patches.is_dir():
        names += sorted(p.relative_to(deploy_dir).as_posix() for p in patches.rglob("*") if p.is_file())
    compose = deploy_dir / COMPOSE_FILE
    if compose.is_file():
        names += [n for n in own_files(compose.read_bytes(), lambda n: (deploy_dir / n).is_file()) if n not in names]
    return names


def read_deployed(deploy_dir: Path) -> dict[str, bytes]:
    return {n: (deploy_dir / n).read_bytes() for n in deployed_names(deploy_dir)}
