"""Planning a rolling switch over an inventory: batches, timeouts, expected duration.

Pure: no Docker, no HTTP. The nodes of one batch switch at the same time (one thread each)
and the next batch starts only when every node of this one has passed its health and smoke
gate, so at most K nodes are out of the router's pool at any moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

# With no boot on record: what a node is assumed to take. The post's cold boots are 231 s
# (W4A16) to 450 s (TurboQuant), so the plan says "assumed" rather than guessing low.
ASSUMED_BOOT = 300.0
# Drain, verify, compose up, smoke: seconds around the boot when no run is on record.
ASSUMED_OVERHEAD = 15.0


def batches(items: Sequence[T], k: int) -> list[list[T]]:
    """Consecutive groups of at most `k`, in the given order."""
    if k < 1:
        raise ValueError("max-unavailable must be at least 1")
    return [list(items[i:i + k]) for i in range(0, len(items), k)]


@dataclass(frozen=True)
class NodePlan:
    name: str
    endpoint: str
    address: str
    port: int
    current: str                 # e.g. "rev 3 (alpha)" or "nothing deployed"
    expected: float              # seconds this node is expected to be out of the pool
    basis: str                   # where `expected` comes from
    health_timeout: float
    rollback_timeout: float

    @property
    def worst(self) -> float:
        """Out of the pool at most this long: a boot that times out, then the rollback's boot."""
        return self.health_timeout + self.rollback_timeout + ASSUMED_OVERHEAD


def expected_from(last: dict[str, Any] | None) -> tuple[float, str]:
    """Expected time out of the pool from the node's last deployed revision (its step timings
    or its time to healthy), else the assumption."""
    if last:
        timings = last.get("timings") or {}
        out_steps = [v for k, v in timings.items() if k in ("drain", "verify", "activate", "wait-healthy", "check")]
        number = last.get("number")
        if out_steps:
            return round(sum(float(v) for v in out_steps), 2), f"last run (rev {number})"
        tth = (last.get("facts") or {}).get("time_to_healthy")
        if isinstance(tth, int | float):
            return round(float(tth) + ASSUMED_OVERHEAD, 2), f"last boot (rev {number}) + {ASSUMED_OVERHEAD:.0f} s"
    return ASSUMED_BOOT + ASSUMED_OVERHEAD, "no boot on record: assumed"


@dataclass(frozen=True)
class RolloutPlan:
    action: str                  # "switch eagle3", "rollback"
    nodes: list[NodePlan]
    max_unavailable: int
    pause: float
    rollback_all_on_failure: bool

    @property
    def batches(self) -> list[list[NodePlan]]:
        return batches(self.nodes, self.max_unavailable)

    @property
    def expected_seconds(self) -> float:
        """Batches in turn, each as long as its slowest node, with the pauses between."""
        b = self.batches
        return round(sum(max(n.expected for n in batch) for batch in b) + self.pause * max(len(b) - 1, 0), 2)

    @property
    def worst_seconds(self) -> float:
        """Every node of the first batch hits its timeouts; nothing after it starts."""
        return max((n.worst for n in self.batches[0]), default=0.0)

    def lines(self) -> list[str]:
        k, n = self.max_unavailable, len(self.nodes)
        out = [f"{self.action} over {n} node(s) in {len(self.batches)} batch(es) of at most {k}: "
               f"at least {max(n - k, 0)} of {n} stay in the pool",
               f"  expected {_clock(self.expected_seconds)} (from each node's last run), pause {self.pause:g} s "
               "between batches; stop at the first failure: that node rolls back, later nodes are untouched, "
               + ("earlier nodes are rolled back too" if self.rollback_all_on_failure
                  else "earlier nodes stay on the new revision")]
        for i, batch in enumerate(self.batches, 1):
            out.append(f"  batch {i}: {', '.join(p.name for p in batch)}")
            for p in batch:
                out.append(f"    {p.name:<12} {p.endpoint:<32} {p.address}:{p.port:<6} now {p.current:<22} "
                           f"expected {p.expected:7.1f} s ({p.basis}); timeouts health {p.health_timeout:g} s, "
                           f"rollback {p.rollback_timeout:g} s")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "max_unavailable": self.max_unavailable, "pause": self.pause,
                "rollback_all_on_failure": self.rollback_all_on_failure,
                "expected_seconds": self.expected_seconds, "worst_first_batch_seconds": self.worst_seconds,
                "batches": [[p.name for p in b] for b in self.batches],
                "nodes": [{"name": p.name, "endpoint": p.endpoint, "address": p.address, "port": p.port,
                           "current": p.current, "expected_seconds": p.expected, "basis": p.basis,
                           "health_timeout": p.health_timeout, "rollback_timeout": p.rollback_timeout}
                          for p in self.nodes]}


def _clock(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
