"""The watch command: supervise the node after each switch, or print its systemd unit."""

from __future__ import annotations

import json
from typing import Any

import click

from ..actions.watch import WatchNode
from ..watch.unit import unit_text
from . import options
from .base import Ctx, pass_ctx


@click.command(epilog="Examples: b70deploy watch | b70deploy watch --json | "
               "b70deploy watch --unit > /etc/systemd/system/b70deploy-watch.service")
@click.option("--unit", is_flag=True, help="Print a systemd unit that keeps watch running, and exit.")
@click.option("--interval", type=click.FloatRange(min=0.1), help="Seconds between looks (default: node "
              "watch.interval, 10).")
@options.as_json("each event (one object per line)")
@pass_ctx
def watch(ctx: Ctx, unit: bool, interval: float | None, as_json: bool) -> None:
    """Follows the current revision's vllm container: deaths and restart loops (Docker events),
    /health, a periodic smoke request, fatal log lines and the error rate in /metrics. Inside
    the bake window after a switch (node watch.bake_seconds, or the stack's bake_seconds) a
    failure rolls back to the revision that was current before, once per revision; after it,
    watch alerts and does not act. A container that is not the current revision's is drift:
    reported, never acted on. Runs in the foreground, one line per event; SIGTERM stops it."""
    if unit:
        click.echo(unit_text(ctx.node), nl=False)
        return
    action = WatchNode(ctx.node, interval=interval)

    def emit(event: dict[str, Any]) -> None:
        if as_json:
            click.echo(json.dumps(event, sort_keys=True))
        else:
            rev = f" rev {event['revision']}" if event["revision"] is not None else ""
            diag = f" [diagnosis: {event['diagnosis']}]" if event["diagnosis"] else ""
            click.echo(f"{event['time']} {event['event']}{rev}: {event['text']}{diag}")

    for line in action.plan():
        click.echo(line, err=True)
    action.run(emit)
