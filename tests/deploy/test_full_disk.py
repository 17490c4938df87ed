"""A state dir that fills up, in-process: the decision table of the switch on a small tmpfs of
the test's own (kit/smallfs.py), filled to a level before the switch or at a point inside it
by the runner's fault hook. The node behind the seam is the in-memory fake (test_state_machine);
tests/actions/test_integrity.py does the same on the real engine from outside."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.fakenode import stack_files
from kit.smallfs import fill, small_fs
from test_state_machine import Bench, plan_for

from b70deploy.deploy.driver import Outcome
from b70deploy.state import space


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Path]:
    with small_fs(tmp_path / "small", 1024) as mounted:
        yield mounted


def bench_on(small: Path) -> Bench:
    b = Bench(small)
    space.ensure_reserve(b.state.path)
    return b


def full_line(outcome: Outcome) -> bool:
    return any("is full (no space left on device)" in d for d in outcome.details)


@pytest.mark.parametrize("leave_kib", [0, 16, 64, 200])
def test_too_little_room_is_refused_before_the_drain_naming_the_state_dir(small: Path, leave_kib: int) -> None:
    b = bench_on(small)
    fill(small, leave_kib * 1024)
    with pytest.raises(space.StateDirFull) as refused:
        b.switch()
    assert str(b.state.path) in str(refused.value) and "is full" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert [e for e in b.node.effects if not e.startswith(("preflight", "warm"))] == []  # nothing stopped
    assert b.agreed() == "alpha" and b.state.revisions.numbers() == [1, 2]


@pytest.mark.parametrize("point,step", [("before", "drain"), ("before", "activate"), ("before", "wait-healthy"),
                                        ("before", "commit")])
def test_a_disk_that_fills_before_the_commit_is_undone_and_every_record_written(
        small: Path, point: str, step: str) -> None:
    """The reserve lets the failure's bookkeeping through: the node serves alpha, `current` and
    every outcome say so, no revision is left pending, the output names the full state dir."""
    b = bench_on(small)
    filled: list[Path] = []

    def fault(at: str, name: str) -> None:
        Bench.fault(b, at, name)
        if (at, name) == (point, step) and not filled:
            filled.append(fill(small))

    b.fault = fault  # type: ignore[method-assign]
    outcome = b.switch()
    assert filled and not outcome.ok and outcome.rolled_back, outcome.summary
    assert full_line(outcome), outcome.details
    assert "node back on revision 2 (alpha)" in outcome.summary
    assert b.agreed() == "alpha"
    assert b.state.revisions.get(3).status.outcome in ("failed", "aborted")


def test_a_disk_with_no_reserve_left_still_undoes_every_step(small: Path) -> None:
    """No room at all, not even the reserve: no outcome can be written after activate, and
    still every undo runs and the node serves what `current` names."""
    b = bench_on(small)

    def fault(at: str, name: str) -> None:
        Bench.fault(b, at, name)
        if (at, name) == ("before", "commit"):
            space.release_reserve(b.state.path)
            fill(small)

    b.fault = fault  # type: ignore[method-assign]
    outcome = b.switch()
    assert not outcome.ok and full_line(outcome), outcome.details
    assert any("could not write revision 3's outcome" in d for d in outcome.details), outcome.details
    assert b.node.serves() == "alpha" and b.node.deployed == stack_files("alpha")
    assert b.state.revisions.current_number() == 2  # never moved: `current` names what serves


@pytest.mark.parametrize("point,step", [("during", "commit"), ("after", "commit"), ("before", "companions")])
def test_a_disk_that_fills_after_the_commit_still_succeeds_with_a_warning(small: Path, point: str, step: str) -> None:
    """Committed (`current` names beta, its outcome deployed): what is written later only adds
    to the records, so no room even for the reserve is a warning and exit 0."""
    b = bench_on(small)

    def fault(at: str, name: str) -> None:
        Bench.fault(b, at, name)
        if (at, name) == (point, step):
            space.release_reserve(b.state.path)
            fill(small)

    b.fault = fault  # type: ignore[method-assign]
    outcome = b.switch()
    assert outcome.ok and outcome.exit_code == 0, outcome.summary
    assert any(w.startswith("warning: could not write") for w in outcome.warnings), outcome.warnings
    assert any("is full (no space left on device)" in w for w in outcome.warnings)
    assert b.node.serves() == "beta" and b.state.revisions.current_number() == 3
    assert b.state.revisions.get(3).status.outcome == "deployed"


def test_a_pending_revision_left_by_a_full_disk_is_closed_by_the_next_run(small: Path) -> None:
    b = bench_on(small)
    store = b.state.revisions
    left = store.create(stack="beta", kind="switch", files=stack_files("beta"), image_ref="img-beta",
                        image_id="img-beta", repo_digest=None, operator="t@h", message="", created="2026-12-01")
    assert left.status.outcome == "pending"
    b.node.broken.add("beta")
    b.driver().execute("switch beta", plan_for("beta"))
    assert store.get(left.number).status.outcome == "interrupted"
    assert [e["number"] for e in store.index() if e["outcome"] == "pending"] == []


def test_a_journal_that_cannot_be_written_skips_no_undo(small: Path) -> None:
    """The field report's bug: `undo-start` was journaled outside the runner's try, so the first
    journal line that failed skipped every undo after it. Here every line after check fails."""
    b = bench_on(small)
    journal = b.state.journal.path

    def fault(at: str, name: str) -> None:
        Bench.fault(b, at, name)
        if (at, name) == ("during", "check"):
            journal.rename(journal.with_suffix(".kept"))
            journal.mkdir()  # every append now fails (IsADirectoryError)
            b.node.trap = ("fail", "commit")

    b.fault = fault  # type: ignore[method-assign]
    outcome = b.switch()
    assert not outcome.ok and outcome.rolled_back, outcome.summary
    assert any("could not write the journal line undo-start" in d for d in outcome.details), outcome.details
    assert b.node.serves() == "alpha" and b.node.deployed == stack_files("alpha")
    assert b.state.revisions.current_number() == 2 and b.state.revisions.get(3).status.outcome == "failed"
