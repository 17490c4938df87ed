"""A compose folder's own files: what a compose file reads from the folder beside it.

A hand-made deployment (the report's /apps/b70-vllm) is more than docker-compose.yml and
.env: an `env_file:` (vllm023.env) and bind-mounted files (vllm-patches/marlin_utils.py)
live beside it and change what runs. `references` reads them from the compose file's own
text, statically and cheaply (no Compose, no engine), so the deploy dir, `adopt` and
`import` agree on which files a deployment is made of. A path that needs `${VAR}`
interpolation, is absolute, or leaves the folder is not the folder's own and is skipped.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import yaml


@dataclass(frozen=True)
class Reference:
    name: str                          # relative to the compose file's folder, normalized
    kind: Literal["env_file", "mount"]
    service: str
    target: str | None = None          # for a mount: the path inside the container


def _own(path: str) -> str | None:
    """`path` as a name inside the folder, or None when it is not one of the folder's files."""
    if not path or "$" in path or path.startswith(("/", "~")):
        return None
    norm = posixpath.normpath(path)
    if norm == "." or norm.startswith("../") or norm == "..":
        return None
    return norm


def env_files_of(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, dict):  # long syntax: {path: ..., required: ...}
            item = item.get("path")
        if isinstance(item, str):
            out.append(item)
    return out


def mount_of(entry: Any) -> tuple[str, str] | None:
    """(source, target) of a bind mount whose source is a path (not a named volume)."""
    if isinstance(entry, dict):
        if entry.get("type", "bind") != "bind":
            return None
        source, target = entry.get("source"), entry.get("target")
        return (source, target) if isinstance(source, str) and isinstance(target, str) else None
    if not isinstance(entry, str) or ":" not in entry:
        return None
    parts = entry.split(":")
    source, target = parts[0], parts[1]
    # Short syntax: a source that is not a path (no "." or "/" in front) names a volume.
    return (source, target) if source.startswith((".", "/", "~")) else None


class _ComposeLoader(yaml.SafeLoader):
    """YAML as Compose reads it: an override file's `!reset` and `!override` tags (Compose's merge
    rules for a value a later file replaces) hold the value itself."""


def _tagged(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


for _tag in ("!reset", "!override"):
    _ComposeLoader.add_constructor(_tag, _tagged)


def parse_compose(compose_text: bytes | str) -> dict[str, Any]:
    """A compose file as plain YAML (override tags hold their value); {} when it is unreadable."""
    try:
        doc = yaml.load(compose_text, Loader=_ComposeLoader)  # a SafeLoader: no object construction
    except yaml.YAMLError:
        return {}
    return doc if isinstance(doc, dict) else {}


def references(compose_text: bytes | str) -> list[Reference]:
    """Every env_file and bind-mount source of every service that is a path inside the folder,
    in file order; an unreadable compose file has none (Compose itself reports it)."""
    services = parse_compose(compose_text).get("services")
    if not isinstance(services, dict):
        return []
    found: list[Reference] = []
    for service, spec in services.items():
        if not isinstance(spec, dict):
            continue
        for path in env_files_of(spec.get("env_file") or []):
            name = _own(path)
            if name is not None:
                found.append(Reference(name, "env_file", str(service)))
        for entry in spec.get("volumes") or []:
            got = mount_of(entry)
            name = _own(got[0]) if got else None
            if got is not None and name is not None:
                found.append(Reference(name, "mount", str(service), got[1]))
    return found


def own_files(compose_text: bytes | str, exists: Callable[[str], bool]) -> list[str]:
    """The referenced names that are regular files (`exists(name)` says so): a mounted folder
    is not copied, it is the operator's."""
    seen: list[str] = []
    for ref in references(compose_text):
        if ref.name not in seen and exists(ref.name):
            seen.append(ref.name)
    return seen
