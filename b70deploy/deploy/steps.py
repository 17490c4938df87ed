"""The switch as a visible list of steps, each with its compensation.

    preflight -> warm -> idle -> record -> snapshot | drain -> verify -> activate -> wait-healthy
      -> check -> release -> settle -> commit -> companions

Everything left of the drain needs no GPU and is labelled "before drain": the clients are
still served while it runs (the plan itself, render, image pin, patches, lint and compose
config, is built before the first step). A check that can fail without the drain runs there
(idle: the host's load); after the drain only what needs the node quiet (verify: connections).

`switch` and `rollback` share it; they differ only in where the plan's files come from (a
fresh render, or the exact bytes of an earlier revision). Old and new cannot run side by
side on one GPU, so the old stack is stopped before the new one starts (its container is
created first, which needs no GPU), and a failed new stack costs a second cold load to bring
the old one back: the two waits have their own timeouts.

The clients wait for the engine, not for the tool (issue 35): the health wait sees readiness
within a poll of 0.05 s once the log says the server starts (docker/health.py), the smoke tests
run as soon as /health answers, and the door is released when they pass. The settle window is
then spent serving: settle watches the stack, and if it dies inside the window the run fails
there, and its undo holds the door again and rolls back; the companions start meanwhile.

Hot standby (a plan with `standby`, the new stack rendered with vLLM's sleep mode; issue 24): the
new stack's slot is created beside the live one before the door holds; the drain then puts the
live stack to sleep instead of stopping it; a rollback whose target's slot sleeps wakes it at
activate instead of booting. A woken slot passed every check when it went to sleep: it is asked
/health once and one completion (what a wake can still get wrong: garbage), then gets the door.
A failure removes the new slot and wakes the sleeper the same way. Slots are the tool's records
(state/slots.py): a slot no run recorded (a killed run's candidate) is removed, never taken for a
revision; after commit, slots asleep past the count stop, the one asleep longest first. A plan
without standby on a node that has slots stops them all in the drain: the new stack boots alone.

Every effect on the node goes through `Run.io` (a NodeIO); the state dir through `Run.store`.
"""

from __future__ import annotations

import contextvars
import io as _io
import re
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dotenv import dotenv_values

from ..errors import NodeBusy, OperationError, UserError
from ..render.door import image_in
from ..render.files import COMPOSE_FILE
from ..render.masking import modes
from ..render.vllm_args import parse_command
from ..state import space
from ..state.revisions import DamagedRecord, Revision, RevisionStore, Verdict
from ..state.slots import SlotBook
from ..state.stamps import now_iso, operator
from ..vllmlog.bootlog import check_expectations, parse_boot_facts
from ..vllmlog.diagnosis import diagnose, for_stack
from .nodeio import VLLM, NodeIO, WaitResult
from .plan import DeployPlan, recovery
from .runner import Runner, Step

if TYPE_CHECKING:
    from ..config.schema import Stack
    from ..ui.progress import Reporter


@dataclass
class Handoff:
    """What one step hands the next (and the driver, for the outcome): nothing else is mutable
    in a run. Each field names the step that writes it and who reads it."""

    revision: Revision | None = None        # record (or the resumed run's); every later step, the outcome
    previous: Revision | None = None        # record / snapshot; undo of activate, the outcome
    previous_files: dict[str, bytes] | None = None  # record / snapshot (checked before the drain); the undos
    activated: bool = False                 # activate; the driver: compensate, and was bad input seen early
    wait: WaitResult | None = None          # wait-healthy, settle; check, the failed outcome's log lines
    rollback_wait: WaitResult | None = None  # undo of activate; the rolled-back outcome's seconds
    facts: dict[str, Any] = field(default_factory=dict)       # wait-healthy, check; commit, the outcome
    checks_passed: list[str] = field(default_factory=list)    # check; the outcome's details
    ahead: dict[str, Future[Any]] = field(default_factory=dict)  # settle starts the companions; companions joins
    slot: int | None = None                 # drain (standby): the slot the new revision runs in; activate, undos
    woken: bool = False                     # drain (standby): that slot is a standby, woken at activate
    dozed: int | None = None                # drain (standby): the live slot put to sleep; the undos wake it
    held: bool = False                      # drain: the door holds and its counter saw nothing in flight; verify


@dataclass(frozen=True)
class Run:
    """One run of a plan: its inputs, fixed (plan, node, store, reporter, journal), and `got`,
    what the steps learned so far."""

    plan: DeployPlan
    io: NodeIO
    store: RevisionStore
    reporter: Reporter
    runner: Runner[Run]
    after_interrupt: bool = False  # an earlier run was killed: live files prove nothing
    got: Handoff = field(default_factory=Handoff)

    def info(self, message: str) -> None:
        self.reporter.info(message)

    @property
    def book(self) -> SlotBook:
        """The standby slots' records (state/slots.py), beside the revisions in the state dir."""
        return SlotBook(self.store.root.parent)

    def salvage(self, write: Callable[[], object], what: str, *, reserve: bool = True) -> bool:
        """A bookkeeping write of the failure and undo paths: never raises (state/space.py)."""
        return space.best_effort(self.store.root.parent, write, what, self.runner.warn, reserve=reserve)

    def undo_files(self) -> dict[str, bytes]:
        """The previous revision's bytes for an undo, verified (a resumed run checks them now)."""
        got = self.got
        assert got.previous is not None
        if got.previous_files is None:
            got.previous_files = got.previous.verified_files()
        return got.previous_files

    def undo_modes(self) -> dict[str, int]:
        """The modes the previous revision recorded for those bytes (an operator's 0600 key)."""
        assert self.got.previous is not None
        return self.got.previous.modes()


# ---------------------------------------------------------------- preflight


