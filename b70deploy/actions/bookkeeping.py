"""The state dir's small changes: pin, unpin, prune (and what it would delete), unlock. Each goes through the mutating
wrapper (the lock, one audit line); like `history`, they import no switch machinery."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .mutating import mutating

if TYPE_CHECKING:
    from ..config.node import Node
    from ..state.lock import Holder


def set_pin(node: Node, number: int, pinned: bool) -> None:
    """`pin` / `unpin`: a pinned revision is never pruned."""
    with mutating(node, "pin" if pinned else "unpin", wait=10.0) as m:
        m.state.revisions.update_status(number, pinned=pinned)
        m.ended("ok", revision=number)


def prune_plan(node: Node, keep: int | None, *, force: bool = False) -> tuple[list[int], dict[int, str]]:
    """What prune would delete, and the old revisions it keeps with why (changes nothing)."""
    from ..state.revisions import RevisionStore

    return RevisionStore(node.state_dir).prune_plan(keep or node.config.keep_revisions, force=force,
                                                    asleep=_asleep(node))


def _asleep(node: Node) -> set[int]:
    """The revisions whose hot-standby slots are on the node (never pruned: a rollback wakes them)."""
    from .inspect import standbys

    return {int(s["slot"]) for s in standbys(node) if s.get("slot") is not None}


def prune(node: Node, keep: int | None, *, force: bool = False) -> list[int]:
    """Delete old revisions, keeping the newest `keep`, every pinned one and the current one
    (and, unless `force`, the newest adopted revision and unproven imports)."""
    with mutating(node, "prune", wait=10.0) as m:
        gone = m.state.revisions.prune(keep or node.config.keep_revisions, force=force, asleep=_asleep(node))
        m.ended("ok", removed=gone)
    return gone


def unlock(node: Node) -> Holder | None:
    """Clear a stale lock left by a killed run: taking it over is clearing it (refused, LockBusy,
    while its process runs)."""
    with mutating(node, "unlock", take_stale=True) as m:
        held = m.lock.taken_over
        m.ended("ok", cleared=held.describe() if held else None)
    return held
