"""`diff STACK`: what a switch would change in the deploy dir, secrets masked."""

from __future__ import annotations

import contextlib
import difflib
import stat
from collections.abc import Collection, Mapping
from pathlib import Path

from ..config.node import Node
from ..deploy.deploydir import strays
from ..render.masking import NONE, Secrets, mask_bytes, opaque
from ..state.fsio import read_tree
from ..ui.notice import node_secrets
from .prepare import switch_view


def _text(data: bytes | None, secrets: Secrets, whole: bool = False) -> list[str]:
    if data is None:
        return []
    if whole:
        return [mask_bytes(data) + "\n"]
    return secrets.text(data.decode(errors="replace")).splitlines(keepends=True)


def unified(old: Mapping[str, bytes], new: Mapping[str, bytes], *, old_label: str, new_label: str,
            secrets: Secrets = NONE, hidden: Collection[str] = ()) -> str:
    """A unified diff of two file sets, secret values masked on both sides; each file of `hidden`
    (render.masking.opaque: an operator's private key) one fingerprint line, never its text."""
    chunks: list[str] = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        whole = name in hidden
        lines = difflib.unified_diff(_text(a, secrets, whole), _text(b, secrets, whole),
                                     fromfile=f"{old_label}/{name}" if a is not None else "/dev/null",
                                     tofile=f"{new_label}/{name}" if b is not None else "/dev/null")
        chunk = "".join(lines)
        if chunk and not chunk.endswith("\n"):
            chunk += "\n"
        chunks.append(chunk)
    return "".join(chunks)


def diff_against_dir(deploy_dir: Path, new: Mapping[str, bytes], *, secrets: Secrets = NONE) -> str:
    old = read_tree(deploy_dir, sorted(new))
    return unified(old, new, old_label=str(deploy_dir), new_label="rendered", secrets=secrets,
                   hidden=opaque(tree_modes(deploy_dir, sorted(old))))


def as_written(deploy_dir: Path, files: Mapping[str, bytes], compose_files: Collection[str],
               recorded: Collection[str]) -> tuple[dict[str, bytes], list[str]]:
    """A dry run's view of the deploy dir: the bytes a write of `files` replaces or removes (deploy/
    deploydir.strays, the rule the write itself follows), and the files of the current revision
    (`recorded`) it leaves as they are: the operator's bound files a rendered stack no longer reads."""
    gone = strays(deploy_dir, files, tuple(compose_files))
    kept = sorted(n for n in recorded if n not in files and n not in gone and (deploy_dir / n).is_file())
    return read_tree(deploy_dir, sorted(set(files) | set(gone))), kept


def kept_line(kept: Collection[str]) -> list[str]:
    if not kept:
        return []
    return [f"  kept as they are (files of yours it no longer reads, left unmanaged): {', '.join(kept)}"]


def tree_modes(root: Path, names: Collection[str]) -> dict[str, int]:
    """The mode of each of `names` under `root` that is there."""
    out = {}
    for name in names:
        with contextlib.suppress(OSError):
            out[name] = stat.S_IMODE((root / name).stat().st_mode)
    return out


def switch_files(node: Node, name: str) -> tuple[dict[str, bytes], Secrets, str | None]:
    """The files `switch name` would write (pinned image, patched files) when the image is on
    the engine, else the plain render and a remark saying so; with the secrets to mask."""
    v = switch_view(node, name)
    secrets = v.secrets | node_secrets(node)
    if v.exact:
        return v.files, secrets, None
    return v.files, secrets, "showing the plain render; not resolved: " + "; ".join(v.unresolved)