def compose_check(io: NodeIO, files: Mapping[str, bytes]) -> None:
    """`docker compose config` on the files: unresolved or empty interpolation (the post's
    env_file pitfall) fails here, before anything stops."""
    doc, error = io.compose_config(files)
    if doc is None:
        raise UserError(f"docker compose config rejects the files: {error}",
                        fix="see `b70deploy render`; every ${VAR} must be set in .env")
    service = doc["services"][io.service]
    command = [str(a) for a in service.get("command") or []]
    if not command:  # `entrypoint: [vllm, serve, MODEL, ...]` and no command (naptha-node's model files)
        command = [str(a) for a in service.get("entrypoint") or []]
    try:  # positional or --model (a launcher's), in a bash -c script too
        model: str | None = parse_command(command).model
    except ValueError:  # a script it cannot read: its first word stands for it
        model = command[0] if command else None
    if not (model or "").strip() or (model or "").startswith("-"):
        raise UserError("the model argument is empty after interpolation",
                        fix="set VLLM_MODEL in the .env beside the compose file (env_file: does not feed ${VAR})")


def _preflight(r: Run) -> None:
    p = r.plan
    if p.kind == "switch":  # lint ran compose config on a fresh render already
        if p.lint_errors:  # one line, one fix: `lint` gives each finding's own
            raise UserError(f"lint found {len(p.lint_errors)} error(s) in {p.stack.name}: "
                            + "; ".join(p.lint_errors),
                            fix=f"`b70deploy lint {p.stack.name}` gives the fix for each; nothing was changed")
        done = r.io.ensure_draft(p.stack)
        if done:
            r.info(done)
    else:  # a rollback: the old bytes must still resolve
        compose_check(r.io, p.files)
    door = image_in(p.files.get(COMPOSE_FILE, b""))
    if door is not None and not r.io.image_present(door):  # found now, not once the old stack is stopped
        raise UserError(f"the front door's image {door} is not on the node",
                        fix="b70deploy door --build, or set door.image in the node config to an image it has")
    for w in p.warnings:
        r.info(f"warning: {w}")


# ---------------------------------------------------------------- warm


def _warm(r: Run) -> None:
    """Work the new stack's boot would otherwise do inside the outage: its image's compile
    caches ready (state/caches.py), its weights read into the page cache (docker/pagecache.py)."""
    p = r.plan
    current = r.store.current()
    keep = [i for i in (current.meta.image_id if current else None,) if i]
    for line in (r.io.prepare_caches(p.image.id, keep), r.io.warm_weights(p.stack)):
        if line:
            r.info(line)


# ---------------------------------------------------------------- record, snapshot


def _record(r: Run) -> None:
    if r.got.revision is None:  # else a resumed run: the killed one stored (and noted) it already
        p = r.plan
        r.got.previous = r.store.current()  # DamagedRecord (exit 2) when its records cannot be read
        r.got.previous_files = undo_bytes(r.io, r.got.previous)
        r.got.revision = r.store.create(
            stack=p.stack.name, kind=p.kind, files=p.files, image_ref=p.image.ref, image_id=p.image.id,
            repo_digest=p.image.repo_digest, operator=operator(), message=p.message, created=now_iso(),
            restored_from=p.restored_from, stack_doc=p.stack.model_dump(mode="json"), modes=modes(p.files, p.modes))
        r.runner.note(revision=r.got.revision.number, previous=r.got.previous.number if r.got.previous else None)
        r.info(f"revision {r.got.revision.number} ({p.stack.name}); previous: "
               + (f"{r.got.previous.number} ({r.got.previous.meta.stack})" if r.got.previous else "none"))
    keep(r.io, r.got.revision)


def undo_bytes(io: NodeIO, previous: Revision | None) -> dict[str, bytes] | None:
    """What an undo would write back, checked before the drain: the live deploy dir when it is
    byte for byte what `previous` recorded (its stored copy is then not needed), else the stored
    copy, verified against its hashes (DamagedRecord: the switch is refused, nothing stopped)."""
    if previous is None:
        return None
    live = io.read_deployed()
    return live if previous.matches(live) else previous.verified_files()


def keep(io: NodeIO, rev: Revision) -> None:
    """Tag the revision's image as ours, so `docker image prune` cannot delete what a rollback
    to it needs (docker/keep.py). Idempotent: a resumed run tags again."""
    image_id = rev.meta.image_id
    if image_id and io.image_present(image_id):
        io.keep_image(image_id)


def _unrecord(r: Run) -> None:
    rev = r.got.revision
    if rev is not None:
        r.salvage(lambda: r.store.get(rev.number).status.outcome == "pending" and r.store.update_status(
            rev.number, outcome="failed" if r.got.activated else "aborted", updated=now_iso()),
            f"revision {rev.number}'s outcome")


def _snapshot(r: Run) -> None:
    """Keep what the deploy dir holds now, if no revision has those bytes (a hand-made or
    hand-edited deployment), so `rollback` can bring it back."""
    live = r.io.read_deployed()
    if not live:
        r.info("deploy dir is empty: first deployment on this node")
        return
    for number in _recent(r.store, r.got.previous):
        try:
            same = r.store.get(number).matches(live)  # by hash: e.g. a killed run's files, being rolled back
        except DamagedRecord:
            continue  # records that cannot be read match nothing
        if same:
            r.info(f"deploy dir matches revision {number}")
            return
    # Only what passed the health gate under the tool counts as healthy: files a killed run
    # left behind are kept, as interrupted, never as a rollback target by stack name.
    adopted = keep_live(r.store, r.io, live, message="snapshot of the live deploy dir before a switch",
                        outcome="interrupted" if r.after_interrupt else None)
    r.got.previous, r.got.previous_files = adopted, dict(live)
    r.runner.note(previous=adopted.number, adopted=adopted.number)
    r.info(f"live files differed from every revision: kept them as revision {adopted.number}")


def keep_live(store: RevisionStore, io: NodeIO, live: Mapping[str, bytes], *, message: str,
              outcome: Verdict | None = None) -> Revision:
    """record_live of a deploy dir the tool finds, its stack and image read from the files: a rendered
    .env's pinned id (VLLM_IMAGE_ID) and the reference it came from, else what VLLM_IMAGE names now."""
    env = live.get(".env", b"")
    pinned = _dotenv_value(env, "VLLM_IMAGE_ID")
    image_ref = (pinned and _dotenv_value(env, "VLLM_IMAGE_REF")) or _dotenv_value(env, "VLLM_IMAGE") or "unknown"
    image_id = pinned or (io.image_id(image_ref) if image_ref != "unknown" else None)
    return record_live(store, io, live, stack=_label_stack(live) or "adopted", image_ref=image_ref,
                       image_id=image_id, message=message, outcome=outcome)


