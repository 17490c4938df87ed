"""Deploy commands: switch, rollback, resume, drain, verify, restore, gc, up/down --dark. Each
builds its action from the flags and prints what it returns, every one but verify through `mutate`.
(`status` and `history` are in
records, logs, pin, unpin, prune, audit and unlock in revisions: they need no switch machinery.)"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from ..actions.dark import DarkDown, DarkUp
from ..actions.gc import Gc, Removed
from ..actions.node_ops import Drain, Restore, Verify
from ..actions.resume import Resume
from ..actions.rollback import Rollback
from ..actions.rollout import RollingOutcome, Rollout, Verb
from ..actions.switch import DeployOptions, Switch
from ..deploy.driver import Outcome
from ..deploy.plan import DeployPlan
from ..deploy.rollout import RolloutPlan
from ..errors import Declined, UserError
from ..ui.output import emit_json, table
from ..ui.progress import PlainReporter
from . import options
from .base import Ctx, mutate, pass_ctx
from .complete import rollback_targets, stack_names

_TIMEOUT_HELP = "Seconds to wait for /health of the new stack (default: node timeouts.health, 720)."


def confirm(question: str, assume_yes: bool) -> None:
    """Ask on a terminal before stopping production; never blocks a pipe or CI."""
    if assume_yes or not sys.stdin.isatty():
        return
    if not click.confirm(question, default=False, err=True):
        raise Declined("declined at the prompt; nothing changed")


def ask_first(plan: Callable[[], DeployPlan], question: Callable[[DeployPlan], str],
              assume_yes: bool) -> Callable[[DeployPlan], None] | None:
    """Ask before the deploy lock is taken (an answer may take minutes; the lock would stop every other
    command meanwhile): the plan is made, the question asked, and the run under the lock goes on only
    when its own plan is the one agreed to. None: nothing to ask (--yes, or no terminal)."""
    if assume_yes or not sys.stdin.isatty():
        return None
    agreed = plan()
    try:
        confirm(question(agreed), False)
    except Declined as e:
        no = e

        def declined(now: DeployPlan) -> None:
            raise no  # said under the lock, so the audit log keeps the "no" as a declined run

        return declined

    def same(now: DeployPlan) -> None:
        if _agreed_key(now) != _agreed_key(agreed):
            raise Declined("the node changed while you were asked (another revision, image or files); nothing "
                           "changed", fix="run the command again to see the new plan")

    return same


def _agreed_key(plan: DeployPlan) -> tuple[Any, ...]:
    return plan.stack.name, plan.image.id, sorted(plan.files.items()), plan.restored_from


def finish(outcome: Outcome, as_json: bool) -> None:
    """The exit line of switch, rollback and resume: the outcome (or its JSON), its exit code."""
    if as_json:
        emit_json(outcome.to_dict())
    else:
        if not outcome.ok:  # a success's checks were shown as they passed
            for line in outcome.details:
                click.echo(line, err=True)
        for line in outcome.warnings:  # committed, but a record could not be written (a full disk)
            click.echo(line, err=True)
        click.echo(outcome.summary)
    if not outcome.ok:
        sys.exit(outcome.exit_code)


def _rolling_options(fn: Any) -> Any:
    for opt in reversed([
        click.option("--nodes", "select", metavar="all|a,b",
                     help="With an inventory: these nodes, in batches (see --max-unavailable)."),
        click.option("--max-unavailable", type=click.IntRange(1), default=1, show_default=True,
                     help="With --nodes: nodes out of the pool at once (the batch size)."),
        click.option("--pause", type=click.FloatRange(0), default=0.0, show_default=True,
                     help="With --nodes: seconds to wait between batches."),
        click.option("--rollback-all-on-failure", is_flag=True,
                     help="With --nodes: on a failure, roll back the nodes already switched too."),
    ]):
        fn = opt(fn)
    return fn


def _rollout(ctx: Ctx, select: str, action: str, verb: Verb, opts: DeployOptions, *, max_unavailable: int,
             pause: float, rollback_all: bool, yes: bool, as_json: bool, dry_run: bool = False,
             take_stale: bool = False) -> None:
    """switch/rollback over inventory nodes: prepare all, print the plan, then batch by batch."""
    nodes = ctx.nodes(select)
    rollout = Rollout(nodes, action, verb, opts, max_unavailable=max_unavailable, pause=pause,
                      rollback_all_on_failure=rollback_all, take_stale=take_stale)
    if dry_run:
        plan, _ = rollout.plan(PlainReporter())
        if as_json:
            emit_json(plan.to_dict())
        else:
            click.echo("\n".join([*plan.lines(), "(dry run, nothing changed)"]))
        return

    def ask(plan: RolloutPlan) -> None:
        if not as_json:
            click.echo("\n".join(plan.lines()))
        confirm(f"Start: {action} on {len(nodes)} node(s), {max_unavailable} at a time?", yes)

    def end(outcome: RollingOutcome) -> None:
        if as_json:
            emit_json(outcome.to_dict())
        else:
            table(["node", "state", "revision", "seconds", "summary"],
                  [[r.name, r.state, r.revision or "", f"{r.seconds:.1f}", r.summary.split(": ", 1)[-1]]
                   for r in outcome.results])
            click.echo(outcome.summary)
        if not outcome.ok:
            sys.exit(outcome.exit_code)

    # Each node's run goes through actions/mutating.py under that node's own lock.
    mutate(lambda reporter: rollout.run(reporter, confirm=ask), live=False, end=end)


def _no_rolling_flags(max_unavailable: int, pause: float, rollback_all: bool) -> None:
    if max_unavailable != 1 or pause or rollback_all:
        raise UserError("--max-unavailable, --pause and --rollback-all-on-failure need --nodes",
                        fix="add --nodes all (or a,b) to act on inventory nodes")


def _common(fn: Any) -> Any:
    for opt in reversed([
        options.MESSAGE,
        click.option("--timeout", type=float, help=_TIMEOUT_HELP),
        click.option("--rollback-timeout", type=float, help="Seconds to wait for /health when rolling back."),
        options.LOCK_WAIT,
        options.VERIFY_WAIT,
        click.option("--yes", "-y", is_flag=True, help="Do not ask before draining production."),
        options.as_json("the outcome"),
    ]):
        fn = opt(fn)
    return fn


@click.command(epilog="Examples: b70deploy switch eagle3 -m 'EAGLE-3 with the fixed draft' --yes | "
             "b70deploy switch eagle3 --nodes all --max-unavailable 2 --pause 30")
@click.argument("stack", shell_complete=stack_names)
@click.option("--dry-run", is_flag=True, help="Print the plan and the diff; change nothing.")
@click.option("--no-auto-rollback", is_flag=True, help="On failure, leave the failed stack for inspection.")
@_rolling_options
@_common
@pass_ctx
def switch(ctx: Ctx, stack: str, dry_run: bool, no_auto_rollback: bool, select: str | None, max_unavailable: int,
           pause: float, rollback_all_on_failure: bool, message: str, timeout: float | None,
           rollback_timeout: float | None, lock_wait: float, verify_wait: float, yes: bool, as_json: bool) -> None:
    """A failure after activation rolls back to the previous revision automatically.

    With --nodes (an inventory): every node is prepared and linted first, the plan is printed,
    then batches of --max-unavailable nodes switch at once; the next batch starts when the
    whole batch passed health and smoke. The first failure stops the rollout: that node rolls
    back, later nodes stay untouched, earlier ones stay new unless --rollback-all-on-failure."""
    opts = DeployOptions(message=message, timeout=timeout, rollback_timeout=rollback_timeout,
                         auto_rollback=not no_auto_rollback, lock_wait=lock_wait, verify_wait=verify_wait)
    if select is not None:
        _rollout(ctx, select, f"switch {stack}", lambda node: Switch(node, stack, opts), opts,
                 max_unavailable=max_unavailable, pause=pause, rollback_all=rollback_all_on_failure, yes=yes,
                 as_json=as_json, dry_run=dry_run)
        return
    _no_rolling_flags(max_unavailable, pause, rollback_all_on_failure)
    action = Switch(ctx.node, stack, opts)
    if dry_run:
        preview = action.preview()
        click.echo("\n".join(preview.lines))
        if preview.refusal is not None:
            raise preview.refusal  # what the switch itself would stop on, after the plan
        return
    prod = ctx.node.config.ports.prod
    agreed = ask_first(action.plan, lambda plan: f"Drain production on :{prod} and switch to {stack}?", yes)
    mutate(lambda reporter: action.run(reporter, confirm=agreed), quiet=as_json, end=lambda o: finish(o, as_json))


@click.command(epilog="Examples: b70deploy rollback | b70deploy rollback tq-256k | b70deploy rollback 12 | "
             "b70deploy rollback --nodes a,b --max-unavailable 1")
@click.argument("target", required=False, shell_complete=rollback_targets)
@click.option("--dry-run", is_flag=True, help="Print the target, the plan and the diff; change nothing.")
@_rolling_options
@_common
@pass_ctx
def rollback(ctx: Ctx, target: str | None, dry_run: bool, select: str | None, max_unavailable: int, pause: float,
             rollback_all_on_failure: bool, message: str, timeout: float | None, rollback_timeout: float | None,
             lock_wait: float, verify_wait: float, yes: bool, as_json: bool) -> None:
    """No TARGET: the previous revision (or, after a killed run, the one before it).
    A stack name: the newest revision of that stack that ran healthy. A number: that revision."""
    opts = DeployOptions(message=message, timeout=timeout, rollback_timeout=rollback_timeout, lock_wait=lock_wait,
                         verify_wait=verify_wait)
    if select is not None:
        _rollout(ctx, select, f"rollback {target or ''}".strip(), lambda node: Rollback(node, target, opts), opts,
                 max_unavailable=max_unavailable, pause=pause, rollback_all=rollback_all_on_failure, yes=yes,
                 as_json=as_json, dry_run=dry_run, take_stale=True)
        return
    _no_rolling_flags(max_unavailable, pause, rollback_all_on_failure)
    action = Rollback(ctx.node, target, opts)
    if dry_run:
        click.echo("\n".join(action.preview()))
        return
    agreed = ask_first(action.plan, lambda plan: f"Drain production and roll back to revision {plan.restored_from} "
                       f"({plan.stack.name})?", yes)
    mutate(lambda reporter: action.run(reporter, confirm=agreed), quiet=as_json, end=lambda o: finish(o, as_json))


@click.command(epilog="Example: b70deploy resume")
@options.LOCK_WAIT
@options.as_json("the outcome")
@pass_ctx
def resume(ctx: Ctx, lock_wait: float, as_json: bool) -> None:
    mutate(Resume(ctx.node, lock_wait=lock_wait).run, quiet=as_json, end=lambda o: finish(o, as_json))


@click.command(epilog="Example: b70deploy drain --yes && b70deploy verify --wait 60")
@options.LOCK_WAIT
@click.option("--yes", "-y", is_flag=True, help="Do not ask before stopping production.")
@pass_ctx
def drain(ctx: Ctx, lock_wait: float, yes: bool) -> None:
    """Stop production's vllm and its companions (the GPU free for `up --dark`); `restore` starts them."""
    confirm(f"Drain production on :{ctx.node.config.ports.prod} (clients get errors until `b70deploy restore`)?",
            yes)
    mutate(Drain(ctx.node, lock_wait=lock_wait).run, live=False, end=lambda services: click.echo(
        f"node drained: {', '.join(services)} stopped; `b70deploy restore` brings them back"))


