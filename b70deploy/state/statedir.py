"""One object in front of the state dir: revisions, the journal, the audit log and the lock.

    <state_dir>/revisions/   immutable revisions, index.json, current
    <state_dir>/journal.jsonl every step transition of every run
    <state_dir>/audit.log    who ran which mutating command, how it ended
    <state_dir>/lock(.json)  one deploy at a time, and who holds it
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .audit import AuditLog
from .journal import Journal, RunRecord
from .lock import DeployLock
from .revisions import RevisionStore


@dataclass(frozen=True)
class StateDir:
    path: Path

    @cached_property
    def revisions(self) -> RevisionStore:
        return RevisionStore(self.path)

    @cached_property
    def journal(self) -> Journal:
        return Journal(self.path)

    @cached_property
    def audit(self) -> AuditLog:
        return AuditLog(self.path)

    def lock(self, command: str, *, wait: float = 0.0, take_stale: bool = False) -> DeployLock:
        return DeployLock(self.path, command, wait=wait, take_stale=take_stale)

    def interrupted_run(self) -> RunRecord | None:
        """The last run, if it never journaled its end (killed, or the machine went down)."""
        run = self.journal.last_run()
        return run if run is not None and not run.finished else None
