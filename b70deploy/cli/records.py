"""Record commands that only read: status and history. Kept apart from the deploy commands
so they import no switch machinery and start fast (issue 13: under 300 ms with 10,000
revisions)."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..actions import inspect
from ..errors import EXIT_FAILED
from ..state.revisions import FSCK_FIX
from ..ui.output import echo_lines, emit_json, plain_rows, table
from . import options
from .base import Ctx, pass_ctx
from .complete import node_names, revision_numbers

PAGE = 20  # history's default: the newest rows; --all or -n N for more

@click.command(epilog="Examples: b70deploy status --json | b70deploy status --nodes | b70deploy status --nodes a,b")
@options.as_json("the status")
@click.option("--nodes", "select", is_flag=False, flag_value="all", default=None, metavar="[all|a,b]",
              help="With an inventory: one row per node (all when no list is given).")
@click.option("--node", "node_name", metavar="NAME", shell_complete=node_names,
              help="With an inventory: this node's full status.")
@pass_ctx
def status(ctx: Ctx, as_json: bool, select: str | None, node_name: str | None) -> None:
    if select is not None:
        from ..actions.rollout import status_rows  # the switch machinery: only for --nodes

        rows = status_rows(ctx.nodes(select))
        if as_json:
            emit_json(rows)
            return
        table(["node", "endpoint", "address", "rev", "stack", "outcome", "container", "/health", "healthy s", "lock"],
              [[r["node"], r["endpoint"], r["address"], r["revision"] or "", r["stack"] or "", r["outcome"] or "",
                r["container"], r["health"], r["time_to_healthy"] or "",
                "INTERRUPTED" if r["interrupted"] else ("held" if r["lock"] else "")] for r in rows],
              optional=("healthy s", "endpoint", "address", "outcome", "lock"))
        healthy = sum(1 for r in rows if r["health"] == 200)
        click.echo(f"{healthy} of {len(rows)} node(s) healthy")
        return
    if node_name is not None:
        ctx.node_name = node_name
    st = inspect.status(ctx.node)
    if as_json:
        emit_json(st)
    else:
        _print_status(st)
    if st["container"].get("engine_error"):
        sys.exit(EXIT_FAILED)  # what runs is unknown: a script must not read this as "all well"


def _print_status(st: dict[str, Any]) -> None:
    out: list[str] = []  # one write at the end, fitted to the terminal: thousands of lines cost 0.1 s otherwise
    cur = st["current"]
    if cur is None and st.get("current_number") is not None and st["damaged"]:
        out.append(f"revision {st['current_number']}: its records cannot be read (see DAMAGED)")
    elif cur is None:
        out.append("no revision deployed")
    else:
        out.append(f"revision {cur['number']}: {cur['stack']} ({cur['outcome']}), image {cur['image_ref']} "
                   f"= {str(cur['image_id'])[:19]}, deployed {cur['created']}")
        for key, value in sorted((st.get("facts") or {}).items()):
            if not isinstance(value, list | dict):
                out.append(f"  {key}: {value}")
    out.append(f"container: {st['container'].get('status')}; /health: {st['health']}")
    for sb in st.get("standbys") or []:
        what = "asleep" if sb["asleep"] else sb["status"] if sb["status"] != "running" else "awake, not served"
        out.append(f"standby: revision {sb['slot']} ({sb['stack']}) {what}")
    lock = st.get("lock")
    if lock:
        state = "running" if lock["alive"] else "STALE (process gone)"
        out.append(f"lock: {state}: pid {lock['pid']} `{lock['command']}` step {lock['step'] or '-'} since "
                   f"{lock['since']}")
    run = st.get("interrupted")
    if run:
        out.append(f"INTERRUPTED: `{run['command']}` stopped at step {run['step']} (revision {run['revision']}); "
                   f"fix: {run['fix']}")
    elif st["container"].get("engine_error"):
        out.append(f"UNKNOWN: {st['container']['engine_error']}; fix: {st['fix']}")
    elif st["differs"]:
        out.append(f"DIFFERS: {'; '.join(st['differs'])}; fix: {st['fix']}")
    for changed in st.get("mounts_changed") or []:
        out.append(f"MOUNT CHANGED: {changed}; the revision recorded other bytes (a rollback to it mounts these)")
    gone = [f"IMAGE GONE: rollback to revision {g['revision']} ({g['stack']}) needs {str(g['image_id'])[:19]}; "
            f"fix: {g['fix']}" for g in st["rollback_images_gone"]]
    gone += [f"DAMAGED: {d}" for d in st["damaged"]]
    out += gone
    echo_lines(out)


# Left out of a narrow terminal's table, the first first: a revision's number, stack, outcome, date,
# image and why it failed are what an operator reads history for.
HISTORY_OPTIONAL = ("KV tokens", "healthy s", "pin", "kind", "message", "image")


@click.command(epilog="Examples: b70deploy history | b70deploy history 12 | b70deploy history -n 100 | "
                    "b70deploy history --all | b70deploy history --json | b70deploy history --node gpu2")
@click.argument("revision", type=int, required=False, shell_complete=revision_numbers)
@options.as_json("every revision (or the last N)")
@click.option("-n", "last", type=click.IntRange(min=0), default=None,
              help=f"Only the last N revisions (default {PAGE} in a table; 0 = all).")
@click.option("--all", "show_all", is_flag=True, help="Every revision, as plain rows (fast on any count).")
@click.option("--node", "node_name", metavar="NAME", shell_complete=node_names,
              help="With an inventory: that node's revisions.")
@pass_ctx
def history(ctx: Ctx, revision: int | None, as_json: bool, last: int | None, show_all: bool,
            node_name: str | None) -> None:
    """A table shows the newest revisions and says how many more there are (cells cut and columns
    left out to fit the terminal); --json (unless -n) and --all give every one. REVISION: that
    one revision whole, its failure text included."""
    if node_name is not None:
        ctx.node_name = node_name
    if revision is not None:
        record = inspect.revision_record(ctx.node, revision)
        if as_json:
            emit_json(record)
        else:
            echo_lines(f"{key}: {value}" for key, value in record.items() if value not in (None, "", [], {}))
        return
    whole = show_all or last == 0 or (as_json and last is None)
    total, shown = inspect.history(ctx.node, None if whole else (last if last is not None else PAGE))
    if as_json:
        emit_json(shown)
        return
    headers = ["rev", "stack", "kind", "outcome", "pin", "created", "image", "KV tokens", "healthy s", "message"]
    cells = [[r["number"], r["stack"], r["kind"],
              "DAMAGED" if r.get("damage") else r["outcome"] + (" (asleep)" if r.get("asleep") else ""),
              "*" if r["pinned"] else "", _short_time(r["created"]),
              r["image_ref"] + (" (GONE)" if r["image_gone"] else ""),
              f"{r['kv_cache_tokens']:,}" if r.get("kv_cache_tokens") else "",
              r.get("time_to_healthy") or "", r["message"]] for r in shown]
    if any(r.get("failure") for r in shown):  # why a revision failed, beside what it was for
        headers.append("why it failed")
        for row, r in zip(cells, shown, strict=True):
            row.append(r.get("failure") or "")
    if show_all:
        plain_rows(headers, cells)  # thousands of rows: no fitting pass over them
    else:
        # with a failure to show, the message gives it room first (`history N` has both whole)
        failing = "why it failed" in headers
        table(headers, cells, optional=("message", *HISTORY_OPTIONAL) if failing else HISTORY_OPTIONAL)
    gone = gone_images(shown)
    gone += [f"revision {r['number']}: DAMAGED: {r['damage']}; fix: {FSCK_FIX}" for r in shown if r.get("damage")]
    if gone:
        click.echo("\n".join(gone), err=True)  # one write, as in `status`
    if last is None and len(shown) < total:
        click.echo(f"{len(shown)} newest of {total:,} revisions; --all or -n N for more", err=True)


def _short_time(stamp: str) -> str:
    """2026-12-01T23:49:32+0000 as 2026-12-01 23:49 (the table's; --json and `history N` keep it whole)."""
    return stamp[:16].replace("T", " ") if len(stamp) >= 16 and stamp[10:11] == "T" else stamp


def gone_images(rows: list[dict[str, Any]]) -> list[str]:
    """One line per gone image, naming the revisions that ran it (twenty rows of one image
    are one fix, not twenty)."""
    by_image: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["image_gone"]:
            by_image.setdefault(str(r["image_id"]), []).append(r)
    lines = []
    for image_id, revs in by_image.items():
        numbers = ", ".join(str(r["number"]) for r in sorted(revs, key=lambda r: r["number"]))
        label = "revision" if len(revs) == 1 else "revisions"
        lines.append(f"image {image_id[:19]} is gone ({label} {numbers}); fix: {revs[0]['image_fix']}")
    return lines
