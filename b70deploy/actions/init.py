"""`init`: discover the node and write its config, every value with where it came from.

From the engine: the running vLLM Compose project (container labels: project, working dir,
compose and env files), and from `docker compose config` of its files the published port
and bind address, the models dir and its path in the container (the bind that holds the model the
command serves, at /models or anywhere), the vllm service's env_file and the companions (the
project's other services, with their volumes and container_name). From the host: the numeric gids that
own the /dev/dri nodes, and the state dir. Nothing is written over an existing config.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..config.compose_folder import references
from ..config.compose_keys import TOOL_LABELS, label_map
from ..config.node import CWD_NAME, SYSTEM_PATH, default_state_dir
from ..config.schema import NodeConfig
from ..config.validation import validate
from ..deploy.nodeio import VLLM
from ..docker import discover, platform
from ..docker.image_inspect import entrypoint_facts
from ..errors import UserError
from ..render import devices
from ..render.files import COMPOSE_FILE, DOTENV_FILE
from ..render.from_compose import ImageEntrypoint, serve_arguments, stack_from_compose
from ..render.gpu import read_back
from ..render.masking import NONE, Secrets, is_reference, is_secret, mask, secret_variables
from ..render.vllm_args import API_KEY_ENV, API_KEY_FLAG, CONTAINER_MODELS, CONTAINER_PORT, api_keys
from ..state.fsio import write_atomic
from ..state.stamps import now_iso
from ..ui import notice

SYSTEM_STATE = Path("/var/lib/b70deploy")


@dataclass(frozen=True)
class Fact:
    key: str
    value: Any
    source: str

    def shown(self) -> str:
        """The value fit to print: secret-looking environment values masked."""
        if self.key == "companions":
            return "; ".join(_companion(c) for c in self.value)
        if self.key == "variables":  # names only: a secret label's value is among them (the file has them)
            return ", ".join(self.value)
        return str(self.value)


def _companion(c: dict[str, Any]) -> str:
    hidden = secret_variables(c.get("environment", {}), c.get("secrets", []))
    parts = [f"image {c['image']}"]
    if c.get("command"):
        parts.append(f"command {' '.join(c['command'])}")
    if c.get("port"):
        parts.append(f"port {c['port']}->{c.get('container_port') or c['port']}")
    if c.get("container_name"):
        parts.append(f"container_name {c['container_name']}")
    if c.get("volumes"):
        parts.append("volumes " + ", ".join(f"{v['source']}:{v['target']}" for v in c["volumes"]))
    if c.get("environment"):
        parts.append("env " + ", ".join(f"{k}={mask(hidden[k])}" if k in hidden else k for k in c["environment"]))
    return f"{c['name']} ({', '.join(parts)})"


@dataclass
class Discovery:
    """What the engine and the host said (the impure half of init)."""

    compose: dict[str, Any] | None         # `docker compose config` of the chosen project, every profile on
    compose_text: bytes                    # its compose file as written (env_file names survive there)
    chosen: discover.LiveProject | None
    access: devices.DeviceAccess
    device_dir: Path
    signs: list[platform.Found] = field(default_factory=list)  # the GPU platform's traces, strongest first
    # The same config without interpolation: the companions' environment as written (${VAR} kept).
    written: dict[str, Any] | None = None
    service: str | None = None             # --service: the vLLM service, where the project has several
    image: ImageEntrypoint | None = None   # the vllm service's image's ENTRYPOINT and CMD (what runs bare flags)
    # Values the operator's env files mark secret: all of a private (0600) one's, a secret name's in any.
    secret_values: frozenset[str] = frozenset()
    # What Compose interpolates the project's files with: the values of its .env (or --env-file).
    variables: dict[str, str] = field(default_factory=dict)
    # The key the running vLLM asks /v1 requests for (its --api-key, else VLLM_API_KEY), as vLLM reads it.
    api_key: str | None = None


@dataclass
class InitPlan:
    config: dict[str, Any]
    facts: list[Fact] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Files init writes beside the config, 0600: the node's secrets_env_file with the running vLLM's key.
    secret_files: dict[str, str] = field(default_factory=dict)

    def text(self, *, masked: bool = False) -> str:
        """The config file: a header saying where each value came from, then the YAML; `masked`:
        fit to print, each secret as render/masking.mask shows it."""
        head = [f"# b70deploy node config, written by `b70deploy init` on {now_iso()}.",
                "# Where each value came from:"]
        head += [f"#   {f.key}: {f.source}" for f in self.facts]
        config = self.secrets.tree(self.config) if masked else self.config
        if masked and self.secret:
            head.append("# Secret values are masked here: `b70deploy init` (without --print) writes them, mode 0600.")
        return "\n".join(head) + "\n" + yaml.safe_dump(config, sort_keys=False)

    @property
    def secrets(self) -> Secrets:
        """The companions' secrets: their names, the keys init marked, and the values of both."""
        found = NONE
        for c in self.config.get("companions", []):
            marked = c.get("secrets", [])
            found |= Secrets(keys=frozenset(marked),
                             values=frozenset(secret_variables(c.get("environment", {}), marked).values()))
        names = self.config.get("secret_variables", [])
        found |= Secrets(keys=frozenset(names),
                         values=frozenset(secret_variables(self.config.get("variables", {}), names).values()))
        for text in self.secret_files.values():
            found |= Secrets(keys=frozenset({API_KEY_ENV}), values=frozenset(
                v for k, _, v in (line.partition("=") for line in text.splitlines()) if v))
        return found

    @property
    def secret(self) -> bool:
        return bool(self.secrets.values)

    def to_dict(self) -> dict[str, Any]:
        shown: dict[str, Any] = self.secrets.tree({"config": self.config, "notes": self.notes,
                                                   "sources": {f.key: f.source for f in self.facts}})
        return shown