def record_live(store: RevisionStore, io: NodeIO, live: Mapping[str, bytes], *, stack: str, image_ref: str,
                image_id: str | None, message: str, outcome: Verdict | None = None,
                patches: list[dict[str, Any]] | None = None) -> Revision:
    """Keep a deployment the tool did not make (the live deploy dir) as a revision of kind
    adopt, each file with its mode from the deploy dir's (an operator's 0600 key stays 0600):
    deployed when it answers /health now (a rollback target by stack name), else superseded,
    unless the caller knows better (`outcome`)."""
    verdict: Verdict = outcome or ("deployed" if io.probe_health() == 200 else "superseded")
    rev = store.create(stack=stack, kind="adopt", files=live, image_ref=image_ref, image_id=image_id,
                       repo_digest=None, operator=operator(), message=message, created=now_iso(),
                       patches=patches, outcome=verdict, modes=modes(live, io.read_modes()))
    keep(io, rev)
    return rev


def _recent(store: RevisionStore, previous: Revision | None, n: int = 5) -> list[int]:
    """The previous revision first, then the newest few: where live files most likely come from."""
    newest = sorted(store.numbers(), reverse=True)[:n]
    first = [previous.number] if previous is not None else []
    return first + [x for x in newest if x not in first]


def _dotenv_value(data: bytes, key: str) -> str | None:
    return dotenv_values(stream=_io.StringIO(data.decode(errors="replace"))).get(key)


def _label_stack(files: Mapping[str, bytes]) -> str | None:
    m = re.search(rb'b70deploy\.stack: "([a-z0-9][a-z0-9._-]*)"', files.get(COMPOSE_FILE, b""))
    return m.group(1).decode() if m else None


# ---------------------------------------------------------------- drain, verify


def _drain(r: Run) -> None:
    """The new files in place and vllm's new container created from them while the old one
    still serves; only then is the old one stopped: creating a container is 0.5-0.8 s of the
    engine's work on vfs that the clients no longer wait for (benchmarks/README.md). With a
    front door, the door holds new requests first and the old stack finishes what it has."""
    slots = r.io.slots()  # asked before the door holds: the clients do not wait for it
    fresh = not r.io.has_compose_file()
    r.io.write_deployed(r.plan.files, r.plan.modes)
    # A door that runs is brought in line before it holds: one whose service changed (its image, the host's
    # network) is recreated, and Caddy's stop waits for the requests it holds until the engine kills it.
    synced = r.io.door_sync(running_only=True)
    _hold(r)
    r.io.replace(r.io.service, stopping=r.plan.stopping)
    for slot in sorted(slots):  # a stack without sleep mode after standby slots: it boots alone
        _retire(r, slot)
    if slots:
        r.info(f"standby: {r.plan.stack.name} does not sleep: stopped the standby slots {_numbers(slots)}")
    if not synced:  # a node's first door: after the stop (the old vllm may have had the node's port)
        r.io.door_sync()
    number = r.got.revision.number if r.got.revision else "?"
    if fresh:
        r.info(f"nothing deployed yet: nothing to drain; created {r.io.service} from revision {number}")
        return
    stopped = ", ".join([r.io.service, *r.plan.stopping])
    r.info(f"created {r.io.service} from revision {number}, then stopped {stopped} (as compose stop: the router's "
           "health check moves traffic away)" + _kept_note(r.plan))


def _kept_note(plan: DeployPlan) -> str:
    """What the drain leaves running (deploy/companions.py says why), as the end of a line."""
    if not plan.kept:
        return ""
    return f"; kept {', '.join(plan.kept)} running (others wait for it and it cannot reach {VLLM})"


def _hold(r: Run) -> None:
    """The door's drain: new requests held (its /health 503, so a cluster router reroutes),
    then wait until the requests it has on the old stack are done, by its own counter."""
    if not r.io.door_close():
        return
    deadline = r.io.monotonic() + r.plan.waits.verify
    busy = r.io.door_in_flight()
    if busy:
        r.info(f"door: holding new requests; waiting up to {r.plan.waits.verify:.0f} s for {busy} in flight")
    while busy:
        if r.io.monotonic() >= deadline:
            if r.plan.kind == "rollback":
                r.info(f"warning: {busy} request(s) still in flight through the door; rolling back anyway")
                return
            raise OperationError(f"{busy} request(s) still in flight through the door after "
                                 f"{r.plan.waits.verify:.0f} s", fix="wait for clients to finish, or raise "
                                 "--verify-wait")
        r.io.sleep(0.02)  # the clients are held meanwhile: a request's end is seen within this
        busy = r.io.door_in_flight()
    r.got.held = True
    r.info("door: holding new requests; nothing in flight on the old stack")


def _reopen(r: Run) -> None:
    """A failed switch points the door back at the previous revision, serving again."""
    if r.got.previous is not None:
        r.io.door_open(r.got.previous.number)


def _undo_drain(r: Run) -> None:
    """The previous revision's files back and it serving again, companions started, the door
    pointed back at it."""
    if r.got.previous is None:
        r.io.discard(r.io.service)  # made from the new files, never started
        r.info("no previous revision: the node is left without a running stack")
        return
    if r.got.rollback_wait is not None and r.got.rollback_wait.healthy and r.io.probe_health() == 200:
        # undo activate has just brought the previous revision back to healthy: only its companions are left
        if r.plan.companions:
            r.io.up(r.plan.companions, recreate=False)  # the kept ones too: compose recreates one that diverged
            r.info(_started(r.plan))
        _reopen(r)
        return
    r.io.write_deployed(r.undo_files(), r.undo_modes())
    restore(r.io, r.reporter, companions=r.plan.companions, timeout=r.plan.waits.rollback,
            revision=r.got.previous.number)


def _idle(r: Run) -> None:
    """The readings the drain does not change (the load), before it: a busy host refuses the switch while
    the clients are still served, instead of after they were held for the whole wait."""
    if r.store.current_number() is None and not r.io.has_compose_file():
        r.info("nothing is serving: load check skipped")  # no client can be cut off, whatever the load
        return
    _wait_idle(r, drained=False, fix="wait for the load to drop, or raise load_threshold in the node config; "
               "--verify-wait waits longer; nothing was changed")


def _verify(r: Run) -> None:
    """After the drain, what only a drained node shows: no live connections on vllm's port, feeders quiet."""
    if r.got.previous is None:  # no revision was serving: no client can be cut off
        r.info("nothing was serving: idle check skipped")
        return
    if r.got.held:  # every client comes through the door, which holds them and counted none in flight
        r.info("door: every client held, none in flight: the node is quiet")
        return
    _wait_idle(r, drained=True, fix="wait for clients to finish, or raise --verify-wait")


def _wait_idle(r: Run, *, drained: bool, fix: str) -> None:
    """Read the node's idle readings of one kind (`Reading.drained`) until every one is ok, up to the run's
    --verify-wait; a switch then fails with `fix`, a rollback goes on with a warning."""
    limit = r.plan.waits.verify
    deadline = r.io.monotonic() + limit
    waiting = False
    while True:
        got = [x for x in r.io.idle_readings() if x.drained == drained]
        bad = [x for x in got if not x.ok]
        if not bad:
            for x in got:
                r.info(f"{x.name}: {x.detail}")
            return
        text = "; ".join(f"{x.name}: {x.detail}" for x in bad)
        if not waiting:  # said at the first busy reading, whatever the clock says next
            r.info(f"waiting up to {limit:.0f} s for the node to go idle: {text}")
            waiting = True
        if r.io.monotonic() >= deadline:
            if r.plan.kind == "rollback":
                r.info(f"warning: node not idle ({text}); rolling back anyway")
                return
            if not drained:
                raise NodeBusy(f"node busy after {limit:.0f} s, switch refused before the drain: {text}", fix=fix)
            raise OperationError(f"node not idle after {limit:.0f} s: {text}", fix=fix)
        r.io.sleep(1.0)


def _numbers(slots: Mapping[int, str]) -> str:
    return ", ".join(f"{n} ({state})" for n, state in sorted(slots.items()))


# ---------------------------------------------------------------- hot standby: drain, its undo


def _known_slots(r: Run) -> dict[int, str]:
    """The engine's slots that the records hold (state/slots.py), and the one this run made (a resumed
    run's); every other slot is a killed run's candidate and is removed here, never taken for a revision.
    A node whose slots predate the records adopts them once."""
    found = r.io.slots()
    if not r.book.exists():
        r.book.adopt(found, r.store.current_number())
    records = r.book.read()
    for n in sorted(found):
        if n not in records and n != r.got.slot:
            r.io.retire(n)
            r.info(f"standby: removed slot {n} ({found[n]}): no run recorded it as a revision (a killed run's)")
    r.book.drop(*(n for n in records if n not in found))  # removed by hand: nothing left to wake
    return {n: state for n, state in found.items() if n in records or n == r.got.slot}


def _retire(r: Run, slot: int) -> None:
    r.io.retire(slot)
    r.book.drop(slot)


def _drain_standby(r: Run) -> None:
    """The new revision's slot created beside the live one while the clients are still served (not on
    the door's network yet); then the door holds, the live slot falls asleep (a live stack outside the
    slots stops, as the stop-first drain does). A rollback to a slot that runs its bytes creates nothing: that slot
    is woken at activate (or kept awake)."""
    sb, got = r.plan.standby, r.got
    assert sb is not None and got.revision is not None  # steps() chose this drain; record ran before
    slots = _known_slots(r)
    # A rollback to bytes a recorded slot runs takes that slot: woken if it sleeps, else as it is (a run killed
    # before its own slot started leaves the previous revision serving; booting it again would hold the clients
    # for a cold boot).
    wake = sb.wake_slot if sb.wake_slot is not None and slots.get(sb.wake_slot) in ("asleep", "live", "awake") \
        else None
    r.io.write_deployed(r.plan.files, r.plan.modes)
    if got.woken or wake is not None:
        got.slot, got.woken = wake if wake is not None else got.slot, True
    else:
        got.slot = got.revision.number
        r.runner.note(slot=got.slot, woken=False)
        if got.slot not in slots:  # a resumed drain: the killed run created it already
            r.io.boot_beside(got.slot)
    r.runner.note(slot=got.slot, woken=got.woken)
    assert got.slot is not None  # set just above, or by the killed run
    # The door's container and config in place before it holds (its network is where the new slot joins): a
    # config that differs loads while the gate is open, where a reload cuts no stream (render/door.py), a door
    # recreated (from the host's network into the project's) holds nothing yet, and the held clients do not
    # wait for these engine calls (issue 35). Without slots only a door that runs: a node's first waits for
    # the stop below (a stack outside the slots may hold the node's port).
    synced = r.io.door_sync(running_only=not slots)
    _hold(r)
    live = next((n for n, state in slots.items() if state == "live" and n != got.slot), None)
    if got.dozed is None and live is not None:
        got.dozed = live
        r.runner.note(dozed=live)
    if got.dozed is not None:
        # A resumed drain dozes it again: the killed run may have ended before it slept, or after it left the
        # door's network (awake, off it); one asleep is only asked. Never a new slot beside an awake one.
        if slots.get(got.dozed) in ("live", "awake", "asleep"):
            took = r.io.doze(got.dozed, sb.level)
            record = r.book.read().get(got.dozed)
            r.book.asleep(got.dozed, record.revision if record is not None else got.dozed)
            r.info(f"standby: revision {got.dozed}'s slot fell asleep at level {sb.level} in {took:.2f} s")
    elif not slots and r.io.container_status() not in ("missing", "exited"):
        # outside the slots (the first standby switch of a stop-first node): it stops first, as without
        # standby. Never with slots: the one the probes reach may be a sleeper still on the door's network
        # (a run killed before activate), and stopping it would take the revision it holds.
        r.io.stop([r.io.service])
        r.info(f"standby: stopped {r.io.service} (it runs outside the standby slots)")
    if not synced:
        r.io.door_sync()
    if got.woken and slots.get(got.slot) == "asleep":
        r.info(f"standby: revision {got.slot}'s slot sleeps with these bytes: it is woken, not booted")
    elif got.woken:
        r.info(f"standby: revision {got.slot}'s slot runs these bytes: it is kept, not booted")
    else:
        r.info(f"standby: created revision {got.slot}'s slot beside the sleeping ones")


