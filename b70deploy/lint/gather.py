"""Collect what the lint rules read: the shell side of lint (Docker, Compose, sockets, files).

Without Docker (`docker=False`) only the pure facts are gathered and the image, compose
and port checks are listed in `ctx.skipped`; the Docker SDK is then not even imported
(`lint --all --no-docker` over 1,000 stacks starts without it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.node import Node
from ..config.schema import Stack
from ..config.secrets_file import load_secrets
from ..errors import B70Error, UserError
from ..render import devices as devices_mod
from ..render.draft import served_draft_path
from ..render.files import render
from ..render.patches import PatchSpec, deploy_files, find_patch, materialize, mounts_for, upstream_split
from ..state.revisions import Revision, RevisionStore
from ..vllmlog.bootlog import parse_boot_facts
from . import Finding, LintContext, lint_stack
from .findings import STACK_INVALID
from .kv import MeasuredKV

if TYPE_CHECKING:
    from ..docker.image_inspect import ImageInspector


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


def _port_owner(node: Node, client: Any) -> str | None:
    port = node.config.ports.prod
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((node.config.bind_address, port))
            return None
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return None
    for c in client.containers.list(ignore_removed=True):  # one removed meanwhile is not an owner
        ports = (c.attrs.get("NetworkSettings") or {}).get("Ports") or {}
        bound = any(str(b.get("HostPort")) == str(port) for binds in ports.values() if binds for b in binds)
        if bound:
            if c.labels.get("com.docker.compose.project") == node.project:
                return None  # our own running stack: the switch drains it first
            return f"container {c.name}"
    return "a process outside Docker"


def build_context(node: Node, stack: Stack, *, docker: bool = True, inspector: ImageInspector | None = None,
                  check_port: bool = True, pin_image: str | None = None, port: int | None = None,
                  project: str | None = None, memory: RevisionMemory | None = None) -> LintContext:
    """Gather the facts for `stack`. With docker and no `inspector`, one is made and closed here.
    `pin_image` (an image id) goes into .env as VLLM_IMAGE, as a switch records it."""
    if docker and inspector is None:
        from ..docker.image_inspect import ImageInspector

        with ImageInspector(node.state_dir) as own:
            return build_context(node, stack, docker=True, inspector=own, check_port=check_port,
                                 pin_image=pin_image, port=port, project=project, memory=memory)
    skipped: list[str] = []
    models_dir: Path | None = node.models_dir if node.models_dir.is_dir() else None
    # On this host an absent models folder is an error (models-dir-missing): the switch would stop
    # the old stack for a bind the engine refuses. On a remote node it is not ours to see.
    missing = node.models_dir if models_dir is None and node.on_this_host else None
    if models_dir is None and missing is None:
        skipped.append(f"models_dir {node.models_dir} not found: model and draft file checks skipped")
    patch_errors: dict[str, tuple[str, str]] = {}
    specs: list[PatchSpec] = []
    for name in stack.patches:
        try:
            specs.append(find_patch(node.patches_dir, name))
        except UserError as e:
            patch_errors[name] = ("patch-unknown", e.what)  # the rule gives the fix
    ctx_image = None
    image_error = None
    patched = []
    upstream: list[str] = []
    if docker:
        assert inspector is not None
        try:
            ctx_image = inspector.facts(stack.image)
        except UserError as e:
            image_error = e.what
        if ctx_image is not None:
            specs, upstream = upstream_split(specs, ctx_image.vllm_version)
            for spec in specs:
                try:
                    patched.extend(materialize([spec], stack.image, inspector))
                except UserError as e:
                    patch_errors[spec.name] = ("patch-does-not-apply", e.what)
    else:
        skipped.append("no Docker: image, patch, compose config and port checks skipped")
    access = devices_mod.scan(node.device_dir, node.config.gids)
    secrets, _warnings = load_secrets(node.secrets_env_file)
    rendered = render(stack, node, access, secrets=secrets, mounts=mounts_for(patched),
                      patch_files=deploy_files(patched), draft_path=served_draft_path(stack, node.config.models_target),
                      image=pin_image, port=port, project=project)
    if upstream:
        rendered = dataclasses.replace(rendered, notes=(*rendered.notes, *upstream))
    ctx = LintContext(node=node, stack=stack, rendered=rendered, models_dir=models_dir, models_dir_missing=missing,
                      image=ctx_image,
                      image_error=image_error, patch_errors=patch_errors, patched=patched, skipped=skipped,
                      measured_kv=measured_kv(node, stack, ctx_image.id if ctx_image else None, memory),
                      patches_upstream=upstream)
    if docker:
        # `docker compose config` (a subprocess, ~0.1 s) runs while the port is checked here
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="compose-config") as pool:
            config = pool.submit(_compose_config, ctx)
            if check_port and inspector is not None:
                with contextlib.suppress(B70Error):
                    ctx.port_owner = _port_owner(node, inspector.client)
            config.result()
    return ctx


def _compose_config(ctx: LintContext) -> None:
    from ..docker.node import compose_config

    ctx.compose_config, ctx.compose_error = compose_config(ctx.rendered.files, ctx.node.project)


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
            ctx = build_context(node, stack, docker=docker, inspector=inspector, check_port=check_port,
                                memory=memory)
            out[name] = (lint_stack(ctx), ctx.skipped)
    finally:
        catalogue.save_cache()
        if inspector is not None:
            inspector.close()
    return out


def preflight(node: Node, stack: Stack, *, inspector: ImageInspector | None = None,
              pin_image: str | None = None, port: int | None = None, project: str | None = None) -> LintContext:
    """For `switch`: the full context (with the materialized patches in `ctx.patched` and the
    rendered files in `ctx.rendered`, .env pinned to `pin_image`); run `lint_stack(ctx)` on it
    and stop on an error. Pass an inspector you close (`with ImageInspector(state_dir) as insp:`)
    to reuse it."""
    return build_context(node, stack, docker=True, inspector=inspector, check_port=port is None,
                         pin_image=pin_image, port=port, project=project)