def default_target(given: str | None) -> Path:
    """--config, else where load_node looks first without one: /etc/b70deploy/node.yaml for
    root, ./b70deploy.yaml otherwise."""
    if given:
        return Path(given)
    return SYSTEM_PATH if os.geteuid() == 0 else Path.cwd() / CWD_NAME


def gather(project: str | None, device_dir: Path | None = None, service: str | None = None) -> Discovery:
    projects = discover.live_projects()
    found = [p for p in projects if p.vllm_services]
    chosen = None
    if project is not None:
        chosen = next((p for p in projects if p.name == project), None)
        if chosen is None:
            raise UserError(f"no container of compose project {project!r} on this engine",
                            fix="start it (docker compose --profile gpu up -d) or name a project from "
                            "`docker compose ls`")
    elif len(found) > 1:
        raise UserError(f"{len(found)} compose projects run vLLM: {', '.join(p.name for p in found)}",
                        fix="say which one is production: b70deploy init --project NAME")
    elif found:
        chosen = found[0]
    text = b""
    if chosen is not None and chosen.config_files:
        with contextlib.suppress(OSError):  # on another host (docker_host): the labels' paths are not here
            text = chosen.config_files[0].read_bytes()
    from ..docker.engine import client

    signs = platform.discover(platform.engine_info(client()))
    doc = discover.project_config(chosen) if chosen else None
    written = discover.project_config(chosen, interpolate=False) if chosen else None
    name = _vllm_name(chosen, service) if chosen is not None else None
    if device_dir is None:  # the running service's own device map names the folder, else /dev/dri
        svc = ((doc or {}).get("services") or {}).get(name) if name else None
        mapped = read_back(svc or {}).device_dir
        device_dir = Path(mapped) if mapped else Path("/dev/dri")
    live = chosen.services.get(name) if chosen is not None and name is not None else None
    keys: list[str] = []
    if live is not None:
        with contextlib.suppress(Exception):  # removed meanwhile: no key read
            attrs = client().containers.get(live.container).attrs
            keys = api_keys([attrs.get("Path") or "", *(attrs.get("Args") or [])], attrs["Config"].get("Env") or [])
    return Discovery(compose=doc, compose_text=text, chosen=chosen, access=devices.scan(device_dir),
                     device_dir=device_dir, signs=signs, written=written, service=service,
                     image=entrypoint_facts(live.image_id or live.image_ref) if live is not None else None,
                     secret_values=marked_values(chosen, text) if chosen else frozenset(),
                     variables=project_variables(chosen) if chosen else {}, api_key=keys[0] if keys else None)


