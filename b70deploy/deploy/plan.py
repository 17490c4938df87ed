"""What one switch or rollback will do, as immutable data: built before anything stops.

A `DeployPlan` is the node facts the steps need (companions, timeouts), the
stack, the exact bytes to write and the image they are pinned to, and what preflight found.
The steps never re-read the node config or the catalogue: everything they decide on is here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ..config.node import Node
    from ..config.schema import Stack
    from ..docker.engine import ImageInfo

Kind = Literal["switch", "rollback"]


@dataclass(frozen=True)
class Timeouts:
    health: float = 720.0      # the new stack's wait for /health
    rollback: float = 720.0    # the previous stack's wait when it is brought back
    verify: float = 30.0       # how long the node may take to go idle after the drain

    @classmethod
    def of(cls, node: Node, *, health: float | None = None, rollback: float | None = None,
           verify: float = 30.0) -> Timeouts:
        t = node.config.timeouts
        return cls(health=health or t.health, rollback=rollback or t.rollback, verify=verify)


@dataclass(frozen=True)
class DeployPlan:
    kind: Kind
    stack: Stack
    files: Mapping[str, bytes]          # the deploy dir's new bytes, read-only
    image: ImageInfo
    message: str
    companions: tuple[str, ...] = ()
    timeouts: Timeouts = Timeouts()
    auto_rollback: bool = True
    restored_from: int | None = None    # a rollback: the revision whose bytes these are
    lint_errors: tuple[str, ...] = ()   # a switch: "[rule-id] message"; preflight refuses to drain when any
    warnings: tuple[str, ...] = ()
    secret_keys: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))
