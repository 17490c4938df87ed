"""`rollback [STACK|REV]`: bring back the exact bytes of an earlier revision, pinned to the
image id that ran them, as a new revision whose parent is the current one."""

from __future__ import annotations

from dataclasses import dataclass

from ..config.node import Node
from ..config.schema import Smoke, Stack
from ..deploy.driver import Outcome
from ..deploy.plan import DeployPlan, Kind
from ..docker import engine
from ..docker.node import DockerNode
from ..errors import UserError
from ..state.revisions import Revision
from ..state.statedir import StateDir
from ..ui.progress import Reporter
from .switch import Confirm, DeployOptions, announced, driver


def resolve_target(state: StateDir, spec: str | None) -> Revision:
    """No spec: the revision before the current one (after a killed run: the one the node was
    on when it started). A number: that revision. A stack name: its newest healthy revision."""
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
    found = store.latest_healthy(stack=spec)
    if found is None:
        raise UserError(f"no revision of stack {spec!r} ever ran healthy",
                        fix="`b70deploy history` lists revisions; give a revision number instead")
    return found


def stack_of(node: Node, rev: Revision) -> Stack:
    """The stack a revision was rendered from: its own record, else the catalogue, else a
    bare one that only checks /health (a snapshot of a hand-made deployment)."""
    if rev.meta.stack_doc:
        return Stack.model_validate(rev.meta.stack_doc)
    try:
        return node.catalogue().load(rev.meta.stack)
    except UserError:
        return Stack(name="adopted", image="unknown", model={"path": "unknown"},  # type: ignore[arg-type]
                     served_model_names=["unknown"], max_model_len=256,
                     smoke=Smoke(completion=None, tool_call=False, aliases=False))


def revision_plan(node: Node, rev: Revision, opts: DeployOptions, *, kind: Kind, message: str,
                  restored_from: int | None) -> DeployPlan:
    """A revision's own bytes and image, as a plan (a rollback, or a resumed run's)."""
    image = engine.ImageInfo(ref=rev.meta.image_ref, id=rev.meta.image_id or rev.meta.image_ref,
                             repo_digest=rev.meta.repo_digest, tags=())
    return DeployPlan(kind=kind, stack=stack_of(node, rev), files=rev.read_files(), image=image, message=message,
                      companions=node.companions, timeouts=opts.timeouts(node), auto_rollback=opts.auto_rollback,
                      restored_from=restored_from)


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
        image_id = target.meta.image_id
        if image_id and not DockerNode.production(self.node).image_present(image_id):
            raise UserError(f"the image that ran revision {target.number} is gone: {image_id} "
                            f"(was {target.meta.image_ref})",
                            fix=f"docker load or pull that exact image (tag {target.meta.image_ref} may have moved)")
        return revision_plan(self.node, target, self.opts, kind="rollback", restored_from=target.number,
                             message=self.opts.message or f"rollback to revision {target.number}")

    def run(self, reporter: Reporter, *, confirm: Confirm | None = None) -> Outcome:
        return announced(self.node, "rollback", self.target or "previous", lambda: driver(
            self.node, reporter, self.opts).execute(self.command, lambda: self.plan(reporter), take_stale=True,
                                                    confirm=confirm))