def _vllm_name(p: discover.LiveProject, service: str | None) -> str:
    """The vLLM service of project `p`: the one named (--service), else `vllm` when it runs vLLM (or
    when none visibly does: an external start script hides the server from the command line), else
    the only one that does. Several and none named: a UserError listing them."""
    runs = p.vllm_services
    if service is not None:
        if service not in p.services:
            raise UserError(f"project {p.name} has no service {service!r} with a container",
                            fix=f"name one of {', '.join(sorted(p.services))} (--service)")
        return service
    if VLLM in runs or (not runs and VLLM in p.services):
        return VLLM
    if not runs:
        raise UserError(f"no container of project {p.name} runs vLLM (vllm serve, or python -m "
                        "vllm.entrypoints.openai.api_server)", where=str(p.working_dir),
                        fix="start its vLLM service, or name the production project with --project")
    if len(runs) > 1:
        raise UserError(f"project {p.name} runs vLLM in {len(runs)} services: {', '.join(sorted(runs))}",
                        fix="say which one the tool switches: b70deploy init --service NAME (the others are kept "
                            "as they are)")
    return runs[0]


def marked_values(p: discover.LiveProject, compose_text: bytes) -> frozenset[str]:
    """The values the project's env files (its .env, every service's env_file) mark secret."""
    dotenv = p.env_files or [p.working_dir / DOTENV_FILE]  # Compose reads the folder's .env unless told another
    return notice.marked_values({*dotenv, *(p.working_dir / r.name for r in references(compose_text)
                                             if r.kind == "env_file")})


def project_variables(p: discover.LiveProject) -> dict[str, str]:
    """The variables Compose interpolated the project with: its .env, or the env files it was told."""
    from dotenv import dotenv_values

    found: dict[str, str] = {}
    for path in p.env_files or [p.working_dir / DOTENV_FILE]:
        with contextlib.suppress(OSError):
            found.update({k: v for k, v in dotenv_values(path).items() if v is not None})
    return found


