"""`rollback [STACK|REV]`: bring back the exact bytes of an earlier revision, pinned to the
image id that ran them, as a new revision whose parent is the current one."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..config.node import Node
from ..config.schema import Smoke, Stack
from ..deploy.driver import Outcome
from ..deploy.plan import DeployPlan, ImageInfo, Kind, recovery
from ..deploy.steps import plan_lines
from ..docker.image_inspect import ImageInspector
from ..docker.node import DockerNode
from ..errors import UserError
from ..render.door import image_in
from ..render.filenames import COMPOSE_FILE
from ..render.masking import opaque
from ..state.revisions import Revision
from ..state.statedir import StateDir
from ..ui.notice import node_secrets
from ..ui.progress import Reporter
from .diff import as_written, kept_line, tree_modes, unified
from .handmade import check_drift, check_files, mounts_changed, own_stack
from .mutating import mutating
from .switch import Confirm, DeployOptions, asleep_line, deploy, kept_companions, standby_plan


def resolve_target(state: StateDir, spec: str | None) -> Revision:
    """No spec: the revision before the current one (after a killed run: the one the node was
    on when it started). A number: that revision. A stack name: its newest revision that ran
    healthy or was imported (never run: the rollback is what proves it)."""
    store = state.revisions
    if spec is None:
        run = state.interrupted_run()
        before = run.context.get("previous") if run is not None else None
        if isinstance(before, int) and store.exists(before):
            return store.get(before)
        cur = store.current()
        if cur is None:
            raise UserError("nothing has been deployed yet: there is no previous revision",
                            fix="b70deploy switch STACK")
        if cur.meta.parent is not None and store.exists(cur.meta.parent):
            return store.get(cur.meta.parent)
        older = store.latest_healthy(exclude=[cur.number])
        if older is None:
            raise UserError(f"revision {cur.number} has no earlier healthy revision to return to",
                            fix="`b70deploy history` lists the revisions")
        return older
    if spec.isdigit():
        return store.get(int(spec))
    found = store.latest_restorable(spec)
    if found is None:
        raise UserError(f"no revision of stack {spec!r} ever ran healthy or was imported",
                        fix="`b70deploy history` lists revisions; give a revision number, or `b70deploy import` "
                            "a saved copy --as that stack")
    return found


def handmade_origin(state: StateDir, rev: Revision) -> Revision | None:
    """The adopt or import `rev`'s bytes come from (itself, or through rollbacks of rollbacks),
    None when the tool rendered them."""
    seen: set[int] = set()
    while rev.meta.kind == "rollback" and rev.meta.restored_from is not None and rev.number not in seen:
        seen.add(rev.number)
        if not state.revisions.exists(rev.meta.restored_from):
            return None  # pruned: its bytes were checked when that rollback ran
        rev = state.revisions.get(rev.meta.restored_from)
    return rev if rev.meta.kind in ("adopt", "import") else None


def stack_of(node: Node, rev: Revision) -> Stack:
    """The stack a revision was rendered from: its own record, else the catalogue, else a
    bare one that only checks /health. Bytes the tool did not render (adopt, import) are never
    mapped onto a catalogue stack of the same name."""
    if rev.meta.stack_doc:
        return Stack.model_validate(rev.meta.stack_doc)
    if rev.meta.kind in ("adopt", "import"):
        return own_stack(node, rev.meta.stack, {})
    try:
        return node.catalogue().load(rev.meta.stack)
    except UserError:
        return Stack(name=rev.meta.stack, image="unknown", model={"path": "unknown"},  # type: ignore[arg-type]
                     served_model_names=["unknown"], max_model_len=256,
                     smoke=Smoke(completion=None, tool_call=False, aliases=False))


def revision_plan(node: Node, rev: Revision, opts: DeployOptions, *, kind: Kind, message: str,
                  restored_from: int | None, stack: Stack | None = None,
                  warnings: tuple[str, ...] = ()) -> DeployPlan:
    """A revision's own bytes and image, as a plan (a rollback, or a resumed run's)."""
    image = ImageInfo(ref=rev.meta.image_ref, id=rev.meta.image_id or rev.meta.image_ref,
                             repo_digest=rev.meta.repo_digest, tags=())
    stack = stack or stack_of(node, rev)
    files = rev.verified_files()
    wake = slot_of(StateDir(node.state_dir), rev) if kind == "rollback" else None
    standby = standby_plan(node, stack, files, wake_slot=wake)
    return DeployPlan(kind=kind, stack=stack, files=files, image=image,
                      message=message, companions=node.companions,
                      kept=() if standby else kept_companions(node, files), waits=opts.waits(node),
                      auto_rollback=opts.auto_rollback, restored_from=restored_from, warnings=warnings,
                      platform=node.config.platform, standby=standby,
                      modes=rev.modes())


def slot_of(state: StateDir, rev: Revision) -> int:
    """The standby slot that runs `rev`'s bytes: the revision they were first deployed as (a rollback
    runs in the slot of the revision it restored, docker/standby.py)."""
    seen: set[int] = set()
    while rev.meta.kind == "rollback" and rev.meta.restored_from is not None and rev.number not in seen:
        seen.add(rev.number)
        if not state.revisions.exists(rev.meta.restored_from):
            break
        rev = state.revisions.get(rev.meta.restored_from)
    return rev.number


@dataclass
class Rollback:
    node: Node
    target: str | None
    opts: DeployOptions

    @property
    def command(self) -> str:
        return f"rollback {self.target or ''}".strip()

    def plan(self, reporter: Reporter | None = None) -> DeployPlan:
        """The target's files and image; refused when that exact image is gone."""
        target = resolve_target(StateDir(self.node.state_dir), self.target)
        if target.status.outcome == "failed" and reporter is not None:
            reporter.info(f"warning: revision {target.number} failed when it was deployed")
        if target.status.outcome == "unproven" and reporter is not None:
            reporter.info(f"revision {target.number} was imported and never ran under b70deploy: the health gate "
                          "decides, and the previous revision comes back if it fails")
        self._check_door(target)
        meta = target.meta
        if meta.image_id and not DockerNode.production(self.node).image_present(meta.image_id):
            raise UserError(f"the image that ran revision {target.number} is gone: {meta.image_id} "
                            f"(was {meta.image_ref}); nothing was stopped",
                            fix=recovery(meta.image_ref, meta.image_id, meta.repo_digest))
        origin = handmade_origin(StateDir(self.node.state_dir), target)
        stack, warnings = self._check_handmade(target, origin) if origin is not None else (None, [])
        return revision_plan(self.node, target, self.opts, kind="rollback", restored_from=target.number,
                             message=self.opts.message or f"rollback to revision {target.number}", stack=stack,
                             warnings=tuple(warnings))

    def _check_door(self, target: Revision) -> None:
        """The door is the node's: a revision made without it (adopted, or before the door was
        enabled) would take it away and leave the clients' connections refused while its vllm
        starts on the node's port; its bytes are the operator's, so the door is not added to them."""
        if not self.node.config.door.enabled or image_in(target.read_files().get(COMPOSE_FILE, b"")) is not None:
            return
        raise UserError(f"revision {target.number} was made without the front door, and {self.node.source} "
                        "enables it (door:): rolling back to it would remove the door from the node's port; "
                        "nothing was stopped",
                        fix=f"roll back to a revision made with the door (`b70deploy history`), `b70deploy switch "
                            f"{target.meta.stack}` to render that stack behind the door, or set door.enabled: false "
                            f"in {self.node.source} to serve without it")

    def _check_handmade(self, target: Revision, origin: Revision) -> tuple[Stack, list[str]]:
        """Bytes the tool did not render are rolled back to as bytes: the preflight of an import
        (only what would certainly fail refuses), the drift check of `origin`'s patch records and
        mounts; the smoke tests are what the copy itself serves."""
        with ImageInspector(self.node.state_dir) as inspector:
            checked = check_files(self.node, target.verified_files(), name=target.meta.stack,
                                  where=f"revision {target.number}", inspector=inspector)
            notes = check_drift(origin, checked.image.ref, inspector)
        notes += [f"recorded mount {m}" for m in mounts_changed(origin.meta.patches)]
        return own_stack(self.node, target.meta.stack, checked.vllm), notes + checked.warnings

    def preview(self) -> list[str]:
        """--dry-run: the target, its image, the current revision, the steps and the diff of the
        files against the deploy dir; nothing on the node changes (a gone image refuses, as the
        rollback itself would)."""
        plan = self.plan()
        cur = StateDir(self.node.state_dir).revisions.current()
        live, kept = as_written(self.node.deploy_dir, plan.files, self.node.compose_files,
                                cur.meta.files if cur else ())
        hidden = opaque(cur.modes() if cur else {}, plan.modes, tree_modes(self.node.deploy_dir, live),
                        compose_files=self.node.compose_files)
        text = unified(live, plan.files, old_label="deployed", new_label=f"revision-{plan.restored_from}",
                       secrets=plan.secrets | node_secrets(self.node), hidden=hidden)
        lines = [f"rollback to revision {plan.restored_from} ({plan.stack.name}): plan (dry run, nothing changed)",
                 f"  image {plan.image.ref} = {plan.image.id}",
                 f"  current: {f'revision {cur.number} ({cur.meta.stack})' if cur else 'nothing deployed'}",
                 *[f"  warning: {w}" for w in plan.warnings], *asleep_line(self.node, plan, cur),
                 *kept_line(kept), ""]
        return [*lines, *plan_lines(plan), "", text.rstrip("\n") if text else "(no file changes)"]

    def run(self, reporter: Reporter, *, confirm: Confirm | None = None) -> Outcome:
        """Lock first (taking over a killed run's), then plan, then the steps."""
        with mutating(self.node, self.command, wait=self.opts.lock_wait, take_stale=True, step="plan",
                      announce=("rollback", self.target or "previous")) as m:
            t0 = time.monotonic()
            plan = self.plan(reporter)
            return deploy(self.node, self.command, plan, reporter, m, planned_in=time.monotonic() - t0,
                          confirm=confirm)
