"""The hand-run Compose projects on an engine, read from their containers' labels.

Compose labels every container it makes with its project, service, working dir, compose
files and env file; `docker compose config` of those files (the same argv as any of our
compose calls) then gives the resolved services: ports, mounts, env files, commands. That
is all `init` needs to write a node config for a box nobody described to the tool.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..deploy.deploydir import WORKING_DIR as WORKING_DIR  # the label init and adopt read here
from ..errors import UserError
from . import engine
from .proc import last_line, run

PROJECT = "com.docker.compose.project"
SERVICE = "com.docker.compose.service"
CONFIG_FILES = "com.docker.compose.project.config_files"
# The modules `python -m` starts vLLM's OpenAI server from (render/vllm_args.split_launcher).
SERVER_MODULES = frozenset({"vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main"})
ENV_FILE = "com.docker.compose.project.environment_file"


@dataclass(frozen=True)
class LiveService:
    name: str
    container: str
    status: str
    image_ref: str            # as the compose file named it (Config.Image)
    image_id: str
    runs_vllm: bool


@dataclass
class LiveProject:
    name: str
    working_dir: Path
    config_files: list[Path]
    env_files: list[Path]
    services: dict[str, LiveService] = field(default_factory=dict)

    @property
    def vllm_services(self) -> list[str]:
        return [s.name for s in self.services.values() if s.runs_vllm]


def _runs_vllm(command: str) -> bool:
    """vLLM's server in the container's command line (the list API joins entrypoint and command, so
    an image's ENTRYPOINT counts): `vllm serve`, `python -m vllm.entrypoints.openai.api_server`,
    `python -m vllm.entrypoints.cli.main serve`, also inside a bash -c script."""
    words = [a.rsplit("/", 1)[-1].strip("\"';&") for a in command.split()]
    return any((a == "vllm" and b == "serve") or (a == "-m" and b in SERVER_MODULES)
               for a, b in itertools.pairwise(words))


def _paths(label: str | None) -> list[Path]:
    return [Path(p) for p in (label or "").split(",") if p]


def live_projects() -> list[LiveProject]:
    """Every Compose project with a container on this engine, by name."""
    projects: dict[str, LiveProject] = {}
    # sparse: the list API's own fields, no inspect per container (on a busy engine one may be
    # gone between the list and its inspect).
    for c in engine.client().containers.list(all=True, sparse=True, filters={"label": PROJECT}):
        attrs = c.attrs or {}
        labels = attrs.get("Labels") or {}
        name = labels[PROJECT]
        project = projects.get(name)
        if project is None:
            project = projects[name] = LiveProject(
                name=name, working_dir=Path(labels.get(WORKING_DIR, ".")),
                config_files=_paths(labels.get(CONFIG_FILES)), env_files=_paths(labels.get(ENV_FILE)))
        service = labels.get(SERVICE, "?")
        names = attrs.get("Names") or [service]
        project.services[service] = LiveService(
            name=service, container=str(names[0]).lstrip("/"), status=str(attrs.get("State", "?")),
            image_ref=str(attrs.get("Image", "")), image_id=str(attrs.get("ImageID", "")),
            runs_vllm=_runs_vllm(str(attrs.get("Command", ""))))
    return sorted(projects.values(), key=lambda p: p.name)


def project_config(project: LiveProject, *, interpolate: bool = True) -> dict[str, Any]:
    """`docker compose config` of the project's own files with every profile on (which of them
    run, its containers say), as Compose resolves them; `interpolate=False`: ${VAR} as written."""
    argv = ["docker", "compose", "--project-directory", str(project.working_dir), "-p", project.name]
    for f in project.config_files:
        argv += ["-f", str(f)]
    for f in project.env_files:
        argv += ["--env-file", str(f)]
    argv += ["--profile", "*", "config", "--format", "json"]
    if not interpolate:
        argv.append("--no-interpolate")
    result = run(argv, timeout=60, check=False)
    if result.returncode != 0:
        where = ", ".join(map(str, project.config_files)) or str(project.working_dir)
        raise UserError(f"docker compose config rejects project {project.name}'s files: {last_line(result.stderr)}",
                        where=where, fix="correct the compose file (docker compose config shows why), then run "
                        "init again")
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc
