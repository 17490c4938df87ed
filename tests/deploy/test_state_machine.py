"""The switch's decision table on the in-memory node, no Docker: every step x {fails,
interrupted (Ctrl-C/SIGTERM), killed before, killed during, killed after} x {resume, rollback}.

The node serves `alpha` (revision 2, whose parent is `gamma`, revision 1) and is switched
to `beta`. After the failure or the kill, and then the recovery, the test asks the node
itself which stack it serves and compares the deploy dir's bytes with the current
revision's: the files, the records and the containers must agree.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import pytest
from kit.fakenode import FakeNode, Quiet, stack_files

from b70deploy.actions.inspect import differences, serving_slot
from b70deploy.actions.rollback import resolve_target
from b70deploy.config.node import Node
from b70deploy.config.schema import Smoke, Stack
from b70deploy.deploy import interrupts
from b70deploy.deploy.deploydir import write_deployed
from b70deploy.deploy.driver import Driver, Outcome
from b70deploy.deploy.plan import DeployPlan, ImageInfo, Kind, StandbyPlan, Waits
from b70deploy.deploy.runner import Killed
from b70deploy.deploy.steps import plan_lines, steps
from b70deploy.errors import NodeBusy, UserError
from b70deploy.state.journal import RunRecord
from b70deploy.state.revisions import Revision
from b70deploy.state.slots import SlotBook
from b70deploy.state.statedir import StateDir

COMPANIONS = ("webui",)
KEPT = "db"  # a companion the drain leaves running (deploy/companions.py): webui waits for it
SHM = Path("/dev/shm")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """The state dir on tmpfs where there is one: fsync is what costs on a disk, and the
    decision table, not the disk, is under test here (the engine tests keep real disks)."""
    if not (SHM.is_dir() and os.access(SHM, os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="b70-state-machine-", dir=SHM) as d:
        yield Path(d)




def stack(name: str) -> Stack:
    return Stack(name=name, image=f"img-{name}", model={"path": name},  # type: ignore[arg-type]
                 served_model_names=[name], max_model_len=256, settle_seconds=3,
                 smoke=Smoke(completion=None, tool_call=False, aliases=False))


def plan_for(name: str, *, kind: Kind = "switch", files: dict[str, bytes] | None = None,
             restored_from: int | None = None, standby: StandbyPlan | None = None, kept: bool = False) -> DeployPlan:
    return DeployPlan(kind=kind, stack=stack(name), files=files or stack_files(name),
                      image=ImageInfo(f"img-{name}", f"img-{name}", None, ()), message="",
                      companions=(*COMPANIONS, KEPT) if kept else COMPANIONS, kept=(KEPT,) if kept else (),
                      waits=Waits(health=5, rollback=5, verify=0), restored_from=restored_from, standby=standby)


def plan_of_revision(rev: Revision, *, kind: Kind, restored_from: int | None, standby: bool = False,
                     kept: bool = False) -> DeployPlan:
    name = str(rev.meta.stack_doc["name"])
    # the slot of a rollback's bytes: the revision they were first deployed as (actions/rollback.py)
    slot = rev.meta.restored_from if rev.meta.kind == "rollback" else rev.number
    return plan_for(name, kind=kind, files=rev.read_files(), restored_from=restored_from,
                    standby=StandbyPlan(wake_slot=slot if kind == "rollback" else None) if standby else None,
                    kept=kept)


STEP_NAMES = [s.name for s in steps(plan_for("beta"))]
MODES = ["fails", "interrupted", "killed-before", "killed-during", "killed-after"]


class Bench:
    """A node on alpha with gamma before it, and a fault hook that tracks the runner's step."""

    def __init__(self, tmp: Path, *, door: bool = False, standby: bool = False, kept: bool = False) -> None:
        self.state = StateDir(tmp / "state")
        self.kept = kept  # a database-like companion, KEPT, beside webui: the plans keep it running
        self.standby = standby  # alpha live in its slot (2), gamma asleep in its own (1); the door in front
        self.node = FakeNode(images={"img-alpha", "img-beta", "img-gamma"}, door=door or standby)
        self.point: tuple[str, str] | None = None  # ("before"|"after", step): SIGKILL there
        self.interrupt: tuple[str, str] | None = None  # ("before"|"after", step): Ctrl-C there, between steps
        store = self.state.revisions
        for name in ("gamma", "alpha"):
            rev = store.create(stack=name, kind="switch", files=stack_files(name), image_ref=f"img-{name}",
                               image_id=f"img-{name}", repo_digest=None, operator="t@h", message="",
                               created="2026-11-30T00:00:00+0000", stack_doc=stack(name).model_dump(mode="json"))
            if store.current() is not None:
                store.update_status(store.current_number() or 0, outcome="superseded")
            store.update_status(rev.number, outcome="deployed")
            store.set_current(rev.number)
        self.node.deployed = stack_files("alpha")
        self.node.door_points = store.current_number() if self.node.door else None
        for service in ("vllm", *COMPANIONS, *((KEPT,) if kept else ())):
            self.node.running[service] = stack_files("alpha")
        if standby:
            del self.node.running["vllm"]
            self.node.slot_files = {1: stack_files("gamma"), 2: stack_files("alpha")}
            self.node.slot_state = {1: "asleep", 2: "live"}
            self.node.target = 2

    def fault(self, point: str, step: str) -> None:
        if point == "before":
            self.node.step = step
        if self.point == (point, step):
            self.point = None
            raise Killed(f"killed {point} {step}")
        if self.interrupt == (point, step):
            self.interrupt = None
            raise KeyboardInterrupt
        trap = self.node.trap
        if point == "during" and trap is not None and trap[1] == step:  # the step made no effect to trap
            self.node.trap = None
            if trap[0] == "kill":
                raise Killed(f"killed during {step}")
            if trap[0] == "interrupt":
                raise KeyboardInterrupt
            raise RuntimeError(f"injected failure in {step}")

    def driver(self) -> Driver:
        return Driver(self.state, self.node, Quiet(), fault=self.fault)

    def switch(self) -> Outcome:
        return self.driver().execute("switch beta", plan_for("beta", standby=StandbyPlan() if self.standby else None,
                                                             kept=self.kept))

    def resume(self) -> Outcome:
        def plan_of(run: RunRecord, rev: Revision) -> DeployPlan:
            kind: Kind = "rollback" if run.context.get("kind") == "rollback" else "switch"
            return plan_of_revision(rev, kind=kind, restored_from=rev.meta.restored_from, standby=self.standby,
                                    kept=self.kept)

        def replan(run: RunRecord) -> DeployPlan:  # killed before the revision was stored
            return plan_for(str(run.context["stack"]), standby=StandbyPlan() if self.standby else None, kept=self.kept)

        return self.driver().resume("resume", plan_of, replan)

    def rollback(self) -> Outcome:
        target = resolve_target(self.state, None)  # the rollback's own plan, before the driver runs it
        return self.driver().execute("rollback", plan_of_revision(target, kind="rollback", restored_from=target.number,
                                                                  standby=self.standby, kept=self.kept))

    def agreed(self) -> str | None:
        """The stack the node serves, once files, records and containers are checked to agree."""
        store = self.state.revisions
        current = store.current()
        assert current is not None
        served = self.node.serves()
        assert served == current.meta.stack, f"node serves {served}, records say {current.meta.stack}"
        assert self.node.deployed == current.read_files(), "deploy dir differs from the current revision"
        assert self.node.running.get("webui") is not None, "companions not started again"
        assert [e["number"] for e in store.index() if e["outcome"] in ("pending", "deployed")
                and e["number"] != current.number] == [], store.index()
        assert self.state.interrupted_run() is None
        if self.node.door:
            assert self.node.door_points == current.number, f"door points at {self.node.door_points}"
        return served