def _undo_drain_standby(r: Run) -> None:
    """The new slot removed (never a standby woken for a rollback: it is put back to sleep or stays),
    the previous revision serving again, checked, and the door pointed back at it."""
    got = r.got
    if got.rollback_wait is not None and got.rollback_wait.healthy and r.io.probe_health() == 200:
        _reopen(r)  # undo activate brought the previous revision back already
        if got.slot is not None and not got.woken and got.slot in r.io.slots():
            _retire(r, got.slot)  # a crashed slot, left for after the door reopened
        return
    if got.slot is not None and not got.woken and got.slot in r.io.slots():
        _retire(r, got.slot)
    if got.previous is None:
        r.info("no previous revision: the node is left without a running stack")
        return
    if got.dozed is not None:
        _back_from_standby(r, got.dozed)
        _reopen(r)
        return
    r.io.write_deployed(r.undo_files(), r.undo_modes())
    if "live" in r.io.slots().values():  # the failure came before the live slot was touched
        _reopen(r)
        return
    home = _home_slot(r)
    if home is not None:  # a recovery whose drain put nothing to sleep: the previous revision's own slot
        _back_in_slot(r, home)
        _reopen(r)
        return
    restore(r.io, r.reporter, companions=r.plan.companions, timeout=r.plan.waits.rollback,
            revision=got.previous.number)


def _back_from_standby(r: Run, slot: int) -> None:
    """The previous revision's sleeping slot woken and asked for one completion: it passed every check
    when it went to sleep, and the completion is what a wake can still get wrong (garbage; issue 35)."""
    got = r.got
    assert got.previous is not None
    r.io.write_deployed(r.undo_files(), r.undo_modes())
    took = r.io.wake(slot)
    waited = _woken_health(r, got.previous.number)
    passed, failed = r.io.smoke(_stack_of(got.previous, r.plan), one=True)
    if failed:
        raise OperationError(f"revision {got.previous.number} woke from standby and failed its smoke tests: "
                             + "; ".join(failed), fix="b70deploy rollback (boots it cold)")
    r.book.serving(slot, got.previous.number)
    got.rollback_wait = waited  # only now: the door may point at it
    r.info(f"standby: revision {got.previous.number} awake in {took:.2f} s, answered "
           + (passed[0] if passed else "/health"))


def _home_slot(r: Run) -> int | None:
    """The slot the records hold for the previous revision (serving or asleep): None when it never ran in
    one (a stop-first node's first standby switch: it runs in the project's own container)."""
    assert r.got.previous is not None
    return next((rec.slot for rec in r.book.read().values() if rec.revision == r.got.previous.number), None)


def _back_in_slot(r: Run, slot: int) -> None:
    """The previous revision back in its slot, never in the project's own container (slots are the tool's
    records): woken when that slot sleeps, else booted cold in it from the previous files, and recorded
    as serving once healthy. A recovery that put nothing to sleep (the killed run had) and whose woken
    standby failed comes here."""
    got = r.got
    assert got.previous is not None
    state = r.io.slots().get(slot)
    if state == "asleep":
        _back_from_standby(r, slot)
        return
    r.io.write_deployed(r.undo_files(), r.undo_modes())
    # Unrecorded until healthy: a kill inside the boot leaves a slot the next recovery removes, never one
    # it takes for the revision.
    if state is not None:
        r.io.retire(slot)
    r.book.drop(slot)
    r.io.boot_beside(slot)
    r.io.start_beside(slot)
    got.rollback_wait = r.io.wait_healthy(timeout=r.plan.waits.rollback, reporter=r.reporter)
    if not got.rollback_wait.healthy:
        raise OperationError(f"revision {got.previous.number} did not come back in slot {slot}: "
                             f"{got.rollback_wait.reason}", fix="b70deploy rollback (boots it cold)")
    r.book.serving(slot, got.previous.number)
    r.info(f"standby: revision {got.previous.number} booted again in its slot {slot}, healthy in "
           f"{got.rollback_wait.elapsed:.1f} s")


def _woken_health(r: Run, number: int) -> WaitResult:
    """/health of a slot just woken: one probe (its server never stopped), the full wait only when it does
    not answer 200 at once."""
    t0 = r.io.monotonic()
    if r.io.probe_health() == 200:
        return WaitResult(True, r.io.monotonic() - t0, "healthy")
    waited = r.io.wait_healthy(timeout=r.plan.waits.rollback, reporter=r.reporter)
    if not waited.healthy:
        raise OperationError(f"revision {number} woke from standby but is not healthy: {waited.reason}")
    return waited


def _stack_of(rev: Revision, plan: DeployPlan) -> Stack:
    from ..config.schema import Stack

    return Stack.model_validate(rev.meta.stack_doc) if rev.meta.stack_doc else plan.stack


def _activate_standby(r: Run) -> None:
    r.got.activated = True
    assert r.got.slot is not None  # the drain picked it
    if r.got.woken:
        took = r.io.wake(r.got.slot)  # a slot already awake (the drain said "kept") is only joined: 0 s of wake
        r.info(f"standby: woke revision {r.got.slot}'s slot in {took:.2f} s")
        return
    r.io.start_beside(r.got.slot)
    r.info(f"started revision {r.got.slot}'s slot on the door's network")


