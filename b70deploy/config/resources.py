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
