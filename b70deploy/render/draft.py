"""The EAGLE draft fix: a copy of the draft whose config.json allows more positions.

vLLM takes a draft's length from its own config.json (the smallest of the length keys);
past it, drafting stops and acceptance is zero (the post's draft said 2048). The fix is one
field in a copy: weights are hard-linked (no extra space, original untouched), config.json
is a new file, and the copy appears under its final name in one rename.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import OperationError, UserError
from ..state.fsio import fsync_dir
from .vllm_args import container_model_path

if TYPE_CHECKING:
    from ..config.schema import Stack

FIELD = "max_position_embeddings"
# Keys vLLM reads for a model's length (smallest wins); rope scaling aside.
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
               "model_max_length", "max_seq_length")


def read_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError("no config.json", where=str(model_dir), fix="point at a model folder") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"config.json is not readable JSON: {e}", where=str(path), fix="repair the file") from None
    if not isinstance(data, dict):
        raise UserError("config.json is not a JSON object", where=str(path), fix="repair the file")
    return data


def length_limit(config: dict[str, Any]) -> tuple[str, int] | None:
    """(key, value) of the smallest length key in a config (and its text_config), or None."""
    found: list[tuple[int, str]] = []
    for scope, cfg in (("", config), ("text_config.", config.get("text_config"))):
        if not isinstance(cfg, dict):
            continue
        for key in LENGTH_KEYS:
            v = cfg.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                found.append((v, scope + key))
    if not found:
        return None
    v, key = min(found)
    return key, v


def copy_name(draft_rel: str, n: int) -> str:
    return f"{draft_rel.rstrip('/')}.b70-mpe{n}"


_COPY = re.compile(r"^(?P<draft>.+)\.b70-mpe(?P<n>[1-9][0-9]{0,7})$")


def stack_copy(stack: Stack) -> str | None:
    """The draft copy `stack` serves, relative to the models dir: None when it asks for none
    (no draft, or no max_position_embeddings to raise). The one place its path is made: the
    command (served_draft_path), the switch's copy and page-cache read, and `render`'s note."""
    spec = stack.speculative
    if spec is None or not spec.model or spec.draft_max_position_embeddings is None:
        return None
    return copy_name(spec.model, spec.draft_max_position_embeddings)


def served_draft_path(stack: Stack, root: str) -> str | None:
    """The container path of the draft the switch will serve (the fixed copy, if one is asked
    for), below `root`, the node's models_target."""
    rel = stack_copy(stack)
    return container_model_path(rel, root) if rel is not None else None


def copy_origin(name: str) -> tuple[str, int] | None:
    """The inverse of copy_name: (draft_rel, n) for a copy's name, else None."""
    m = _COPY.match(name)
    return (m.group("draft"), int(m.group("n"))) if m else None


def _edit_config(text: str, n: int) -> str:
    """Change only the one value, keeping the file's formatting when the key occurs once."""
    pat = re.compile(rf'("{FIELD}"\s*:\s*)(-?\d+)')
    if len(pat.findall(text)) == 1:
        return pat.sub(lambda m: f"{m.group(1)}{n}", text)
    data = json.loads(text)
    data[FIELD] = n
    return json.dumps(data, indent=2) + "\n"


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)  # another filesystem, or links not allowed: a real copy


def _is_current(copy: Path, src: Path, n: int) -> bool:
    try:
        cfg = read_config(copy)
    except UserError:
        return False
    if cfg.get(FIELD) != n:
        return False
    for entry in src.rglob("*"):
        if entry.is_file() and entry.name != "config.json":
            other = copy / entry.relative_to(src)
            if not other.is_file() or other.stat().st_size != entry.stat().st_size:
                return False
    return True


def make_draft_copy(src: Path, dest: Path, n: int) -> bool:
    """Write `dest`: `src` with config.json's max_position_embeddings set to `n`.

    Idempotent: returns False when `dest` already is that copy. Atomic: built beside `dest`
    and renamed into place; a stale `dest` is replaced.
    """
    if not src.is_dir():
        raise UserError("draft folder not found", where=str(src), fix="check speculative.model and models_dir")
    text = (src / "config.json").read_text(encoding="utf-8") if (src / "config.json").is_file() else None
    if text is None:
        raise UserError("draft has no config.json", where=str(src), fix="point at the EAGLE draft's folder")
    read_config(src)  # readable JSON object, or a UserError naming the file
    if dest.is_dir() and _is_current(dest, src, n):
        return False
    try:
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp"))
    except OSError as e:
        raise OperationError(f"cannot write the draft copy beside {dest}: {e.strerror or e}",
                             fix=f"make {dest.parent} writable and check its free space") from None
    try:
        for entry in sorted(src.rglob("*")):
            rel = entry.relative_to(src)
            target = tmp / rel
            if entry.is_dir():
                target.mkdir(exist_ok=True)
            elif rel.as_posix() != "config.json":
                target.parent.mkdir(parents=True, exist_ok=True)
                _link_or_copy(entry, target)
        (tmp / "config.json").write_text(_edit_config(text, n), encoding="utf-8")
        os.chmod(tmp, 0o755)
        old: Path | None = None
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            os.rename(dest, old)
        os.rename(tmp, dest)
        fsync_dir(dest.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
        raise
    return True


def ensure_draft_copy(models_dir: Path, draft_rel: str, n: int) -> str:
    """The switch's entry point: the copy's path relative to `models_dir` (made if needed)."""
    rel = copy_name(draft_rel, n)
    make_draft_copy(models_dir / draft_rel, models_dir / rel, n)
    return rel
