"""Runs a list of steps, journals every transition, and undoes completed steps on failure.

A step is a name, an action and an optional compensation. When a step fails, its own
compensation (it may have done half its work: files written, then compose up failed) and
those of the steps already done run in reverse order (the last first), each journaled,
and the failure is re-raised (Ctrl-C and SIGTERM included: they are failures
that undo). A fault hook runs at three points of every step: `before` it is journaled as
started, `during` (its effects done, not yet journaled as done) and `after`. By default it
kills this process with SIGKILL when B70DEPLOY_FAULT=POINT:STEP asks for it; tests that
drive the runner in-process pass a hook that raises `Killed` instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..state.journal import Journal
from ..state.space import best_effort
from ..ui.progress import Reporter
from . import interrupts

S = TypeVar("S")
FAULT_ENV = "B70DEPLOY_FAULT"


@dataclass(frozen=True)
class Step(Generic[S]):
    name: str
    summary: str                       # what it does, for the plan
    action: Callable[[S], None]
    compensation: Callable[[S], None] | None = None
    undo_summary: str = "-"            # what its compensation does, for the plan
    commits: bool = False              # once it is done the run has committed: later journal lines are best-effort


@dataclass
class StepFailed(Exception):
    step: str
    error: BaseException
    undo_errors: list[str] = field(default_factory=list)
    compensated: bool = False

    def __str__(self) -> str:
        return f"step {self.step} failed: {self.error}"


class Killed(BaseException):
    """Stands in for SIGKILL where a test drives the runner in-process: nothing runs after
    it, no compensation and no journal line, as when the kernel ends the process."""


Fault = Callable[[str, str], None]  # (point, step name); may kill or raise


def fault_from_env(point: str, step: str) -> None:
    """Signal this process at `point` of `step` when the environment asks for it:
    B70DEPLOY_FAULT=POINT:STEP sends SIGKILL, POINT:STEP:INT or :TERM an interrupt."""
    want = os.environ.get(FAULT_ENV, "")
    if want.startswith(f"{point}:{step}") and want[len(f"{point}:{step}"):] in ("", ":KILL", ":INT", ":TERM"):
        name = want[len(f"{point}:{step}") + 1:] or "KILL"
        os.kill(os.getpid(), getattr(signal, f"SIG{name}"))


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[list[int]]:
    """SIGINT and SIGTERM are noted, not acted on, while the block runs: an undo cut short by
    a second Ctrl-C would leave the node half way back. Main thread only (signals are)."""
    seen: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def note(signum: int, frame: object) -> None:
        seen.append(signum)

    before = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield seen
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


class Runner(Generic[S]):
    def __init__(self, journal: Journal, reporter: Reporter, *, command: str,
                 on_step: Callable[[str], None] | None = None, run_id: str | None = None,
                 fault: Fault = fault_from_env) -> None:
        self.journal = journal
        self.fault = fault
        self.reporter = reporter
        self.command = command
        self.on_step = on_step
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.timings: dict[str, float] = {}
        self.committed = False
        self.warnings: list[str] = []  # bookkeeping that could not be written (a full disk), said once each

    def warn(self, line: str) -> None:
        self.warnings.append(line)
        self.reporter.info(line)

    def _log(self, event: str, **fields: object) -> bool:
        """A journal line that must not stop what follows it (an undo, a committed run's end)."""
        return best_effort(self.journal.path.parent, lambda: self.journal.append(self.run_id, event, **fields),
                           f"the journal line {event} ({self.journal.path})", self.warn)

    def _step_line(self, event: str, **fields: object) -> None:
        """Before the commit a journal line that cannot be written stops the run (resume needs
        them); after it, the node is on the new revision and a lost line is a warning."""
        if self.committed:
            self._log(event, **fields)
        else:
            self.journal.append(self.run_id, event, **fields)

    def start(self, context: dict[str, object]) -> None:
        self.journal.append(self.run_id, "run-start", command=self.command, context=context, pid=os.getpid())

    def note(self, **context: object) -> None:
        """Record facts a resumed run will need (revision numbers and such)."""
        self.journal.append(self.run_id, "context", context=context)

    def run(self, steps: Sequence[Step[S]], state: S, *, done: Sequence[Step[S]] = (),
            compensate: bool | Callable[[], bool] = True) -> None:
        """Run `steps`; `done` are steps an interrupted run had completed (for compensation).
        `compensate` may be asked at the failure (what was done by then decides)."""
        completed: list[Step[S]] = list(done)
        for step in steps:
            started = False  # an interrupt can land between two steps too (a hook, a journal line)
            t0 = time.monotonic()
            try:
                if not self.committed:  # after the commit a signal is noted, never raised (interrupts.hold)
                    interrupts.check()  # a signal a finalizer swallowed still stops the run here
                if step.commits:
                    interrupts.hold()  # from the commit on, the run ends with the commit's outcome
                self.fault("before", step.name)
                if self.on_step is not None:
                    self.on_step(step.name)
                self._step_line("step-start", step=step.name)
                started = True
                self.reporter.phase(step.name, step.summary)
                step.action(state)
                self.fault("during", step.name)
                self.timings[step.name] = round(time.monotonic() - t0, 3)
                self.committed = self.committed or step.commits
                self._step_line("step-done", step=step.name, seconds=self.timings[step.name])
                completed.append(step)
                started = False
                self.fault("after", step.name)
            except Killed:
                raise
            except BaseException as exc:
                if started:
                    self.timings[step.name] = round(time.monotonic() - t0, 3)
                    self._log("step-failed", step=step.name, error=str(exc)[:2000])
                failure = StepFailed(step.name, exc)
                undo = compensate() if callable(compensate) else compensate
                if undo:  # the step's own compensation only if it started: it may be half done
                    failure.undo_errors = self.compensate([*completed, *([step] if started else [])], state)
                    failure.compensated = True
                self._log("run-failed", step=step.name, error=str(exc)[:2000], compensated=undo)
                raise failure from exc
        self._log("run-ok")

    def compensate(self, completed: Sequence[Step[S]], state: S) -> list[str]:
        with deferred_interrupts() as deferred:
            errors = self._compensate(completed, state)
        if deferred:  # undoing was not cut short: say that the signal was seen
            self._log("undo-shielded", signals=deferred)
            self.reporter.info(f"signal {', '.join(map(str, deferred))} during the undo: finished the undo first")
        return errors

    def _compensate(self, completed: Sequence[Step[S]], state: S) -> list[str]:
        errors: list[str] = []
        for step in reversed(completed):
            if step.compensation is None:
                continue
            # Every journal line here is best-effort: a full disk must not skip the undo behind it.
            self._log("undo-start", step=step.name)
            self.reporter.phase(f"undo {step.name}", step.undo_summary)
            try:
                step.compensation(state)
            except Exception as exc:  # keep undoing the rest, report all
                errors.append(f"undo {step.name}: {exc}")
                self._log("undo-failed", step=step.name, error=str(exc)[:2000])
            else:
                self._log("undo-done", step=step.name)
        return errors
