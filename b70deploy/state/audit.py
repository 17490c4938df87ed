"""The append-only audit log: who ran which mutating command, when, and how it ended."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .stamps import now_iso, whoami


class AuditLog:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "audit.log"

    def record(self, command: str, outcome: str, **fields: Any) -> None:
        entry = {"time": now_iso(), **asdict(whoami()), "command": command, "outcome": outcome, **fields}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(entry, sort_keys=True, default=str) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def entries(self, last: int | None = None) -> list[dict[str, Any]]:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out[-last:] if last else out
