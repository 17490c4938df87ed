"""What one switch or rollback will do, as immutable data: built before anything stops.

A `DeployPlan` is the node facts the steps need (companions, its waits), the
stack, the exact bytes to write and the image they are pinned to, and what preflight found.
The steps never re-read the node config or the catalogue: everything they decide on is here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from ..render.masking import NONE, Secrets

if TYPE_CHECKING:
    from ..config.node import Node
    from ..config.schema import Stack

Kind = Literal["switch", "rollback"]


@dataclass(frozen=True)
class ImageInfo:
    """An image as a plan pins it: the reference asked for and the id it named then
    (docker/engine.py `image_info` reads it from the engine)."""

    ref: str
    id: str
    repo_digest: str | None
    tags: tuple[str, ...]


def recovery(image_ref: str, image_id: str | None, repo_digest: str | None) -> str:
    """How to get a revision's gone image back: the exact image, not what its tag names now."""
    exact = (image_id or image_ref)[:19]
    if repo_digest:
        return f"docker pull {repo_digest} (the exact image {exact}; the tag {image_ref} may have moved)"
    return (f"docker load -i FILE, FILE being a `docker save` of the exact image {exact} (it was never pulled "
            f"by digest, and the tag {image_ref} may have moved)")


@dataclass(frozen=True)
class Waits:
    """How long this run waits, from the flags over the node config's `timeouts:` (config/schema.py)."""

    health: float = 720.0      # the new stack's wait for /health
    rollback: float = 720.0    # the previous stack's wait when it is brought back
    verify: float = 30.0       # how long the node may take to go idle after the drain

    @classmethod
    def of(cls, node: Node, *, health: float | None = None, rollback: float | None = None,
           verify: float = 30.0) -> Waits:
        t = node.config.timeouts
        return cls(health=health or t.health, rollback=rollback or t.rollback, verify=verify)


@dataclass(frozen=True)
class StandbyPlan:
    """Hot standby for this run (issue 24): the new stack renders with sleep mode, so it boots in its own
    slot beside the live one, which sleeps instead of stopping."""

    level: int = 1          # /sleep?level=N of the live slot (vllm/v1/worker/gpu_worker.py:160-182, 0.21.0)
    count: int = 1          # at most this many slots asleep once the run is done; the oldest stop first
    wake_slot: int | None = None  # a rollback: the slot holding the target's bytes, woken when it sleeps


@dataclass(frozen=True)
class DeployPlan:
    kind: Kind
    stack: Stack
    files: Mapping[str, bytes]          # the deploy dir's new bytes, read-only
    image: ImageInfo
    message: str
    companions: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()          # companions the stop-first drain leaves running (deploy/companions.py)
    waits: Waits = Waits()
    auto_rollback: bool = True
    restored_from: int | None = None    # a rollback: the revision whose bytes these are
    lint_errors: tuple[str, ...] = ()   # a switch: "[rule-id] message"; preflight refuses to drain when any
    warnings: tuple[str, ...] = ()
    secrets: Secrets = NONE             # masked in the dry run's diff
    platform: str | None = None         # the node's GPU platform: which crash signatures its log can carry
    standby: StandbyPlan | None = None  # hot standby (deploy/steps.py, "Hot standby"); None: stop-first
    modes: Mapping[str, int] = field(default_factory=dict)  # a rollback: the modes its revision recorded

    @property
    def stopping(self) -> tuple[str, ...]:
        """The companions the stop-first drain stops: every one it does not keep."""
        return tuple(c for c in self.companions if c not in self.kept)

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))
        object.__setattr__(self, "modes", MappingProxyType(dict(self.modes)))

