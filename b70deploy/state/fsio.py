"""Atomic file writes: temp file in the same folder, fsync, rename, fsync the folder.

A reader (or a crash) sees the old bytes or the new bytes, never a torn file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
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


def write_tree(root: Path, files: Mapping[str, bytes], modes: Mapping[str, int]) -> None:
    """Write each file of `files` (relative names) under `root`, each atomically."""
    for name, data in files.items():
        write_atomic(root / name, data, mode=modes.get(name, 0o644))


def read_tree(root: Path, names: list[str]) -> dict[str, bytes]:
    """The current bytes of `names` under `root`; a missing file is absent from the result."""
    out: dict[str, bytes] = {}
    for name in names:
        p = root / name
        if p.is_file():
            out[name] = p.read_bytes()
    return out
