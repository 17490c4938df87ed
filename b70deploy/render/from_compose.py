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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from ..config.schema import ABS_PATH_RE, ENV_KEY_RE, IMAGE_RE, Speculative, Stack
from ..config.validation import first_error, value_error
from ..errors import UserError
from ..state import caches
from . import gpu
from .draft import copy_origin
from .masking import is_secret
from .vllm_args import (
    CONTAINER_PORT,
    FLAGS,
    SPEC_FLAG,
    ParsedServe,
    entrypoint_style,
    model_rel_path,
    parse_serve_args,
    split_prelude,
)

SERVE = ["vllm", "serve"]
# Service keys the stack or the node config account for; any other is named in the notes.
_HANDLED = frozenset({"image", "command", "entrypoint", "environment", "volumes", "ports", "devices", "group_add",
                      "shm_size", "profiles", "restart", "networks", "labels", "env_file"}) | gpu.READ_KEYS


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
           out: FromCompose) -> str:
    """The entrypoint style the stack renders for: what will really run its command."""
    own = _argv(service.get("entrypoint"))
    own_style = entrypoint_style(own) if own else None
    if image is not None and image.entrypoint_style != "other":
        out.sources["entrypoint_style"] = f"image {image.ref} ({image.id.removeprefix('sha256:')[:12]})"
        if own_style is not None and own_style != image.entrypoint_style:
            out.notes.append(f"the compose file overrides the image's entrypoint ({own_style}); a stack renders "
                             f"none, so the image's own ({image.entrypoint_style}) runs the command")
        return image.entrypoint_style
    if own_style in ("bash-c", "vllm-serve"):
        absent = "image not on this engine" if image is None else f"image {image.ref} has no known entrypoint"
        out.sources["entrypoint_style"] = f"the compose file's entrypoint ({absent})"
        return own_style
    style = "bash-c" if command[:2] == SERVE else "vllm-serve"
    out.sources["entrypoint_style"] = ("the command's shape (it " + ("names `vllm serve`" if style == "bash-c"
                                       else "starts with the model") + "; no entrypoint known)")
    return style


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
    out.weights_at.add(str((_holder(path, binds) or {}).get("target")))
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


def _flag_tokens(key: str, raw: Mapping[str, list[str]]) -> list[str]:
    """The tokens as written for every flag that feeds the top-level stack key `key`."""
    return [t for f in FLAGS if f.key.split(".")[0] == key for t in raw.get(f.key, [])]


def stack_from_compose(service: Mapping[str, Any], *, image: ImageEntrypoint | None = None,
                       where: str = "compose file") -> FromCompose:
    """The stack document for one resolved compose service (see the module docstring).

    `image`: the entrypoint facts of the service's image, None when the engine does not have it
    (the compose file's own entrypoint, else the command's shape, decides). `where` names the
    service in errors (e.g. "docker-compose.yml: services.vllm"). Raises UserError when the
    service cannot be a stack (no image, no model, a model outside any bind mount, a secret
    on the command line, values that make no valid stack).
    """
    ref = str(service.get("image") or "")
    if not IMAGE_RE.match(ref):
        raise UserError(f"image {ref!r} is not an image reference" if ref else "the service has no image",
                        where=where, fix="give the service an image: such as intel/vllm:latest")
    out = FromCompose(doc={"image": ref})
    parsed = parse_serve_args(_serve_args(service, image, where, out))
    out.notes += parsed.notes
    binds = _binds(service)
    _required(parsed, binds, where, out)
    extra = _flags(parsed, binds, where, out)
    if extra:
        out.doc["extra_args"] = extra
    _environment(service, out)
    _mounts(service, out)
    _node_facts(service, parsed.fixed.get("--port", str(CONTAINER_PORT)), out)
    out.notes += gpu.carry(service, out.node, out.doc)  # the platform's GPU access (render/gpu.py)
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
    command = _argv(service.get("command"))
    if not command:
        raise UserError("the service has no command", where=where,
                        fix="write the vllm serve command into the compose file's command:")
    try:
        prelude, command = split_prelude(command)
    except ValueError as e:
        raise UserError(f"the command is a bash -c script b70deploy cannot read: {e}", where=where,
                        fix="write it as bash -c \"PRELUDE && vllm serve MODEL FLAGS\" (or a plain vllm serve "
                            "command)") from None
    if prelude is not None:
        out.doc["prelude"] = prelude
        out.sources["prelude"] = "the command's bash -c script, before `&& vllm serve` (kept verbatim)"
    style = out.doc["entrypoint_style"] = _style(service, image, command, out)
    if command[:2] == SERVE:
        if style == "vllm-serve":
            out.notes.append("the command repeats `vllm serve` under an ENTRYPOINT [vllm, serve] image; the stack "
                             "renders the model and flags only")
        return command[2:]
    if style == "bash-c":
        out.notes.append("the command lacks `vllm serve` for a bash -c entrypoint (it fails with `exec: --: "
                         "invalid option`); the stack renders it")
    return command