def _undo_activate_standby(r: Run) -> None:
    """The failed slot's log kept and the slot removed when it holds the device (a crashed one is removed
    by the undo of drain, once the door reopened), then the previous revision back: woken from its sleep
    and checked, or, outside the slots, booted from its files."""
    got = r.got
    _join_ahead(r)
    if got.wait is None or got.wait.healthy:
        _save_log(r)
    home = _home_slot(r) if got.previous is not None else None  # before the retire below drops a record
    # A boot whose process ended holds nothing, and the engine is busy tearing its container down (asking it
    # now waits for that, 0.4-0.6 s on vfs): it is removed after the door reopens (undo of drain).
    ended = got.wait is not None and got.wait.ended
    state = r.io.slots().get(got.slot) if got.slot is not None and not ended else None
    if got.slot is not None and state is not None and (got.woken or state in ("live", "awake", "asleep", "running",
                                                                              "restarting")):
        _retire(r, got.slot)  # it holds the device (a woken standby that failed its checks included)
    if got.previous is None:
        r.info("no previous revision to return to")
        return
    r.info(f"rolling back to revision {got.previous.number} ({got.previous.meta.stack})")
    if got.dozed is not None:
        _back_from_standby(r, got.dozed)
        return
    if home is not None:  # it ran in a slot: back in that slot, never in the project's own container
        _back_in_slot(r, home)
        return
    files = r.undo_files()
    r.io.write_deployed(files, r.undo_modes())
    r.io.door_sync()
    r.io.up([r.io.service])
    got.rollback_wait = r.io.wait_healthy(timeout=r.plan.waits.rollback, reporter=r.reporter)
    if not got.rollback_wait.healthy:
        raise OperationError(f"revision {got.previous.number} did not come back: {got.rollback_wait.reason}")


def _commit_standby(r: Run) -> None:
    """The records first name the slot serving as the new revision, then the revision is committed: a kill
    between the two leaves a recorded slot that recovery treats as the live one, never an unknown."""
    assert r.got.slot is not None and r.got.revision is not None
    r.book.serving(r.got.slot, r.got.revision.number)
    _commit(r)


def _prune_standbys(r: Run) -> None:
    """After commit: every slot but the live one and the recorded sleepers removed; of those asleep past the
    count, the one asleep longest stops first; a live stack outside the slots, stopped by the drain, is removed."""
    sb = r.plan.standby
    assert sb is not None
    slots = _known_slots(r)
    for slot, state in sorted(slots.items()):  # a slot that exited or never woke
        if slot != r.got.slot and state != "asleep":
            _retire(r, slot)
    asleep = [rec.slot for rec in r.book.sleeping() if rec.slot != r.got.slot and slots.get(rec.slot) == "asleep"]
    for slot in asleep[:max(0, len(asleep) - sb.count)]:
        _retire(r, slot)
        r.info(f"standby: stopped revision {slot}'s slot, asleep longest (at most {sb.count} asleep)")
    if r.got.dozed is None:
        r.io.discard(r.io.service)


# ---------------------------------------------------------------- activate, wait, check


def _activate(r: Run) -> None:
    r.got.activated = True
    r.io.start(r.io.service)
    r.info(f"started {r.io.service} from revision {r.got.revision.number if r.got.revision else '?'}")


def _undo_activate(r: Run) -> None:
    """Keep the failed boot's log, then write the previous revision's files back and bring it up."""
    _join_ahead(r)  # a companion start still running must not race the compose calls below
    if r.got.wait is None or r.got.wait.healthy:
        _save_log(r)  # it failed after booting (checks): the whole log, read from the engine
    if r.got.previous is None:
        r.io.stop([r.io.service])
        r.info("no previous revision to return to: vllm stopped")
        return
    r.info(f"rolling back to revision {r.got.previous.number} ({r.got.previous.meta.stack})")
    meta = r.got.previous.meta
    if meta.image_id and not r.io.image_present(meta.image_id):
        raise OperationError(f"the image that ran revision {r.got.previous.number} ({meta.image_id}) is gone",
                             fix=f"{recovery(meta.image_ref, meta.image_id, meta.repo_digest)}, "
                                 "then b70deploy rollback")
    files = r.undo_files()  # checked before the container goes: a damaged copy is refused first
    r.io.discard(r.io.service)  # its log is kept; a crash-looping container makes compose's stop slow
    r.io.write_deployed(files, r.undo_modes())
    r.io.door_sync()  # the previous files' door, or none: before vllm, which may want the node's port
    r.io.up([r.io.service])
    r.got.rollback_wait = r.io.wait_healthy(timeout=r.plan.waits.rollback, reporter=r.reporter)
    if not r.got.rollback_wait.healthy:
        raise OperationError(f"revision {r.got.previous.number} did not come back: {r.got.rollback_wait.reason}")
    r.info(f"revision {r.got.previous.number} healthy again in {r.got.rollback_wait.elapsed:.1f} s")


def _save_log(r: Run, lines: list[str] | None = None) -> None:
    """Keep the boot's log with the revision: the lines the follower read, or the engine's copy."""
    rev = r.got.revision
    if rev is None:
        return
    got = lines if lines is not None else r.io.container_log()
    if got:
        r.salvage(lambda: r.store.save_log(rev.number, "\n".join(got) + "\n"), f"revision {rev.number}'s log",
                  reserve=False)


def _wait_healthy(r: Run) -> None:
    if r.got.woken:  # a sleeping slot woken: its server never stopped; one probe, no boot to watch
        assert r.got.slot is not None
        r.got.wait = _woken_health(r, r.got.slot)
        r.info(f"/health 200 after the wake, in {r.got.wait.elapsed:.2f} s")
        return
    r.got.wait = r.io.wait_healthy(timeout=r.plan.waits.health, reporter=r.reporter)
    r.got.wait.finding = for_stack(r.got.wait.finding, r.plan.stack)  # the fix checked against the stack that booted
    _save_log(r, r.got.wait.log_lines)  # already in memory: reporting a crash waits on no API call
    if not r.got.wait.healthy:
        raise OperationError(r.got.wait.reason)
    r.got.facts["time_to_healthy"] = round(r.got.wait.elapsed, 2)
    r.info(f"/health 200 after {r.got.wait.elapsed:.1f} s")


