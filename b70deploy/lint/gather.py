"""Collect what the lint rules read: a stack's render as docker/produce.py made it (the one
producer of deploy files, with the engine's facts), plus what lint reads from the node's folders
itself (the models dir, a previous boot's KV measurement in the state dir).

Without Docker the producer skips the engine's facts and says so in `ctx.skipped`; the Docker
SDK is then not even imported (`lint --all --no-docker` over 1,000 stacks starts without it).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..config.node import Node
from ..config.schema import Stack
from ..docker.produce import Produced, produce
from ..errors import B70Error, UserError
from ..render.standby import standby_of
from ..state.revisions import Revision, RevisionStore
from ..vllmlog.bootlog import parse_boot_facts
from . import Finding, LintContext, lint_stack
from .findings import STACK_INVALID
from .kv import MeasuredKV


def _memory_key(doc: dict[str, Any]) -> tuple[Any, ...]:
    """What moves the memory vLLM leaves for KV, for one model on one node."""
    spec = doc.get("speculative") or {}
    model = doc.get("model") or {}
    return (model.get("path"), spec.get("model") if isinstance(spec, dict) else None,
            bool(doc.get("enforce_eager")), doc.get("gpu_memory_utilization"))


class _Shelf:
    """Some revisions, read newest first, each at most once, grouped by `_memory_key`."""

    def __init__(self, numbers: list[int]) -> None:
        self.unread = numbers  # oldest first: the newest is popped
        self.by_key: dict[tuple[Any, ...], list[Revision]] = {}


class RevisionMemory:
    """The revisions that may hold a stack's KV measurement, for a lint of many stacks: the
    index (one file) picks those of the stack's image, and of these each revision's meta.json
    is read at most once, newest first, grouped by memory key. A lint of 1,000 stacks over
    10,000 revisions then reads each revision of a linted image once (not once per stack),
    and a single preflight still stops at the newest match."""

    def __init__(self, store: RevisionStore) -> None:
        self.store = store
        self._entries: list[dict[str, Any]] | None = None
        self._shelves: dict[tuple[str, str | None], _Shelf] = {}

    def newest(self, key: tuple[Any, ...], image_ref: str, image_id: str | None) -> Iterator[Revision]:
        """The revisions of the image (by id when both know it, else by reference, as
        measured_kv compares them) whose stack has memory key `key`, newest first."""
        shelf = self._shelf(image_ref, image_id)
        yield from list(shelf.by_key.get(key, []))  # all newer than any revision not read yet
        while shelf.unread:
            try:
                rev = self.store.get(shelf.unread.pop())
            except (B70Error, OSError, ValueError, KeyError, TypeError):
                continue
            doc = rev.meta.stack_doc
            if not isinstance(doc, dict):
                continue
            own = _memory_key(doc)
            shelf.by_key.setdefault(own, []).append(rev)
            if own == key:
                yield rev

    def _shelf(self, image_ref: str, image_id: str | None) -> _Shelf:
        if (image_ref, image_id) not in self._shelves:
            if self._entries is None:
                self._entries = self.store.index()
            self._shelves[image_ref, image_id] = _Shelf([int(e["number"]) for e in self._entries
                                                         if _same_image(e, image_ref, image_id)])
        return self._shelves[image_ref, image_id]


def _same_image(entry: dict[str, Any], image_ref: str, image_id: str | None) -> bool:
    """By id when Docker told us the stack's and the revision recorded one, else by reference."""
    if image_id and entry.get("image_id"):
        return bool(entry["image_id"] == image_id)
    return bool(entry.get("image_ref") == image_ref)


def measured_kv(node: Node, stack: Stack, image_id: str | None = None,
                memory: RevisionMemory | None = None) -> MeasuredKV | None:
    """The newest revision that booted this stack's model, draft and image (by id when Docker
    told us it, else by reference) with the same enforce-eager and memory share, and recorded
    its KV memory: in its facts, or in its saved log when vLLM refused to start. `memory`
    shares the revisions read between the stacks of one lint."""
    store = RevisionStore(node.state_dir)
    want = _memory_key(stack.model_dump(mode="json"))
    for rev in (memory or RevisionMemory(store)).newest(want, stack.image, image_id):
        doc = rev.meta.stack_doc
        assert isinstance(doc, dict)  # RevisionMemory keeps only revisions that recorded their stack
        facts = rev.status.facts
        gib, tokens = facts.get("available_kv_gib"), facts.get("kv_cache_tokens")
        if gib is None and tokens is None:
            try:
                logged = parse_boot_facts(store.log_path(rev.number).read_text(errors="replace").splitlines())
            except OSError:
                continue
            gib, tokens = logged.available_kv_gib, logged.kv_cache_tokens
        if isinstance(gib, (int, float)) or isinstance(tokens, int):
            return MeasuredKV(revision=rev.number, available_kv_gib=float(gib) if isinstance(gib, (int, float))
                              else None, kv_cache_tokens=tokens if isinstance(tokens, int) else None,
                              kv_cache_dtype=str(doc.get("kv_cache_dtype", "auto")))
    return None


