"""`resume`: finish a run that was killed, from the step where it stopped.

Steps are idempotent (files are rewritten whole, containers force-recreated, waits
re-waited), so the interrupted step is run again. A run killed while it was undoing its
steps is undone again. If it fails, the usual compensations run.
"""

from __future__ import annotations

from typing import Literal

from ..config.node import Node
from ..deploy.runner import Runner
from ..deploy.steps import Deployment, steps
from ..docker import engine
from ..state.audit import AuditLog
from ..state.journal import Journal
from ..state.lock import DeployLock
from ..state.revisions import RevisionStore
from ..ui.progress import Reporter
from .rollback import stack_of
from .switch import Options, Outcome, _failed, _run, configure


def resume(node: Node, reporter: Reporter, opts: Options, *, command: str) -> Outcome:
    journal = Journal(node.state_dir)
    run = journal.last_run()
    if run is None or run.finished:
        return Outcome(True, RevisionStore(node.state_dir).current_number(), "-", "nothing to resume: the last run "
                       "finished", [])
    lock = DeployLock(node.state_dir, command, wait=opts.lock_wait, take_stale=True)
    lock.acquire()
    audit = AuditLog(node.state_dir)
    try:
        outcome = _resume(node, reporter, opts, run, lock, journal)
        audit.record(command, "ok" if outcome.ok else "failed", revision=outcome.revision, summary=outcome.summary)
        return outcome
    finally:
        lock.release()


def _resume(node: Node, reporter: Reporter, opts: Options, run: object, lock: DeployLock, journal: Journal) -> Outcome:
    from ..state.journal import RunRecord

    assert isinstance(run, RunRecord)
    store = RevisionStore(node.state_dir)
    ctx = run.context
    rev_no = ctx.get("revision")
    if not isinstance(rev_no, int) or not store.exists(rev_no):
        journal.append(run.run_id, "run-aborted", reason="resumed: stopped before anything changed")
        for entry in store.index():  # a revision stored just before the kill, never noted
            if entry["outcome"] == "pending":
                store.update_status(entry["number"], outcome="aborted")
        cur = store.current_number()
        return Outcome(True, cur, str(ctx.get("stack", "-")),
                       f"the interrupted `{run.command}` stopped before changing the node; still on revision {cur}",
                       [])
    rev = store.get(rev_no)
    prev_no = ctx.get("previous")
    previous = store.get(prev_no) if isinstance(prev_no, int) and store.exists(prev_no) else None
    image = engine.ImageInfo(ref=rev.meta.image_ref, id=rev.meta.image_id or rev.meta.image_ref,
                             repo_digest=rev.meta.repo_digest, tags=())
    kind: Literal["switch", "rollback"] = "rollback" if ctx.get("kind") == "rollback" else "switch"
    d = Deployment(node=node, reporter=reporter, kind=kind, stack=stack_of(node, rev), files=rev.read_files(),
                   image=image, message=rev.meta.message, restored_from=rev.meta.restored_from)
    opts.auto_rollback = bool(ctx.get("auto_rollback", True))
    configure(d, opts)
    d.revision, d.previous = rev, previous
    started = {str(e.get("step")) for e in run.events if e["event"] == "step-start"}
    d.activated = "activate" in started
    journal.append(run.run_id, "run-aborted", reason="resumed by a new run")
    runner: Runner[Deployment] = Runner(journal, reporter, command=f"resume {run.command}", on_step=lock.set_step)
    d.runner = runner
    runner.start({**ctx, "resumed_from": run.run_id})
    plan = steps(d)
    done_names = run.steps_done()
    done = [s for s in plan if s.name in done_names]
    undoing = any(e["event"].startswith("undo") or e["event"] == "step-failed" for e in run.events)
    reporter.phase("resume", f"`{run.command}` stopped at {run.last_step}; "
                   + ("undoing it" if undoing else "finishing it"))
    if undoing:
        from ..deploy.runner import StepFailed

        errors = runner.compensate(done, d)
        journal.append(runner.run_id, "run-failed", step=run.last_step, error="interrupted while undoing")
        return _failed(d, StepFailed(str(run.last_step), RuntimeError("the run was killed while undoing"), errors,
                                     True))
    skip = next((i for i, s in enumerate(plan) if s.name not in done_names), len(plan))
    return _run(d, runner, skip=skip, done=done)
