"""Read-only views: status, history, diff between revisions, logs, the audit log.

`history` must start fast on any number of revisions: the engine client, the renderer, the
differ and the lock (psutil, filelock) are imported by the view that uses them, not here."""

from __future__ import annotations

import contextlib
import contextvars
import io
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import B70Error, UserError
from ..state.journal import Journal
from ..state.revisions import (
    FAILURE_SHOWN,
    FSCK_FIX,
    HEALTHY_OUTCOMES,
    DamagedRecord,
    Revision,
    RevisionStore,
    Summaries,
    sha256,
)

if TYPE_CHECKING:
    from ..config.node import Node

T = TypeVar("T")
DEEP_ROWS = 200  # history reads the records of the rows it shows up to this many (--all of 10,000: not)
STATUS_CHECKS = 20  # status reads the records of the newest this many revisions

FACT_ROWS = [
    ("kv_cache_tokens", "GPU KV cache (tokens)"),
    ("max_concurrency", "max concurrency"),
    ("kv_cache_dtype", "KV dtype"),
    ("attention_backend", "attention backend"),
    ("flash_attn_version", "FlashAttention"),
    ("moe_method", "MoE method"),
    ("compile_seconds", "torch.compile (s)"),
    ("time_to_healthy", "time to healthy (s)"),
    ("vllm_version", "vLLM"),
]


def status(node: Node) -> dict[str, Any]:
    """What runs, what the records say, and, where they differ, what and the one fix."""
    from ..docker.probe import probe_health
    from ..state.lock import holder_info

    with ThreadPoolExecutor(max_workers=4) as pool:
        # The engine and /health answer (the docker CLI: ~20 ms a call) while the records are read here.
        box = _soon(pool, _container, node)
        health = _soon(pool, probe_health, f"http://{node.address}:{node.settings.prod_port}/health")
        present = _soon(pool, image_ids)
        asleep = _soon(pool, standbys, node)
        store = RevisionStore(node.state_dir)
        damaged: list[str] = []  # records that cannot be read: listed, never a reason to fail
        try:
            cur = store.current()
        except DamagedRecord as e:
            cur = None
            damaged.append(e.what)
        table = store.summaries()
        # The newest revisions (the likely rollback targets) are read whole: a torn record is listed.
        newest = store.marked(table.rows(max(len(table) - STATUS_CHECKS, 0)))
        damaged += [row["damage"] for row in newest if row.get("damage") and row["damage"] not in damaged]
        out: dict[str, Any] = {"node": node.project, "deploy_dir": str(node.deploy_dir),
                               "state_dir": str(node.state_dir), "current": cur.summary() if cur else None,
                               "current_number": store.current_number(), "damaged": damaged}
        if cur is not None:
            out["facts"] = cur.status.facts
        out["lock"] = holder_info(node.state_dir)
        try:
            run = Journal(node.state_dir).last_run()
        except DamagedRecord as e:
            run = None
            damaged.append(e.what)
        if run is not None and not run.finished:
            out["interrupted"] = {"command": run.command, "step": run.last_step, "run": run.run_id,
                                  "revision": run.context.get("revision"), "previous": run.context.get("previous"),
                                  "fix": "b70deploy resume (finish it) or b70deploy rollback (undo it)"}
        out["container"] = box.result()
        # every slot but the one serving (a new slot joins the door's network created: listed until it runs)
        out["standbys"] = [s for s in asleep.result() if not (s["on_door"] and not s["asleep"]
                                                               and s["status"] != "created")]
        out["serving_slot"] = serving_slot(node)
        code = health.result()
        out["health"] = code if code is not None else "refused"
        out["door"] = door_view(node)
        out["differs"], out["fix"] = differences(node, store, cur, out)
        out["mounts_changed"] = _mounts_changed(store, cur)
        out["rollback_images_gone"] = gone_targets(table, present.result(), cur.number if cur else None)
    return out


def _mounts_changed(store: RevisionStore, cur: Revision | None) -> list[str]:
    """The current revision's recorded mounts from outside it (adopt, import; through a rollback
    to one) whose bytes changed on this host."""
    rev = cur
    if rev is not None and rev.meta.kind == "rollback" and rev.meta.restored_from is not None \
            and store.exists(rev.meta.restored_from):
        rev = store.get(rev.meta.restored_from)
    records = [p for p in (rev.meta.patches or []) if p.get("source")] if rev is not None else []
    if not records:
        return []
    from .handmade import mounts_changed  # lint and Docker: only for a revision that recorded mounts

    return mounts_changed(records)