_VARIABLE = re.compile(r"(?<!\$)\$\{?([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Labels:
    """A service's own labels as a switch renders them (Compose text, `${VAR}` references kept), the
    operator's .env values they name, and the variables that hold a secret label's value."""

    labels: dict[str, str]
    variables: dict[str, str]
    secret: tuple[str, ...] = ()


def _labels_of(service: str, written: Any, variables: dict[str, str]) -> Labels:
    """The labels as written. One holding a secret in clear (a basic-auth label's users written inline)
    becomes `${B70_LABEL_...}`, its value (Compose's `$$` as the `$` the container gets) a variable of
    the rendered .env (0600): the rendered compose file others may read never holds it."""
    # b70deploy.* are the tool's (a project an earlier switch rendered): every render writes its own.
    labels = {k: v for k, v in label_map(written or {}).items() if not k.startswith(TOOL_LABELS)}
    given: dict[str, str] = {}
    secret: list[str] = []
    for key, value in labels.items():
        if value and is_secret(key) and not is_reference(value):
            name = "B70_LABEL_" + re.sub(r"[^A-Za-z0-9]+", "_", f"{service}_{key}").strip("_").upper()
            given[name], labels[key] = value.replace("$$", "$"), f"${{{name}}}"
            secret.append(name)
    named = sorted({m for v in labels.values() for m in _VARIABLE.findall(v)})
    given |= {k: variables[k] for k in named if k in variables}
    return Labels(labels, dict(sorted(given.items())), tuple(secret))


def _port(spec: dict[str, Any], want: int | None = None) -> tuple[int, int, str | None] | None:
    """(published, container port, host ip) of the service's first published TCP port
    (the one to `want` when given)."""
    for p in spec.get("ports") or []:
        if not isinstance(p, dict) or not p.get("published") or (want is not None and p.get("target") != want):
            continue
        return int(p["published"]), int(p["target"]), p.get("host_ip") or None
    return None


def _published(services: dict[str, Any]) -> set[int]:
    """Every host port the project's services publish (a companion's 8001 is no dark port)."""
    return {int(p["published"]) for spec in services.values() if isinstance(spec, dict)
            for p in spec.get("ports") or [] if isinstance(p, dict) and str(p.get("published") or "").isdigit()}


def plan(d: Discovery, state_dir: Path | None = None) -> InitPlan:
    """The config and the provenance of each value (pure: reads only `d` and the process's uid)."""
    out = InitPlan(config={})
    cfg, facts, notes = out.config, out.facts, out.notes

    def put(key: str, value: Any, source: str) -> None:
        node, *rest = key.split(".")
        if rest:
            cfg.setdefault(node, {})[rest[0]] = value
        else:
            cfg[node] = value
        facts.append(Fact(key, value, source))

    if d.access.gids:
        put("device_dir", str(d.device_dir), "present on this host" if str(d.device_dir) == "/dev/dri" else
            "the device map of the running vLLM service")
        put("gids", dict(d.access.gids), f"owners of the device nodes in {d.device_dir} (numeric: the image's "
            "/etc/group may lack render)")
    else:
        put("device_dir", None, f"{d.device_dir}: " + ("; ".join(d.access.notes) or "no device nodes")
            + " (no GPU devices: render without group_add)")
        notes.append(f"no GPU device nodes under {d.device_dir}: the node renders without devices")
    _platform(d, put, notes)
    root = os.geteuid() == 0
    if state_dir is not None:
        put("state_dir", str(state_dir.absolute()), "--state-dir")
    else:
        put("state_dir", str(SYSTEM_STATE if root else default_state_dir()),
            "running as root: the system state folder" if root else "not root: the user state folder (platformdirs)")
    p, doc = d.chosen, d.compose
    if p is None or doc is None:
        notes.append("no running vLLM compose project found: project, deploy_dir, ports and models_dir keep "
                     "their defaults (b70deploy switch deploys from scratch)")
        return out
    label = f"container {next(iter(p.services.values())).container}"
    put("project", p.name, f"label {discover.PROJECT} of {label}")
    put("deploy_dir", str(p.working_dir), f"label {discover.WORKING_DIR}: the folder the hand-made "
        "compose file lives in, which b70deploy now writes")
    services = doc.get("services") or {}
    name = _vllm_name(p, d.service)
    if name != VLLM:  # the operator's own name (vllm-server): the node config names it, every command uses it
        put("service", name, f"--service {name}" if d.service else
            f"the service of project {p.name} that runs vLLM")
    if not p.vllm_services:
        notes.append(f"no container of project {p.name} shows vLLM on its command line: service {VLLM} is taken "
                     "as it is (a start script's argv is not read; adopt and import keep the script as bytes)")
    _project_files(p, services, put, notes)
    if p.env_files and p.env_files != [p.working_dir / DOTENV_FILE]:
        notes.append(f"env file {', '.join(map(str, p.env_files))}: b70deploy reads {DOTENV_FILE} beside the "
                     "compose file")
    vllm = services.get(name) or {}
    parsed = serve_arguments(vllm, d.image)
    listens = parsed.fixed.get("--port", "") if parsed is not None else ""
    port = _port(vllm, int(listens) if listens.isdigit() else CONTAINER_PORT) or _port(vllm)
    if port is None:
        notes.append(f"service {name} publishes no port: ports.prod keeps its default")
    else:
        published, target, host_ip = port
        where = f"ports of service {name} ({host_ip or '0.0.0.0'}:{published}->{target})"
        put("ports.prod", published, where)
        taken = _published(services)
        dark = next(n for n in range(published + 1, 65536) if n not in taken)
        put("ports.dark", dark, "the first port above ports.prod that no service of the project publishes (the "
            "report's dark port 8001 beside 8000); change it if another program holds it")
        put("bind_address", host_ip or "0.0.0.0", where)
        if target != CONTAINER_PORT:
            notes.append(f"vllm listens on {target} in its container: a stack from this file keeps it "
                         f"(container_port: {target}); catalogue stacks listen on {CONTAINER_PORT}")
    _models(vllm, d.image, name, put, notes, doc.get("volumes") or {})
    # Compose's resolved config inlines env_file into environment: the file's own text names it.
    env_files = [str(p.working_dir / r.name) for r in references(d.compose_text)
                 if r.kind == "env_file" and r.service == name]
    if len(env_files) == 1:
        put("secrets_env_file", env_files[0], f"env_file of service {name} (its runtime environment: "
            "stacks b70deploy renders pass it into vllm.env, 0600)")
        with contextlib.suppress(OSError):  # another user's file: init only notes modes
            mode = stat.S_IMODE(Path(env_files[0]).stat().st_mode)
            if mode & 0o077:
                notes.append(f"{env_files[0]} is mode {mode:o}: chmod 600 it (it holds secrets)")
    if d.api_key:
        _api_key(d.api_key, env_files, cfg, out, put)
    written = (d.written or {}).get("services") or {}
    own = _labels_of(name, (written.get(name) or vllm).get("labels"), d.variables)
    _node_wide(name, vllm, doc, p.name, put, own.labels)
    if own.variables:
        put("variables", own.variables, f"the project's .env values the labels of service {name} name: the "
            "rendered .env (0600) gives them" + (", a secret label's value among them" if own.secret else ""))
    # Only the services Compose ran (a variant behind a profile nobody started is not the node's).
    companions = [_companion_of(other, services[other], doc, notes, (written.get(other) or {}).get("environment"),
                                d.secret_values, d.variables, (written.get(other) or services[other]).get("labels"))
                  for other in sorted(services) if other != name and other in p.services]
    if companions:
        put("companions", companions, f"the other services of project {p.name} "
            f"({', '.join(c['name'] for c in companions)}): stopped with vllm by a drain, started after it")
    in_labels = sorted(set(_label_secrets(written, d.variables, d.secret_values)) | set(own.secret))
    if in_labels:
        put("secret_variables", in_labels, "the labels of the project's services interpolate them from its .env, "
            "each a value of an env file you marked secret (0600) or under a secret name: masked in every output")
    if out.secret:
        notes.append("the companions hold secrets (" + ", ".join(sorted(out.secrets.keys | {
            k for c in companions for k in c.get("environment", {}) if is_secret(k)})) + "): the node config is "
            "written 0600, and a switch gives each companion its secrets from a 0600 env file, never inlined")
    return out


def _label_secrets(written: dict[str, Any], variables: dict[str, str], secret_values: frozenset[str]) -> list[str]:
    """The variables the services' labels interpolate (a Traefik basic-auth label's `${AUTH_USERS}`)
    whose value is a secret: a value of an env file the operator marked, or under a secret name."""
    named = {m for spec in written.values() for text in label_map((spec or {}).get("labels") or {}).values()
             for m in _VARIABLE.findall(text)}
    return sorted(n for n in named if n in variables and (is_secret(n) or variables[n] in secret_values))


def _project_files(p: discover.LiveProject, services: dict[str, Any], put: Callable[[str, Any, str], None],
                   notes: list[str]) -> None:
    """compose_files and profiles: the files Compose read (its config_files label, in -f order) and
    the profiles of the services it runs (Compose records no profile label: each running
    service's own `profiles:` says which were on)."""
    names = []
    for f in p.config_files:
        if not f.is_relative_to(p.working_dir):
            notes.append(f"compose file {f} is outside {p.working_dir}: adopt keeps the files of the project's folder; "
                         "move it there")
            continue
        names.append(f.relative_to(p.working_dir).as_posix())
    if names and names != [COMPOSE_FILE]:
        put("compose_files", names, f"label {discover.CONFIG_FILES}: the files Compose ran the project from, in order")
    profiles = sorted({str(x) for s in p.services for x in (services.get(s) or {}).get("profiles") or []})
    if profiles != ["gpu"]:
        put("profiles", profiles, "the profiles of the project's running services (" +
            (", ".join(f"{s}: {', '.join((services.get(s) or {}).get('profiles') or [])}" for s in sorted(p.services)
                       if (services.get(s) or {}).get("profiles")) or "none has a profile") + ")")


# The vllm service's keys a switch must keep whatever the stack (init writes them into the node's compose:).
NODE_WIDE = ("networks", "security_opt", "cap_add", "cap_drop", "ipc", "shm_size", "ulimits", "runtime", "devices",
             "group_add", "privileged", "sysctls")


def _device(d: Any) -> Any:
    """A resolved `devices:` entry in the short form the rendered file writes (`host:container`), so
    the same device the platform renders is one entry, not two."""
    if not isinstance(d, dict):
        return d
    short = f"{d.get('source')}:{d.get('target') or d.get('source')}"
    return short if d.get("permissions") in (None, "rwm") else f"{short}:{d['permissions']}"


def _node_wide(name: str, vllm: dict[str, Any], doc: dict[str, Any], project: str,
               put: Callable[[str, Any, str], None], labels: dict[str, str]) -> None:
    """The running service's node-wide keys (NODE_WIDE) and the project's networks, as Compose
    resolved them, and its own labels as written: every switch and rollback renders them again."""
    kept: dict[str, Any] = {"labels": labels} if labels else {}
    for key in NODE_WIDE:
        value = vllm.get(key)
        if value in (None, [], {}, False) or (key == "networks" and value == {"default": None}):
            continue
        kept[key] = [_device(v) for v in value] if key == "devices" else value
    kept = dict(sorted(kept.items()))
    if kept:
        put("compose", kept, f"the node-wide keys of the running service {name} ({', '.join(kept)}): every switch and "
            "rollback keeps them")
    # Compose names every network (`<project>_<key>` unless given a name:); only the default one is its own.
    nets = {k: {kk: vv for kk, vv in v.items() if not (kk == "ipam" and not vv)} if isinstance(v, dict) else v
            for k, v in (doc.get("networks") or {}).items()
            if not (k == "default" and isinstance(v, dict) and v.get("name") == f"{project}_default" and len(v) <= 2
                    and not v.get("ipam"))}
    if nets:
        put("networks", nets, f"the top-level networks of project {project}, each by its name on the engine")


def _platform(d: Discovery, put: Callable[[str, Any, str], None], notes: list[str]) -> None:
    """The node's GPU platform: the running vllm service's own GPU access first (what it was
    given works), else the strongest trace on the host and engine, else cpu."""
    name = _vllm_name(d.chosen, d.service) if d.chosen is not None else VLLM
    svc = ((d.compose or {}).get("services") or {}).get(name) or {}
    given = read_back(svc)
    if given.platform is not None:
        put("platform", given.platform, f"the GPU access of the running service {name}")
        if given.cdi:
            put("nvidia_cdi", True, f"CDI names in the devices of service {name}")
        if given.kfd_device and given.kfd_device != "/dev/kfd":
            put("kfd_device", given.kfd_device, f"devices of service {name}")
        if given.gpus is not None and given.gpus != "all":
            put("gpus", given.gpus, f"the GPU selection of service {name}")
    else:
        chosen = platform.choose(d.signs)
        put("platform", chosen.platform, chosen.source)
    for sign in d.signs:
        notes.append(f"platform {sign.platform}: {sign.source}")


def _api_key(key: str, env_files: list[str], cfg: dict[str, Any], out: InitPlan,
             put: Callable[[str, Any, str], None]) -> None:
    """The running vLLM asks for a key (its --api-key, a `${VAR}` of the project's .env): every stack
    b70deploy renders gets it as VLLM_API_KEY (vLLM reads it when no --api-key is given: build_app,
    vllm/entrypoints/openai/api_server.py at 0001948b) from the node's secrets_env_file, so a switch
    never serves /v1 to anyone. Without an env_file of the service, init writes that file (0600)."""
    if env_files:
        with contextlib.suppress(OSError):
            if API_KEY_ENV in Path(env_files[0]).read_text():
                return
        out.notes.append(f"vLLM asks for an API key: add {API_KEY_ENV}=<the key> to {env_files[0]}, or every stack "
                         "b70deploy renders serves /v1 without one (lint: api-key-unset)")
        return
    path = str(Path(cfg["state_dir"]) / "vllm-secrets.env")
    out.secret_files[path] = f"{API_KEY_ENV}={key}\n"
    put("secrets_env_file", path, f"the key the running vLLM asks /v1 requests for (its {API_KEY_FLAG}), written "
        f"there as {API_KEY_ENV} (0600): every stack b70deploy renders keeps it")


def _models(vllm: dict[str, Any], image: ImageEntrypoint | None, name: str,
            put: Callable[[str, Any, str], None], notes: list[str], volumes: dict[str, Any]) -> None:
    """models_dir and models_target from the bind that holds the model the service serves (at whatever
    target: the report's /llms:/llms), or hf_cache from the bind that holds its hub cache: read the one
    way stack from-compose reads the service, however it starts vLLM."""
    try:
        found = stack_from_compose(vllm, image=image, where=f"service {name}")
    except UserError as e:
        binds = [v for v in vllm.get("volumes") or [] if isinstance(v, dict) and v.get("type") == "bind"]
        at_models = next((b for b in binds if b.get("target") == CONTAINER_MODELS), None)
        if at_models is not None:  # no command to read: the /models bind
            put("models_dir", at_models["source"], f"the bind mount at {CONTAINER_MODELS} of service {name}")
        notes.append(f"service {name} does not map to a stack ({e.what}): models_dir and hf_cache are not read "
                     "from its command")
        return
    model = found.doc["model"]["path"]
    if "models_dir" in found.node:
        where = f"the bind mount of service {name} that holds its model {model}"
        put("models_dir", found.node["models_dir"], where)
        put("models_target", found.node["models_target"], where)
        if "models_read_only" in found.node:  # read-only, as a node that never said it binds it, is not written
            put("models_read_only", False, f"the bind mount of service {name} that holds its model is read-write")
    if "hf_cache" in found.node:
        put("hf_cache", found.node["hf_cache"], f"service {name}: {found.sources['hf_cache']}, for its hub model "
            f"{model}")
        if "hf_cache_target" in found.node:
            put("hf_cache_target", found.node["hf_cache_target"], f"where service {name} has it in its container")
        if "hf_hub_folder" in found.node:
            put("hf_hub_folder", found.node["hf_hub_folder"], f"service {name}'s hub folder below it "
                f"({found.sources['hf_cache']})")
    if "hf_cache_volume" in found.node:
        key = found.node["hf_cache_volume"]
        put("hf_cache_volume", (volumes.get(key) or {}).get("name") or key,
            f"service {name}: {found.sources['hf_cache_volume']}, for its hub model {model} (the engine's name)")
        if "hf_cache_target" in found.node:
            put("hf_cache_target", found.node["hf_cache_target"], f"where service {name} has it in its container")
    if not ({"models_dir", "hf_cache", "hf_cache_volume"} & set(found.node)):
        notes.append(f"the model of service {name} ({model}) is in no bind mount: models_dir and hf_cache keep "
                     "their defaults")


# What a switch renders for a companion; any other key of the hand-made service is named in a note.
_COMPANION_KEYS = frozenset({"image", "command", "ports", "environment", "volumes", "container_name", "profiles",
                             "restart", "labels", "env_file"})


def _env_map(environment: dict[str, Any] | list[Any]) -> dict[str, Any]:
    """A service's environment as a mapping: without interpolation Compose keeps the list form
    (`- 'KEY=VALUE'`, louislepage's) as written; a bare `KEY` takes the shell's value (None here)."""
    if isinstance(environment, dict):
        return environment
    return {k: (v if eq else None) for k, eq, v in (str(item).partition("=") for item in environment)}


def _companion_of(name: str, spec: dict[str, Any], doc: dict[str, Any], notes: list[str],
                  written: dict[str, Any] | list[Any] | None = None,
                  secret_values: frozenset[str] = frozenset(),
                  variables: dict[str, str] | None = None, labels: Any = None) -> dict[str, Any]:
    """A companion as the node config keeps it: image, command, port, environment as written
    (`written`: ${VAR} references kept, with the values those variables had; else as resolved, a
    literal `$` as Compose's `$$`), its data volumes (a named volume by the engine's own name, so
    the switch mounts the same data) and container_name."""
    comp: dict[str, Any] = {"name": name, "image": spec.get("image")}
    if spec.get("command"):
        comp["command"] = [str(a) for a in spec["command"]]
    got = _port(spec)
    if got is not None:
        comp["port"], comp["container_port"] = got[0], got[1]
    resolved = {str(k): "" if v is None else str(v) for k, v in (spec.get("environment") or {}).items()}
    env = {k: v.replace("$", "$$") for k, v in resolved.items()}
    if written is not None:
        # As written; what Compose read from an env_file is only in the resolved config: as it read it.
        env = {**env, **{str(k): "" if v is None else str(v) for k, v in _env_map(written).items()}}
    if env:
        comp["environment"] = env
    own = _labels_of(name, labels, variables or {})
    named = sorted({m for v in env.values() for m in _VARIABLE.findall(v)})
    given = {k: (variables or {})[k] for k in named if k in (variables or {})} | own.variables
    if given:
        comp["variables"] = given
    # A value holding a secret in clear (a reference says where one is, and stays as written), or a
    # variable's: from an env file or .env the operator marked secret, under a name that does not say so.
    marked = sorted({k for k, v in env.items() if k not in named and not is_secret(k) and not is_reference(v)
                     and any(s in resolved.get(k, "") for s in secret_values)}
                    | {k for k, v in given.items() if not is_secret(k) and v in secret_values} | set(own.secret))
    if marked:
        comp["secrets"] = marked
    volumes = []
    for v in spec.get("volumes") or []:
        if not isinstance(v, dict) or not v.get("target"):
            continue
        if v.get("type") == "volume" and v.get("source"):
            # Compose prefixes a volume with the project unless it is given a name: the engine's name it is.
            source = ((doc.get("volumes") or {}).get(v["source"]) or {}).get("name") or v["source"]
        elif v.get("type") == "bind" and str(v.get("source", "")).startswith("/"):
            source = v["source"]
        else:
            notes.append(f"companion {name}: the {v.get('type')} mount at {v['target']} is not carried over")
            continue
        volumes.append({"source": str(source), "target": str(v["target"]), "read_only": bool(v.get("read_only"))})
    if volumes:
        comp["volumes"] = volumes
    if spec.get("container_name"):
        comp["container_name"] = str(spec["container_name"])
    # Every other key as Compose resolved it (depends_on the vllm service's healthcheck, networks,
    # security_opt...), through the companion's compose: passthrough; the default network is every render's.
    carried = {k: v for k, v in sorted(spec.items()) if k not in _COMPANION_KEYS and v not in (None, [], {})
               and not (k == "networks" and v == {"default": None})}
    if own.labels:  # as written (a Traefik router's): a switch renders them beside b70deploy's own
        carried = dict(sorted({**carried, "labels": own.labels}.items()))
    if carried:
        comp["compose"] = carried
    return comp


@dataclass
class Init:
    target: Path
    project: str | None = None
    state_dir: Path | None = None
    device_dir: Path | None = None   # None: the running service's device map, else /dev/dri
    service: str | None = None       # the vLLM service, where the project runs several

    to_stdout: bool = False   # --print: nothing is written, so an existing file is no obstacle

    def plan(self) -> InitPlan:
        self._refuse_existing()  # before asking the engine anything
        result = plan(gather(self.project, self.device_dir, self.service), self.state_dir)
        validate(NodeConfig, result.config, where=f"{self.target} (as init would write it)")
        return result

    def run(self, result: InitPlan) -> Path:
        """Write the config; an existing file is never replaced."""
        self._refuse_existing()
        for path, text in result.secret_files.items():
            if not Path(path).exists():  # an earlier init's: the operator's file now
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                write_atomic(Path(path), text.encode(), mode=0o600)
        write_atomic(self.target, result.text().encode(), mode=0o600 if result.secret else 0o644)
        return self.target

    def _refuse_existing(self) -> None:
        if not self.to_stdout and self.target.exists():
            raise UserError(f"{self.target} exists: init never overwrites a node config",
                            fix="move it away first, pass --config ANOTHER_PATH, or use --print")
