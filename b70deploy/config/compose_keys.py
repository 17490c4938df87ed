"""Which keys of the vllm service a stack may pass through (`compose:`), and which it may not.

b70deploy renders some keys itself and relies on them: the image it pinned, the command the
stack's keys make, the published port its probes use, the profile, env files and bind mounts it
writes and checks. `labels` go through beside the tool's own (a Traefik router's): only a key in
the tool's namespace (`b70deploy.*`, the labels it finds its containers by) is refused. A stack that set one of those
would silently undo what the switch checks, so it is refused; every other key of the Compose
Specification's service goes through as written, and `docker compose config` judges it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .names import NAME_RE

# key -> what to do instead (the fix of the one-line refusal, and the note of from-compose).
OWNED: dict[str, str] = {
    "image": "set the stack's image:",
    "build": "build the image, then set the stack's image: to it",
    "command": "set the stack's keys and extra_args: the command is rendered from them",
    "entrypoint": "set the stack's entrypoint_style, launcher or shell",
    "ports": "set the node's ports and bind_address (b70deploy's probes use the published port)",
    "profiles": "drop it: b70deploy starts the service by its own profile",
    "env_file": "set the stack's env: and the node's secrets_env_file",
    "volumes": "set the stack's mounts: (host paths, read-only), or the node's models_dir or hf_cache",
    "container_name": "drop it: the dark project runs a second container of the service, and the project network "
                      "reaches it by the service's name",
    "restart": "drop it: b70deploy restarts and stops the service itself",
    "extends": "set the stack's extends: (another stack file)",
}


# A companion's: what its own node config keys say (config/schema.py Companion), and what every
# render sets (the profile, the restart policy).
COMPANION_OWNED: dict[str, str] = {
    **{k: OWNED[k] for k in ("build", "profiles", "restart", "extends")},
    "image": "set the companion's image:",
    "command": "set the companion's command:",
    "ports": "set the companion's port: and container_port:",
    "environment": "set the companion's environment:",
    "volumes": "set the companion's volumes:",
    "container_name": "set the companion's container_name:",
    "env_file": "set the companion's environment:",
}


def check_keys(compose: Mapping[str, Any], owned: Mapping[str, str] = OWNED) -> tuple[str, str] | None:
    """(what is wrong, the fix) for the first key of a `compose:` passthrough that cannot be passed
    through (a stack's: `owned` OWNED; a companion's: COMPANION_OWNED), else None."""
    for key, value in compose.items():
        if key in owned:
            return f"compose.{key} is a key b70deploy renders itself", owned[key]
        if not isinstance(key, str) or not (NAME_RE.match(key) or key.startswith("x-")):
            return f"compose key {key!r} is not a Compose service key", "use the Compose Specification's key names"
        if key == "environment" and not isinstance(value, (Mapping, list)):
            return "compose.environment is neither a mapping nor a list", "write KEY: value entries"
        if key == "labels":
            if not isinstance(value, (Mapping, list)):
                return "compose.labels is neither a mapping nor a list", "write key: value entries"
            ours = next((k for k in label_map(value) if k.startswith(TOOL_LABELS)), None)
            if ours is not None:
                return (f"compose.labels.{ours} is in b70deploy's own label namespace ({TOOL_LABELS}*)",
                        f"rename the label: {TOOL_LABELS}* labels are the ones b70deploy finds its containers by")
    return None


TOOL_LABELS = "b70deploy."  # the namespace of the labels every render writes (and finds containers by)


def label_map(labels: Mapping[str, Any] | list[Any]) -> dict[str, str]:
    """A service's labels as a mapping: Compose's list form (`- key=value`) too; a bare key is ''."""
    if isinstance(labels, Mapping):
        return {str(k): "" if v is None else str(v) for k, v in labels.items()}
    return {k: v for k, _, v in (str(item).partition("=") for item in labels)}