@click.command(epilog="Example: b70deploy verify --wait 60 --json")
@click.option("--wait", type=float, default=0.0, help="Keep reading until idle or this many seconds pass.")
@options.as_json("the readings")
@pass_ctx
def verify(ctx: Ctx, wait: float, as_json: bool) -> None:
    """Exit 1 if not."""
    idle, got = Verify(ctx.node, wait=wait).run()
    if as_json:
        emit_json({"idle": idle, "readings": [{"name": r.name, "ok": r.ok, "detail": r.detail} for r in got]})
    else:
        for r in got:
            click.echo(f"{'ok  ' if r.ok else 'BUSY'} {r.name}: {r.detail}")
        click.echo("node idle" if idle else "node NOT idle")
    if not idle:
        sys.exit(1)


@click.command(epilog="Example: b70deploy restore --timeout 720")
@click.option("--timeout", type=float, help="Seconds to wait for /health (default: node timeouts.restore, 720).")
@options.LOCK_WAIT
@pass_ctx
def restore(ctx: Ctx, timeout: float | None, lock_wait: float) -> None:
    mutate(Restore(ctx.node, timeout=timeout, lock_wait=lock_wait).run,
           end=lambda elapsed: click.echo(f"node restored: healthy after {elapsed:.1f} s"))


