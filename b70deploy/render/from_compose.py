"""A hand-made Compose service back into a stack document: the inverse of render (pure).

`stack_from_compose` takes one service as `docker compose config --format json` prints it
(variables interpolated, `env_file:` contents merged into `environment`, relative paths made
absolute, a literal `$` written `$$`) and the entrypoint facts of its image, and returns the
stack document whose render gives the same effective `vllm serve` command and environment.
The flags are read through render/vllm_args.FLAGS, the same table that renders them; what
the stack cannot say is kept verbatim (`extra_args`) or reported in `notes`, never dropped
silently. Facts that belong to the node config (models dir, ports, gids) come back in `node`.
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from ..config.compose_keys import OWNED, TOOL_LABELS, label_map
from ..config.hub import CONTAINER_HF_HOME, HUB_FOLDER, HUB_ID_RE
from ..config.schema import ABS_PATH_RE, ENV_KEY_RE, IMAGE_RE, Speculative, Stack
from ..config.validation import first_error, value_error
from ..errors import UserError
from ..state import caches
from . import gpu
from .draft import copy_origin
from .masking import NONE, Secrets, is_secret
from .vllm_args import (
    API_KEY_ENV,
    API_KEY_FLAG,
    CONTAINER_PORT,
    FLAGS,
    SPEC_FLAG,
    UNSAID,
    ParsedServe,
    entrypoint_style,
    flag_name,
    model_rel_path,
    parse_serve_args,
    shell_of,
    split_launcher,
    split_prelude,
)

SERVE = ["vllm", "serve"]
# Service keys the stack or the node config account for (or that b70deploy renders itself);
# any other is carried in the stack's compose: passthrough, or named in the notes.
_HANDLED = frozenset({"image", "command", "entrypoint", "environment", "volumes", "ports", "shm_size", "profiles",
                      "restart", "labels", "env_file"})
# The keys that give the container its GPU: read by gpu_access.
GPU_KEYS = frozenset({"devices", "group_add", "deploy", "gpus", "runtime"})


class ImageEntrypoint(Protocol):
    """What the mapping needs from image_inspect.ImageFacts."""

    ref: str
    id: str
    entrypoint_style: str


@dataclass
class FromCompose:
    doc: dict[str, Any]                                  # a valid stack document, without `name`
    sources: dict[str, str] = field(default_factory=dict)  # stack key -> where its value came from
    node: dict[str, Any] = field(default_factory=dict)   # node config values the service implies
    withheld: list[str] = field(default_factory=list)    # secret env keys left out of the stack
    weights_at: set[str] = field(default_factory=set)    # container targets of the binds holding weights
    notes: list[str] = field(default_factory=list)


def _unescape(value: Any) -> Any:
    """`docker compose config` writes a literal `$` as `$$`; the container sees one."""
    return value.replace("$$", "$") if isinstance(value, str) else value


def _argv(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [_unescape(value)]
    return [str(_unescape(v)) for v in value]


def _style(service: Mapping[str, Any], image: ImageEntrypoint | None, command: list[str],
           out: FromCompose, *, taken: bool = False) -> str:
    """The entrypoint style the stack renders for: what will really run its command. `taken`: the
    compose file's entrypoint is part of the program read (a launcher, a shell script), which the
    stack renders as the entrypoint under an ENTRYPOINT [vllm, serve] or unknown image."""
    own = _argv(service.get("entrypoint"))
    own_style = entrypoint_style(own) if own and not taken else None
    if image is not None and image.entrypoint_style != "other":
        out.sources["entrypoint_style"] = f"image {image.ref} ({image.id.removeprefix('sha256:')[:12]})"
        if own_style is not None and own_style != image.entrypoint_style:
            out.notes.append(f"the compose file overrides the image's entrypoint ({own_style}); a stack renders "
                             f"none, so the image's own ({image.entrypoint_style}) runs the command")
        elif taken and image.entrypoint_style == "bash-c":
            out.notes.append("the compose file's entrypoint starts vLLM; the stack runs it as the command, through "
                             "the image's own bash -c entrypoint")
        return image.entrypoint_style
    if taken:
        out.sources["entrypoint_style"] = "the launcher or shell that starts vLLM (rendered as the entrypoint)"
        return "vllm-serve"
    if own_style in ("bash-c", "vllm-serve"):
        absent = "image not on this engine" if image is None else f"image {image.ref} has no known entrypoint"
        out.sources["entrypoint_style"] = f"the compose file's entrypoint ({absent})"
        return own_style
    style = "bash-c" if command[:2] == SERVE else "vllm-serve"
    out.sources["entrypoint_style"] = ("the command's shape (it " + ("names `vllm serve`" if style == "bash-c"
                                       else "starts with the model") + "; no entrypoint known)")
    return style


def _program(service: Mapping[str, Any], image: ImageEntrypoint | None, where: str) -> tuple[list[str], bool]:
    """The argv that starts vLLM as far as the stack must say it, and whether the compose file's
    (or the image's) entrypoint is part of it: a `python -m vllm.entrypoints.openai.api_server`
    launcher, a `bash -lc SCRIPT` entrypoint. An entrypoint or command that is a script of its own
    (flags built from environment variables) cannot be read, so it is refused, never dropped."""
    own = _argv(service.get("entrypoint"))
    # No command: the image's CMD, unless the service sets its own entrypoint (which drops it).
    command = _argv(service.get("command")) or ([] if own else list(getattr(image, "cmd", None) or []))
    fix = ("write the `vllm serve` command the script runs into command: and drop entrypoint:, or keep the file's "
           "bytes as they are: b70deploy import FILE")
    if own and entrypoint_style(own) == "other":
        launcher = split_launcher(own)[0]
        if launcher is not None and len(own) == len(launcher):
            return [*own, *command], True
        if shell_of(own) is not None and len(own) + len(command) == 3:
            return [*own, *command], True  # bash -c SCRIPT, the script in entrypoint: or in command:
        raise UserError(f"the entrypoint {shlex.join(own)} starts vLLM its own way (a script b70deploy cannot read)",
                        where=f"{where}.entrypoint", fix=fix)
    if own and entrypoint_style(own) == "vllm-serve" and len(own) > 2:
        return [*own, *command], True  # the model and flags in entrypoint: itself (naptha-node's model files)
    facts_ep = list(getattr(image, "entrypoint", None) or [])
    if not own and len(split_launcher(facts_ep)[0] or []) == len(facts_ep) > 0 and split_launcher(command)[0] \
            is None and shell_of(command) is None:
        return [*facts_ep, *command], True  # an image whose ENTRYPOINT is the launcher: the flags after it
    head = command[0] if command else ""
    if head.endswith(".sh") or (shell_of(command) is None and posixpath.basename(head) in ("bash", "sh")):
        raise UserError(f"the command runs the script {shlex.join(command[:2])}, which b70deploy cannot read",
                        where=f"{where}.command", fix=fix)
    return command, False


def _set(doc: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    for part in parts[:-1]:
        doc = doc.setdefault(part, {})
    doc[parts[-1]] = value


def _binds(service: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [v for v in service.get("volumes") or [] if isinstance(v, dict) and v.get("type") == "bind"]


def _holder(path: str, binds: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The bind mount whose target holds `path` (the deepest, when binds nest)."""
    holders = [b for b in binds if path == b.get("target") or path.startswith(f"{str(b.get('target')).rstrip('/')}/")]
    return max(holders, key=lambda b: len(str(b.get("target")))) if holders else None


def weights_bind(path: str, binds: Sequence[Mapping[str, Any]]) -> tuple[str, str, str] | None:
    """(host folder, its container path, the model's path below it) for a model served from a bind
    mount at any target (the report's /llms:/llms, not /models), None outside every bind. Below
    the bind, a model in Hugging Face's `org/name` layout (huggingface/Qwen/Qwen3-30B-A3B-W4A16)
    has the folder above `org/name` as its models folder, so the catalogue's `Qwen/...` paths
    resolve there too."""
    holder = _holder(path, binds)
    if holder is None:
        return None
    target, source = str(holder["target"]).rstrip("/"), str(holder.get("source") or "").rstrip("/")
    parts = [p for p in path[len(target):].split("/") if p]
    if not parts:
        return None
    base = "/".join(parts[:-2]) if len(parts) > 2 else ""
    return (f"{source}/{base}" if base else source, f"{target}/{base}" if base else target,
            "/".join(parts[-2:] if base else parts))


def _in_container(path: str, binds: Sequence[Mapping[str, Any]], what: str, where: str,
                  out: FromCompose) -> str:
    """A container path as a path below the node's models_dir (the bind that holds it)."""
    found = weights_bind(path, binds)
    if found is None:
        rel = model_rel_path(path)
        if rel is None:
            raise UserError(f"{what} {path!r} is not inside a bind-mounted folder", where=where,
                            fix="bind-mount the weights folder (e.g. /srv/models:/models) and name the model by its "
                                "path in the container")
        return rel
    host, inside, rel = found
    if out.node.setdefault("models_dir", host) != host:
        raise UserError(f"the {what} is in {host}, the model in {out.node['models_dir']}",
                        where=where, fix="put the model and its draft under one host folder (the models_dir)")
    out.node["models_target"] = inside
    holder = _holder(path, binds) or {}
    if not holder.get("read_only"):  # the operator's read-write weights bind (OPEA's ./data:/data) stays so
        out.node["models_read_only"] = False
    out.weights_at.add(str(holder.get("target")))
    return rel


def _speculative(text: str, binds: Sequence[Mapping[str, Any]], where: str, out: FromCompose) -> dict[str, Any]:
    conf = json.loads(text)
    if not isinstance(conf, dict):
        raise ValueError("not a JSON object")
    known = set(Speculative.model_fields) - {"tuning", "draft_max_position_embeddings"}
    spec: dict[str, Any] = {k: v for k, v in conf.items() if k in known}
    tuning = {k: v for k, v in conf.items() if k not in known}
    if any(isinstance(v, (dict, list)) or v is None for v in tuning.values()):
        raise ValueError("a nested value")
    if tuning:
        spec["tuning"] = tuning
    if isinstance(spec.get("model"), str):
        rel = _in_container(spec["model"], binds, "draft model", where, out)
        origin = copy_origin(rel)  # b70deploy's own draft copy: the original and the raised length
        if origin is not None:
            spec["model"], spec["draft_max_position_embeddings"] = origin
        else:
            spec["model"] = rel
    return spec


# Of config/hub.py's HUB_CACHE_VARIABLES, these two name the hub folder itself (HF_HOME the folder
# above it); none set is root's ~/.cache/huggingface.
HUB_CACHE_VARS = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")
# A name operators write (after HUGGING_FACE_HUB_TOKEN, which the hub client does read) that it never reads.
UNREAD_CACHE_VAR = "HUGGING_FACE_HUB_CACHE"


def hub_folder(environment: Mapping[str, Any]) -> tuple[str, str]:
    """(the container path of the hub folder, the variable that put it there)."""
    for var in HUB_CACHE_VARS:
        if environment.get(var):
            return str(environment[var]).rstrip("/"), var
    home = str(environment.get("HF_HOME") or CONTAINER_HF_HOME).rstrip("/")
    return f"{home}/hub", "HF_HOME" if environment.get("HF_HOME") else "the hub client's default for root"


def _hub_cache(service: Mapping[str, Any], where: str, out: FromCompose) -> None:
    """The host folder of a hub model's cache: the bind that holds the container's hub folder (named
    by HF_HUB_CACHE or HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else the hub client's default for
    root). Its HF_HOME on the host becomes the node's hf_cache, which render binds as the
    container's HF_HOME; a hub folder of another name (HF_HUB_CACHE=/cache/models) keeps the bind
    that holds it as hf_cache and its path below it as hf_hub_folder. A named volume that is HF_HOME
    becomes hf_cache_volume (mounted as it was); one elsewhere is refused."""
    hub, named_by = hub_folder(service.get("environment") or {})
    if (service.get("environment") or {}).get(UNREAD_CACHE_VAR):
        out.notes.append(f"{UNREAD_CACHE_VAR} is not a variable the hub client reads (its legacy one is "
                         f"HUGGINGFACE_HUB_CACHE): vLLM finds the cache at {hub} ({named_by})")
    for v in service.get("volumes") or []:
        target = str(v.get("target") or "").rstrip("/") if isinstance(v, dict) else ""
        if not target or not (hub == target or hub.startswith(f"{target}/")):
            continue
        if v.get("type") == "volume" and v.get("source") and target == posixpath.dirname(hub):
            # A named volume that is HF_HOME: mounted as it was (the node's hf_cache_volume, its engine name).
            out.node["hf_cache_volume"] = str(v["source"])
            if target != CONTAINER_HF_HOME:
                out.node["hf_cache_target"] = target
            out.sources["hf_cache_volume"] = f"the named volume at {target} that holds the hub cache {hub} ({named_by})"
            out.weights_at.add(str(v.get("target")))
            return
        if v.get("type") != "bind":
            raise UserError(f"the Hugging Face cache at {target} is the {v.get('type')} {v.get('source')!r}",
                            where=f"{where}.volumes",
                            fix="bind a host folder there, or mount a named volume at its HF_HOME "
                                f"({posixpath.dirname(hub)}): b70deploy mounts the node's hf_cache or hf_cache_volume")
        source = str(v.get("source")).rstrip("/")
        host_hub = f"{source}{hub[len(target):]}"
        out.sources["hf_cache"] = f"the bind at {target} that holds the hub cache {hub} ({named_by})"
        out.weights_at.add(str(v.get("target")))
        if posixpath.basename(host_hub) != HUB_FOLDER:
            # HF_HUB_CACHE names the hub folder whatever its name (config/hub.py): the bind as written,
            # and the hub folder's path below it.
            out.node["hf_cache"], out.node["hf_hub_folder"] = source, posixpath.relpath(hub, target)
            if target != CONTAINER_HF_HOME:
                out.node["hf_cache_target"] = target
            return
        out.node["hf_cache"] = posixpath.dirname(host_hub)
        if posixpath.dirname(hub) != CONTAINER_HF_HOME:
            out.node["hf_cache_target"] = posixpath.dirname(hub)  # bound where the operator had it
        if target != posixpath.dirname(hub):
            out.notes.append(f"the bind at {target} holds more than the hub cache: a stack binds only its HF_HOME "
                             f"({posixpath.dirname(hub)}, from {out.node['hf_cache']})")
        return
    out.notes.append(f"no volume holds the hub cache ({hub}, {named_by}): vLLM downloads the model at every boot; "
                     "set the node's hf_cache to a host folder that holds it")


def _flag_tokens(key: str, raw: Mapping[str, list[str]]) -> list[str]:
    """The tokens as written for every flag that feeds the top-level stack key `key`."""
    return [t for f in FLAGS if f.key.split(".")[0] == key for t in raw.get(f.key, [])]


def stack_from_compose(service: Mapping[str, Any], *, image: ImageEntrypoint | None = None,
                       where: str = "compose file", networks: Mapping[str, Any] | None = None,
                       secrets: Secrets = NONE) -> FromCompose:
    """The stack document for one resolved compose service (see the module docstring).

    `image`: the entrypoint facts of the service's image, None when the engine does not have it
    (the compose file's own entrypoint, else the command's shape, decides). `where` names the
    service in errors (e.g. "docker-compose.yml: services.vllm"). Raises UserError when the
    service cannot be a stack (no image, no model, a model outside any bind mount, a secret
    on the command line, values that make no valid stack). `networks`: the file's top-level networks
    (the definitions of those the service joins become the node's networks:). `secrets`: what else
    is secret (the node's, and the values env files mark): such variables are left out as well.
    """
    ref = str(service.get("image") or "")
    if not IMAGE_RE.match(ref):
        raise UserError(f"image {ref!r} is not an image reference" if ref else "the service has no image",
                        where=where, fix="give the service an image: such as intel/vllm:latest")
    out = FromCompose(doc={"image": ref})
    parsed = parse_serve_args(_serve_args(service, image, where, out))
    out.notes += parsed.notes
    binds = _binds(service)
    _required(service, parsed, binds, where, out)
    extra = _flags(parsed, binds, where, out)
    if extra:
        out.doc["extra_args"] = extra
    _environment(service, out, secrets)
    _mounts(service, out)
    _node_facts(service, parsed.fixed.get("--port", str(CONTAINER_PORT)), out)
    _passthrough(service, networks or {}, out)
    try:
        Stack.model_validate({"name": "from-compose", **out.doc})
    except ValidationError as exc:
        key, what, fix = first_error(exc, Stack)
        raise UserError(f"the command gives a stack that does not validate: {key}: {what}", where=where,
                        fix=fix) from None
    return out


def _serve_args(service: Mapping[str, Any], image: ImageEntrypoint | None, where: str,
                out: FromCompose) -> list[str]:
    """The tokens after `vllm serve`, with the entrypoint style that will run them."""
    command, taken = _program(service, image, where)
    if not command:
        raise UserError("the service has no command", where=where,
                        fix="write the vllm serve command into the compose file's command:")
    shell = shell_of(command)
    try:
        prelude, command = split_prelude(command)
    except ValueError as e:
        raise UserError(f"the command is a bash -c script b70deploy cannot read: {e}", where=where,
                        fix="write it as bash -c \"PRELUDE && vllm serve MODEL FLAGS\" (or a plain vllm serve "
                            "command)") from None
    if prelude is not None:
        out.doc["prelude"] = prelude
        out.sources["prelude"] = "the command's bash -c script, before `&& vllm serve` (kept verbatim)"
    if shell is not None and (taken or (shell != ["bash", "-c"] and (prelude is not None or shell[1] != "-c"))):
        out.doc["shell"] = shell  # a login shell (bash -lc) reads /etc/profile: the script may need it
        out.sources["shell"] = f"the command's shell ({' '.join(shell)}), kept"
    launcher, command = split_launcher(command)
    if launcher is not None:
        out.doc["launcher"] = launcher
        out.sources["launcher"] = f"the {'entrypoint' if taken else 'command'}: {' '.join(launcher)}, kept (it takes " \
                                  "the model as --model)"
    style = out.doc["entrypoint_style"] = _style(service, image, command, out, taken=taken)
    if command[:2] == SERVE:
        if style == "vllm-serve" and launcher is None and shell is None and not taken:
            out.notes.append("the command repeats `vllm serve` under an ENTRYPOINT [vllm, serve] image; the stack "
                             "renders the model and flags only")
        return command[2:]
    if style == "bash-c":
        out.notes.append("the command lacks `vllm serve` for a bash -c entrypoint (it fails with `exec: --: "
                         "invalid option`); the stack renders it")
    return command


def serve_arguments(service: Mapping[str, Any], image: ImageEntrypoint | None = None) -> ParsedServe | None:
    """The service's vLLM arguments however it starts vLLM (the image's entrypoint or CMD, a launcher,
    a bash -c script, `vllm serve`), as stack_from_compose reads them; None when they cannot be read
    (an external script, a service without a command)."""
    try:
        return parse_serve_args(_serve_args(service, image, "compose file", FromCompose(doc={})))
    except UserError:
        return None


def _required(service: Mapping[str, Any], parsed: ParsedServe, binds: Sequence[Mapping[str, Any]], where: str,
              out: FromCompose) -> None:
    """The model (the one thing vLLM requires); no secret on the command line. Served names and the
    length stay unsaid when the command leaves them to vLLM (it serves under the model argument,
    and derives the length from the model's config)."""
    if parsed.model is None:
        raise UserError("the command names no model", where=where,
                        fix="give the model path after `vllm serve` (or as --model)")
    if HUB_ID_RE.match(parsed.model) and weights_bind(parsed.model, binds) is None:
        out.doc["model"] = {"path": parsed.model, "hub": True}
        out.sources["model"] = "the command's model, a Hugging Face hub id (loaded from the hub cache)"
        _hub_cache(service, where, out)
    else:
        out.doc["model"] = {"path": _in_container(parsed.model, binds, "model", where, out)}
    _api_key(parsed, out)
    secret = next((t for t in parsed.extra if t.startswith("--")
                   and is_secret(t[2:].split("=")[0].replace("-", "_"))), None)
    if secret is not None:  # a stack file is 0644 and printed: no secret goes into it
        raise UserError(f"the command passes {secret.split('=')[0]} in clear", where=where,
                        fix="move it into the node's secrets_env_file (e.g. VLLM_API_KEY=...) and drop the flag")


def _api_key(parsed: ParsedServe, out: FromCompose) -> None:
    """`--api-key KEY` out of the stack's flags (a stack file is printed): vLLM reads VLLM_API_KEY when no
    --api-key is given (build_app, vllm/entrypoints/openai/api_server.py at 0001948b: `args.api_key or
    [envs.VLLM_API_KEY]`), which the node's secrets_env_file gives; `api_key: true` keeps it required."""
    kept: list[str] = []
    skip = False
    for token in parsed.extra:
        name, inline = flag_name(token)
        if name == API_KEY_FLAG:
            skip = inline is None
            out.doc["api_key"] = True
        elif skip and not token.startswith("-"):
            continue
        else:
            skip = False
            kept.append(token)
    if out.doc.get("api_key"):
        parsed.extra[:] = kept
        out.withheld.append(API_KEY_ENV)
        out.sources["api_key"] = (f"the command's {API_KEY_FLAG}, left out of the stack: vLLM reads {API_KEY_ENV} "
                                  "from the node's secrets_env_file instead")


def _flags(parsed: ParsedServe, binds: Sequence[Mapping[str, Any]], where: str, out: FromCompose) -> list[str]:
    """Set the stack keys the flags give; return extra_args: the flags kept verbatim."""
    extra = list(parsed.extra)
    for key, value in parsed.values.items():
        if key == "speculative":
            try:
                value = _speculative(value, binds, where, out)
            except (ValueError, TypeError) as e:
                out.notes.append(f"{SPEC_FLAG} is not a speculative: mapping the stack can hold ({e}): kept "
                                 "verbatim in extra_args")
                extra += parsed.raw[key]
                continue
        _set(out.doc, key, value)
    if "prefix_caching" not in parsed.values:
        out.doc["prefix_caching"] = UNSAID  # vLLM's default, as the command had it: no flag rendered
    # A value the schema refuses (say --dtype half) stays a flag: same command, lint still reads it.
    for top in sorted({k.split(".")[0] for k in parsed.values}):
        bad = value_error(Stack, [top], out.doc[top]) if top in out.doc else None
        if bad is not None:
            del out.doc[top]
            extra += _flag_tokens(top, parsed.raw)
            out.notes.append(f"{bad[0]}: {bad[1]}: the flag is kept verbatim in extra_args")
    port = parsed.fixed.get("--port")
    if port is not None:
        if port.isdigit() and 0 < int(port) < 65536:
            if int(port) != CONTAINER_PORT:
                out.doc["container_port"] = int(port)  # the operator's: their healthcheck and companions name it
        else:
            raise UserError(f"the command's --port {port!r} is not a port number", where=where,
                            fix="give --port a number (vLLM's own default is 8000)")
    host = parsed.fixed.get("--host")
    if host in ("0.0.0.0", "::", ""):
        out.doc["host"] = host  # the operator's, kept: a command without it renders none
    elif host is not None:
        out.notes.append(f"--host {host} is left out: without it vLLM listens on every interface, which the "
                         "published port reaches (not the container's loopback)")
    return extra


def _environment(service: Mapping[str, Any], out: FromCompose, secrets: Secrets) -> None:
    env: dict[str, str] = {}
    # the cache variables of a file b70deploy rendered, on any platform: every render sets its own
    ours = {k: v for p in gpu.PLATFORMS for k, v in caches.container_env(p).items()}
    if "b70deploy.stack" in (service.get("labels") or {}) and "hf_cache" in out.node:
        # a file b70deploy rendered names the hub cache it binds: the node's hf_cache says so again
        ours["HF_HOME"] = out.node.get("hf_cache_target", CONTAINER_HF_HOME)
    for key, value in sorted((service.get("environment") or {}).items()):
        if value is not None and ours.get(key) == value:
            continue
        if value is None:
            out.notes.append(f"environment {key} has no value here (Compose takes it from the shell): left out")
        elif secrets.is_secret(key) or str(value) in secrets.values:
            out.withheld.append(key)
        elif not ENV_KEY_RE.match(key) or any(c in str(value) for c in "\n\r\x00"):
            out.notes.append(f"environment {key!r} is not a single-line variable a stack can hold: left out")
        else:
            env[key] = str(_unescape(value))
    if out.withheld:
        out.notes.append(f"secret-looking variables left out of the stack: {', '.join(out.withheld)}; put them "
                         "in the node's secrets_env_file (0600), which every render adds")
    if env:
        out.doc["env"] = env


def _mounts(service: Mapping[str, Any], out: FromCompose) -> None:
    mounts = []
    for v in service.get("volumes") or []:
        if not isinstance(v, dict):
            continue
        source, target = str(v.get("source") or ""), str(v.get("target") or "")
        if target in out.weights_at:
            continue
        if v.get("type") != "bind":
            kind = "named volume" if v.get("type") == "volume" else f"{v.get('type')} mount"
            out.notes.append(f"the {kind} at {target} is not carried over (a stack mounts host paths only)")
        elif target == caches.CONTAINER_ROOT:
            continue  # the warm-boot cache bind of a file b70deploy rendered: every render adds its own
        elif not (ABS_PATH_RE.match(source) and ABS_PATH_RE.match(target)) or "/" in (source, target):
            out.notes.append(f"the bind {source}:{target} is not a plain absolute path pair: left out")
        else:
            mounts.append({"source": source, "target": target, **({} if v.get("read_only") else {"read_only": False})})
            if "/vllm/" in target and posixpath.splitext(target)[1] == ".py":
                out.notes.append(f"{source} replaces {target} in the image: `b70deploy patch from-file {source} "
                                 f"--target {target} --image {service.get('image')} --name NAME` makes it a patch "
                                 "that detects drift when the image changes")
    if mounts:
        out.doc["mounts"] = mounts


def _node_facts(service: Mapping[str, Any], container_port: str, out: FromCompose) -> None:
    published = False
    extra: list[str] = []
    for p in service.get("ports") or []:
        if not isinstance(p, dict):
            continue
        if str(p.get("target")) == container_port and p.get("published") and not published:
            published = True
            out.node["ports"] = {"prod": int(str(p["published"]).split("-")[0])}
            if p.get("host_ip"):
                out.node["bind_address"] = p["host_ip"]
            continue
        # Any other port the service publishes (metrics, a second API): kept as Compose's short syntax.
        short = ":".join(str(x) for x in (p.get("host_ip"), p.get("published"), p.get("target")) if x)
        extra.append(short + (f"/{p['protocol']}" if p.get("protocol") not in (None, "tcp") else ""))
    if extra:
        out.doc["extra_ports"] = extra
    if not published and service.get("expose"):
        # A proxy on the project network reaches the service; b70deploy's own probes (/health, smoke)
        # need a published port, which render keeps on loopback for a stack with expose:.
        out.notes.append(f"the port is only exposed (expose: {', '.join(map(str, service['expose']))}): the stack "
                         "keeps expose:, and b70deploy publishes it on 127.0.0.1 only, for its own probes")
    gpu_access(service, out)
    if service.get("shm_size"):
        out.node["shm_size"] = str(service["shm_size"])


def gpu_access(service: Mapping[str, Any], out: FromCompose) -> None:
    """The service's GPU access (GPU_KEYS): first the platform's own, as render/gpu.py reads it
    back (device requests, `gpus:`, CDI names, /dev/kfd and /dev/dri: the node's platform and
    device paths, the stack's gpus), which render writes again; then the devices it does not
    account for: /dev/dri's nodes first, else the first device, is the node's device_dir (a
    folder, or one device node such as /dev/dri/card0), the others and `runtime` go through
    `compose:` as written; numeric group_add entries become the node's gids. Nothing is dropped."""
    out.notes += gpu.carry(service, out.node, out.doc)
    carried: dict[str, Any] = out.doc.setdefault("compose", {})
    accounted = {out.node.get("device_dir"), out.node.get("kfd_device")} - {None}
    devices = [d for d in service.get("devices") or [] if isinstance(d, dict) and d.get("source")
               and d["source"] not in accounted and not (out.node.get("nvidia_cdi") and "=" in str(d["source"]))]
    # The render-node folder first (its nodes' gids are the ones group_add needs), then as listed.
    devices.sort(key=lambda d: posixpath.basename(str(d["source"]).rstrip("/")) != "dri")
    if devices and "device_dir" not in out.node:
        out.node["device_dir"] = devices.pop(0)["source"]
    rest = [f"{d['source']}:{d.get('target') or d['source']}" + (f":{d['permissions']}" if d.get("permissions")
                                                                   else "") for d in devices]
    if rest:
        carried["devices"] = rest
    groups = [str(g) for g in service.get("group_add") or []]
    if any(g.isdigit() for g in groups):
        out.node["gids"] = {f"gid{g}": int(g) for g in groups if g.isdigit()}
    named = [g for g in groups if not g.isdigit()]
    if named:
        out.notes.append(f"group_add names {', '.join(named)}: Docker looks names up in the image's /etc/group; "
                         "give the host's numeric gids in the node config (gids:)")
    if service.get("runtime"):
        carried["runtime"] = service["runtime"]


def _passthrough(service: Mapping[str, Any], networks: Mapping[str, Any], out: FromCompose) -> None:
    """Every other key of the service, as `docker compose config` resolved it, into the stack's
    compose: (ulimits, healthcheck, cap_drop, expose, a static address...); the networks it joins
    into the node's networks:. A key b70deploy owns is named in the notes."""
    carried: dict[str, Any] = out.doc.setdefault("compose", {})
    own = sorted(k for k in label_map(service.get("labels") or {}) if not k.startswith(TOOL_LABELS))
    if own:  # the node's, as its node-wide keys are: a stack of another service must not drop them
        out.notes.append(f"labels ({', '.join(own)}) are the node's, not the stack's: `b70deploy init` writes them "
                         "into the node config's compose: labels, and every stack renders them")
    for key in sorted(set(service) - _HANDLED - GPU_KEYS):
        value = service[key]
        if value is None or (key == "ipc" and value == "host"):  # unset, or what every render writes
            continue
        if key in OWNED:
            out.notes.append(f"{key} is not carried over (b70deploy renders it itself): {OWNED[key]}")
        elif key == "networks":
            _networks(value, networks, carried, out)
        else:
            carried[key] = value
    if not carried:
        del out.doc["compose"]


def _networks(joined: Any, networks: Mapping[str, Any], carried: dict[str, Any], out: FromCompose) -> None:
    if not isinstance(joined, dict) or joined == {"default": None}:
        return  # the project's default network, which every render joins
    carried["networks"] = joined
    defined: dict[str, Any] = {}
    for name in joined:
        conf = dict(networks.get(name) or {})
        if not conf.get("external"):
            conf.pop("name", None)  # Compose's <project>_<name>: the node's project names it
        if conf:
            defined[name] = conf
    if defined:
        out.node["networks"] = defined
        out.notes.append(f"the service joins {', '.join(joined)}: the node config's networks: defines "
                         f"{', '.join(defined)} (companions join the project's default network only)")
