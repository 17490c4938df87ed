"""`diff STACK`: what a switch would change in the deploy dir, secrets masked."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path

from ..config.node import Node
from ..render.masking import NONE, Secrets
from ..state.fsio import read_tree
from .prepare import switch_view


def _text(data: bytes | None, secrets: Secrets) -> list[str]:
    if data is None:
        return []
    return secrets.text(data.decode(errors="replace")).splitlines(keepends=True)


def unified(old: Mapping[str, bytes], new: Mapping[str, bytes], *, old_label: str, new_label: str,
            secrets: Secrets = NONE) -> str:
    """A unified diff of two file sets, secret values masked on both sides."""
    chunks: list[str] = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        lines = difflib.unified_diff(_text(a, secrets), _text(b, secrets),
                                     fromfile=f"{old_label}/{name}" if a is not None else "/dev/null",
                                     tofile=f"{new_label}/{name}" if b is not None else "/dev/null")
        chunk = "".join(lines)
        if chunk and not chunk.endswith("\n"):
            chunk += "\n"
        chunks.append(chunk)
    return "".join(chunks)


def diff_against_dir(deploy_dir: Path, new: Mapping[str, bytes], *, secrets: Secrets = NONE) -> str:
    old = read_tree(deploy_dir, sorted(new))
    return unified(old, new, old_label=str(deploy_dir), new_label="rendered", secrets=secrets)


def switch_files(node: Node, name: str) -> tuple[dict[str, bytes], Secrets, str | None]:
    """The files `switch name` would write (pinned image, patched files) when the image is on
    the engine, else the plain render and a remark saying so; with the secrets to mask."""
    v = switch_view(node, name)
    if v.exact:
        return v.files, v.secrets, None
    return v.files, v.secrets, "showing the plain render; not resolved: " + "; ".join(v.unresolved)
