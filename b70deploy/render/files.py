"""Render a stack for a node into the files Compose reads (pure: returns bytes).

Same inputs, same bytes: nothing here reads the clock or the environment.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..config.hub import HUB_CACHE_VARIABLES, HUB_FOLDER
from ..config.node import Node
from ..config.resources import data_dir
from ..config.schema import Stack
from ..errors import UserError
from ..state import caches
from ..state.fsio import file_mode
from . import door as door_config
from . import standby
from .devices import DeviceAccess
from .filenames import COMPANION_SECRETS_SUFFIX, COMPANIONS_DIR
from .filenames import COMPOSE_FILE as COMPOSE_FILE  # re-exported: the deploy-dir names, imported from here
from .filenames import DOTENV_FILE as DOTENV_FILE
from .filenames import RUNTIME_ENV_FILE as RUNTIME_ENV_FILE
from .gpu import GpuAccess, from_device_access
from .masking import NONE, Secrets, secret_variables
from .passthrough import merge as merge_passthrough
from .vllm_args import (
    MODEL_REF,
    container_command,
    model_argument,
)

if TYPE_CHECKING:
    import jinja2


@dataclass(frozen=True)
class Mount:
    """A path bind-mounted read-only into the vllm container: a patched file of ours, or a
    host path the stack names (`mounts:`)."""

    source: str  # relative to the deploy dir (patches/marlin_utils.py), or an absolute host path
    target: str  # absolute path inside the container
    read_only: bool = True  # a stack's mount the operator had read-write stays so


@dataclass(frozen=True)
class Rendered:
    stack: str
    files: dict[str, bytes]
    command: list[str]
    notes: tuple[str, ...] = ()
    interpolation: dict[str, str] = field(default_factory=dict)
    secret_keys: frozenset[str] = frozenset()  # keys from the node's secrets file: never printed
    secrets: Secrets = NONE                    # every secret key and value the files hold

    def mode(self, name: str) -> int:
        return file_mode(name)

    def masked(self, name: str) -> str:
        """A file's text fit to print: secret values replaced."""
        return self.secrets.text(self.files[name].decode())


def companion_env_file(name: str) -> str:
    """The 0600 env file (state.fsio.file_mode: `*.env`) a companion reads its secrets from."""
    return f"{name}{COMPANION_SECRETS_SUFFIX}"




# JSON leaves these raw, but YAML refuses them (U+FFFE/U+FFFF, DEL, C1 controls: Compose will
# not parse the file) or folds them as line breaks (NEL, U+2028/9): write them as escapes.
_NON_YAML = str.maketrans({chr(c): f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0), 0x2028, 0x2029, 0xFFFE, 0xFFFF)})


def _q(value: object) -> str:
    """A YAML scalar that cannot inject keys: JSON strings are valid YAML flow scalars."""
    return json.dumps(str(value), ensure_ascii=False).translate(_NON_YAML)


def _q_interp(value: object) -> str:
    """Like _q, but a literal `$` is escaped for Compose; our own ${VLLM_MODEL} is kept."""
    text = str(value)
    return _q(text if text == MODEL_REF else text.replace("$", "$$"))


def _env_q(value: object) -> str:
    text = str(value)
    if "\n" in text or "\r" in text or "\x00" in text:
        raise UserError("an environment value contains a newline", fix="env values are single lines")
    if "'" not in text:
        return f"'{text}'"  # single quotes: literal, no interpolation in Compose's parser
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


@functools.cache  # one per process: jinja2 compiles each template once per Environment
def _environment() -> jinja2.Environment:
    import jinja2  # here, not at the top: `status` and `diff` read this module's file names, not templates

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        bytecode_cache=_bytecode_cache(),
    )
    env.filters["q"] = _q
    env.filters["q_interp"] = _q_interp
    env.filters["env_q"] = _env_q
    return env


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """The templates as an earlier run compiled them, in jinja2's folder for this user (in the
    temp dir; jinja2 refuses one another user owns or can read, and checks each file against
    its template's source): a render then skips jinja2's lexer and compiler (~15 ms of every
    switch). A folder it cannot use, or a file it cannot write, means compiling as before."""
    import jinja2

    class Kept(jinja2.FileSystemBytecodeCache):
        def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            with contextlib.suppress(OSError):
                super().load_bytecode(bucket)

        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            with contextlib.suppress(OSError):  # a full disk, a temp dir cleaned meanwhile
                super().dump_bytecode(bucket)

    try:
        return Kept()
    except (OSError, RuntimeError):  # jinja2 could not make the folder, or found it unsafe
        return None