def arm(b: Bench, mode: str, step: str) -> None:
    """The fault `mode` at `step`: a failure or an interrupt inside it, or a kill before, during or after it."""
    if mode in ("fails", "interrupted"):
        b.node.trap = ("fail" if mode == "fails" else "interrupt", step)
    elif mode == "killed-during":
        b.node.trap = ("kill", step)
    else:
        b.point = (mode.removeprefix("killed-"), step)


def expected(mode: str, step: str, recovery: str) -> str:
    if mode in ("fails", "interrupted"):  # undone at once; resume has nothing to do, rollback goes to gamma
        return "alpha" if recovery == "resume" else "gamma"
    if recovery == "rollback":  # back to where the killed run started
        return "alpha"
    return "beta"  # resume finishes the switch, planning it again if it was killed before record


@pytest.mark.parametrize("door", [False, True], ids=["direct", "door"])
@pytest.mark.parametrize("recovery", ["resume", "rollback"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("step", STEP_NAMES)
def test_every_step_every_fault_then_recovery(root: Path, step: str, mode: str, recovery: str, door: bool) -> None:
    b = Bench(root, door=door)
    arm(b, mode, step)
    if mode in ("fails", "interrupted"):
        outcome = b.switch()
        assert not outcome.ok and outcome.exit_code == (1 if mode == "fails" else 130)
        assert b.agreed() == "alpha"  # undone at once: alpha serves, records say so
    else:
        with pytest.raises(Killed):
            b.switch()
        run = b.state.interrupted_run()
        at = STEP_NAMES.index(step)
        assert run is not None
        assert run.last_step == (step if mode != "killed-before" else (STEP_NAMES[at - 1] if at else None))
    after = b.resume() if recovery == "resume" else b.rollback()
    assert after.ok, after.details
    assert b.agreed() == expected(mode, step, recovery)


@pytest.mark.parametrize("door", [False, True], ids=["direct", "door"])
@pytest.mark.parametrize("point", ["before", "after"])
@pytest.mark.parametrize("step", STEP_NAMES)
def test_an_interrupt_between_two_steps_is_undone_like_one_inside_a_step(root: Path, step: str, point: str,
                                                                        door: bool) -> None:
    """benchmarks/chaos.py found it: a SIGTERM that landed after drain's `step-done` (in the
    runner's own bookkeeping, outside any step) left the node drained, the run unfinished and
    the CLI saying "aborted", exit 1. Now it is undone like an interrupt inside a step."""
    b = Bench(root, door=door)
    b.interrupt = (point, step)
    outcome = b.switch()
    assert not outcome.ok and outcome.exit_code == 130, outcome.summary
    assert b.agreed() == "alpha"  # undone at once: alpha serves, records say so, the run is closed
    run = b.state.journal.last_run()
    assert run is not None and run.finished


@pytest.mark.parametrize("recovery", ["resume", "rollback"])
@pytest.mark.parametrize("mode", ["fails", "killed-during"])
@pytest.mark.parametrize("step", STEP_NAMES)
def test_a_kept_companion_runs_on_through_every_fault_and_recovery(root: Path, step: str, mode: str,
                                                                  recovery: str) -> None:
    """A companion the plan keeps (a database webui waits for) is never stopped nor started again: not by
    the drain, its undo, a failed switch's rollback, a resume or a rollback; webui stops and starts as before."""
    b = Bench(root, kept=True)
    arm(b, mode, step)
    if mode == "fails":
        assert not b.switch().ok
    else:
        with pytest.raises(Killed):
            b.switch()
    assert (b.rollback() if recovery == "rollback" else b.resume()).ok
    assert b.agreed() == expected(mode, step, recovery)
    assert b.node.running.get(KEPT) == stack_files("alpha") and KEPT not in b.node.starts, b.node.effects


def test_a_switch_and_its_rollback_stop_and_start_the_client_companion_only(root: Path) -> None:
    b = Bench(root, kept=True)
    assert b.switch().ok and b.agreed() == "beta"
    assert b.rollback().ok and b.agreed() == "alpha"
    assert b.node.starts == {"webui": 2}  # db: never stopped, never started again


def test_the_dry_run_names_the_companions_that_stop_and_the_ones_that_keep_running() -> None:
    drain = next(line for line in plan_lines(plan_for("beta", kept=True)) if " drain " in line)
    assert "stop vllm, webui; db keep running" in drain
    drain = next(line for line in plan_lines(plan_for("beta")) if " drain " in line)
    assert "stop vllm, webui (as compose stop)" in drain


def test_the_matrix_covers_every_step_and_runs_without_docker() -> None:
    assert STEP_NAMES == ["preflight", "warm", "idle", "record", "snapshot", "drain", "verify", "activate",
                          "wait-healthy", "check", "release", "settle", "commit", "companions"]


def test_a_killed_drain_leaves_half_written_files_that_resume_completes(root: Path) -> None:
    b = Bench(root)
    b.node.trap = ("kill", "drain")
    with pytest.raises(Killed):
        b.switch()
    mixed: dict[str, Any] = {n: d for n, d in b.node.deployed.items()}
    assert mixed["docker-compose.yml"] == stack_files("beta")["docker-compose.yml"]
    assert mixed[".env"] == stack_files("alpha")[".env"]  # torn, as a kill between two renames leaves it
    assert b.node.serves() == "alpha"  # the files are written before anything is created or stopped
    assert b.resume().ok
    assert b.agreed() == "beta"


def test_a_failed_boot_after_activate_writes_the_previous_files_back(root: Path) -> None:
    b = Bench(root)
    b.node.broken.add("beta")
    outcome = b.switch()
    assert not outcome.ok and outcome.rolled_back
    assert b.agreed() == "alpha"
    assert b.state.revisions.get(3).status.outcome == "failed"



@pytest.mark.parametrize("step,serves", [("verify", "alpha"), ("wait-healthy", None)])
def test_no_auto_rollback_keeps_a_failed_stack_but_undoes_a_switch_that_started_none(
        root: Path, step: str, serves: str | None) -> None:
    """Not idle at verify: the drain created beta's container and wrote its files, nothing of
    beta ran, so there is nothing to inspect: alpha serves again. A boot that failed stays."""
    b = Bench(root)
    if step == "verify":
        b.node.trap = ("fail", step)
    else:
        b.node.broken.add("beta")  # its boot never becomes healthy
    outcome = b.driver().execute("switch beta", replace(plan_for("beta"), auto_rollback=False))
    assert not outcome.ok
    assert b.node.serves() == serves
    if serves == "alpha":
        assert outcome.rolled_back and b.agreed() == "alpha"
    else:
        assert "--no-auto-rollback" in outcome.summary and b.node.deployed == stack_files("beta")


def test_an_engine_that_dies_inside_the_settle_window_fails_the_switch(root: Path) -> None:
    b = Bench(root)
    b.node.dies_after_ready.add("beta")
    outcome = b.switch()
    assert not outcome.ok and outcome.rolled_back
    assert any("settle window" in d for d in outcome.details), outcome.details
    assert b.agreed() == "alpha"
    assert b.state.revisions.get(3).status.outcome == "failed"


def test_lint_errors_stop_the_preflight_in_one_line_with_one_fix(root: Path) -> None:
    bench = Bench(root)
    errors = ("[patch-unknown] no patch named 'x' in /p", "[image-missing] image img-beta not found")
    with pytest.raises(UserError) as caught:
        bench.driver().execute("switch beta", replace(plan_for("beta"), lint_errors=errors))
    line = str(caught.value)
    assert "\n" not in line and "\\n" not in line and line.count("fix: ") == 1, line
    assert line.startswith("lint found 2 error(s) in beta: [patch-unknown] no patch named 'x' in /p; [image-missing]")
    assert bench.node.deployed == stack_files("alpha")


def test_every_recorded_revision_keeps_its_image_tagged_even_after_a_kill_in_record(root: Path) -> None:
    """The keep tag is made in record (docker/keep.py); a run killed there tags on resume."""
    b = Bench(root)
    b.node.trap = ("kill", "record")  # the keep tag is record's one effect on the node
    with pytest.raises(Killed):
        b.switch()
    assert "img-beta" not in b.node.kept
    assert b.resume().ok
    assert b.node.kept == {"img-beta"}
    assert b.rollback().ok  # back to alpha: a new revision, pinned to alpha's image, tagged too
    assert b.node.kept == {"img-alpha", "img-beta"}  # one tag per image, however many revisions


def test_caches_and_weights_are_ready_before_the_drain_and_the_running_image_is_kept(root: Path) -> None:
    b = Bench(root)
    assert b.switch().ok
    assert b.node.warmed == ["caches img-beta keep img-alpha", "weights beta"]  # alpha's cache may not be evicted
    steps_seen = [e.split(":", 1)[0] for e in b.node.effects]
    assert steps_seen.index("warm") < steps_seen.index("drain")
    # The new container is created from the new files while alpha still serves; creating it stops the old one.
    assert [e for e in b.node.effects if e.startswith(("drain:", "activate:"))] == [
        "drain:write", "drain:create vllm", "activate:start vllm"]


def test_with_a_door_the_drain_holds_before_vllm_and_the_release_comes_after_the_checks(root: Path) -> None:
    """The running door is brought in line with the new files before it holds (a door recreated while it
    holds would take the held requests with it), then holds, and only then is vllm replaced."""
    b = Bench(root, door=True)
    assert b.switch().ok
    assert [e for e in b.node.effects if e.startswith(("drain:", "activate:", "release:"))] == [
        "drain:write", "drain:door sync", "drain:door close", "drain:create vllm", "activate:start vllm",
        "release:door open 3"]
    assert b.agreed() == "beta" and b.node.door_points == 3


def test_with_a_door_a_failed_boot_points_it_back_at_the_previous_revision(root: Path) -> None:
    b = Bench(root, door=True)
    b.node.broken.add("beta")
    outcome = b.switch()
    assert not outcome.ok and outcome.rolled_back
    assert b.agreed() == "alpha" and b.node.door_points == 2
    assert "release:door open 3" not in b.node.effects  # the failed stack never had the door


def test_a_door_whose_image_is_missing_is_refused_before_the_drain(root: Path) -> None:
    b = Bench(root, door=True)
    files = {**stack_files("beta")}
    files["docker-compose.yml"] += b'  door:\n    image: "b70deploy/door:caddy-2.11.7"\n'
    with pytest.raises(UserError) as caught:
        b.driver().execute("switch beta", plan_for("beta", files=files))
    assert "b70deploy door --build" in str(caught.value)
    assert b.agreed() == "alpha" and not [e for e in b.node.effects if e.startswith("drain:")]


# ---------------------------------------------------------------- hot standby (issue 24)

STANDBY_STEPS = [s.name for s in steps(plan_for("beta", standby=StandbyPlan()))]


def standby_agreed(b: Bench) -> str | None:
    """agreed(), and the slots as the standby promises: the served revision's slot live, at most one
    asleep, no slot left half made."""
    served = b.agreed()
    slots = b.node.slots()
    assert set(slots.values()) <= {"live", "asleep"}, slots
    assert list(slots.values()).count("live") == 1 and list(slots.values()).count("asleep") <= 1, slots
    return served


@pytest.mark.parametrize("recovery", ["resume", "rollback"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("step", STANDBY_STEPS)
def test_standby_every_step_every_fault_then_recovery(root: Path, step: str, mode: str, recovery: str) -> None:
    b = Bench(root, standby=True)
    arm(b, mode, step)
    if mode in ("fails", "interrupted"):
        outcome = b.switch()
        assert not outcome.ok and outcome.exit_code == (1 if mode == "fails" else 130)
        assert standby_agreed(b) == "alpha"
        assert "up vllm" not in " ".join(b.node.effects)  # back by waking, never a cold boot
    else:
        with pytest.raises(Killed):
            b.switch()
        assert b.state.interrupted_run() is not None
    after = b.resume() if recovery == "resume" else b.rollback()
    assert after.ok, after.details
    assert standby_agreed(b) == expected(mode, step, recovery)


def test_standby_steps_are_the_switch_with_its_own_drain_activate_and_standbys() -> None:
    assert STANDBY_STEPS == ["preflight", "warm", "idle", "record", "snapshot", "drain", "verify", "activate",
                             "wait-healthy", "check", "release", "settle", "commit", "standbys", "companions"]


def test_standby_switch_sleeps_the_live_slot_and_boots_beside_it(root: Path) -> None:
    b = Bench(root, standby=True)
    assert b.switch().ok
    # the new slot is created and the door synced while alpha still serves; the door holds only then
    assert [e for e in b.node.effects if e.split(":")[0] in ("drain", "activate", "release", "standbys")] == [
        "drain:write", "drain:boot beside 3", "drain:door sync", "drain:door close", "drain:doze 2 level 1",
        "activate:start beside 3", "release:door open 3", "standbys:retire 1"]
    assert standby_agreed(b) == "beta" and b.node.slots() == {2: "asleep", 3: "live"}


def test_standby_failed_boot_wakes_the_standby_checks_it_and_points_the_door_back(root: Path) -> None:
    b = Bench(root, standby=True)
    b.node.broken.add("beta")
    outcome = b.switch()
    assert not outcome.ok and outcome.rolled_back, outcome.summary
    at = b.node.effects.index("activate:start beside 3")
    undo = b.node.effects[at + 1:]
    # woken, asked /health once and one completion: it passed every check when it went to sleep; the crashed
    # slot (its process ended: it holds nothing) is removed once the door has reopened
    assert [e.split(":", 1)[1] for e in undo] == ["wait", "write", "wake 2", "one completion", "door open 2",
                                                   "retire 3"], undo
    assert "release:door open 3" not in b.node.effects  # the failed stack never had the door
    assert standby_agreed(b) == "alpha" and b.node.slots() == {1: "asleep", 2: "live"}


def test_standby_woken_with_garbage_is_not_given_the_door(root: Path) -> None:
    """A wake that answers /health and emits garbage: the smoke tests after the wake catch it."""
    b = Bench(root, standby=True)
    b.node.broken.add("beta")
    b.node.smoke_fails.add("alpha")
    outcome = b.switch()
    assert not outcome.ok and not outcome.rolled_back
    assert "rollback FAILED" in outcome.summary
    assert any("woke from standby and failed its smoke tests" in d for d in outcome.details), outcome.details
    assert b.node.door_points is None  # still holding: the garbage never got the clients


def test_standby_recovery_whose_woken_standby_fails_boots_the_previous_revision_in_its_slot(root: Path) -> None:
    """Issue 35, deliver 4: a switch killed after its drain (alpha asleep in slot 2, beta's slot 3 made); the
    rollback removes slot 3, puts nothing to sleep and wakes slot 2, which fails its completion. The previous
    revision (alpha) comes back booted cold in its own slot, recorded as serving there, never in the
    project's own container."""
    b = Bench(root, standby=True)
    b.point = ("after", "drain")
    with pytest.raises(Killed):
        b.switch()
    b.node.smoke_fails.add("alpha")  # what the wake gets wrong; a cold boot is checked by /health
    b.node.effects.clear()
    outcome = b.rollback()
    assert not outcome.ok and outcome.rolled_back, outcome.summary
    undo = [e.split(":", 1)[1] for e in b.node.effects[b.node.effects.index("check:one completion") + 1:]]
    assert undo == ["retire 2", "write", "boot beside 2", "start beside 2", "wait", "door open 2"], undo
    assert "vllm" not in b.node.running and not any("up vllm" in e for e in b.node.effects), b.node.effects
    assert b.node.slots() == {1: "asleep", 2: "live"} and b.node.slot_files[2] == stack_files("alpha")
    assert standby_agreed(b) == "alpha" and b.node.door_points == 2
    records = SlotBook(b.state.path).read()
    assert (records[2].revision, records[2].asleep_since) == (2, None), records


def test_standby_rollback_wakes_the_sleeping_slot_instead_of_booting(root: Path) -> None:
    b = Bench(root, standby=True)
    assert b.switch().ok
    b.node.effects.clear()
    assert b.rollback().ok  # to alpha, revision 2, asleep in its slot
    assert standby_agreed(b) == "alpha"
    assert b.node.slots() == {2: "live", 3: "asleep"}
    drained = [e for e in b.node.effects if e.split(":")[0] in ("drain", "activate")]
    assert drained == ["drain:write", "drain:door sync", "drain:door close", "drain:doze 3 level 1",
                       "activate:wake 2"], drained
    # no health wait, no settle window, one completion: the door is released right after it
    after = [e for e in b.node.effects if e.split(":")[0] in ("wait-healthy", "check", "release", "settle")]
    assert after == ["check:one completion", "release:door open 4"], after
    assert b.state.revisions.current_number() == 4 and b.node.door_points == 4


@dataclass(frozen=True)
class StatusNode:
    """What status's advice reads of a node (actions/inspect.py): its records and its deploy dir."""

    state_dir: Path
    deploy_dir: Path
    compose_files: tuple[str, ...] = ("docker-compose.yml",)


def status_advice(b: Bench, node: StatusNode) -> tuple[list[str], str | None]:
    """status's differences and fix for the fake node as it stands: its deploy dir's bytes on disk, the
    container the door reaches, the slot records."""
    write_deployed(node.deploy_dir, b.node.deployed)
    store = b.state.revisions
    cur = store.current()
    assert cur is not None
    st = {"container": {"status": "running", "stack": b.node.serves()}, "lock": None,
          "serving_slot": serving_slot(cast(Node, node)), "door": {"points_at": b.node.door_points}}
    return differences(cast(Node, node), store, cur, st)


def test_status_names_the_serving_slot_by_its_record_and_advises_a_rollback_that_works_on_standby(
        root: Path) -> None:
    """The records' current pointer moved back to revision 2 while slot 3 serves revision 3 (the deploy dir
    holding revision 3's bytes): status names the slot by its record and advises `rollback 2`, never `adopt`
    (refused on a standby node); the advice followed wakes revision 2's slot, and status then agrees."""
    b = Bench(root, standby=True)
    node = StatusNode(b.state.path, root / "deploy")
    assert serving_slot(cast(Node, node)) is None  # no records yet: no slot is named
    assert b.switch().ok
    assert serving_slot(cast(Node, node)) == {"slot": 3, "revision": 3}
    assert status_advice(b, node) == ([], None)
    b.state.revisions.update_status(3, outcome="superseded")  # the records moved back to 2 by hand
    b.state.revisions.set_current(2)
    found, fix = status_advice(b, node)
    assert found[-1] == "standby slot 3 serves as revision 3, not the current revision 2", found
    assert fix == "b70deploy rollback 2 (wakes or boots it in its own slot)"
    target = resolve_target(b.state, fix.split()[2])
    b.node.effects.clear()
    assert b.driver().execute("rollback", plan_of_revision(target, kind="rollback", restored_from=target.number,
                                                           standby=True)).ok
    assert "activate:wake 2" in b.node.effects  # woken in its slot, not booted
    assert standby_agreed(b) == "alpha"
    assert serving_slot(cast(Node, node)) == {"slot": 2, "revision": b.state.revisions.current_number()}
    assert status_advice(b, node) == ([], None)


def test_status_names_no_serving_slot_when_its_records_cannot_be_read(root: Path) -> None:
    b = Bench(root, standby=True)
    assert b.switch().ok
    node = StatusNode(b.state.path, root / "deploy")
    SlotBook(b.state.path).path.write_text("{not json")
    assert serving_slot(cast(Node, node)) is None  # status still answers; the slot check waits for fsck
    found, fix = status_advice(b, node)
    assert not any("standby slot" in f for f in found) and fix is None, (found, fix)


def test_a_switch_without_standby_stops_every_slot_first(root: Path) -> None:
    b = Bench(root, standby=True)
    assert b.driver().execute("switch beta", plan_for("beta")).ok
    assert "drain:retire 1" in b.node.effects and "drain:retire 2" in b.node.effects
    assert b.node.slots() == {} and b.agreed() == "beta"


# ---------------------------------------------------------------- the tool's seconds, the slots' records (issue 35)


def test_a_busy_host_refuses_the_switch_before_the_drain(root: Path) -> None:
    """The load is read before the drain: the clients were never held for a switch that cannot happen."""
    b = Bench(root, door=True)
    b.node.load = 9.0
    with pytest.raises(NodeBusy) as caught:
        b.switch()
    assert "load_threshold in the node config" in str(caught.value) and "timeouts.verify" not in str(caught.value)
    assert not [e for e in b.node.effects if e.split(":")[0] in ("drain", "verify", "activate")], b.node.effects
    assert "idle:readings" in b.node.effects and b.node.door_points == 2
    assert b.agreed() == "alpha" and b.state.revisions.numbers() == [1, 2]  # nothing recorded either


def test_the_door_is_released_when_the_smoke_tests_pass_and_settle_watches_it_serving(root: Path) -> None:
    b = Bench(root, door=True)
    assert b.switch().ok
    order = [e for e in b.node.effects if e.split(":")[0] in ("wait-healthy", "check", "release", "settle")]
    assert order == ["wait-healthy:wait", "check:smoke", "release:door open 3", "settle:up webui"], order


def test_an_engine_that_dies_serving_inside_the_settle_window_gets_the_door_held_and_rolled_back(root: Path) -> None:
    b = Bench(root, door=True)
    b.node.dies_after_ready.add("beta")
    outcome = b.switch()
    assert not outcome.ok and outcome.rolled_back
    undo = [e for e in b.node.effects if e.startswith("settle:")]
    assert "settle:door close" in undo and undo[-1] == "settle:door open 2", undo
    assert undo.index("settle:door close") < undo.index("settle:up vllm")
    assert b.agreed() == "alpha"


def test_a_killed_standby_switch_is_rolled_back_to_the_recorded_slot_never_the_killed_runs(root: Path) -> None:
    """Killed after activate: slot 3 runs on the door's network, never checked. The rollback removes it (no
    run recorded it), wakes alpha's slot, and the next switch succeeds with at most one slot asleep."""
    b = Bench(root, standby=True)
    b.point = ("after", "activate")
    with pytest.raises(Killed):
        b.switch()
    assert b.node.slots() == {1: "asleep", 2: "asleep", 3: "live"}  # what the engine shows after the kill
    b.node.effects.clear()
    assert b.rollback().ok
    assert "drain:retire 3" in b.node.effects and "drain:doze 3 level 1" not in b.node.effects, b.node.effects
    assert standby_agreed(b) == "alpha" and 3 not in b.node.slots()
    recorded = json.loads((b.state.path / "slots.json").read_text())["slots"]
    assert recorded["2"] == {"revision": 4, "asleep_since": None}  # serves as the rollback's revision
    b.node.effects.clear()
    assert b.switch().ok  # beta again, as revision 5
    assert standby_agreed(b) == "beta" and list(b.node.slots().values()).count("asleep") == 1


def test_the_standby_kept_is_the_one_asleep_most_recently(root: Path) -> None:
    """alpha (slot 2) woken by a rollback keeps its low number; the next switch puts it to sleep, and it,
    not beta's older sleeper (slot 3), is the standby kept."""
    b = Bench(root, standby=True)
    assert b.switch().ok            # beta live in 3, alpha asleep in 2
    assert b.rollback().ok          # alpha woken in 2, beta asleep in 3
    assert b.node.slots() == {2: "live", 3: "asleep"}
    b.node.images.add("img-delta")
    assert b.driver().execute("switch delta", plan_for("delta", standby=StandbyPlan())).ok
    assert b.node.slots() == {2: "asleep", 5: "live"}, b.node.slots()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_real_signal_after_the_commit_is_noted_and_the_run_ends_with_the_commit(root: Path, signum: int) -> None:
    """Under the CLI's handlers (interrupts.installed), a signal delivered between commit and companions is
    noted: the run finishes, the outcome is the commit's, exit 0, and it names the signal."""
    b = Bench(root, door=True)
    plain = b.fault

    def signal_after_commit(point: str, step: str) -> None:
        plain(point, step)
        if (point, step) == ("after", "commit"):
            os.kill(os.getpid(), signum)

    with interrupts.installed():
        outcome = Driver(b.state, b.node, Quiet(), fault=signal_after_commit).execute("switch beta", plan_for("beta"))
    assert outcome.ok and outcome.exit_code == 0 and outcome.signals == [signal.Signals(signum).name], outcome
    assert b.agreed() == "beta"


def test_a_private_file_keeps_its_recorded_mode_through_a_rollback_and_a_failed_switchs_undo(root: Path) -> None:
    """An adopted revision holds the operator's key, recorded 0600: a rollback to it writes the key
    0600 into the deploy dir and records 0600 again; a switch from it that fails writes it back 0600."""
    b = Bench(root)
    store = b.state.revisions
    keyed = {**stack_files("gamma"), "keys/node.pem": b"-----BEGIN PRIVATE KEY-----\n"}
    adopted = store.create(stack="gamma", kind="adopt", files=keyed, image_ref="img-gamma", image_id="img-gamma",
                           repo_digest=None, operator="t@h", message="", created="2026-11-30T00:00:00+0000",
                           stack_doc=stack("gamma").model_dump(mode="json"), outcome="superseded",
                           modes={"keys/node.pem": 0o600})
    plan = replace(plan_of_revision(adopted, kind="rollback", restored_from=adopted.number), modes=adopted.modes())
    assert b.driver().execute("rollback", plan).ok
    assert b.agreed() == "gamma"
    assert b.node.deployed_modes["keys/node.pem"] == 0o600 and b.node.deployed_modes["docker-compose.yml"] == 0o644
    back = store.current()
    assert back is not None and back.number == adopted.number + 1 and back.modes()["keys/node.pem"] == 0o600
    assert os.stat(back.files_dir / "keys/node.pem").st_mode & 0o777 == 0o600
    arm(b, "fails", "wait-healthy")
    assert not b.switch().ok
    assert b.agreed() == "gamma" and b.node.deployed_modes["keys/node.pem"] == 0o600


def test_standby_a_drain_killed_before_its_live_slot_slept_is_resumed_by_dozing_it(root: Path) -> None:
    """Issue 35: the killed run noted the slot it puts to sleep, then died before it slept (its sleep runs beside
    its leaving the door's network). `resume` dozes it before it starts the new slot: never a new stack
    beside an awake one on the device."""
    b = Bench(root, standby=True)
    doze = b.node.doze

    def killed(slot: int, level: int) -> float:
        b.node.doze = doze  # once
        raise Killed("killed before the slot slept")

    b.node.doze = killed
    with pytest.raises(Killed):
        b.switch()
    assert b.node.slots()[2] == "live"  # awake still
    b.node.effects.clear()
    assert b.resume().ok
    done = [e.split(":", 1)[1] for e in b.node.effects]
    assert done.index("doze 2 level 1") < done.index("start beside 3"), done
    assert standby_agreed(b) == "beta" and b.node.slots() == {2: "asleep", 3: "live"}
