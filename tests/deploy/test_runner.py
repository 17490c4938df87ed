"""The step runner: order, journal, compensation in reverse, fault injection (pure)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from b70deploy.deploy import interrupts
from b70deploy.deploy.runner import Runner, Step, StepFailed
from b70deploy.errors import Terminated
from b70deploy.state.journal import Journal
from b70deploy.ui.progress import PlainReporter


def steps(log: list[str], fail_at: str | None = None) -> list[Step[list[str]]]:
    def act(name: str):  # type: ignore[no-untyped-def]
        def f(state: list[str]) -> None:
            if name == fail_at:
                raise RuntimeError(f"{name} broke")
            state.append(name)
        return f

    def undo(name: str):  # type: ignore[no-untyped-def]
        return lambda state: state.append(f"undo-{name}")

    return [Step("a", "", act("a"), undo("a")), Step("b", "", act("b")), Step("c", "", act("c"), undo("c")),
            Step("d", "", act("d"), undo("d"))]


def test_success_journals_each_transition(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    state: list[str] = []
    runner: Runner[list[str]] = Runner(journal, PlainReporter(), command="t")
    runner.start({"x": 1})
    runner.run(steps(state), state)
    assert state == ["a", "b", "c", "d"]
    run = journal.last_run()
    assert run is not None and run.finished and run.steps_done() == ["a", "b", "c", "d"]


def test_failure_compensates_the_failing_step_then_completed_steps_in_reverse(tmp_path: Path) -> None:
    """The failing step may have done half its work (files written, compose up failed): its
    own compensation runs first."""
    journal = Journal(tmp_path)
    state: list[str] = []
    runner: Runner[list[str]] = Runner(journal, PlainReporter(), command="t")
    runner.start({})
    with pytest.raises(StepFailed) as info:
        runner.run(steps(state, fail_at="d"), state)
    assert info.value.step == "d"
    assert state == ["a", "b", "c", "undo-d", "undo-c", "undo-a"]
    events = [e["event"] for e in journal.lines()]
    assert events[-1] == "run-failed" and "undo-done" in events


def test_no_compensation_when_asked(tmp_path: Path) -> None:
    state: list[str] = []
    runner: Runner[list[str]] = Runner(Journal(tmp_path), PlainReporter(), command="t")
    runner.start({})
    with pytest.raises(StepFailed):
        runner.run(steps(state, fail_at="c"), state, compensate=False)
    assert state == ["a", "b"]


class SignalsItsOwnEnd:
    """Collected while the main thread runs: SIGTERM lands inside its __del__, where Python
    prints "Exception ignored" and carries on (a closing socket or connection pool, in life)."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_sigterm_a_finalizer_swallowed_still_stops_the_run_before_the_next_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    swallowed: list[sys.UnraisableHookArgs] = []
    monkeypatch.setattr(sys, "unraisablehook", swallowed.append)  # where "Exception ignored" comes from
    state: list[str] = []

    def b(s: list[str]) -> None:
        s.append("b")
        SignalsItsOwnEnd()  # made and collected at once

    sequence = steps(state)
    sequence[1] = Step("b", "", b)
    runner: Runner[list[str]] = Runner(Journal(tmp_path), PlainReporter(), command="t")
    runner.start({})
    with interrupts.installed(), pytest.raises(StepFailed) as info:
        runner.run(sequence, state)
    assert [type(u.exc_value) for u in swallowed] == [Terminated]  # Python did swallow it
    assert info.value.step == "c" and isinstance(info.value.error, Terminated)
    assert state == ["a", "b", "undo-a"]  # c and d never ran; what ran was undone


SCRIPT = """
import sys
from pathlib import Path
from b70deploy.state.journal import Journal
from b70deploy.ui.progress import PlainReporter
from b70deploy.deploy.runner import Runner, Step
r = Runner(Journal(Path(sys.argv[1])), PlainReporter(), command="t")
r.start({})
r.run([Step(n, "", lambda s: None) for n in ("a", "b", "c")], None)
"""


@pytest.mark.parametrize("fault,last_done", [("before:a", []), ("after:a", ["a"]), ("after:b", ["a", "b"]),
                                             ("before:c", ["a", "b"])])
def test_fault_injection_kills_at_the_boundary(tmp_path: Path, fault: str, last_done: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env={"B70DEPLOY_FAULT": fault,
                          "PYTHONPATH": str(Path(__file__).resolve().parents[2])}, capture_output=True, check=False)
    assert proc.returncode == -9
    run = Journal(tmp_path).last_run()
    assert run is not None and not run.finished
    assert run.steps_done() == last_done


def test_torn_journal_line_is_skipped(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.append("r1", "run-start", command="switch x", context={"revision": 3})
    journal.append("r1", "step-done", step="record")
    with journal.path.open("a") as fh:
        fh.write('{"run": "r1", "event": "step-')
    run = journal.last_run()
    assert run is not None and run.steps_done() == ["record"] and run.context["revision"] == 3
