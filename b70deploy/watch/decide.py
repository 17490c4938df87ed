"""What watch does about what it saw: looks in, acts out, no effects (tested as a table).

Inside the bake window after a switch, a failure of the switched-to revision rolls back to
the revision that was current before it, once per revision (a second failure, or a failure
of a rollback's revision, only alerts: no flapping). After the bake window, alerts only.
A container that is not the current revision's (drift) is reported and never acted on: the
failure would be someone else's container, not the revision's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

# Problem kinds, in the order an alert names them first: the one that carries the diagnosis leads.
KINDS = ("fatal-log", "died", "restart-loop", "down", "unhealthy", "smoke", "error-rate")


@dataclass(frozen=True)
class Subject:
    """The current revision, as far as watch cares."""

    revision: int
    stack: str
    kind: str                     # switch, rollback, adopt
    parent: int | None            # the revision current before it: the rollback target
    parent_healthy: bool
    committed_at: float | None    # epoch seconds its run committed it (None: unknown)
    bake_seconds: float


@dataclass(frozen=True)
class Problem:
    kind: str
    detail: str
    diagnosis: str | None = None


@dataclass(frozen=True)
class Look:
    at: float                                 # epoch seconds
    subject: Subject | None
    busy: str | None = None                   # why not to look now (a deploy holds the lock, a drain)
    problems: tuple[Problem, ...] = ()
    drift: tuple[str, ...] = ()


@dataclass(frozen=True)
class Act:
    what: Literal["rollback", "alert", "drift", "note"]
    revision: int | None
    text: str
    key: str                                  # said once per (revision, key)
    to: int | None = None                     # rollback: the target revision
    diagnosis: str | None = None


@dataclass(frozen=True)
class Memory:
    rolled_back: frozenset[int] = frozenset()           # kept in the state dir (watch/memory.py)
    said: frozenset[tuple[int, str]] = frozenset()      # this process's alerts, not repeated


def in_bake(look: Look) -> bool:
    s = look.subject
    return s is not None and s.committed_at is not None and look.at - s.committed_at < s.bake_seconds


def why_not_act(look: Look, memory: Memory) -> str | None:
    """None when a failure now rolls back; else why it only alerts."""
    s = look.subject
    assert s is not None
    if not in_bake(look):
        return f"after the {s.bake_seconds:g} s bake window: not acting"
    if s.revision in memory.rolled_back:
        return "watch rolled this revision back once already: not acting again"
    if s.kind != "switch":
        return f"revision {s.revision} is a {s.kind}, not a switch: not acting"
    if s.parent is None or not s.parent_healthy:
        return "no healthy previous revision to return to: not acting"
    return None


def decide(look: Look, memory: Memory) -> list[Act]:
    s = look.subject
    rev = s.revision if s is not None else 0
    if look.busy is not None:
        acts = [Act("note", s.revision if s else None, f"{look.busy}: not looking", key=f"busy:{look.busy}")]
    elif s is None:
        acts = []
    elif look.drift:
        acts = [Act("drift", rev, d, key=f"drift:{d}") for d in look.drift]
    elif not look.problems:
        acts = []
    else:
        problems = sorted(look.problems, key=lambda p: KINDS.index(p.kind) if p.kind in KINDS else len(KINDS))
        diagnosis = next((p.diagnosis for p in problems if p.diagnosis), None)
        reason = why_not_act(look, memory)
        if reason is None:
            acts = [Act("rollback", rev, "; ".join(p.detail for p in problems), key="rollback", to=s.parent,
                        diagnosis=diagnosis)]
        else:
            acts = [Act("alert", rev, f"{p.detail} ({reason})", key=f"alert:{p.kind}", diagnosis=diagnosis)
                    for p in problems]
    return [a for a in acts if (rev, a.key) not in memory.said]


def remember(memory: Memory, acts: list[Act]) -> Memory:
    """The memory after `acts` were carried out (a rollback counts once it is started)."""
    said = memory.said | {(a.revision or 0, a.key) for a in acts}
    rolled = memory.rolled_back | {a.revision for a in acts if a.what == "rollback" and a.revision is not None}
    return replace(memory, said=frozenset(said), rolled_back=frozenset(rolled))
