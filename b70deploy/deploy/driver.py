"""Drives a plan through the steps under the deploy lock, and says where the node ended.

    execute   a built plan -> (take over a killed run) -> confirm -> run the steps
    resume    finish, or undo, the steps of a killed run from its journal

The caller holds the deploy lock (actions/mutating.py) and built the plan (its verb's own
plan(), e.g. actions/switch.py); the driver calls neither back.
    Outcome   the one result of a switch, rollback or resume: ok, revision, the summary line

On a failure the runner has already undone the completed steps (the previous revision
serves again); the outcome says so, or says what could not be undone and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import NodeBusy, Terminated, UserError
from ..state import space
from ..state.journal import RunRecord
from ..state.statedir import StateDir
from . import interrupts
from .nodeio import NodeIO
from .plan import DeployPlan
from .runner import Fault, Runner, Step, StepFailed, fault_from_env
from .steps import Run, steps

if TYPE_CHECKING:
    from ..state.revisions import Revision
    from ..ui.progress import Reporter


@dataclass
class Outcome:
    ok: bool
    revision: int | None
    stack: str
    summary: str             # the one line that says what state the node is in
    details: list[str] = field(default_factory=list)
    exit_code: int = 0
    rolled_back: bool = False  # failed, and the previous revision serves again
    diagnosis: str | None = None  # the fatal log signature of a failed boot, with its fix
    warnings: list[str] = field(default_factory=list)  # a success's bookkeeping that could not be written
    remarks: tuple[str, ...] = ()  # the plan's warnings (lint), said at preflight; in --json's "warnings" too
    signals: list[str] = field(default_factory=list)  # came after the commit: noted, the run finished (exit 0)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "revision": self.revision, "stack": self.stack, "summary": self.summary,
                "details": self.details, "exit_code": self.exit_code, "rolled_back": self.rolled_back,
                "diagnosis": self.diagnosis, "warnings": [*self.remarks, *self.warnings], "signals": self.signals}


def _no_step(step: str) -> None:
    return None


@dataclass
class Driver:
    """One node's state dir and effects, and how a run reports and may be interrupted."""

    state: StateDir
    io: NodeIO
    reporter: Reporter
    keep_revisions: int = 20
    fault: Fault = fault_from_env

    def execute(self, command: str, plan: DeployPlan, *, planned_in: float = 0.0,
                on_step: Callable[[str], None] = _no_step,
                confirm: Callable[[DeployPlan], None] | None = None) -> Outcome:
        """Run `plan` (built by its verb under the lock the caller holds): take over a killed
        run, let `confirm` refuse the plan, run the steps; a failure has been undone when this
        returns. `on_step` names each step in the lock's details."""
        # Said once it is built: a plan refused as bad input stays a one-line error.
        self.reporter.phase("plan", "before drain: files rendered or read back, image present and pinned, "
                            "patches extracted, lint, compose config")
        self.reporter.info(f"image {plan.image.ref} = {plan.image.id[:19]}; planned in {planned_in:.2f} s")
        self._room(plan)  # before the first write of the run: its journal line
        interrupted = self.close_interrupted(by=command)  # we hold the lock: an unfinished run was killed
        if confirm is not None:
            on_step("confirm")
            confirm(plan)
        runner = self._runner(command, on_step)
        runner.start({"kind": plan.kind, "stack": plan.stack.name, "restored_from": plan.restored_from,
                      "auto_rollback": plan.auto_rollback, "previous": self.state.revisions.current_number()})
        run = Run(plan, self.io, self.state.revisions, self.reporter, runner, after_interrupt=interrupted)
        return self._run(run, runner)

    def resume(self, command: str, plan_of: Callable[[RunRecord, Revision], DeployPlan],
               replan: Callable[[RunRecord], DeployPlan] | None = None, *,
               on_step: Callable[[str], None] = _no_step) -> Outcome:
        """Finish the killed run from the step where it stopped, or undo it if it was undoing
        (under the lock the caller holds). Steps are idempotent (files rewritten whole,
        containers recreated, waits re-waited), so the interrupted step runs again. A run
        killed before it stored its revision is planned again with `replan` and run from the start."""
        store = self.state.revisions
        run = self.state.interrupted_run()
        if run is None:
            return Outcome(True, store.current_number(), "-", "nothing to resume: the last run finished")
        return self._resume(command, run, plan_of, replan, on_step)

    def close_interrupted(self, *, by: str) -> bool:
        """Mark a killed run as ended and every revision still `pending` (the killed run's, or
        one whose run could not write its outcome: a full disk) as interrupted; whether a run was
        killed. We hold the lock: no run that could still finish one is left."""
        run = self.state.interrupted_run()
        if run is not None:
            self.state.journal.append(run.run_id, "run-aborted", reason=f"interrupted; taken over by `{by}`")
        store = self.state.revisions
        table = store.summaries()
        for number, outcome in zip(table.numbers(), table.column("outcome"), strict=True):
            if outcome == "pending" and store.get(number).status.outcome == "pending":
                store.update_status(number, outcome="interrupted",
                                    failure="its run ended before it recorded the outcome")
        if run is None:
            return False
        self.reporter.info(f"took over from the interrupted `{run.command}` (stopped at {run.last_step or 'start'})")
        return True

    # ------------------------------------------------------------------ internals

    def _room(self, plan: DeployPlan) -> None:
        """StateDirFull unless the state dir has room for what running `plan` writes."""
        index = self.state.revisions.index_path
        space.check(self.state.path, space.need([len(b) for b in plan.files.values()],
                                                index.stat().st_size if index.is_file() else 0))

    def _runner(self, command: str, on_step: Callable[[str], None]) -> Runner[Run]:
        return Runner(self.state.journal, self.reporter, command=command, on_step=on_step, fault=self.fault)

    def _resume(self, command: str, run: RunRecord, plan_of: Callable[[RunRecord, Revision], DeployPlan],
                replan: Callable[[RunRecord], DeployPlan] | None, on_step: Callable[[str], None]) -> Outcome:
        store, journal, ctx = self.state.revisions, self.state.journal, run.context
        rev_no = ctx.get("revision")
        if not isinstance(rev_no, int) or not store.exists(rev_no):
            journal.append(run.run_id, "run-aborted", reason="resumed: stopped before it stored its revision")
            for entry in store.index():  # a revision stored just before the kill, never noted
                if entry["outcome"] == "pending":
                    store.update_status(entry["number"], outcome="aborted")
            if replan is None:
                cur = store.current_number()
                return Outcome(True, cur, str(ctx.get("stack", "-")),
                               f"the interrupted `{run.command}` stopped before changing the node; still on "
                               f"revision {cur}")
            self.reporter.phase("resume", f"`{run.command}` stopped before it stored its revision; running it again")
            plan = replan(run)
            self._room(plan)
            runner = self._runner(f"{command} {run.command}", on_step)
            runner.start({**ctx, "previous": store.current_number(), "resumed_from": run.run_id})
            return self._run(Run(plan, self.io, store, self.reporter, runner, after_interrupt=True), runner)
        rev = store.get(rev_no)
        plan = plan_of(run, rev)
        self._room(plan)
        runner = self._runner(f"{command} {run.command}", on_step)
        r = Run(plan, self.io, store, self.reporter, runner)
        prev_no = ctx.get("previous")
        r.got.revision = rev
        r.got.previous = store.get(prev_no) if isinstance(prev_no, int) and store.exists(prev_no) else None
        # hot standby: the slot the killed run created or picked, and the live slot it put to sleep
        slot, dozed = ctx.get("slot"), ctx.get("dozed")
        r.got.slot = slot if isinstance(slot, int) else None
        r.got.dozed = dozed if isinstance(dozed, int) else None
        r.got.woken = bool(ctx.get("woken"))
        started = {str(e.get("step")) for e in run.events if e["event"] == "step-start"}
        r.got.activated = "activate" in started
        journal.append(run.run_id, "run-aborted", reason="resumed by a new run")
        runner.start({**ctx, "resumed_from": run.run_id})
        all_steps = steps(plan)
        done_names = run.steps_done()
        done = [s for s in all_steps if s.name in done_names]
        undoing = any(e["event"].startswith("undo") or e["event"] == "step-failed" for e in run.events)
        self.reporter.phase("resume", f"`{run.command}` stopped at {run.last_step}; "
                            + ("undoing it" if undoing else "finishing it"))
        if undoing:  # the step that failed was being undone with the others
            failed_name = next((e.get("step") for e in run.events if e["event"] == "step-failed"), None)
            failed = next((s for s in all_steps if s.name == failed_name and s not in done), None)
            errors = runner.compensate([*done, *([failed] if failed else [])], r)
            journal.append(runner.run_id, "run-failed", step=run.last_step, error="interrupted while undoing")
            return self._failed(r, StepFailed(str(run.last_step), RuntimeError("the run was killed while undoing"),
                                              errors, True))
        skip = next((i for i, s in enumerate(all_steps) if s.name not in done_names), len(all_steps))
        return self._run(r, runner, skip=skip, done=done)

    def _run(self, r: Run, runner: Runner[Run], *, skip: int = 0, done: Sequence[Step[Run]] = ()) -> Outcome:
        try:
            # --no-auto-rollback keeps a failed stack for inspection; a run that failed before it
            # started one (not idle at verify) has nothing to inspect and is undone as always.
            runner.run(steps(r.plan)[skip:], r, done=done,
                       compensate=lambda: r.plan.auto_rollback or not r.got.activated)
        except StepFailed as failure:
            return self._failed(r, failure)
        rev = r.got.revision
        assert rev is not None  # record ran, in this run or the killed one
        store = self.state.revisions
        # Committed: the node is on the new revision. What is written from here on only adds to
        # the records, so a full disk makes it a warning and the run still succeeds.
        r.salvage(lambda: store.update_status(rev.number, timings=dict(runner.timings)),
                  f"revision {rev.number}'s step timings")  # now with commit and companions
        asleep = set(self.io.slots()) if r.plan.standby is not None else set()  # standbys' bytes stay
        r.salvage(lambda: store.prune(self.keep_revisions, asleep=asleep), "the pruned index (old revisions stay)")
        facts = r.got.facts or rev.status.facts  # a resumed run may have checked nothing
        kv = facts.get("kv_cache_tokens")
        extra = f", KV {kv:,} tokens" if isinstance(kv, int) else ""
        warned = runner.warnings + ([space.full_line(self.state.path)] if any(
            "state dir is full" in w for w in runner.warnings) else [])
        signals = interrupts.held()
        if signals:
            warned.append(f"{', '.join(signals)} came after the commit: the run finished, the node is on revision "
                          f"{rev.number}")
        return Outcome(True, rev.number, r.plan.stack.name,
                       f"node on revision {rev.number} ({r.plan.stack.name}), healthy in "
                       f"{facts.get('time_to_healthy', 0):.1f} s{extra}", r.got.checks_passed, warnings=warned,
                       remarks=r.plan.warnings, signals=signals)

    def _failed(self, r: Run, failure: StepFailed) -> Outcome:
        store = self.state.revisions
        err = failure.error
        if isinstance(err, UserError | space.StateDirFull | NodeBusy) and not r.got.activated:
            raise err  # bad input, no room or a busy host, found before the drain: one line, nothing changed
        interrupt = ("SIGTERM" if isinstance(err, Terminated)
                     else "Ctrl-C" if isinstance(err, KeyboardInterrupt) else None)
        failed = f"interrupted ({interrupt})" if interrupt else "failed"
        details = [f"{failed} at {failure.step}" + (f": {err}" if not interrupt else "")]
        finding = r.got.wait.finding if r.got.wait is not None else None
        if finding is not None:
            details.append(f"diagnosis: {finding.one_line()}")
            details.append(f"  log line: {finding.line}")
        if r.got.wait is not None and not r.got.wait.healthy:
            details.append("last log lines:")
            details += [f"  | {line}" for line in r.got.wait.tail(12)]
        rev = r.got.revision
        if rev is not None:
            verdict = "interrupted" if interrupt else "failed" if r.got.activated else "aborted"
            r.salvage(lambda: store.update_status(rev.number, outcome=verdict, failure=f"{failure.step}: {err}",
                                                  diagnosis=finding.one_line() if finding else None, facts=r.got.facts,
                                                  timings=dict(r.runner.timings)),
                      f"revision {rev.number}'s outcome")
            if r.got.activated:
                details.append(f"revision {rev.number} kept with its log: b70deploy logs {rev.number}")
        details += failure.undo_errors
        details += r.runner.warnings
        if space.is_full(failure) or any("state dir is full" in w for w in r.runner.warnings):
            details.append(space.full_line(self.state.path))
        prev, name = r.got.previous, r.plan.stack.name
        rolled_back = False
        if not r.plan.auto_rollback and r.got.activated:
            summary = (f"node left on failed revision {r.got.revision.number if r.got.revision else '?'} "
                       "(--no-auto-rollback); fix: b70deploy rollback")
        elif failure.undo_errors:
            summary = "rollback FAILED: the node may be serving nothing; see above, then b70deploy status"
        elif prev is not None:
            rolled_back = True
            back = f" in {r.got.rollback_wait.elapsed:.1f} s" if r.got.rollback_wait else ""
            summary = (f"switch to {name} {failed}; node back on revision {prev.number} ({prev.meta.stack}), "
                       f"healthy{back}")
        else:
            summary = f"switch to {name} {failed}; no previous revision, node serves nothing"
        code = (143 if interrupt == "SIGTERM" else 130) if interrupt else 1
        return Outcome(False, r.got.revision.number if r.got.revision else None, name, summary, details, exit_code=code,
                       rolled_back=rolled_back, diagnosis=finding.one_line() if finding else None,
                       remarks=r.plan.warnings)