def _settle(r: Run) -> None:
    """Healthy is not enough: the stack must stay up for its settle window (vLLM's engine can die right
    after the server answers, and then /health turns 503 and the container exits). The window is spent
    serving: the door was released when the smoke tests passed, and this step watches the stack; if it
    dies inside the window, the run fails here and its undo holds the door again and rolls back. The
    companions start meanwhile (the companions step takes them). A woken standby has no window: it stayed
    up through its own when it first served."""
    window = 0.0 if r.got.woken else r.plan.stack.settle_seconds
    if r.plan.companions and window > 0:
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="settle")
        # In a copy of this context: a remote node's engine endpoint is a context variable.
        r.got.ahead["companions"] = pool.submit(contextvars.copy_context().run, r.io.up, r.plan.companions,
                                                recreate=False)
        pool.shutdown(wait=False)
    if window <= 0:
        return
    end = r.io.monotonic() + window
    while r.io.monotonic() < end:
        r.io.sleep(min(0.5, window))
        status, code = r.io.container_status(), r.io.probe_health()
        if status != "running" or code != 200:
            lines = r.io.container_log()
            finding = diagnose(lines, r.plan.stack, r.plan.platform)
            reason = (f"the stack failed inside its {window:g} s settle window after ready: container {status}, "
                      f"/health {code or 'refused'}")
            r.got.wait = WaitResult(False, r.got.wait.elapsed if r.got.wait else 0.0, reason, finding, log_lines=lines)
            _save_log(r, lines)
            raise OperationError(reason)
    wait(r.got.ahead.values())  # the step's effects end with it (a resumed run knows what was done)
    r.info(f"stayed healthy for the {window:g} s settle window, serving")


def _join_ahead(r: Run) -> None:
    """Let a companion start begun in the settle window end; its result no longer matters."""
    started = r.got.ahead.pop("companions", None)
    if started is not None:
        wait([started])
    r.got.ahead.clear()


def _check(r: Run) -> None:
    """The smoke tests as soon as /health answers, and the boot's facts against the stack's expectations.
    A woken standby: one completion (what a wake can still get wrong); its boot facts were checked when it
    first served, and are its revision's."""
    if r.got.woken:
        assert r.got.slot is not None
        if r.store.exists(r.got.slot):
            r.got.facts.update(r.store.get(r.got.slot).status.facts)
        r.got.facts["time_to_healthy"] = round(r.got.wait.elapsed, 2) if r.got.wait else 0.0
        passed, failed = r.io.smoke(r.plan.stack, one=True)
        r.got.checks_passed += passed
        if failed:
            raise OperationError("; ".join(failed))
        for p in passed:
            r.info(f"ok: {p}")
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="version") as pool:  # beside the smoke tests
        version = pool.submit(contextvars.copy_context().run, r.io.served_version)
        passed, failed = r.io.smoke(r.plan.stack)
    # A resumed run: the boot it waited for happened in the killed process; read it back.
    lines = r.got.wait.log_lines if r.got.wait is not None else r.io.container_log()
    facts = parse_boot_facts(lines)
    problems = check_expectations(facts, r.plan.stack.expect)
    if problems and r.got.wait is not None:
        # /health can answer before Docker has the engine's last boot lines in its log (the wait
        # follows it within 0.05 s): read the log whole once more before calling a fact unstated.
        again = r.io.container_log()
        if len(again) > len(lines):  # the log only grows: more lines came since the wait read it
            lines, facts = again, parse_boot_facts(again)
            problems = check_expectations(facts, r.plan.stack.expect)
    # What the log stated, False included (0.21's "Asynchronous scheduling is enabled."); None is unstated.
    recorded = {k: v for k, v in facts.to_dict().items() if v is not None and v != []}
    for key in ("attention_backend", "kv_cache_dtype", "moe_method", "kv_cache_tokens"):
        if recorded.get(key) is not None:
            r.info(f"boot: {key} = {recorded[key]}")
    r.got.facts.update(recorded)
    if version.result():
        r.got.facts["vllm_version"] = version.result()
    r.got.checks_passed += passed
    for p in passed:
        r.info(f"ok: {p}")
    if failed:
        _died_on_smoke(r)
    problems += failed
    if problems:
        raise OperationError("; ".join(problems))


def _died_on_smoke(r: Run) -> None:
    """A smoke test the engine died on (vLLM answers the request HTTP 500, then its server exits): the
    log says why, and the failure carries that diagnosis, as a boot's does."""
    lines = r.io.container_log()
    finding = diagnose(lines, r.plan.stack, r.plan.platform)
    if finding is not None:
        elapsed = r.got.wait.elapsed if r.got.wait else 0.0
        r.got.wait = WaitResult(False, elapsed, f"the engine died on a smoke test: {finding.title}", finding,
                                log_lines=lines)
        _save_log(r, lines)


# ---------------------------------------------------------------- release


def _release(r: Run) -> None:
    assert r.got.revision is not None  # record ran before
    r.io.door_open(r.got.revision.number)


def _undo_release(r: Run) -> None:
    r.io.door_close()  # held again until the previous revision serves (undo drain points the door back)


# ---------------------------------------------------------------- commit, companions


def _commit(r: Run) -> None:
    assert r.got.revision is not None  # record ran before
    r.store.update_status(r.got.revision.number, outcome="deployed", facts=r.got.facts, timings=dict(r.runner.timings),
                          vllm_version=r.got.facts.get("vllm_version"), updated=now_iso())
    # One revision is deployed: the previous one, and the current one (they differ when the
    # live files were snapshotted first), are superseded.
    previous = r.got.previous.number if r.got.previous else None
    for number in {previous, r.store.current_number()} - {None, r.got.revision.number}:
        if number is not None and r.store.exists(number) and r.store.get(number).status.outcome == "deployed":
            r.store.update_status(number, outcome="superseded", updated=now_iso())
    r.store.set_current(r.got.revision.number)


