"""Durable state files: atomic replaces and whole-line appends.

`write_atomic`: temp file in the same folder, fsync, rename, fsync the folder; a reader (or
a crash) sees the old bytes or the new bytes, never a torn file. `append_jsonl`: one JSON
line per call to an append-only log (the journal, the audit log), whole and fsynced.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_mode(name: str) -> int:
    """The one mode rule for deployed and stored files: env files (`.env`, `vllm.env`, any
    `*.env`) carry secrets such as HF_TOKEN and are 0600; everything else is 0644."""
    return 0o600 if name.endswith(".env") else 0o644


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    import tempfile  # here: with what it imports (random, hashes) 4 ms of a command that only reads (history)

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)  # before any byte is written: secrets are never world-readable
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def sweep_temp(folder: Path, older_than: float) -> list[str]:
    """Remove write_atomic's `.NAME.*.tmp` files in `folder` older than `older_than` (epoch):
    what a writer killed between writing and renaming left. Returns their names."""
    gone = []
    with contextlib.suppress(FileNotFoundError):
        for p in folder.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if p.name.startswith(".") and p.name.endswith(".tmp") and p.is_file() \
                        and p.lstat().st_mtime < older_than:
                    p.unlink()
                    gone.append(p.name)
    return gone


def write_tree(root: Path, files: Mapping[str, bytes], modes: Mapping[str, int] | None = None) -> None:
    """Write each file of `files` (relative names) under `root`, each atomically, with the mode
    `modes` gives it, else `file_mode`'s."""
    for name, data in files.items():
        write_atomic(root / name, data, mode=(modes or {}).get(name, file_mode(name)))


def read_tree(root: Path, names: list[str]) -> dict[str, bytes]:
    """The current bytes of `names` under `root`; a missing file is absent from the result."""
    out: dict[str, bytes] = {}
    for name in names:
        p = root / name
        if p.is_file():
            out[name] = p.read_bytes()
    return out


def append_jsonl(path: Path, entry: Mapping[str, Any]) -> None:
    """Append `entry` as one JSON line to `path` (created 0600: logs name users and commands).

    O_APPEND plus a single write keeps concurrent writers' lines whole; the fsync makes the
    line outlive a crash, so `status` and `resume` can trust what they read back.
    """
    line = json.dumps(entry, sort_keys=True, default=str) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