def _standby_memory(node: Node, stack: Stack, models_dir: Path | None) -> tuple[int | None, int | None]:
    """(host RAM available, the weights' size) for a stack that may sleep at level 1; a node with the door
    (which standby needs) is this host, where /proc/meminfo and the models folder are."""
    level = standby_of(stack, node)
    if not level.sleeps or level.level != 1 or not node.on_this_host:
        return None, None
    host = None
    with contextlib.suppress(OSError, ValueError):
        meminfo = Path("/proc/meminfo").read_text()
        m = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo, re.MULTILINE)
        host = int(m.group(1)) * 1024 if m else None
    folder = models_dir / stack.model.path if models_dir is not None and not stack.model.hub else None
    weights = None
    if folder is not None and folder.is_dir():
        weights = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    return host, weights


def build_context(produced: Produced, *, memory: RevisionMemory | None = None) -> LintContext:
    """What the rules read: the render a deployment would write and the engine's facts
    (docker/produce.py made both), and what lint itself reads from the node's folders (the
    models dir, a previous boot's KV measurement)."""
    node, stack = produced.node, produced.stack
    skipped = list(produced.skipped)
    models_dir: Path | None = node.models_dir if node.models_dir.is_dir() else None
    # On this host an absent models folder is an error (models-dir-missing): the switch would stop
    # the old stack for a bind the engine refuses. On a remote node it is not ours to see.
    missing = node.models_dir if models_dir is None and node.on_this_host else None
    if models_dir is None and missing is None:
        skipped.insert(0, f"models_dir {node.models_dir} not found: model and draft file checks skipped")
    skipped += [f"lint.ignore {rule}: {why}" for rule, why in stack.lint.ignore.items()]
    image = produced.image
    host, weights = _standby_memory(node, stack, models_dir)
    return LintContext(node=node, stack=stack, rendered=produced.rendered, models_dir=models_dir,
                       host_available=host, weights_bytes=weights,
                       models_dir_missing=missing, image=image, image_error=produced.image_error,
                       compose_config=produced.compose_config, compose_error=produced.compose_error,
                       patch_errors=dict(produced.patch_errors), patched=list(produced.patched),
                       patches_upstream=list(produced.patches_upstream), port_owner=produced.port_owner,
                       subnet_owner=produced.subnet_owner,
                       gpu_missing=list(produced.gpu_missing), skipped=skipped,
                       measured_kv=measured_kv(node, stack, image.id if image else None, memory))


def context(node: Node, stack: Stack, *, docker: bool = True, check_port: bool = True,
            memory: RevisionMemory | None = None) -> LintContext:
    """The context for one stack as `lint` sees it: produced as a switch would, then read."""
    return build_context(produce(node, stack, docker=docker, check_port=check_port), memory=memory)


def lint_stacks(node: Node, names: list[str], *, docker: bool = True,
                check_port: bool = True) -> dict[str, tuple[list[Finding], list[str]]]:
    """Findings and skipped checks per stack. A stack that does not load is one error finding."""
    inspector = None
    if docker:
        from ..docker.image_inspect import ImageInspector

        inspector = ImageInspector(node.state_dir)
    out: dict[str, tuple[list[Finding], list[str]]] = {}
    catalogue = node.catalogue()
    memory = RevisionMemory(RevisionStore(node.state_dir))
    try:
        for name in names:
            try:
                stack = catalogue.load(name)
            except UserError as e:
                out[name] = ([Finding(id=STACK_INVALID, severity="error", message=e.what,
                                      fix=e.fix or "correct the stack file", stack=name)], [])
                continue
            ctx = build_context(produce(node, stack, docker=docker, inspector=inspector, check_port=check_port),
                                memory=memory)
            out[name] = (lint_stack(ctx), ctx.skipped)
    finally:
        catalogue.save_cache()
        if inspector is not None:
            inspector.close()
    return out
