"""`gc`: remove what no revision needs any more, each thing with the reason it may go.

The plan is a list of items of a few kinds; `run` removes them under the deploy lock, so a
switch never records a revision while its image is being released. Kinds today:

    keep-tag   a keep tag (docker/keep.py: one per image, or one of the former per-revision
               ones) of an image no revision left runs (theirs were pruned); the engine deletes
               the image with its last tag when no container uses it
    cache      the warm-boot cache folder (state/caches.py) of an image no revision runs
               any more (on this host only: a remote node's folders are compose's)

A pinned or the current revision is never pruned (state/revisions.py), so its image's tag stays.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ..config.node import Node
from ..deploy.nodeio import NodeIO
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
    image: str | None = None   # the image a keep tag names
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
        # Every revision left (a sleeping standby's included: prune keeps those) keeps its image's tag;
        # read from the index, so a damaged record elsewhere does not stop gc.
        needed = set(StateDir(self.node.state_dir).revisions.summaries().column("image_id"))
        kept = io.kept_images()
        ours: dict[str, list[str]] = {}  # image -> its tags of ours, in the order they go
        for tag, image in sorted(kept.items()):
            ours.setdefault(image, []).append(tag)
        items = []
        for tag, image in sorted(kept.items()):
            if image in needed:
                continue
            last = tag == ours[image][-1] and set(io.image_tags(image)) == set(ours[image])
            items.append(Item("keep-tag", tag, "no revision left runs its image", image=image,
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
        deleted, refused = io.release_tag(item.name)
        if refused:
            result = Removed(item, False, f"kept: {refused}")
        else:
            result = Removed(item, True, "tag and image removed" if deleted else "tag removed")
        reporter.info(f"{item.name}: {result.detail}")
        return result
