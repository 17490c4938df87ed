"""Where the shipped templates, stacks and patches live.

In a wheel they are package data under b70deploy/_data; in a source checkout (editable
install, tests) they are the top-level folders next to the package.
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent.parent  # b70deploy/


def data_dir(kind: str) -> Path:
    """Return the folder of shipped `kind` ("templates", "stacks" or "patches")."""
    packaged = _PKG / "_data" / kind
    if packaged.is_dir():
        return packaged
    return _PKG.parent / kind


def is_shipped(folder: Path) -> bool:
    """Whether `folder` is the shipped data folder of that name: the package's own files, which the
    next `pip install -U` (or checkout) replaces."""
    return folder.resolve() == data_dir(folder.name).resolve()
