"""Stack file commands: `stack from-compose`."""

from __future__ import annotations

from pathlib import Path

import click

from ..actions.stack_from_compose import StackFromCompose
from ..ui.output import emit_json, note
from . import options
from .base import Ctx, pass_ctx


@click.group(epilog="Example: b70deploy stack from-compose /apps/b70-vllm/docker-compose.yml --name tq-256k")
def stack() -> None:
    pass  # a group: its summary is in COMMANDS (base.py), its commands below


@stack.command("from-compose", epilog="Example: b70deploy stack from-compose /apps/b70-vllm/docker-compose.yml "
                                      "--env /apps/b70-vllm/.env --name hand-w4a16")
@click.argument("compose_file", metavar="COMPOSE")
@click.option("--env", "env_file", metavar="FILE",
              help="Interpolate ${VAR} from FILE instead of the .env beside COMPOSE (as docker compose --env-file).")
@click.option("--name", required=True, help="The new stack's name; the file is <stacks dir>/NAME.yaml "
                                          "(./stacks/NAME.yaml while the node uses the shipped catalogue).")
@click.option("--service", metavar="NAME", help="The service that runs vLLM (default: vllm, or the one that "
                                                "runs `vllm serve`).")
@click.option("-f", "--file", "more", multiple=True, metavar="FILE",
              help="A compose file Compose reads after COMPOSE (an override file), in -f order.")
@click.option("--profile", "profiles", multiple=True, metavar="NAME",
              help="A profile the project runs with (default: every profile).")
@click.option("-o", "--out", metavar="FILE", help="Write to FILE (named NAME.yaml) instead of the stacks dir.")
@options.as_json("the stack, node facts and notes")
@pass_ctx
def from_compose(ctx: Ctx, compose_file: str, env_file: str | None, name: str, service: str | None,
                 more: tuple[str, ...], profiles: tuple[str, ...], out: str | None, as_json: bool) -> None:
    """Write a stack file from a hand-made compose file: image, entrypoint style (from the
    image, else the file), the command's flags as stack keys, unknown flags verbatim in
    extra_args, env (secrets left out), host mounts. Refuses to overwrite a file."""
    action = StackFromCompose(ctx.node, Path(compose_file), name, env_file=Path(env_file) if env_file else None,
                              service=service, out=Path(out) if out else None, more=tuple(map(Path, more)),
                              profiles=profiles)
    done = action.run()
    if as_json:
        emit_json(done.to_json())
        return
    for n in done.result.notes:
        note(n)
    facts = {**({"project": done.project} if done.project else {}), **done.result.node}
    if facts:
        note("node config values this file implies: " + ", ".join(f"{k}: {v}" for k, v in facts.items()))
    if done.elsewhere:
        note(done.elsewhere)
    click.echo(f"wrote {done.path} (stack {name}, entrypoint_style {done.result.doc['entrypoint_style']} from "
               f"{done.result.sources.get('entrypoint_style')})")
