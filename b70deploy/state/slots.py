"""The hot-standby slots as the tool recorded them (issue 35): which revision serves in each slot, and
since when each one sleeps.

The engine shows containers; only these records say which of them the tool made into a revision that
passed its checks. Recovery (resume, rollback, status) trusts them, never a guess from the engine: a
slot the records do not hold is a killed run's candidate (created, maybe half booted, maybe on the
door's network), and it is removed, never put to sleep or woken as a revision. Written atomically
(state/fsio.py) at the moments a slot changes role: the live slot put to sleep (drain), a slot serving
(commit, or a failed switch's sleeper woken back), a slot removed.

    <state_dir>/slots.json   {"slots": {"<slot>": {"revision": N, "asleep_since": epoch | null}}}
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from .fsio import write_atomic
from .revisions import DamagedRecord

FILE = "slots.json"


@dataclass(frozen=True)
class SlotRecord:
    slot: int                   # the revision whose files made the slot (its compose project P-r<slot>)
    revision: int               # the revision it serves as (a rollback's serves in its source's slot)
    asleep_since: float | None  # epoch seconds it was put to sleep; None: it serves


@dataclass(frozen=True)
class SlotBook:
    state_dir: Path

    @property
    def path(self) -> Path:
        return self.state_dir / FILE

    def exists(self) -> bool:
        return self.path.is_file()

    def read(self) -> dict[int, SlotRecord]:
        if not self.path.is_file():
            return {}
        try:
            doc = json.loads(self.path.read_text())
            return {int(k): SlotRecord(int(k), int(v["revision"]),
                                       None if v.get("asleep_since") is None else float(v["asleep_since"]))
                    for k, v in doc["slots"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise DamagedRecord(self.path, f"cannot be read ({e})",
                                fix=f"remove {self.path}: the next switch records the slots again") from None

    def _write(self, records: dict[int, SlotRecord]) -> None:
        doc = {"slots": {str(n): {"revision": r.revision, "asleep_since": r.asleep_since}
                         for n, r in sorted(records.items())}}
        write_atomic(self.path, (json.dumps(doc, indent=1) + "\n").encode())

    def serving(self, slot: int, revision: int) -> None:
        """`slot` serves as `revision`; no other slot does (the one that served before sleeps by then)."""
        records = self.read()
        records[slot] = SlotRecord(slot, revision, None)
        self._write(records)

    def asleep(self, slot: int, revision: int) -> None:
        records = self.read()
        records[slot] = SlotRecord(slot, revision, time.time())
        self._write(records)

    def drop(self, *slots: int) -> None:
        records = self.read()
        if any(s in records for s in slots):
            self._write({n: r for n, r in records.items() if n not in slots})

    def adopt(self, found: dict[int, str], current: int | None) -> None:
        """A node whose slots were made before these records: the engine's live and asleep slots are
        taken as they are (the live one as the current revision), once, so its standby is not lost."""
        now = time.time()
        records = {n: SlotRecord(n, current if state == "live" and current is not None else n,
                                 None if state == "live" else now - 1.0 / (1 + n))
                   for n, state in found.items() if state in ("live", "asleep")}
        self._write(records)

    def sleeping(self) -> list[SlotRecord]:
        """Asleep slots, the one asleep longest first."""
        return sorted((r for r in self.read().values() if r.asleep_since is not None),
                      key=lambda r: r.asleep_since or 0.0)