LOOPBACK = "127.0.0.1"


def expose_only(stack: Stack) -> bool:
    """A stack whose port a proxy on the project network reaches (compose: expose): published for
    b70deploy's own probes (/health, smoke) on loopback only, never on the node's bind_address."""
    return bool(stack.compose.get("expose"))


def interpolation_values(stack: Stack, node: Node, *, port: int, image: str | None = None,
                         image_name: str | None = None, door: bool = False, host_door: bool = False) -> dict[str, str]:
    values = {
        # What Compose runs and `docker ps` shows: the tool's keep tag of the pinned image (docker/keep.py,
        # checked against VLLM_IMAGE_ID before every compose up), else the id, else the stack's reference.
        "VLLM_IMAGE": image_name or image or stack.image,
        "VLLM_IMAGE_REF": stack.image,           # the reference it came from (not used by Compose)
        "VLLM_MODEL": model_argument(stack, node.config.models_target),
        "VLLM_PORT": str(port),
        "VLLM_BIND_ADDRESS": LOOPBACK if expose_only(stack) else node.config.bind_address,
        "MODELS_DIR": str(node.models_dir),
    }
    if image and image_name:  # the exact image a revision runs, whatever its name names now (not used by Compose)
        values["VLLM_IMAGE_ID"] = image
    if door:  # the door has the node's port; vllm keeps one on loopback for the tool's probes
        values |= door_config.interpolation(node.config.door, port=port, bind_address=node.config.bind_address,
                                            project=node.project, host=host_door)
    cache = caches.folder_for(node.cache_dir, image) if image else None
    if cache is not None:  # only a pinned image id has caches: a tag can move to another image
        values["CACHE_DIR"] = str(cache)
    return values


def runtime_values(stack: Stack, secrets: Mapping[str, str]) -> dict[str, str]:
    values = dict(stack.env)
    values.update(secrets)
    return dict(sorted(values.items()))


def _hub_cache(stack: Stack, node: Node) -> dict[str, object]:
    """A hub model's cache: the node's hf_cache bound at hf_cache_target (read-write: the hub client
    writes its locks and refs there), or its named volume hf_cache_volume mounted there, which HF_HOME
    names (HF_HUB_CACHE, the hub folder itself, when the node's hf_hub_folder is not HF_HOME's `hub`)
    unless the stack's env already names the cache its own way (HF_HOME, HF_HUB_CACHE: the operator's
    variable, kept as written). Without either vLLM downloads at every boot."""
    cfg = node.config
    if not stack.model.hub or not (cfg.hf_cache or cfg.hf_cache_volume):
        return {}
    target, folder = cfg.hf_cache_target, cfg.hf_hub_folder
    named = any(k in stack.env for k in HUB_CACHE_VARIABLES)
    variable = {"HF_HOME": target} if folder == HUB_FOLDER else \
        {"HF_HUB_CACHE": target if folder == "." else f"{target}/{folder}"}
    mount = {"type": "volume", "source": cfg.hf_cache_volume} if cfg.hf_cache_volume else \
        {"type": "bind", "source": cfg.hf_cache, "bind": {"create_host_path": False}}
    return {"volumes": [{**mount, "target": target}],
            **({} if named else {"environment": variable})}


def _entrypoint(stack: Stack) -> list[str] | None:
    """What runs the command under an ENTRYPOINT [vllm, serve] image when the stack's program is
    not `vllm serve`: the shell of a script (bash runs a prelude), or the launcher itself."""
    if stack.entrypoint_style != "vllm-serve":
        return None
    if stack.prelude or stack.shell:
        return stack.shell or ["/bin/bash", "-c"]
    return list(stack.launcher) if stack.launcher else None


