"""Parsed stack files kept between runs, each checked against its file's content hash.

The strict loader (yamlfile.py) is pure Python, a few milliseconds a file, and a catalogue
merges every parent of an `extends:` chain again for each child: 1,000 stacks took seconds.
Here each file is still read and hashed on every run (cheap), and parsed only when its hash is
not the one stored for its path, so an edited file is parsed anew whatever its mtime says.
Only documents that parsed cleanly are stored: a broken file is reported on every run.

The store is `<state_dir>/stack-cache.json` (0600: stack files may carry env values),
replaced atomically. It is written only into a state dir that already exists (a read-only
command never creates one), and a cache that cannot be read or written is simply not used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from ..state.fsio import write_atomic
from .yamlfile import parse_yaml, yaml_text

VERSION = 1
FILE_NAME = "stack-cache.json"


class DocCache:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE_NAME
        self._stored: dict[str, dict[str, Any]] | None = None  # path -> {"sha": ..., "doc": ...}
        self._new: dict[str, dict[str, Any]] = {}
        self._read: dict[str, dict[str, Any]] = {}  # path -> doc: a parent is read once per catalogue

    def read(self, path: Path) -> dict[str, Any]:
        """The YAML mapping in `path`, as yamlfile.read_yaml gives it (same errors). Callers
        must not change it: it is shared with later reads of the same file. One DocCache serves
        one catalogue operation (Node.catalogue() makes a new one), so a file is read once in it."""
        key = str(path)
        if key in self._read:
            return self._read[key]
        text = yaml_text(path)
        sha = hashlib.sha256(text.encode()).hexdigest()
        entry = self._new.get(key) or self._load().get(key)
        if entry is not None and entry["sha"] == sha:
            doc: dict[str, Any] = entry["doc"]
        else:
            doc = parse_yaml(text, path)
            if _json_exact(doc):  # YAML dates or number keys would come back changed: not kept
                self._new[key] = {"sha": sha, "doc": doc}
        self._read[key] = doc
        return doc

    def save(self) -> None:
        """Store what was parsed anew, dropping entries of files that are gone."""
        if not self._new or not self.path.parent.is_dir():
            return
        entries = {k: v for k, v in self._load().items() if Path(k).is_file()} | self._new
        with contextlib.suppress(OSError):
            write_atomic(self.path, json.dumps({"version": VERSION, "files": entries}).encode(), mode=0o600)
            self._stored, self._new = entries, {}

    def _load(self) -> dict[str, dict[str, Any]]:
        if self._stored is None:
            self._stored = {}
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(self.path.read_bytes())
                if isinstance(data, dict) and data.get("version") == VERSION and isinstance(data.get("files"), dict):
                    self._stored = {k: v for k, v in data["files"].items()
                                    if isinstance(v, dict) and isinstance(v.get("sha"), str)
                                    and isinstance(v.get("doc"), dict)}
        return self._stored


def _json_exact(doc: dict[str, Any]) -> bool:
    try:
        return bool(json.loads(json.dumps(doc)) == doc)
    except (TypeError, ValueError):
        return False
