"""`rollback [STACK|REV]`: bring back the exact bytes of an earlier revision, pinned to the
image id that ran them, as a new revision whose parent is the current one."""

from __future__ import annotations

from ..config.node import Node
from ..config.schema import Smoke, Stack
from ..deploy.steps import Deployment
from ..docker import engine
from ..errors import UserError
from ..state.journal import Journal
from ..state.revisions import Revision, RevisionStore
from ..ui.progress import Reporter
from .switch import Options, configure


def interrupted_previous(node: Node) -> int | None:
    """For a run that was killed: the revision the node was on before it started."""
    run = Journal(node.state_dir).last_run()
    if run is None or run.finished:
        return None
    prev = run.context.get("previous")
    return int(prev) if isinstance(prev, int) else None


def resolve_target(node: Node, spec: str | None) -> Revision:
    store = RevisionStore(node.state_dir)
    if spec is None:
        before = interrupted_previous(node)
        if before is not None and store.exists(before):
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


def build_rollback(node: Node, spec: str | None, reporter: Reporter, opts: Options) -> Deployment:
    target = resolve_target(node, spec)
    if target.status.outcome == "failed":
        reporter.info(f"warning: revision {target.number} failed when it was deployed")
    image_id = target.meta.image_id
    if image_id and not engine.image_present(image_id):
        raise UserError(f"the image that ran revision {target.number} is gone: {image_id} "
                        f"(was {target.meta.image_ref})",
                        fix=f"docker load or pull that exact image (tag {target.meta.image_ref} may have moved)")
    image = engine.ImageInfo(ref=target.meta.image_ref, id=image_id or target.meta.image_ref,
                             repo_digest=target.meta.repo_digest, tags=())
    d = Deployment(node=node, reporter=reporter, kind="rollback", stack=stack_of(node, target),
                   files=target.read_files(), image=image,
                   message=opts.message or f"rollback to revision {target.number}", restored_from=target.number)
    configure(d, opts)
    return d