def _soon(pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> Future[T]:
    """`fn(*args)` in a worker, in this thread's context: the node's engine endpoint (docker/endpoint.py)."""
    return pool.submit(contextvars.copy_context().run, fn, *args)


def standbys(node: Node) -> list[dict[str, Any]]:
    """The node's hot-standby slots (docker/standby.py), [] when the engine does not answer or it has none."""
    from ..docker.containers import standby_slots

    try:
        return [{k: v for k, v in s.items() if k != "doc"} for s in standby_slots(node.project, node.service)]
    except Exception:  # status and history still answer without them
        return []


def serving_slot(node: Node) -> dict[str, int] | None:
    """The standby slot the records say serves, and as which revision (state/slots.py); None without one."""
    from ..state.slots import SlotBook

    try:
        found = [r for r in SlotBook(node.state_dir).read().values() if r.asleep_since is None]
    except UserError:
        return None
    return {"slot": found[0].slot, "revision": found[0].revision} if found else None


def _container(node: Node) -> dict[str, Any]:
    from ..deploy.deploydir import WORKING_DIR
    from ..docker.containers import inspect_service, standby_slots, state_from

    try:
        serving = serving_slot(node)
        live = [s for s in standby_slots(node.project, node.service) if s["on_door"] and s["status"] == "running"
                and (serving is None or s["slot"] == serving["slot"])]  # the recorded slot, never a killed run's
        # behind the door, the slot on its network is what serves (docker/standby.py); else the project's vllm
        attrs = live[0]["doc"] if live else inspect_service(node.project, node.service)
    except B70Error as e:  # the engine may be down; status must still answer, and say so
        return {"status": "unknown", "engine_error": e.what, "engine_fix": e.fix}
    except Exception as e:  # an SDK or CLI surprise: still an answer
        return {"status": "unknown", "engine_error": str(e), "engine_fix": "check the engine answers (docker info)"}
    st = state_from(attrs)
    labels = dict((attrs or {}).get("Config", {}).get("Labels") or {})
    return {"status": st.status, "exit_code": st.exit_code, "image_id": st.image_id,
            "stack": labels.get("b70deploy.stack"), "working_dir": labels.get(WORKING_DIR)}


def differences(node: Node, store: RevisionStore, cur: Revision | None,
                st: dict[str, Any]) -> tuple[list[str], str | None]:
    """Where the deploy dir, the records and the running container disagree, and the one
    command that makes them agree (an interrupted run's advice comes first). A revision whose
    stored bytes are not the ones it recorded is never advised."""
    if st.get("interrupted"):
        return [f"`{st['interrupted']['command']}` was interrupted at {st['interrupted']['step']}"], \
            st["interrupted"]["fix"]
    lock = st.get("lock")
    if lock and not lock["alive"]:
        return [f"a stale lock of pid {lock['pid']} (`{lock['command']}`)"], "b70deploy unlock"
    box = st["container"]
    if box.get("engine_error"):  # what runs is unknown: neither a rollback nor a restore is advice
        return [box["engine_error"]], box["engine_fix"]
    if cur is None:
        number = st.get("current_number")
        if number is not None and store.exists(number):
            return [f"the current revision's records cannot be read: {st['damaged'][0]}"], \
                "b70deploy fsck --repair (sets it aside and keeps the live deploy dir as a new revision)"
        if number is not None:
            return [f"{store.current_path} names revision {number}, which has no folder"], \
                "b70deploy fsck --repair (points it at what the deploy dir holds)"
        return [], None
    from ..deploy.deploydir import drift

    found = drift(node, cur, box)
    serving = st.get("serving_slot")
    if serving is not None and serving["revision"] != cur.number:
        return [*found, f"standby slot {serving['slot']} serves as revision {serving['revision']}, not the current "
                f"revision {cur.number}"], f"b70deploy rollback {cur.number} (wakes or boots it in its own slot)"
    # adopt records what a stop-first node runs; on a standby node a rollback puts it in its slot
    held = holds_revision(node, cur) if found and box.get("status") == "running" and serving is None else None
    if held is not None:  # e.g. a revision's files copied back by hand: a rollback to cur would undo that
        rev = store.get(held)
        return [f"the deploy dir holds revision {held}'s files ({rev.meta.stack}, {rev.meta.kind}), not revision "
                f"{cur.number}'s"], f"b70deploy adopt (records that revision {held} runs; nothing restarts)"
    damage = cur.damage()  # its stored copy, checked against the hashes it recorded
    if found:
        if damage is None:
            return found, f"b70deploy rollback {cur.number} (its exact files and image, recreated)"
        other = store.latest_healthy(exclude=[cur.number], verified=True)
        return [*found, f"its stored copy is damaged too: {damage}"], (
            f"b70deploy rollback {other.number} (revision {other.number}, {other.meta.stack}: its bytes verified)"
            if other is not None else FSCK_FIX)
    if damage is not None:  # the deploy dir is right: the stored copy can be mended from it
        return [f"revision {cur.number}'s stored copy is damaged ({damage}); the deploy dir matches its hashes"], \
            "b70deploy fsck --repair (restores the stored copy from the deploy dir)"
    if box.get("status") != "running":
        return [f"vllm is {box.get('status')}"], "b70deploy restore"
    door = st.get("door")
    if door is not None and door.get("points_at") != cur.number:
        where = "holds every request" if door.get("points_at") is None else f"points at revision {door['points_at']}"
        return [f"the front door {where}, not at revision {cur.number}"], \
            "b70deploy restore (points the door at the current revision)"
    return [], None


def door_view(node: Node, *, last_switch: bool = False) -> dict[str, Any] | None:
    """The front door's state (docker/door.py), None when the deploy dir names none; with
    `last_switch`, what it held in its last closed window (read from its request log)."""
    from ..deploy.deploydir import read_deployed
    from ..render.filenames import DOTENV_FILE

    if b"DOOR_PORT=" not in read_deployed(node.deploy_dir, node.compose_files).get(DOTENV_FILE, b""):
        return None
    from ..docker.door import last_hold, state  # the engine's SDK: only for a node with a door

    now = state(node.project)
    if now is None:
        return {"running": False, "points_at": None}
    last = last_hold(node.project, now) if last_switch else None
    return {"running": True, "points_at": now.points_at, "holding": now.holding, "in_flight": now.in_flight,
            "last_switch": None if last is None else {"held": last.held, "longest_hold_s": last.longest,
                                                      "refused": last.refused, "closed_s": last.seconds}}


def holds_revision(node: Node, cur: Revision, newest: int = 50) -> int | None:
    """The revision (other than `cur`, among the newest few, one that ran healthy or was imported)
    whose recorded file hashes the deploy dir's bytes have, None when none has."""
    from ..deploy.deploydir import read_deployed

    live = {name: sha256(data) for name, data in read_deployed(node.deploy_dir, node.compose_files).items()}
    store = RevisionStore(node.state_dir)
    for number in sorted(store.numbers(), reverse=True)[:newest]:
        try:
            rev = store.get(number) if number != cur.number else None
        except UserError:  # damaged records: status lists them as DAMAGED; they hold nothing here
            continue
        # Only bytes that ran healthy (or an import): a failed run's files left behind are undone by a rollback.
        if rev is not None and rev.meta.files == live and rev.status.outcome in (*HEALTHY_OUTCOMES, "unproven"):
            return number
    return None


def history(node: Node, last: int | None = None) -> tuple[int, list[dict[str, Any]]]:
    """How many revisions there are, and the summaries of the newest `last` (None: all), each with
    `image_gone` (None: the engine did not answer) and, for a gone image, `image_fix`: how to
    get that exact image back."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        present = _soon(pool, image_ids)  # the engine answers while the index is read
        slots = _soon(pool, standbys, node)
        store = RevisionStore(node.state_dir)
        table = store.summaries()
        shown = table.rows(0 if last is None else max(len(table) - last, 0))
        if len(shown) <= DEEP_ROWS:  # a page's records are read whole (a truncated meta.json is marked)
            store.marked(shown)
            _whole_failures(store, shown)
        asleep = {s["slot"] for s in slots.result() if s["asleep"]}
        for row in shown:  # asleep: the standby slot its bytes made sleeps beside the live one
            row["asleep"] = row["number"] in asleep
        return len(table), _marked(shown, present.result())


def _whole_failures(store: RevisionStore, rows: list[dict[str, Any]]) -> None:
    """A page's failure texts whole: the index keeps FAILURE_SHOWN characters of each, status.json all."""
    for row in rows:
        if len(row.get("failure") or "") >= FAILURE_SHOWN and not row.get("damage"):
            with contextlib.suppress(B70Error):  # unreadable: `damage` says so already
                status = store.get(row["number"]).status
                row["failure"] = status.diagnosis or status.failure


def revision_record(node: Node, number: int) -> dict[str, Any]:
    """`history N`: one revision whole: its summary, the failure and diagnosis texts uncut, the step
    timings and boot facts."""
    rev = RevisionStore(node.state_dir).get(number)
    record = {**rev.summary(), "failure": rev.status.failure, "diagnosis": rev.status.diagnosis}
    record["facts"] = rev.status.facts
    record["timings"] = rev.status.timings
    return record


def _marked(rows: list[dict[str, Any]], present: set[str] | None) -> list[dict[str, Any]]:
    """`rows` with `image_gone` and `image_fix` set (see history)."""
    from ..deploy.plan import recovery

    for row in rows:
        image_id = row.get("image_id")
        row["image_gone"] = None if present is None or not image_id else image_id not in present
        if row["image_gone"]:
            row["image_fix"] = recovery(row["image_ref"], image_id, row.get("repo_digest"))
    return rows


def gone_targets(table: Summaries, present: set[str] | None, current: int | None) -> list[dict[str, Any]]:
    """Rollback targets (revisions that ran healthy, other than the current one) whose image is
    gone from the engine (none when it did not answer): read column by column, as a dict only
    for a row that is one."""
    from ..deploy.plan import recovery

    if present is None:
        return []
    return [{"revision": number, "stack": stack, "image_id": image_id, "fix": recovery(ref, image_id, digest)}
            for number, stack, outcome, ref, image_id, digest in zip(
                table.column("number"), table.column("stack"), table.column("outcome"), table.column("image_ref"),
                table.column("image_id"), table.column("repo_digest"), strict=True)
            if image_id and image_id not in present and number != current and outcome in HEALTHY_OUTCOMES]


def image_ids() -> set[str] | None:
    """Every image id on the engine, or None when it does not answer (the records must still
    be shown). The docker CLI, not the SDK: `history` starts without importing it."""
    from ..docker.proc import run
    from ..errors import B70Error

    try:
        result = run(["docker", "image", "ls", "--all", "--quiet", "--no-trunc"], timeout=10, check=False)
    except B70Error:
        return None
    return set(result.stdout.split()) if result.returncode == 0 else None


def _fmt(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.2f}"
    return "-" if v is None else str(v)


def fact_rows(a: dict[str, Any], b: dict[str, Any]) -> list[list[str]]:
    rows = []
    for key, label in FACT_ROWS:
        va, vb = a.get(key), b.get(key)
        if va is None and vb is None:
            continue
        change = ""
        if isinstance(va, int | float) and isinstance(vb, int | float) and not isinstance(va, bool) and va:
            change = f"{(vb - va) / va * 100:+.0f}%"
        rows.append([label, _fmt(va), _fmt(vb), change])
    return rows


def diff_revisions(node: Node, a: int, b: int) -> tuple[str, list[list[str]]]:
    from ..render.files import DOTENV_FILE
    from ..render.masking import Secrets, opaque
    from ..ui.notice import node_secrets
    from .diff import unified

    store = RevisionStore(node.state_dir)
    ra, rb = store.get(a), store.get(b)
    files_a, files_b = ra.read_files(), rb.read_files()
    # Which runtime keys came from the secrets file is not recorded: mask every runtime value,
    # that is every env file's but the .env Compose interpolates from (vllm.env, or an adopted
    # deployment's env_file such as vllm023.env), and every secret the node config knows.
    keys = {k for files in (files_a, files_b) for name, data in files.items()
            if name.endswith(".env") and name != DOTENV_FILE for k in _env_keys(data)}
    secrets = node_secrets(node) | Secrets(keys=frozenset(keys))
    text = unified(files_a, files_b, old_label=f"rev{a}", new_label=f"rev{b}", secrets=secrets,
                   hidden=opaque(ra.modes(), rb.modes(), compose_files=node.compose_files))
    facts_a = {**ra.status.facts, "vllm_version": ra.status.vllm_version}
    facts_b = {**rb.status.facts, "vllm_version": rb.status.vllm_version}
    return text, fact_rows(facts_a, facts_b)


def _env_keys(data: bytes) -> set[str]:
    from dotenv import dotenv_values

    return set(dotenv_values(stream=io.StringIO(data.decode(errors="replace"))))


def logs(node: Node, number: int) -> str:
    store = RevisionStore(node.state_dir)
    store.get(number)  # a clear error for an unknown revision
    path = store.log_path(number)
    if not path.is_file():
        raise UserError(f"revision {number} has no saved container log",
                        fix="logs are kept for revisions that were started by a switch or rollback")
    return path.read_text(errors="replace")


def audit(node: Node, last: int) -> list[dict[str, Any]]:
    from ..state.statedir import StateDir

    return StateDir(node.state_dir).audit.entries(last)
