"""Taking over a hand-run node: init (discover and write the node config), adopt (the live
deployment becomes revision 1), import (a saved copy becomes a rollback target)."""

from __future__ import annotations

from pathlib import Path

import click

from ..actions.adopt import Adopt, Adopted
from ..actions.imports import Import, Imported
from ..actions.init import Init, default_target
from ..ui.output import emit_json, table, warn
from . import options
from .base import Ctx, mutate, pass_ctx


@click.command(epilog="Examples: b70deploy init --print | b70deploy init --project b70-vllm "
                      "--config /etc/b70deploy/node.yaml")
@click.option("--print", "to_stdout", is_flag=True, help="Write the config to stdout instead of a file.")
@click.option("--config", "target", metavar="PATH",
              help="Where to write it (default: the global --config, else /etc/b70deploy/node.yaml as root, "
                   "./b70deploy.yaml otherwise). Never overwritten.")
@click.option("--project", metavar="NAME", help="The compose project that is production, when several run vLLM.")
@click.option("--service", metavar="NAME", help="The vLLM service the tool switches, when the project runs several "
              "(variants behind profiles, chat + embeddings); the others are kept as they are.")
@click.option("--state-dir", type=click.Path(path_type=Path), metavar="DIR",
              help="Revisions, journal, lock (default: /var/lib/b70deploy as root, else the user state folder).")
@options.as_json("the config, the source of each value and the notes (secret values masked)")
@pass_ctx
def init(ctx: Ctx, to_stdout: bool, target: str | None, project: str | None, service: str | None,
         state_dir: Path | None, as_json: bool) -> None:
    """Every value is shown with where it came from (container labels, `docker compose config`
    of the project's files, the /dev/dri device nodes, the GPU platform's traces: NVIDIA device
    nodes, `docker info` runtimes and CDI devices, /dev/kfd, each card's PCI vendor). An existing
    config is never replaced."""
    action = Init(default_target(target or ctx.config_path), project=project, state_dir=state_dir,
                  service=service, to_stdout=to_stdout)
    result = action.plan()
    if to_stdout:
        click.echo(result.text(masked=True), nl=False)
        for f in result.facts:
            click.echo(f"# {f.key} = {f.shown()}  <- {f.source}", err=True)
    else:
        written = action.run(result)
        if as_json:
            emit_json({**result.to_dict(), "written": str(written)})
        else:
            table(["key", "value", "from"], [[f.key, f.shown(), f.source] for f in result.facts])
            click.echo(f"wrote {written}; next: b70deploy adopt")
    for line in result.notes:
        warn(line)


@click.command(epilog="Examples: b70deploy adopt --as ngram | b70deploy adopt --json")
@click.option("--as", "stack", default="adopted", show_default=True, metavar="STACK",
              help="The stack name the live deployment is kept as (`rollback STACK` finds it).")
@options.MESSAGE
@options.as_json("the revision, files and patch records")
@pass_ctx
def adopt(ctx: Ctx, stack: str, message: str, as_json: bool) -> None:
    """Its compose file, .env, every env_file and bind-mounted file, pinned to the image id the
    vllm container runs; each mounted file that replaces a file of the image is recorded as a
    unified diff against it. Adopting the same files again changes nothing and says so."""

    def end(got: Adopted) -> None:
        if as_json:
            emit_json(got.to_dict())
            return
        for note in got.notes:
            click.echo(f"note: {note}", err=True)
        if not got.created:
            click.echo(f"already adopted: revision {got.revision} ({got.stack}) holds these files; nothing changed")
            return
        _files(got.files, got.env, got.patches)
        click.echo(f"adopted as revision {got.revision} ({got.stack}, {got.outcome}), image {got.image_ref} = "
                   f"{got.image_id[:19]}")

    mutate(lambda reporter: Adopt(ctx.node, stack=stack, message=message).run(), live=False, end=end)


@click.command("import", epilog="Examples: b70deploy import /apps/b70-vllm/docker-compose.yml.tq-rollback "
                                "--as tq-256k | b70deploy import docker-compose.yml.pre-ngram --as w4a16 --json")
@click.argument("compose", type=click.Path(path_type=Path), required=False)
@click.option("-f", "--file", "files", multiple=True, type=click.Path(path_type=Path), metavar="FILE",
              help="A compose file of the copy, in Compose's -f order (a base file, then its override): each is "
                   "kept as the node's compose_files name in that place.")
@click.option("--env", "env", type=click.Path(path_type=Path), metavar="FILE",
              help="The .env saved with it (default: .env.SUFFIX beside docker-compose.yml.SUFFIX, else .env).")
@click.option("--profile", "profiles", multiple=True, metavar="NAME",
              help="A profile the project runs with (default: the node's profiles, which a rollback runs it with; "
                   "each one given must be among them).")
@click.option("--as", "stack", metavar="STACK", help="The stack it is a revision of (default: the copy's suffix).")
@options.MESSAGE
@options.as_json("the revision, files and patch records")
@pass_ctx
def import_(ctx: Ctx, compose: Path | None, files: tuple[Path, ...], env: Path | None, profiles: tuple[str, ...],
            stack: str | None, message: str, as_json: bool) -> None:
    """The copy is checked as a rollback checks it (docker compose config, the image present,
    lint) and pinned to the image id its tag names now. It never ran under b70deploy:
    `history` shows it unproven until a rollback to it passes the health gate."""
    given = [*([compose] if compose is not None else []), *files]
    if not given:
        raise click.UsageError("give the saved compose file (COMPOSE, or -f FILE once per file)")

    def end(got: Imported) -> None:
        if as_json:
            emit_json(got.to_dict())
            return
        for line in got.warnings:
            warn(line)
        if not got.created:
            click.echo(f"already imported: revision {got.revision} ({got.stack}) holds these files; nothing changed")
            return
        _files(got.files, got.env, got.patches)
        click.echo(f"imported {', '.join(map(str, given))} (with {got.env_file or 'no .env'}) as revision "
                   f"{got.revision} "
                   f"({got.stack}, unproven), image {got.image_ref} = {got.image_id[:19]}; "
                   f"`b70deploy rollback {got.stack}` runs it")

    mutate(lambda reporter: Import(ctx.node, given[0], env=env, stack=stack, message=message,
                                   more=tuple(given[1:]), profiles=profiles).run(), live=False, end=end)


def _files(names: list[str], env: dict[str, str], patches: list[dict[str, object]]) -> None:
    patched = {str(p["file"]): p for p in patches}
    rows = []
    for name in names:
        what = f"keys: {env[name]}" if name in env else ""
        if name in patched:
            p = patched[name]
            what = f"replaces {p['target']} (diff against image file sha256 {str(p['original_sha256'])[:12]})"
        rows.append([name, what])
    table(["file", "kept"], rows)