def render(stack: Stack, node: Node, devices: GpuAccess | DeviceAccess, *, secrets: Mapping[str, str] | None = None,
           mounts: tuple[Mount, ...] = (), patch_files: Mapping[str, bytes] | None = None,
           draft_path: str | None = None, port: int | None = None, project: str | None = None,
           image: str | None = None, image_name: str | None = None, vllm_version: str | None = None) -> Rendered:
    """Render `stack` for `node`: every file a deployment writes, the patched files (`patch_files`,
    bind-mounted by `mounts`: render/patches.py) beside the compose and env files. The one
    producer of a deploy dir's bytes. `port`/`project` default to production's. `image` pins an image
    id, `image_name` is the name .env gives it (the keep tag). `devices` is the
    node's GPU access (render/gpu.py); a bare /dev/dri scan renders as XPU. `vllm_version` is the
    image's, when known: whether a stack with standby can sleep on this platform (render/standby.py)."""
    access = devices if isinstance(devices, GpuAccess) else \
        from_device_access(devices, stack.gpus if stack.gpus is not None else node.config.gpus)
    sleep = standby.sleeps(stack, node, vllm_version)
    sleep_note = standby.cannot_sleep_note(stack, node, vllm_version)
    if sleep and standby.SLEEP_FLAG not in stack.extra_args:
        stack = stack.model_copy(update={"extra_args": [*stack.extra_args, standby.SLEEP_FLAG]})
    env = _environment()
    port = node.config.ports.prod if port is None else port
    # A prelude's bash -c script is one argument, escaped whole for Compose: it names the model itself.
    model = model_argument(stack, node.config.models_target) if stack.prelude or stack.shell else MODEL_REF
    command = container_command(stack, model=model, draft_path=draft_path, root=node.config.models_target)
    with_door = node.config.door.enabled and project in (None, node.project)  # never a dark stack's
    # The door on the host's network, unless this vLLM sleeps: then it runs in standby slots, which take the
    # service's name on the project network in turn, and the door dials that name (render/door.py).
    host_door = with_door and not any(standby.SLEEP_FLAG in arg for arg in command)
    interp = interpolation_values(stack, node, port=port, image=image, image_name=image_name, door=with_door,
                                  host_door=host_door)
    warm = "CACHE_DIR" in interp
    # The operator's variables the vllm service's labels or a companion's environment or labels name
    # (`${API_USERS}`, `${DB_PASSWORD}`), in the .env (0600)
    # so those references resolve after a switch as they did by hand; the tool's own keys win.
    for variables in (node.config.variables, *(c.variables for c in node.config.companions)):
        interp.update({k: v for k, v in variables.items() if k not in interp})
    # A companion's secrets (render/masking.secret_variables, with the node's secrets file's values).
    hidden = {c.name: secret_variables(c.environment, c.secrets, (secrets or {}).values())
              for c in node.config.companions}
    compose = env.get_template("docker-compose.yml.j2").render(
        stack=stack,
        project=project or node.project,
        service=node.service,
        command=command,
        entrypoint=_entrypoint(stack),
        container_port=stack.container_port,
        runtime_env_name=RUNTIME_ENV_FILE,
        models_target=node.config.models_target,
        models_read_only=node.config.models_read_only if stack.models_read_only is None else stack.models_read_only,
        # A hub model is in the hub cache (_hub_cache); the models folder only for its draft, if any.
        models_bind=not stack.model.hub or bool(stack.speculative and stack.speculative.model),
        mounts=(*mounts, *(Mount(m.source, m.target, m.read_only) for m in stack.mounts),
                *(Mount(b, b) for b in access.binds)),
        devices=access.devices,
        group_add=access.group_add,
        cap_add=access.cap_add,
        security_opt=access.security_opt,
        requests=access.requests,
        platform=access.platform,
        shm_size=node.config.shm_size,
        companions=node.config.companions,
        companion_secrets={c.name: companion_env_file(c.name) if hidden[c.name] else None
                           for c in node.config.companions},
        companion_secret_keys={c.name: frozenset(hidden[c.name]) for c in node.config.companions},
        volumes=sorted({v.source for c in node.config.companions for v in c.volumes if not v.is_bind}
                       | ({node.config.hf_cache_volume} if node.config.hf_cache_volume and stack.model.hub else set())),
        bind_address=node.config.bind_address,
        cache_target=caches.CONTAINER_ROOT if warm else None,
        environment={**(caches.container_env(access.platform) if warm else {}), **access.environment,
                     **(standby.DEV_MODE if sleep else {})},
        door=door_config.service(node.config.door, host=host_door) if with_door else None,
    )
    compose, _ = merge_passthrough(compose, _hub_cache(stack, node), service=node.service,
                                   where=f"node config {node.source}: hf_cache")
    dark = project is not None and project != node.project
    # The node's own settings of the service (the hand-made deployment's security_opt, devices,
    # group_add...) first: every stack has them; a stack's compose: keys go on top.
    compose, merged = merge_passthrough(compose, node.config.compose, service=node.service, dark=dark,
                                        where=f"node config {node.source}: compose")
    networks = dict(node.config.networks)
    if host_door:  # the host door's network to vllm (render/door.py)
        networks[door_config.DOOR_NETWORK] = {"ipam": {"config": [{"subnet": "${DOOR_SUBNET:?}"}]}}
    compose, said = merge_passthrough(compose, stack.compose, service=node.service, networks=networks,
                                      dark=dark, where=f"stack {stack.name}: compose")
    merged += [note for note in said if note not in merged]
    for c in node.config.companions:
        compose, said = merge_passthrough(compose, c.compose, service=c.name, dark=dark,
                                          where=f"node config {node.source}: companions.{c.name}.compose")
        merged += [note for note in said if note not in merged]
    dotenv = env.get_template("env.j2").render(values=list(interp.items()))
    runtime = env.get_template("runtime.env.j2").render(values=list(runtime_values(stack, secrets or {}).items()))
    notes = list(access.notes) + merged
    if expose_only(stack):
        notes.append(f"expose-only: port {port} is published on {LOOPBACK} for b70deploy's probes; the project "
                     f"network reaches {node.service}:{stack.container_port}")
    if warm:
        notes.append(f"warm boots: compile and kernel caches of this image id in {interp['CACHE_DIR']}")
    if access.group_add:
        notes.append("group_add: numeric gids " + ", ".join(
            f"{name}={gid}" for name, gid in sorted(access.gids.items(), key=lambda kv: kv[1])))
    if sleep_note:
        notes.append(sleep_note)
    secret_keys = sorted(secrets or {})
    if secret_keys:
        notes.append(f"secrets from the node's env file go only into {RUNTIME_ENV_FILE} (0600): "
                     + ", ".join(secret_keys))
    companion_files = {}
    for name, values in hidden.items():
        if values:
            companion_files[companion_env_file(name)] = env.get_template("companion.env.j2").render(
                name=name, values=sorted(values.items())).encode()
            notes.append(f"secrets of companion {name} go only into {companion_env_file(name)} (0600): "
                         + ", ".join(sorted(values)))
    hidden_values = {v for values in hidden.values() for v in values.values()} | {
        v for c in node.config.companions for v in secret_variables(c.variables, c.secrets).values()} | set(
        secret_variables(node.config.variables, node.config.secret_variables).values())
    return Rendered(
        stack=stack.name,
        files={COMPOSE_FILE: compose.encode(), DOTENV_FILE: dotenv.encode(), RUNTIME_ENV_FILE: runtime.encode(),
               **companion_files, **(patch_files or {}),
               **{f"{COMPANIONS_DIR}/{name}": text.encode() for name, text in stack.companion_files.items()}},
        command=command,
        notes=tuple(notes),
        interpolation=interp,
        secret_keys=frozenset(secret_keys),
        secrets=Secrets(keys=frozenset(secret_keys) | {k for c in node.config.companions for k in c.secrets}
                        | frozenset(node.config.secret_variables),
                        values=frozenset((secrets or {}).values()) | hidden_values),
    )
