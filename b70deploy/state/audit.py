"""The append-only audit log: who ran which mutating command, when, and how it ended."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .fsio import append_jsonl
from .stamps import now_iso, whoami


class AuditLog:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "audit.log"

    def record(self, command: str, outcome: str, **fields: Any) -> None:
        append_jsonl(self.path, {"time": now_iso(), **asdict(whoami()), "command": command, "outcome": outcome,
                                 **fields})

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
