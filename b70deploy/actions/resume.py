"""`resume`: finish a run that was killed, from the step where it stopped (or undo it, if it
was undoing its steps when it died)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config.node import Node
from ..deploy.driver import Outcome
from ..deploy.plan import DeployPlan, Kind
from ..state.journal import RunRecord
from ..state.revisions import Revision
from ..state.statedir import StateDir
from ..ui.progress import Reporter
from .mutating import mutating
from .rollback import Rollback, revision_plan
from .switch import DeployOptions, Switch, driver


@dataclass
class Resume:
    node: Node
    lock_wait: float = 0.0

    def plan(self) -> str:
        """What resume would do, in one line."""
        run = StateDir(self.node.state_dir).interrupted_run()
        if run is None:
            return "nothing to resume: the last run finished"
        undoing = any(e["event"].startswith("undo") or e["event"] == "step-failed" for e in run.events)
        return f"`{run.command}` stopped at {run.last_step or 'start'}: resume {'undoes' if undoing else 'finishes'} it"

    def _plan_of(self, run: RunRecord, rev: Revision) -> DeployPlan:
        ctx = run.context
        opts = DeployOptions(auto_rollback=bool(ctx.get("auto_rollback", True)), lock_wait=self.lock_wait)
        kind: Kind = "rollback" if ctx.get("kind") == "rollback" else "switch"
        return revision_plan(self.node, rev, opts, kind=kind, message=rev.meta.message,
                             restored_from=rev.meta.restored_from)

    def _replan(self, run: RunRecord) -> DeployPlan:
        """A run killed before it stored its revision: the same verb, planned again."""
        ctx = run.context
        opts = DeployOptions(auto_rollback=bool(ctx.get("auto_rollback", True)), lock_wait=self.lock_wait)
        if ctx.get("kind") == "rollback" and isinstance(ctx.get("restored_from"), int):
            return Rollback(self.node, str(ctx["restored_from"]), opts).plan()
        return Switch(self.node, str(ctx.get("stack")), opts).plan()

    def run(self, reporter: Reporter) -> Outcome:
        if StateDir(self.node.state_dir).interrupted_run() is None:  # nothing to lock for
            return driver(self.node, reporter).resume("resume", self._plan_of, self._replan)
        with mutating(self.node, "resume", wait=self.lock_wait, take_stale=True) as m:
            return m.ended_with(driver(self.node, reporter).resume("resume", self._plan_of, self._replan,
                                                                   on_step=m.lock.set_step))