def _required(parsed: ParsedServe, binds: Sequence[Mapping[str, Any]], where: str, out: FromCompose) -> None:
    """The model, the served names and the length a stack must state; no secret on the command line."""
    if parsed.model is None:
        raise UserError("the command names no model", where=where,
                        fix="give the model path after `vllm serve` (or as --model)")
    out.doc["model"] = {"path": _in_container(parsed.model, binds, "model", where, out)}
    for key, why in (("served_model_names", "clients ask for the model by name"),
                     ("max_model_len", "a stack states its context length")):
        if key not in parsed.values:
            flag = next(f.flag for f in FLAGS if f.key == key)
            given = next((parsed.extra[i:i + 2] for i, t in enumerate(parsed.extra) if t == flag), None)
            what = f"has {' '.join(given)}, which a stack cannot state" if given else f"has no {flag}"
            raise UserError(f"the command {what}", where=where, fix=f"give {flag} a value in the command ({why})")
    secret = next((t for t in parsed.extra if t.startswith("--")
                   and is_secret(t[2:].split("=")[0].replace("-", "_"))), None)
    if secret is not None:  # a stack file is 0644 and printed: no secret goes into it
        raise UserError(f"the command passes {secret.split('=')[0]} in clear", where=where,
                        fix="move it into the node's secrets_env_file (e.g. VLLM_API_KEY=...) and drop the flag")


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
        out.notes.append("the command leaves prefix caching to vLLM's default; the stack states it "
                         "(--enable-prefix-caching): set prefix_caching: false if the model needs that")
    # A value the schema refuses (say --dtype half) stays a flag: same command, lint still reads it.
    for top in sorted({k.split(".")[0] for k in parsed.values} - {"served_model_names", "max_model_len"}):
        bad = value_error(Stack, [top], out.doc[top]) if top in out.doc else None
        if bad is not None:
            del out.doc[top]
            extra += _flag_tokens(top, parsed.raw)
            out.notes.append(f"{bad[0]}: {bad[1]}: the flag is kept verbatim in extra_args")
    for name, value in parsed.fixed.items():
        fixed = next(f.fixed for f in FLAGS if f.flag == name)
        if value != fixed:
            out.notes.append(f"{name} {value} becomes {name} {fixed}: the stack's container listens on "
                             f"0.0.0.0:{CONTAINER_PORT}; the node's ports.prod publishes it")
    return extra


def _environment(service: Mapping[str, Any], out: FromCompose) -> None:
    env: dict[str, str] = {}
    # the cache variables of a file b70deploy rendered, on any platform: every render sets its own
    ours = {k: v for p in gpu.PLATFORMS for k, v in caches.container_env(p).items()}
    for key, value in sorted((service.get("environment") or {}).items()):
        if value is not None and ours.get(key) == value:
            continue
        if value is None:
            out.notes.append(f"environment {key} has no value here (Compose takes it from the shell): left out")
        elif is_secret(key):
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
        if v.get("type") != "bind":
            kind = "named volume" if v.get("type") == "volume" else f"{v.get('type')} mount"
            out.notes.append(f"the {kind} at {target} is not carried over (a stack mounts host paths only)")
        elif target in out.weights_at:
            continue
        elif target == caches.CONTAINER_ROOT:
            continue  # the warm-boot cache bind of a file b70deploy rendered: every render adds its own
        elif not (ABS_PATH_RE.match(source) and ABS_PATH_RE.match(target)) or "/" in (source, target):
            out.notes.append(f"the bind {source}:{target} is not a plain absolute path pair: left out")
        else:
            mounts.append({"source": source, "target": target})
            if not v.get("read_only"):
                out.notes.append(f"{source} is mounted read-write; the stack mounts it read-only")
            if "/vllm/" in target and posixpath.splitext(target)[1] == ".py":
                out.notes.append(f"{source} replaces {target} in the image: `b70deploy patch from-file {source} "
                                 f"--target {target} --image {service.get('image')} --name NAME` makes it a patch "
                                 "that detects drift when the image changes")
    if mounts:
        out.doc["mounts"] = mounts


def _node_facts(service: Mapping[str, Any], container_port: str, out: FromCompose) -> None:
    for p in service.get("ports") or []:
        if isinstance(p, dict) and str(p.get("target")) == container_port and p.get("published"):
            out.node["ports"] = {"prod": int(str(p["published"]).split("-")[0])}
            if p.get("host_ip"):
                out.node["bind_address"] = p["host_ip"]
    for d in service.get("devices") or []:
        if isinstance(d, dict) and d.get("source"):
            out.node.setdefault("device_dir", d["source"])
    groups = [str(g) for g in service.get("group_add") or []]
    if any(g.isdigit() for g in groups):
        out.node["gids"] = {f"gid{g}": int(g) for g in groups if g.isdigit()}
    named = [g for g in groups if not g.isdigit()]
    if named:
        out.notes.append(f"group_add names {', '.join(named)}: Docker looks names up in the image's /etc/group; "
                         "give the host's numeric gids in the node config (gids:)")
    if service.get("shm_size"):
        out.node["shm_size"] = str(service["shm_size"])
    others = sorted(set(service) - _HANDLED)
    if others:
        out.notes.append(f"not carried over (no stack key): {', '.join(others)}")