@click.command(epilog="Examples: b70deploy gc --dry-run | b70deploy gc --json")
@click.option("--dry-run", is_flag=True, help="List what would be removed, and why; change nothing.")
@options.as_json("the items")
@pass_ctx
def gc(ctx: Ctx, dry_run: bool, as_json: bool) -> None:
    action = Gc(ctx.node)
    if dry_run:
        items = action.plan()
        if as_json:
            emit_json([i.to_dict() for i in items])
            return
        for i in items:
            click.echo(f"would remove {i.name}: {i.reason}" + (f" (frees image {i.frees[:19]})" if i.frees else ""))
        click.echo(f"{len(items)} item(s); dry run, nothing changed")
        return

    def end(done: list[Removed]) -> None:
        if as_json:
            emit_json([d.to_dict() for d in done])
        else:
            click.echo(f"gc: removed {sum(d.ok for d in done)} of {len(done)} item(s)")
        if not all(d.ok for d in done):
            sys.exit(1)

    mutate(action.run, quiet=as_json, end=end)


@click.command(epilog="Examples: b70deploy drain && b70deploy up ngram --dark | b70deploy up tiny --dark --force")
@click.argument("stack", shell_complete=stack_names)
@click.option("--dark", is_flag=True, required=True, help="Required: run on the dark port, own project.")
@click.option("--timeout", type=float, help="Seconds to wait for /health of the dark stack (default: node "
              "timeouts.health, 720).")
@click.option("--force", is_flag=True, help="Start even while production's vllm runs (both must fit on the GPU).")
@options.LOCK_WAIT
@pass_ctx
def up(ctx: Ctx, stack: str, dark: bool, timeout: float | None, force: bool, lock_wait: float) -> None:
    mutate(DarkUp(ctx.node, stack, timeout=timeout, force=force, lock_wait=lock_wait).run, end=lambda url: click.echo(
        f"dark {stack} healthy at {url} (project {ctx.node.dark_project}); `b70deploy down --dark` stops it"))


@click.command(epilog="Example: b70deploy down --dark")
@click.option("--dark", is_flag=True, required=True, help="Required: stop the dark stack.")
@pass_ctx
def down(ctx: Ctx, dark: bool) -> None:
    mutate(lambda reporter: DarkDown(ctx.node).run(), live=False,
           end=lambda removed: click.echo("dark stack removed" if removed else "no dark stack"))
