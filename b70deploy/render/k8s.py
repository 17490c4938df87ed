"""A deploy dir's bytes -> Kubernetes manifests (pure: same files, same YAML).

The manifests are read off what the compose render wrote (render/files.py), never re-derived
from the stack: the vllm service of docker-compose.yml, interpolated from the .env beside it
as Compose does, gives the container's `command` (entrypoint) and `args` (command) byte for
byte; vllm.env gives its environment, every value the stack's own `env:` does not hold being a
secret, so only a Secret reference is written, never a value; each patched file under
patches/ becomes a ConfigMap mounted with subPath over the image's file. What Kubernetes says
differently is translated here, one place: the GPU as the vendor's device-plugin resource,
/dev/shm as a memory emptyDir of shm_size, the health wait as a startup probe.

Kubernetes expands `$(VAR)` in args and env values and reduces `$$` to `$`
(third_party/forked/golang/expansion/expand.go and its expand_test.go, kubernetes/kubernetes):
every `$` is written `$$`, so the container gets the bytes Compose gives it.

A render with vLLM's development endpoints (VLLM_SERVER_DEV_MODE, which sleep mode needs) is
refused: they answer on the API port, and a Service cannot keep one path of a port from clients
the way the front door does on a Compose node.
"""

from __future__ import annotations

import hashlib
import io
import math
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from ..config.hub import CONTAINER_HF_HOME
from ..errors import UserError
from ..state import caches
from .filenames import COMPOSE_FILE, DOTENV_FILE
from .gpu import VISIBLE_VAR, Gpus, Platform, gpu_count
from .masking import is_secret
from .patches import PATCH_DIR_IN_DEPLOY
from .standby import DEV_MODE
from .vllm_args import CONTAINER_PORT

# Kubernetes 1.35-1.37 API versions of what is written (all GA since 1.9).
API = {"Deployment": "apps/v1", "Service": "v1", "ConfigMap": "v1"}
IntelDriver = Literal["xe", "i915"]
# The resource each vendor's device plugin registers (docs/kubernetes.md cites each plugin).
INTEL_RESOURCE: dict[IntelDriver, str] = {"xe": "gpu.intel.com/xe", "i915": "gpu.intel.com/i915"}
RESOURCE: dict[str, str] = {"cuda": "nvidia.com/gpu", "rocm": "amd.com/gpu"}
HEALTH_PATH = "/health"  # vLLM's liveness route (vllm/entrypoints/openai/api_server.py)
STARTUP_PERIOD = 10
CONFIGMAP_LIMIT = 1024 * 1024  # the API server refuses a ConfigMap over 1 MiB
# Service keys the translation reads; any other key of the vllm service is named in a note.
READ = frozenset({"image", "profiles", "restart", "entrypoint", "command", "ports", "env_file", "environment",
                  "volumes", "devices", "group_add", "cap_add", "security_opt", "deploy", "ipc", "shm_size",
                  "labels"})
_DNS_BAD = re.compile(r"[^a-z0-9-]+")
_INTERP = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class Options:
    """How the cluster differs from the node: what the export asks the operator."""

    namespace: str | None = None
    models_claim: str | None = None      # a PVC for the weights; none: hostPath of the node's models_dir
    hf_cache_claim: str | None = None    # a PVC for the Hugging Face cache; none: hostPath of hf_cache
    intel_driver: IntelDriver = "xe"     # xpu: which kernel driver the plugin's nodes run


@dataclass(frozen=True)
class Source:
    """A deploy dir's bytes and the facts they do not hold."""

    files: Mapping[str, bytes]
    stack: str
    name: str                    # the objects' base name (a DNS label)
    service: str                 # the vllm service in the compose file
    image: str                   # a reference a cluster can pull (never a local image id)
    stack_env: Mapping[str, str]  # the stack's own env: (the rest of vllm.env is secrets)
    platform: Platform
    gpus: Gpus
    port: int                    # the port clients use (the node's prod port)
    boot_timeout: float          # the node's timeouts.health, seconds
    revision: int | None = None
    # The keys of vllm.env that came from the node's secrets file, when the render said so;
    # None (a revision): every key whose value is not the stack's own.
    secret_keys: frozenset[str] | None = None


