"""`switch STACK`: render a new revision and move the node onto it behind the health gate."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config.node import Node
from ..deploy.runner import Runner, StepFailed
from ..deploy.steps import Deployment, steps
from ..errors import OperationError, UserError
from ..state.audit import AuditLog
from ..state.journal import Journal
from ..state.lock import DeployLock
from ..state.revisions import RevisionStore
from ..ui.progress import Reporter
from .diff import unified
from .prepare import prepare_deploy


@dataclass
class Options:
    message: str = ""
    timeout: float | None = None
    rollback_timeout: float | None = None
    auto_rollback: bool = True
    lock_wait: float = 0.0
    verify_wait: float = 30.0


@dataclass
class Outcome:
    ok: bool
    revision: int | None
    stack: str
    summary: str             # the one line that says what state the node is in
    details: list[str]
    exit_code: int = 0
    rolled_back: bool = False  # failed, and the previous revision serves again

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "revision": self.revision, "stack": self.stack, "summary": self.summary,
                "details": self.details, "exit_code": self.exit_code, "rolled_back": self.rolled_back}


def plan_lines(d: Deployment) -> list[str]:
    out = []
    for i, step in enumerate(steps(d), 1):
        undo = f"  (undo: {step.undo_summary})" if step.compensation else ""
        out.append(f"{i:2d}. {step.name:<13} {step.summary}{undo}")
    return out


def build_switch(node: Node, name: str, reporter: Reporter, opts: Options) -> Deployment:
    """Everything a switch to `name` will write, linted; nothing on the node changes here."""
    ready = prepare_deploy(node, name)
    d = Deployment(node=node, reporter=reporter, kind="switch", stack=ready.stack, files=ready.files,
                   image=ready.image, message=opts.message, secret_keys=ready.secret_keys)
    d.findings = ready.findings
    configure(d, opts)
    return d


def configure(d: Deployment, opts: Options) -> None:
    t = d.node.config.timeouts
    d.timeout = opts.timeout or t.health
    d.rollback_timeout = opts.rollback_timeout or t.rollback
    d.auto_rollback = opts.auto_rollback
    d.verify_wait = opts.verify_wait
    from .checks import wire

    wire(d)


def dry_run(node: Node, name: str, reporter: Reporter, opts: Options) -> list[str]:
    d = build_switch(node, name, reporter, opts)
    store = RevisionStore(node.state_dir)
    cur = store.current()
    from ..state.fsio import read_tree

    live = read_tree(node.deploy_dir, sorted(set(d.files) | set(cur.meta.files if cur else [])))
    text = unified(live, d.files, old_label="deployed", new_label=f"switch-{name}", secret_keys=d.secret_keys)
    lines = [f"switch {name}: plan (dry run, nothing changed)",
             f"  image {d.image.ref} = {d.image.id}",
             f"  current: {f'revision {cur.number} ({cur.meta.stack})' if cur else 'nothing deployed'}", ""]
    lines += plan_lines(d)
    lines += ["", text.rstrip("\n") if text else "(no file changes)"]
    return lines


def execute(node: Node, command: str, opts: Options, build: Callable[[], Deployment], *,
            take_stale: bool = False, ask: Callable[[Deployment], str] | None = None,
            assume_yes: bool = True) -> Outcome:
    """Take the lock first (a second run fails at once), then plan the run with `build`,
    ask before draining when `ask` gives a question, and run the steps; on failure the
    runner has rolled back already."""
    audit = AuditLog(node.state_dir)
    lock = DeployLock(node.state_dir, command, wait=opts.lock_wait, take_stale=take_stale)
    lock.acquire()
    try:
        lock.set_step("plan")
        d = build()  # reads an interrupted run's journal, so before close_interrupted
        if lock.taken_over is not None:
            close_interrupted(node, d.reporter, by=command)
        if ask is not None:
            lock.set_step("confirm")
            confirm(ask(d), assume_yes)
        runner: Runner[Deployment] = Runner(Journal(node.state_dir), d.reporter, command=command,
                                            on_step=lock.set_step)
        d.runner = runner
        runner.start({"kind": d.kind, "stack": d.stack.name, "restored_from": d.restored_from,
                      "auto_rollback": d.auto_rollback})
        outcome = _run(d, runner)
        audit.record(command, "ok" if outcome.ok else "failed", revision=outcome.revision, summary=outcome.summary)
        return outcome
    except BaseException as exc:
        audit.record(command, "error", error=str(exc)[:500])
        raise
    finally:
        lock.release()


def close_interrupted(node: Node, reporter: Reporter, *, by: str) -> None:
    """Mark a killed run as ended, and its uncommitted revision as interrupted."""
    journal = Journal(node.state_dir)
    run = journal.last_run()
    if run is None or run.finished:
        return
    journal.append(run.run_id, "run-aborted", reason=f"interrupted; taken over by `{by}`")
    store = RevisionStore(node.state_dir)
    rev = run.context.get("revision")
    if isinstance(rev, int) and store.exists(rev) and store.get(rev).status.outcome == "pending":
        store.update_status(rev, outcome="interrupted")
    reporter.info(f"took over from the interrupted `{run.command}` (stopped at {run.last_step or 'start'})")


def _run(d: Deployment, runner: Runner[Deployment], *, skip: int = 0, done: list[Any] | None = None) -> Outcome:
    plan = steps(d)
    try:
        runner.run(plan[skip:], d, done=done or [], compensate=d.auto_rollback)
    except StepFailed as failure:
        return _failed(d, failure)
    assert d.revision is not None
    store = RevisionStore(d.node.state_dir)
    store.update_status(d.revision.number, timings=dict(runner.timings))  # now with commit and restore
    store.prune(d.node.config.keep_revisions)
    facts = d.facts or store.get(d.revision.number).status.facts  # a resumed run may have checked nothing
    kv = facts.get("kv_cache_tokens")
    extra = f", KV {kv:,} tokens" if isinstance(kv, int) else ""
    return Outcome(True, d.revision.number, d.stack.name,
                   f"node on revision {d.revision.number} ({d.stack.name}), healthy in "
                   f"{facts.get('time_to_healthy', 0):.1f} s{extra}", d.checks_passed)


def _failed(d: Deployment, failure: StepFailed) -> Outcome:
    store = RevisionStore(d.node.state_dir)
    err = failure.error
    if isinstance(err, UserError) and not d.activated:
        raise err  # bad input found in preflight: exit 2, nothing changed
    details = [f"failed at {failure.step}: {err}"]
    finding = None
    if d.wait is not None and d.wait.finding is not None:
        finding = d.wait.finding
        details.append(f"diagnosis: {finding.one_line()}")
        details.append(f"  log line: {finding.line}")
    if d.wait is not None and not d.wait.healthy:
        details.append("last log lines:")
        details += [f"  | {line}" for line in d.wait.tail(12)]
    if d.revision is not None:
        store.update_status(d.revision.number, outcome="failed" if d.activated else "aborted",
                            failure=f"{failure.step}: {err}"[:2000],
                            diagnosis=finding.one_line() if finding else None, facts=d.facts,
                            timings=dict(d.runner.timings) if d.runner else {})
        if d.activated:
            details.append(f"revision {d.revision.number} kept with its log: b70deploy logs {d.revision.number}")
    details += failure.undo_errors
    prev = d.previous
    rolled_back = False
    if not d.auto_rollback and d.activated:
        summary = (f"node left on failed revision {d.revision.number if d.revision else '?'} (--no-auto-rollback); "
                   "fix: b70deploy rollback")
    elif failure.undo_errors:
        summary = "rollback FAILED: the node may be serving nothing; see above, then b70deploy status"
    elif prev is not None:
        rolled_back = True
        back = f" in {d.rollback_wait.elapsed:.1f} s" if d.rollback_wait else ""
        summary = (f"switch to {d.stack.name} failed; node back on revision {prev.number} ({prev.meta.stack}), "
                   f"healthy{back}")
    else:
        summary = f"switch to {d.stack.name} failed; no previous revision, node serves nothing"
    return Outcome(False, d.revision.number if d.revision else None, d.stack.name, summary, details, exit_code=1,
                   rolled_back=rolled_back)


def confirm(question: str, assume_yes: bool) -> None:
    """Ask on a terminal before stopping production; never blocks a pipe or CI."""
    import click

    if assume_yes or not sys.stdin.isatty():
        return
    if not click.confirm(question, default=False, err=True):
        raise OperationError("cancelled; nothing changed")

