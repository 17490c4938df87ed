"""What watch must remember across its own restarts: the revisions it already rolled back
(at most once each), in <state_dir>/watch.json, replaced atomically."""

from __future__ import annotations

import json
from pathlib import Path

from ..state.fsio import write_atomic


def path_of(state_dir: Path) -> Path:
    return state_dir / "watch.json"


def rolled_back(state_dir: Path) -> frozenset[int]:
    try:
        data = json.loads(path_of(state_dir).read_text())
        return frozenset(int(n) for n in data.get("rolled_back", []))
    except (FileNotFoundError, json.JSONDecodeError, TypeError, ValueError, AttributeError):
        return frozenset()


def save_rolled_back(state_dir: Path, revisions: frozenset[int]) -> None:
    write_atomic(path_of(state_dir), (json.dumps({"rolled_back": sorted(revisions)}) + "\n").encode(), mode=0o644)
