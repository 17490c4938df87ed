"""`stack from-compose COMPOSE --name NAME`: a hand-made compose file becomes a catalogue stack."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..config.compose_folder import references
from ..config.names import check_name
from ..config.node import Node
from ..config.resources import is_shipped
from ..docker.compose import config_of
from ..docker.image_inspect import ImageFacts, ImageInspector
from ..docker.proc import last_line, run
from ..errors import B70Error, UserError
from ..render.filenames import DOTENV_FILE
from ..render.from_compose import SERVE, FromCompose, stack_from_compose
from ..render.masking import Secrets
from ..render.vllm_args import API_SERVER
from ..state.fsio import write_atomic
from ..ui.notice import marked_values, node_secrets


@dataclass
class Converted:
    path: Path
    text: str               # the stack file as written
    service: str
    project: str | None     # the compose project name Compose gives the file
    result: FromCompose
    elsewhere: str | None = None  # why the file is not in the node's catalogue, and how to make it so

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {"stack": self.path.stem, "file": str(self.path), "service": self.service, "stack_doc": r.doc,
                "sources": r.sources, "node": {**({"project": self.project} if self.project else {}), **r.node},
                "withheld_env": r.withheld, "notes": r.notes, "not_in_catalogue": self.elsewhere}


@dataclass(frozen=True)
class Conversion:
    path: Path          # the stack file to write
    argv: list[str]     # the one command that reads the compose file
    elsewhere: str | None = None  # set when the node's catalogue is the shipped one (see plan)


OWN_STACKS = Path("stacks")  # the operator's own catalogue, in the working folder, when the node names none


@dataclass
class StackFromCompose:
    node: Node
    compose_file: Path
    name: str
    env_file: Path | None = None
    service: str | None = None
    out: Path | None = None
    more: tuple[Path, ...] = ()       # the files Compose reads after it (-f a -f b: an override file)
    profiles: tuple[str, ...] = ()    # the profiles it runs with (none: every profile)

    def plan(self) -> Conversion:
        """Where the stack goes and how the file is read; the name is checked before it becomes a
        path. Nothing is read or run. The place: --out, else the node's stacks_dir, unless that is
        the catalogue shipped inside the package (no stacks_dir set): the next `pip install -U`
        replaces that folder, so the operator's stack goes to ./stacks/ and the output says how to
        make it the node's catalogue."""
        check_name(self.name, what="stack name", where="--name")
        elsewhere = None
        if self.out is not None:
            path = self.out
        elif is_shipped(self.node.stacks_dir):
            own = OWN_STACKS.absolute()
            path = own / f"{self.name}.yaml"
            elsewhere = (f"the node's catalogue is the one shipped in the package ({self.node.stacks_dir}), which "
                         f"an upgrade replaces: the stack went to {own}; to deploy it, set stacks_dir: {own} in "
                         f"{self.node.source or 'the node config'} (or pass --stacks-dir {own})")
        else:
            path = self.node.stacks_dir / f"{self.name}.yaml"
        if path.name != f"{self.name}.yaml":
            raise UserError(f"--out {path} is not named {self.name}.yaml", where="--out",
                            fix=f"a catalogue names a stack by its file: write to DIR/{self.name}.yaml")
        return Conversion(path, config_of(self.compose_file, env_file=self.env_file, more=self.more,
                                          profiles=self.profiles), elsewhere)

    def run(self) -> Converted:
        plan = self.plan()
        path = plan.path
        if path.exists():
            raise UserError(f"{path} already exists", where="--name",
                            fix="choose another --name (or --out), or remove that file first")
        for given, what in ((self.compose_file, "COMPOSE"), (self.env_file, "--env"),
                            *((m, "-f") for m in self.more)):
            if given is not None and not given.is_file():
                raise UserError(f"{what} {given} is not a file", where=str(given), fix="check the path")
        config = self._config(plan.argv)
        name, service = self._service(config)
        where = f"{self.compose_file}: services.{name}"
        result = stack_from_compose(service, image=self._image(str(service.get("image") or "")), where=where,
                                    networks=config.get("networks") or {}, secrets=self._secrets())
        if "hf_cache_volume" in result.node:  # the engine's name of the volume (Compose's `name:`)
            key = result.node["hf_cache_volume"]
            result.node["hf_cache_volume"] = ((config.get("volumes") or {}).get(key) or {}).get("name") or key
        text = self._text(result, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text.encode())
        project = config.get("name")
        if name != self.node.service:  # the node names the service the stack renders as
            result.node["service"] = name
        return Converted(path, text, name, str(project) if project else None, result, plan.elsewhere)

    def _secrets(self) -> Secrets:
        """The node's secrets and the values the file's env files mark secret (its .env or --env,
        every env_file:): a stack file is 0644 and printed, so none of them goes into it."""
        folder = self.compose_file.parent
        env_files = [folder / r.name for r in references(self.compose_file.read_bytes()) if r.kind == "env_file"]
        return node_secrets(self.node) | Secrets(values=marked_values([self.env_file or folder / DOTENV_FILE,
                                                                       *env_files]))

    def _config(self, argv: list[str]) -> dict[str, Any]:
        result = run(argv, timeout=60, check=False)
        if result.returncode != 0:
            raise UserError(f"docker compose refuses it: {last_line(result.stderr)}", where=str(self.compose_file),
                            fix=f"docker compose -f {self.compose_file} config shows the whole error")
        try:
            data = json.loads(result.stdout)
        except ValueError:
            raise UserError("docker compose config did not print JSON", where=str(self.compose_file),
                            fix="update Docker Compose to v2") from None
        return data if isinstance(data, dict) else {}

    def _service(self, config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        services: dict[str, Any] = config.get("services") or {}
        if self.service is not None:
            pick = self.service
        elif self.node.service in services:
            pick = self.node.service
        else:
            serving = [n for n, s in services.items() if _serves(s)] or \
                [n for n, s in services.items() if isinstance(s, dict) and "vllm" in str(s.get("image") or "")]
            pick = serving[0] if len(serving) == 1 else ""
        if pick not in services:
            known = ", ".join(sorted(services)) or "none"
            raise UserError(f"no service {pick!r}" if pick else f"cannot tell which service runs vLLM ({known})",
                            where=str(self.compose_file), fix=f"name it with --service (one of: {known})")
        return pick, services[pick]

    def _image(self, ref: str) -> ImageFacts | None:
        """The image's entrypoint facts, or None when the engine lacks the image (or cannot be asked)."""
        if not ref:
            return None
        try:
            with ImageInspector(self.node.state_dir) as inspector:
                return inspector.facts(ref)
        except B70Error:
            return None

    def _text(self, result: FromCompose, service: str) -> str:
        head = [f"# Written by `b70deploy stack from-compose` from {self.compose_file} (service {service}).",
                f"# entrypoint_style from {result.sources.get('entrypoint_style', 'the command')}."]
        head += [f"# note: {' '.join(n.splitlines())}" for n in result.notes]
        body = yaml.safe_dump(result.doc, sort_keys=False, allow_unicode=True, width=1000)
        return "\n".join(head) + "\n" + body


def _serves(service: Any) -> bool:
    """Whether the service starts vLLM by its command or entrypoint: `vllm serve` (in a script too)
    or python -m vllm.entrypoints.openai.api_server."""
    if not isinstance(service, dict):
        return False
    words = [str(w) for key in ("entrypoint", "command") if isinstance(service.get(key), list) for w in service[key]]
    return any(words[i:i + 2] == SERVE for i in range(len(words))) or API_SERVER in words \
        or any("vllm serve" in w for w in words)
