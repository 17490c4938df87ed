"""Revision bookkeeping: logs, pin, unpin, prune, audit, unlock. Kept apart from the deploy
commands so they import no switch machinery (the engine SDK, rich, the renderer)."""

from __future__ import annotations

import sys

import click

from ..actions import bookkeeping, inspect
from ..errors import Declined
from ..ui.output import emit_json, table
from . import options
from .base import Ctx, mutate, pass_ctx
from .complete import revision_numbers


@click.command(epilog="Example: b70deploy logs 12")
@click.argument("revision", type=int, shell_complete=revision_numbers)
@pass_ctx
def logs(ctx: Ctx, revision: int) -> None:
    click.echo(inspect.logs(ctx.node, revision), nl=False)


def _pin(ctx: Ctx, revision: int, pinned: bool) -> None:
    mutate(lambda reporter: bookkeeping.set_pin(ctx.node, revision, pinned), live=False,
           end=lambda _: click.echo(f"revision {revision} {'pinned: never pruned' if pinned else 'unpinned'}"))


@click.command(epilog="Example: b70deploy pin 7")
@click.argument("revision", type=int, shell_complete=revision_numbers)
@pass_ctx
def pin(ctx: Ctx, revision: int) -> None:
    _pin(ctx, revision, True)


@click.command(epilog="Example: b70deploy unpin 7")
@click.argument("revision", type=int, shell_complete=revision_numbers)
@pass_ctx
def unpin(ctx: Ctx, revision: int) -> None:
    _pin(ctx, revision, False)


@click.command(epilog="Examples: b70deploy prune --keep 20 --dry-run | b70deploy prune --keep 5 --yes")
@click.option("--keep", type=click.IntRange(1), help="Revisions to keep (default: node keep_revisions, 20).")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted and what is kept; delete nothing.")
@click.option("--force", is_flag=True, help="Also delete the newest adopted revision and unproven imports.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before deleting.")
@pass_ctx
def prune(ctx: Ctx, keep: int | None, dry_run: bool, force: bool, yes: bool) -> None:
    doomed, kept = bookkeeping.prune_plan(ctx.node, keep, force=force)
    for number, why in sorted(kept.items()):
        click.echo(f"keeping revision {number}: {why}", err=True)
    listed = f": {', '.join(map(str, doomed))}" if doomed else ""
    if dry_run:
        click.echo(f"would delete {len(doomed)} revision(s){listed} (dry run, nothing deleted)")
        return
    if not doomed:
        click.echo("nothing to prune")
        return
    if not yes and sys.stdin.isatty() and not click.confirm(
            f"Delete revision(s) {', '.join(map(str, doomed))} and their files for good?", default=False, err=True):
        raise Declined("declined at the prompt; nothing deleted")
    mutate(lambda reporter: bookkeeping.prune(ctx.node, keep, force=force), live=False, end=lambda gone: click.echo(
        f"pruned {len(gone)} revisions" + (f": {', '.join(map(str, gone))}; `b70deploy gc` frees their images"
                                           if gone else "")))


@click.command(epilog="Example: b70deploy audit -n 20")
@click.option("-n", "last", type=int, default=50, show_default=True)
@options.as_json("the entries")
@pass_ctx
def audit(ctx: Ctx, last: int, as_json: bool) -> None:
    rows = inspect.audit(ctx.node, last)
    if as_json:
        emit_json(rows)
        return
    table(["time", "user", "host", "command", "outcome", "revision"],
          [[r.get("time"), r.get("user"), r.get("host"), r.get("command"), r.get("outcome"), r.get("revision")]
           for r in rows])


@click.command(epilog="Example: b70deploy unlock")
@pass_ctx
def unlock(ctx: Ctx) -> None:
    mutate(lambda reporter: bookkeeping.unlock(ctx.node), live=False, end=lambda holder: click.echo(
        f"cleared the stale lock of {holder.describe()}" if holder else "no stale lock"))


@click.command(epilog="Examples: b70deploy fsck | b70deploy fsck --json | b70deploy fsck --repair")
@click.option("--repair", is_flag=True, help="Mend what can be mended with bytes known to be right (see below).")
@options.as_json("the findings")
@pass_ctx
def fsck(ctx: Ctx, repair: bool, as_json: bool) -> None:
    """Every stored file against the sha256 its revision recorded, every meta.json and
    status.json readable, the index against the folders, `current`, the journal, and each
    revision's image on the engine. --repair puts the current revision's damaged copy back
    from the deploy dir when that has the recorded hashes, writes an unreadable status.json
    anew, sets any other damaged revision aside to revisions/damaged/ and rebuilds the index.
    Exit 1 while anything is left unmended."""
    from ..actions.fsck import Finding
    from ..actions.fsck import fsck as check_store

    def end(found: list[Finding]) -> None:
        left = [f for f in found if f.repaired is None]
        if as_json:
            emit_json({"ok": not left, "findings": [f.to_dict() for f in found]})
        else:
            for f in found:
                click.echo(f"{f.what}; " + (f"repaired: {f.repaired}" if f.repaired else f"fix: {f.fix}"))
            click.echo(f"{len(found)} finding(s), {len(found) - len(left)} repaired" if found else
                       "the store is sound")
        if left:
            raise SystemExit(1)

    mutate(lambda reporter: check_store(ctx.node, repair=repair), live=False, end=end)
