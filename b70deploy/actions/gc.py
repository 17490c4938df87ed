"""`gc`: remove what no revision needs any more, each thing with the reason it may go.

The plan is a list of items of a few kinds; `run` removes them under the deploy lock, so a
switch never records a revision while its image is being released. Kinds today:

    keep-tag   the keep tag (docker/keep.py) of a revision that was pruned; the engine
               deletes the image with it when no other tag names it and no container uses it
    cache      the warm-boot cache folder (state/caches.py) of an image no revision runs
               any more (on this host only: a remote node's folders are compose's)

A pinned or the current revision is never pruned (state/revisions.py), so its tag stays.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ..config.node import Node
from ..deploy.nodeio import NodeIO
from ..docker.keep import keep_tag
from ..docker.node import DockerNode
from ..state import caches
from ..state.statedir import StateDir
from ..ui.progress import Reporter
from .mutating import mutating

ItemKind = Literal["keep-tag", "cache"]


@dataclass(frozen=True)
class Item:
    kind: ItemKind
    name: str                  # what goes, as the operator would name it
    reason: str
    revision: int | None = None
    frees: str | None = None   # what else goes with it: the image, when nothing else names it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Removed:
    item: Item
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.item.to_dict(), "ok": self.ok, "detail": self.detail}


@dataclass
class Gc:
    node: Node
    io: NodeIO | None = None  # the production DockerNode unless a test gives a fake

    @property
    def _io(self) -> NodeIO:
        return self.io if self.io is not None else DockerNode.production(self.node)

    def plan(self) -> list[Item]:
        """What would go, and why; nothing changes."""
        return self._keep_tags(self._io) + self._caches()

    def _keep_tags(self, io: NodeIO) -> list[Item]:
        store = StateDir(self.node.state_dir).revisions
        alive = set(store.numbers())
        kept = io.kept_images()
        asleep = set(io.slots())  # a standby's image runs its sleeping container: never released
        doomed = {n: image for n, image in kept.items() if n not in alive and n not in asleep}
        # An image goes with its tag when every reference to it is a doomed keep tag.
        going = Counter(doomed.values())
        items = []
        for n, image in sorted(doomed.items()):
            refs = io.image_tags(image)
            last = len(refs) == going[image] and n == max(m for m, i in doomed.items() if i == image)
            items.append(Item("keep-tag", keep_tag(self.node.project, n), f"revision {n} was pruned", revision=n,
                              frees=image if last else None))
        return items

    def _caches(self) -> list[Item]:
        if not self.node.on_this_host:
            return []
        store = StateDir(self.node.state_dir).revisions
        needed = {caches.image_key(store.get(n).meta.image_id or "") for n in store.numbers()}
        unused = caches.plan_eviction(caches.scan(self.node.cache_dir), 0, {k for k in needed if k})
        return [Item("cache", str(self.node.cache_dir / e.key), f"no revision runs image {e.key} "
                     f"({e.size / caches.GIB:.2f} GiB)") for e in unused]

    def run(self, reporter: Reporter) -> list[Removed]:
        io = self._io
        with mutating(self.node, "gc") as m:
            items = self.plan()
            reporter.phase("gc", f"{len(items)} item(s) to remove")
            done = [self._remove(io, item, reporter) for item in items]
            m.ended("ok" if all(d.ok for d in done) else "failed", removed=[d.item.name for d in done if d.ok])
        return done

    def _remove(self, io: NodeIO, item: Item, reporter: Reporter) -> Removed:
        """One branch per ItemKind."""
        if item.kind == "cache":
            key = Path(item.name).name
            gone = caches.apply_eviction(self.node.cache_dir, [caches.Entry(key, 0, 0.0)])
            result = Removed(item, bool(gone), "cache folder removed" if gone else "kept: not a cache folder of ours")
            reporter.info(f"{item.name}: {result.detail}")
            return result
        assert item.revision is not None  # a keep-tag item always names its revision
        deleted, refused = io.release_image(item.revision)
        if refused:
            result = Removed(item, False, f"kept: {refused}")
        else:
            result = Removed(item, True, "tag and image removed" if deleted else "tag removed")
        reporter.info(f"{item.name}: {result.detail}")
        return result