def _undo_commit(r: Run) -> None:
    """A failure after commit (companions) rolls the node back, so the current pointer goes back too."""
    prev = r.got.previous
    if prev is not None:
        r.salvage(lambda: r.store.set_current(prev.number), f"the current pointer ({r.store.current_path})")
        if prev.status.outcome == "deployed":
            r.salvage(lambda: r.store.update_status(prev.number, outcome="deployed", updated=now_iso()),
                      f"revision {prev.number}'s outcome")
    else:
        r.store.clear_current()


def _start_companions(r: Run) -> None:
    if r.plan.companions:
        ahead = r.got.ahead.pop("companions", None)
        if ahead is not None:
            ahead.result()  # its failure fails this step, as a start here would
        else:
            # Started, not recreated: compose still recreates one whose config changed (the step
            # took 1.5-1.8 s forced, 0.8-1.4 s not, on vfs: benchmarks/README.md).
            r.io.up(r.plan.companions, recreate=False)
        r.info(_started(r.plan))


def _started(plan: DeployPlan) -> str:
    """The companions' start, named: the ones the drain stopped started, the kept ones left running. The
    start asks for every companion: Compose recreates a kept one whose definition differs from the files."""
    kept = f"; {', '.join(plan.kept)} kept running" if plan.kept else ""
    return f"started {', '.join(plan.stopping) or 'nothing'}{kept}"


BEFORE_DRAIN = "before drain"  # the label of every step the clients do not wait for


def steps(plan: DeployPlan) -> list[Step[Run]]:
    if plan.standby is not None:
        return standby_steps(plan)
    prev = "the previous revision"
    stopped = ", ".join([VLLM, *plan.stopping]) + (f"; {', '.join(plan.kept)} keep running" if plan.kept else "")
    return [
        Step("preflight", f"{BEFORE_DRAIN}: compose config, image present, draft copy, lint verdict", _preflight),
        Step("warm", f"{BEFORE_DRAIN}: compile caches of the image, weights into the page cache", _warm),
        Step("idle", f"{BEFORE_DRAIN}: the host's load under load_threshold (a busy host refuses here)", _idle),
        Step("record", f"{BEFORE_DRAIN}: store the new files as an immutable revision, keep-tag its image", _record,
             _unrecord,
             "mark the revision failed/aborted"),
        Step("snapshot", f"{BEFORE_DRAIN}: keep the live deploy dir if no revision holds it", _snapshot),
        Step("drain", f"write the files atomically, create {VLLM} from them while the old one serves, then "
             f"stop {stopped} (as compose stop)", _drain, _undo_drain,
             f"write {prev}'s files back, bring it up and wait for /health, then companions"),
        Step("verify", "no live connections on vllm's port, feeders quiet", _verify),
        Step("activate", f"start the new {VLLM} container", _activate,
             _undo_activate, f"save the log, write {prev}'s files back, recreate, wait for /health"),
        Step("wait-healthy", "poll /health while watching the container and its log (fast once the server "
             "starts)", _wait_healthy),
        Step("check", "smoke tests as soon as /health answers, boot facts vs expectations", _check),
        Step("release", "a front door, if the node has one, points at the new revision and releases the "
             "requests it held", _release, _undo_release, "hold new requests again"),
        Step("settle", f"serving, the stack watched for {plan.stack.settle_seconds:g} s while the companions "
             "start", _settle),
        Step("commit", "mark the revision deployed and make it current", _commit, _undo_commit,
             f"point current back at {prev}", commits=True),
        Step("companions", "companions started (in the settle window, else now)", _start_companions),
    ]


def standby_steps(plan: DeployPlan) -> list[Step[Run]]:
    """The switch with hot standby: the same steps, with drain, activate and commit the standby's, and the
    standbys held to their count after commit."""
    prev = "the previous revision"
    regular = {s.name: s for s in steps(replace(plan, standby=None))}
    assert plan.standby is not None
    return [
        *(regular[n] for n in ("preflight", "warm", "idle", "record", "snapshot")),
        Step("drain", f"create the new {VLLM} in its own slot beside the live one (a rollback to a sleeping "
             "slot: that slot); the door holds; the live slot sleeps "
             f"(/sleep?level={plan.standby.level})", _drain_standby, _undo_drain_standby,
             f"remove the new slot; wake {prev}'s slot, one completion; point the door back"),
        regular["verify"],
        Step("activate", f"join the new {VLLM} slot to the door's network and start it, or wake the sleeping one",
             _activate_standby, _undo_activate_standby,
             f"save the log, remove the slot; wake {prev}'s, one completion"),
        *(regular[n] for n in ("wait-healthy", "check", "release", "settle")),
        Step("commit", "record the slot as serving, mark the revision deployed and make it current",
             _commit_standby, _undo_commit, f"point current back at {prev}", commits=True),
        Step("standbys", f"at most {plan.standby.count} slot(s) asleep: the one asleep longest stops",
             _prune_standbys),
        regular["companions"],
    ]


def plan_lines(plan: DeployPlan) -> list[str]:
    out = []
    for i, step in enumerate(steps(plan), 1):
        undo = f"  (undo: {step.undo_summary})" if step.compensation else ""
        out.append(f"{i:2d}. {step.name:<13} {step.summary}{undo}")
    return out


# ---------------------------------------------------------------- restore


def restore(io: NodeIO, reporter: Reporter, *, companions: tuple[str, ...], timeout: float,
            revision: int | None) -> WaitResult:
    """Start the deployed revision again (not a rollback): vllm up, /health, then companions,
    and a front door pointed at it (as `revision`). The `restore` verb, and the compensation
    of a drain."""
    if not io.has_compose_file():
        raise OperationError("nothing deployed in the deploy dir", fix="`b70deploy switch STACK` first")
    io.door_sync()
    io.up([io.service], recreate=False)
    result = io.wait_healthy(timeout=timeout, reporter=reporter)
    if not result.healthy:
        raise OperationError(f"vllm did not become healthy: {result.reason}",
                             fix="`b70deploy status` names what runs and the one command that fixes it")
    if companions:
        io.up(companions, recreate=False)
    if revision is not None:
        io.door_open(revision)
    reporter.info(f"vllm healthy after {result.elapsed:.1f} s"
                  + (f"; started {', '.join(companions)}" if companions else ""))
    return result