@dataclass(frozen=True)
class Export:
    objects: list[dict[str, Any]]
    command: list[str] | None    # the container's command (compose entrypoint), as run
    args: list[str]              # the container's args (compose command), as run
    secret_name: str | None
    secret_keys: tuple[str, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def yaml(self) -> bytes:
        return dump(self.objects)

    def summary(self) -> list[dict[str, str]]:
        return [{"kind": o["kind"], "name": o["metadata"]["name"]} for o in self.objects]


def dns_label(text: str, limit: int = 63) -> str:
    """`text` as an RFC 1035 label (a Service's name): lower case, [a-z0-9-], a letter first, at
    most `limit` characters; a name cut short keeps a hash of the whole."""
    label = _DNS_BAD.sub("-", text.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"x-{label}".rstrip("-")
    if len(label) > limit:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        label = f"{label[:limit - 9].rstrip('-')}-{digest}"
    return label


_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_options(opts: Options) -> None:
    """The names the operator gave, as the API server checks them (a namespace is an RFC 1123
    label, a claim an RFC 1123 subdomain)."""
    if opts.namespace is not None and not _LABEL.match(opts.namespace):
        raise UserError(f"{opts.namespace!r} is not a namespace name", where="--namespace",
                        fix="lower-case letters, digits and '-', at most 63, e.g. llm")
    for flag, claim in (("--models-claim", opts.models_claim), ("--hf-cache-claim", opts.hf_cache_claim)):
        if claim is not None and not _SUBDOMAIN.match(claim):
            raise UserError(f"{claim!r} is not a PersistentVolumeClaim name", where=flag,
                            fix="lower-case letters, digits, '-' and '.', e.g. weights")


def interpolate(value: str, values: Mapping[str, str], *, where: str, used: set[str] | None = None) -> str:
    """Compose's interpolation of one value (the Compose Specification, "Interpolation"): `$$`,
    `${VAR}`, `${VAR:?err}`, `${VAR:-default}` (and their forms without `:`), `$VAR`. The names
    read go into `used`."""

    def one(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        if used is not None:
            used.add(name)
        op, arg = m.group(3), m.group(4) or ""
        have = values.get(name)
        unset = have is None or (have == "" and op is not None and op.startswith(":"))
        if op in ("?", ":?") and unset:
            raise UserError(f"{name} is unset: {arg}", where=where, fix=f"the {DOTENV_FILE} beside it names it")
        if op in ("-", ":-") and unset:
            return arg
        if op in ("+", ":+"):
            return "" if unset else arg
        return have or ""

    return _INTERP.sub(one, value)


def k8s_escape(value: str) -> str:
    """A string Kubernetes' $(VAR) expansion gives back unchanged."""
    return value.replace("$", "$$")


def quantity(size: str) -> str:
    """A Docker size (shm_size: 16g, 512m; binary units, docker/go-units RAMInBytes) as a
    Kubernetes quantity."""
    m = re.fullmatch(r"(\d+)([bkmg]?)", size.strip().lower())
    if m is None:
        raise UserError(f"shm_size {size!r} is not a size", fix="use e.g. 16g")
    return m.group(1) + {"": "", "b": "", "k": "Ki", "m": "Mi", "g": "Gi"}[m.group(2)]


def _dotenv(data: bytes) -> dict[str, str]:
    from dotenv import dotenv_values

    # interpolate=False: the files are read as Compose reads them, not as a shell would
    text = io.StringIO(data.decode(errors="replace"))
    return {k: v for k, v in dotenv_values(stream=text, interpolate=False).items() if v is not None}


def _env_map(raw: Any) -> dict[str, str]:
    if isinstance(raw, list):
        return dict(str(e).split("=", 1) for e in raw if "=" in str(e))
    return {str(k): "" if v is None else str(v) for k, v in (raw or {}).items()}


@dataclass(frozen=True)
class _Volume:
    source: str
    target: str
    read_only: bool


def _volumes(raw: Sequence[Any], values: Mapping[str, str], where: str) -> list[_Volume]:
    out = []
    for v in raw:
        if isinstance(v, Mapping):
            out.append(_Volume(interpolate(str(v.get("source", "")), values, where=where),
                               interpolate(str(v["target"]), values, where=where), bool(v.get("read_only"))))
        else:  # short syntax: SRC:DST[:ro]
            parts = interpolate(str(v), values, where=where).split(":")
            out.append(_Volume(parts[0], parts[1] if len(parts) > 1 else parts[0], "ro" in parts[2:]))
    return out


def _labels(src: Source) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": src.name,
            "app.kubernetes.io/managed-by": "b70deploy"}


def _meta(src: Source, opts: Options, name: str, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    meta["labels"] = _labels(src)
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _gpu_resource(src: Source, opts: Options, notes: list[str]) -> dict[str, int]:
    if src.platform == "cpu":
        return {}
    name = INTEL_RESOURCE[opts.intel_driver] if src.platform == "xpu" else RESOURCE[src.platform]
    count = gpu_count(src.gpus)
    if count is None:
        count = 1
        notes.append(f"gpus: all on the node; the Deployment asks for one {name} (set the stack's gpus: to a "
                     "count to ask for more)")
    elif isinstance(src.gpus, list):
        notes.append(f"gpus: device ids {', '.join(map(str, src.gpus))} become a count of {count}: the device "
                     "plugin picks the devices and sets what the container sees")
    return {name: count}


def render(src: Source, opts: Options = Options()) -> Export:
    """The manifests of `src`: ConfigMaps (one per patched file), a Service, a Deployment."""
    where = f"{COMPOSE_FILE} of stack {src.stack}"
    try:
        compose = yaml.safe_load(src.files[COMPOSE_FILE])
        svc = compose["services"][src.service]
    except (KeyError, TypeError, yaml.YAMLError):
        raise UserError(f"no service {src.service!r} in the rendered {COMPOSE_FILE}", where=where,
                        fix="the node config's service names the vllm service") from None
    values = _dotenv(src.files.get(DOTENV_FILE, b""))
    notes: list[str] = []
    known = src.secret_keys or frozenset()
    entrypoint = _argv(svc.get("entrypoint"), values, where, known) if svc.get("entrypoint") else None
    args = _argv(svc.get("command"), values, where, known)
    environment: dict[str, str] = {}
    from_env: set[str] = set()  # environment: keys that hold a secret: read from the Secret, never inlined
    for key, raw in _env_map(svc.get("environment")).items():
        used: set[str] = set()
        text = interpolate(raw, values, where=where, used=used)
        if is_secret(key) or key in known or any(is_secret(u) or u in known for u in used):
            from_env.add(key)
        else:
            environment[key] = text
    if from_env:
        notes.append(f"environment {', '.join(sorted(from_env))}: secrets, read from the Secret (put them there), "
                     "never written here")
    mask = VISIBLE_VAR.get(src.platform)
    if mask in environment:  # host ids: on a cluster the plugin hands over the devices, numbered from 0
        notes.append(f"{mask}={environment.pop(mask)} (this node's device ids) not exported: the device plugin "
                     "gives the container only the devices it allocated")
    runtime: dict[str, str] = {}
    for name in _env_files(svc.get("env_file")):  # in order, a later file's key winning, as Compose reads them
        if name in src.files:
            runtime.update(_dotenv(src.files[name]))
        else:
            notes.append(f"env_file {name} is not among the deploy files: its keys are not exported")
    secret = src.secret_keys if src.secret_keys is not None else \
        frozenset(k for k, v in runtime.items() if src.stack_env.get(k) != v)
    # The stack's own values, as it wrote them (vllm.env holds them quoted for Compose's parser)
    plain = {k: src.stack_env[k] for k in runtime if k not in secret and k in src.stack_env and k not in environment}
    secret_keys = tuple(sorted({*(k for k in runtime if k in secret and k not in environment), *from_env}))
    dev = [k for k in DEV_MODE if k in environment or k in runtime]
    if dev:
        raise UserError(f"the render runs vLLM with its development endpoints ({', '.join(dev)}, which sleep mode "
                        "sets): they answer on the API port, and a Service cannot "
                        "keep them from clients", where=f"stack {src.stack}",
                        fix="export the stack with standby: off (the switch's standby stays on Compose nodes)")

    name = src.name
    objects: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for i, v in enumerate(_volumes(svc.get("volumes") or [], values, where)):
        rel = posixpath.normpath(v.source[2:]) if v.source.startswith("./") else None
        if rel is not None and rel.startswith(f"{PATCH_DIR_IN_DEPLOY}/") and rel in src.files:
            data = src.files[rel]
            if len(data) > CONFIGMAP_LIMIT:
                raise UserError(f"{rel} is {len(data)} bytes, over a ConfigMap's 1 MiB", where=f"stack {src.stack}",
                                fix="mount the patched file from a volume of your own")
            key = posixpath.basename(rel)
            patch = rel.split("/")[1]
            cm = dns_label(f"{name}-{patch}-{i}", 253)
            objects.append({"apiVersion": API["ConfigMap"], "kind": "ConfigMap",
                            "metadata": _meta(src, opts, cm, {"b70deploy/file": rel, "b70deploy/target": v.target,
                                                              "b70deploy/sha256": hashlib.sha256(data).hexdigest()}),
                            "data": {key: data.decode()}})
            vol = f"patch-{i}"
            volumes.append({"name": vol, "configMap": {"name": cm}})
            mounts.append({"name": vol, "mountPath": v.target, "subPath": key, "readOnly": True})
        elif v.target == caches.CONTAINER_ROOT:
            volumes.append({"name": "compile-cache", "emptyDir": {}})
            mounts.append({"name": "compile-cache", "mountPath": v.target})
            notes.append(f"warm-boot caches: {v.target} is an emptyDir (each pod compiles once); give it a PVC to "
                         "keep them across pods")
        elif v.source.startswith("/dev/"):
            notes.append(f"{v.source}: not mounted; the device plugin gives the container its devices")
        elif v.target == CONTAINER_HF_HOME and (opts.hf_cache_claim or v.source.startswith("/")):
            volumes.append(_claim_or_host("hf-cache", opts.hf_cache_claim, v.source, read_only=False))
            mounts.append({"name": "hf-cache", "mountPath": v.target})
        elif v.source == values.get("MODELS_DIR") and (opts.models_claim or v.source.startswith("/")):
            volumes.append(_claim_or_host("models", opts.models_claim, v.source, read_only=v.read_only))
            mounts.append({"name": "models", "mountPath": v.target, **({"readOnly": True} if v.read_only else {})})
        elif v.source.startswith("/"):
            vol = f"mount-{i}"
            volumes.append({"name": vol, "hostPath": {"path": v.source}})
            mounts.append({"name": vol, "mountPath": v.target, **({"readOnly": True} if v.read_only else {})})
        else:  # a folder beside a hand-made compose file: no path on a cluster's node
            fix = " (--hf-cache-claim mounts a PVC there)" if v.target == CONTAINER_HF_HOME else ""
            notes.append(f"volume {v.source}:{v.target} not exported: neither an absolute host path nor a patched "
                         f"file{fix}")
    shm = svc.get("shm_size")
    if shm:
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": quantity(str(shm))}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    if svc.get("ipc") == "host":
        notes.append("ipc: host is not carried (a pod shares no host IPC): /dev/shm is a memory emptyDir of "
                     "shm_size")

    container: dict[str, Any] = {"name": "vllm", "image": src.image, "imagePullPolicy": "IfNotPresent"}
    if entrypoint is not None:
        container["command"] = [k8s_escape(a) for a in entrypoint]
    container["args"] = [k8s_escape(a) for a in args]
    container["ports"] = [{"name": "http", "containerPort": _container_port(svc, values, where), "protocol": "TCP"}]
    env = {**plain, **environment}
    if env:
        container["env"] = [{"name": k, "value": k8s_escape(env[k])} for k in sorted(env)]
    secret_name = None
    if secret_keys:
        secret_name = dns_label(f"{name}-secrets", 253)
        container["envFrom"] = [{"secretRef": {"name": secret_name}}]
    resources = _gpu_resource(src, opts, notes)
    if resources:
        container["resources"] = {"limits": dict(resources)}
    probe = {"httpGet": {"path": HEALTH_PATH, "port": "http"}}
    container["startupProbe"] = {**probe, "periodSeconds": STARTUP_PERIOD,
                                 "failureThreshold": max(1, math.ceil(src.boot_timeout / STARTUP_PERIOD))}
    container["readinessProbe"] = {**probe, "periodSeconds": 5, "failureThreshold": 3}
    security = _security(svc, notes)
    if security:
        container["securityContext"] = security
    container["volumeMounts"] = mounts

    pod: dict[str, Any] = {"containers": [container]}
    gids = sorted({int(g) for g in svc.get("group_add") or [] if str(g).isdigit()})
    if gids:
        pod["securityContext"] = {"supplementalGroups": gids}
        notes.append(f"group_add {', '.join(map(str, gids))}: this node's device gids, as supplementalGroups; "
                     "check them on the cluster's nodes")
    pod["volumes"] = volumes
    # One engine holds its GPUs: the old pod goes before the new one starts (maxSurge 0 on CPU too:
    # two engines do not fit one node's memory either).
    strategy: dict[str, Any] = {"type": "Recreate"} if resources else \
        {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    annotations = {"b70deploy/stack": src.stack,
                   "b70deploy/compose-sha256": hashlib.sha256(src.files[COMPOSE_FILE]).hexdigest()}
    if src.revision is not None:
        annotations["b70deploy/revision"] = str(src.revision)
    selector = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}
    deployment = {"apiVersion": API["Deployment"], "kind": "Deployment",
                  "metadata": _meta(src, opts, name, annotations),
                  "spec": {"replicas": 1, "strategy": strategy, "selector": {"matchLabels": selector},
                           "template": {"metadata": {"labels": _labels(src), "annotations": annotations},
                                        "spec": pod}}}
    service = {"apiVersion": API["Service"], "kind": "Service", "metadata": _meta(src, opts, name),
               "spec": {"type": "ClusterIP", "selector": selector,
                        "ports": [{"name": "http", "port": src.port, "targetPort": "http", "protocol": "TCP"}]}}
    rest = sorted(set(svc) - READ)
    if rest:
        notes.append(f"compose keys of the vllm service not exported: {', '.join(rest)}")
    return Export(objects=[*objects, service, deployment], command=entrypoint, args=args, secret_name=secret_name,
                  secret_keys=secret_keys, notes=tuple(notes))


def _container_port(svc: Mapping[str, Any], values: Mapping[str, str], where: str) -> int:
    """The port vLLM listens on: the first published or exposed container port (a hand-made
    file's own), else the render's."""
    for entry in [*(svc.get("ports") or []), *(svc.get("expose") or [])]:
        text = str(entry.get("target", "")) if isinstance(entry, Mapping) else \
            interpolate(str(entry), values, where=where).split("/")[0].rsplit(":", 1)[-1]
        if text.isdigit():
            return int(text)
    return CONTAINER_PORT


def _env_files(raw: Any) -> list[str]:
    """The env_file paths of a service, relative to its folder (the deploy files' names)."""
    entries = [raw] if isinstance(raw, str | Mapping) else list(raw or [])
    paths = [str(e.get("path", "")) if isinstance(e, Mapping) else str(e) for e in entries]
    return [posixpath.normpath(p) for p in paths if p]


def _argv(raw: Any, values: Mapping[str, str], where: str, known: frozenset[str]) -> list[str]:
    """A compose command or entrypoint as the process gets it (a string is split as a shell
    would: Compose's own rule), refused when it would carry a secret into the manifest."""
    used: set[str] = set()
    if isinstance(raw, str):
        argv = shlex.split(interpolate(raw, values, where=where, used=used))
    else:
        argv = [interpolate(str(a), values, where=where, used=used) for a in raw or []]
    named = [u for u in sorted(used) if is_secret(u) or u in known]
    flags = [a.split("=", 1)[0] for a in argv if a.startswith("--") and is_secret(a.split("=", 1)[0])]
    if named or flags:
        what = f"${{{named[0]}}}" if named else flags[0]
        raise UserError(f"the vllm service's command holds a secret ({what}): the manifest would carry its value",
                        where=where, fix="pass it through the environment (vLLM reads VLLM_API_KEY; HF_TOKEN for "
                                         "the hub) from the node's secrets_env_file")
    return argv


def _claim_or_host(name: str, claim: str | None, host: str, *, read_only: bool) -> dict[str, Any]:
    if claim:
        pvc: dict[str, Any] = {"claimName": claim, **({"readOnly": True} if read_only else {})}
        return {"name": name, "persistentVolumeClaim": pvc}
    # Directory: never created on the node, as the compose bind's create_host_path: false.
    return {"name": name, "hostPath": {"path": host, "type": "Directory"}}


def _security(svc: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    caps = [str(c).removeprefix("CAP_") for c in svc.get("cap_add") or []]
    if caps:
        out["capabilities"] = {"add": caps}
    for opt in svc.get("security_opt") or []:
        if str(opt).replace(":", "=", 1) == "seccomp=unconfined":
            out["seccompProfile"] = {"type": "Unconfined"}
        else:
            notes.append(f"security_opt {opt} not exported")
    return out


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # every object written out in full: no &id001 anchors for kubectl's reader


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # A patched file reads as the file it is, not one line of \n escapes.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(objects: Sequence[Mapping[str, Any]], *, explicit_start: bool = True) -> bytes:
    """One multi-document YAML file, keys in the order written (deterministic)."""
    return yaml.dump_all(list(objects), Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                         allow_unicode=True, explicit_start=explicit_start, width=1 << 16).encode()
