"""A stack's `compose:` keys merged into the rendered vllm service (pure: text in, text out).

The last step of render/files.py's render. Keys the template does not write are added; a key
it writes is merged: a list gains the stack's entries it lacks (devices, cap_add), a mapping
gains the stack's keys (environment; a key both set to different values is refused), a scalar
is the stack's (ipc, shm_size). Which keys may come here at all is config/compose_keys.py's
rule. The node's `networks:` become the project's top-level networks, so a service may join
them (a static address). The operator's `labels` (a Traefik router's) are written under the
template's own, one line each: the tool's `b70deploy.*` lines stay as they are, and a label holding
a secret in clear is refused (the compose file is 0644): it is written `${NAME}`, its value in the
0600 .env.

The rendered text is edited, not re-dumped: its comments, quoting and the label lines other
code reads stay byte for byte; each merged key is one line of JSON (valid YAML flow). Values
are Compose's text: `${VAR}` is interpolated from the deploy dir's .env, a literal `$` is `$$`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from ..config.compose_keys import label_map
from ..errors import UserError
from .masking import is_reference, is_secret

INDENT = "    "  # a key of a service in the template


def _merged(key: str, mine: Any, theirs: Any, where: str) -> Any:
    """The template's value `mine` with the stack's `theirs` (see the module docstring)."""
    if key == "networks" and isinstance(mine, dict):
        # Naming a service's networks names whether it is on `default`: the operator's list or map says,
        # and the template's own networks beside it stay.
        theirs = dict.fromkeys(theirs) if isinstance(theirs, list) else theirs
        mine = {k: v for k, v in mine.items() if k != "default"}
    if isinstance(mine, list) and isinstance(theirs, list):
        return mine + [v for v in theirs if v not in mine]
    if isinstance(mine, dict) and isinstance(theirs, dict):
        clash = next((k for k in theirs if k in mine and mine[k] != theirs[k]), None)
        if clash is not None:
            raise UserError(f"compose.{key}.{clash} is {theirs[clash]!r}, but b70deploy renders {mine[clash]!r}",
                            where=where, fix=f"drop {clash} from compose.{key} (b70deploy sets it)")
        return {**mine, **theirs}
    return theirs


def _env_map(value: Any) -> Any:
    """A list-form environment (KEY=value entries) as a mapping, so it merges with the template's."""
    if isinstance(value, list):
        return {k: v for k, _, v in (str(e).partition("=") for e in value)}
    return value


def _service_block(lines: list[str], service: str) -> tuple[int, int]:
    """The [start, end) line range of the service's keys (after its `  NAME:` line)."""
    start = lines.index(f"  {service}:\n") + 1
    end = start
    while end < len(lines) and (lines[end].startswith(INDENT) or not lines[end].strip()):
        end += 1
    return start, end


def _without_key(lines: list[str], key: str) -> tuple[list[str], list[str]]:
    """The service's lines without `key` and its nested lines; and the comment lines just above it,
    all of them (a comment of two lines lost only its last: the rest was left cut mid-sentence above
    the next key, issue 39), to stand above the merged key."""
    out: list[str] = []
    comment: list[str] = []
    skipping = False
    for line in lines:
        if line.startswith(f"{INDENT}{key}:"):
            skipping = True
            while out and out[-1].startswith(f"{INDENT}#"):
                comment.insert(0, out.pop())
            continue
        if skipping and line.startswith(INDENT + " "):
            continue
        skipping = False
        out.append(line)
    return out, comment


def _with_labels(block: list[str], labels: dict[str, str], where: str) -> list[str]:
    """The service's lines with the operator's labels after the template's own (its `labels:` block)."""
    clear = next((k for k, v in labels.items() if v and is_secret(k) and not is_reference(v)), None)
    if clear is not None:
        raise UserError(f"compose.labels.{clear} holds a secret in clear, and others may read the compose file",
                        where=where, fix="write it as ${NAME} and give NAME in the node config's variables: "
                        "(a companion's: its variables:), which a switch writes into the 0600 .env")
    at = block.index(f"{INDENT}labels:\n") + 1
    while at < len(block) and block[at].startswith(INDENT + " "):
        at += 1
    lines = [f"{INDENT}  {json.dumps(k, ensure_ascii=True)}: {json.dumps(v, ensure_ascii=True)}\n"
             for k, v in labels.items()]
    return block[:at] + lines + block[at:]


def _dark(service: dict[str, Any], networks: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """For a second project beside production: no static address (two containers cannot hold one)
    and no address pool of a project network (the dark copy of the network would overlap it)."""
    nets = service.get("networks")
    if isinstance(nets, dict):
        nets = {n: ({k: v for k, v in (c or {}).items() if k not in ("ipv4_address", "ipv6_address")} or None)
                if isinstance(c, dict) or c is None else c for n, c in nets.items()}
        service = {**service, "networks": nets}
    return service, {n: ({k: v for k, v in d.items() if k != "ipam"} if isinstance(d, dict) and not d.get("external")
                         else d) for n, d in networks.items()}


def merge(text: str, compose: Mapping[str, Any], *, service: str = "vllm", networks: Mapping[str, Any] | None = None,
          dark: bool = False, where: str = "stack compose") -> tuple[str, list[str]]:
    """The rendered compose text with the stack's `compose:` keys merged into `service` and the
    node's `networks` at the top level; and notes. `dark`: rendered for the dark project."""
    extra, nets = dict(compose), dict(networks or {})
    if not extra and not nets:
        return text, []
    env = _env_map(extra.get("environment"))
    secret = next((k for k in env or {} if is_secret(k)), None)
    if secret is not None:
        raise UserError(f"compose.environment.{secret} looks like a secret, and a stack file is printed", where=where,
                        fix="put it in the node's secrets_env_file (0600), which every render adds")
    notes: list[str] = []
    labels = label_map(extra.pop("labels", None) or {})
    if dark and labels:  # a router's labels on the dark project would send production's clients to it
        notes.append("dark project: the operator's labels left out (a router would send production's clients to it)")
        labels = {}
    if dark:
        kept = _dark(extra, nets)
        if kept != (extra, nets):
            notes.append("dark project: static addresses and network address pools left out (production holds them)")
        extra, nets = kept
    doc = yaml.safe_load(text)
    rendered = doc["services"][service]
    lines = text.splitlines(keepends=True)
    start, end = _service_block(lines, service)
    block = lines[start:end]
    tail: list[str] = []
    while block and not block[-1].strip():
        tail.insert(0, block.pop())
    if labels:
        block = _with_labels(block, labels, where)
    for key, value in extra.items():
        if key == "environment":
            value = env
        if key in rendered:
            value = _merged(key, _env_map(rendered[key]) if key == "environment" else rendered[key], value, where)
            block, comment = _without_key(block, key)
            block += comment
        block.append(f"{INDENT}{key}: {json.dumps(value, ensure_ascii=True)}\n")
    out = lines[:start] + block + tail + lines[end:]
    if nets:
        if "networks" in doc:
            raise UserError("the rendered compose file has top-level networks already", where=where,
                            fix="give the project's networks once, in the node config's networks:")
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        out.append(f"networks: {json.dumps(nets, ensure_ascii=True)}\n")
    return "".join(out), notes
