"""Preflight commands: lint, diagnose, draft fix."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..actions.inspect import logs
from ..config.schema import Stack
from ..errors import EXIT_BAD_INPUT, EXIT_FAILED, OperationError, UserError
from ..lint.gather import lint_stacks
from ..render.draft import copy_name, make_draft_copy
from ..state.revisions import RevisionStore
from ..ui.output import echo_lines, emit_json
from ..vllmlog.bootlog import parse_boot_facts
from ..vllmlog.diagnosis import diagnose as run_diagnosis
from . import options
from .base import Ctx, pass_ctx
from .complete import revision_numbers, stack_names


@click.command(epilog="Examples:\n\n  b70deploy lint eagle3\n\n  b70deploy lint --all --json\n\n"
                    "Exit codes: 0 no errors (warnings allowed), 2 errors found.")
@click.argument("stacks", nargs=-1, shell_complete=stack_names)
@click.option("--all", "all_stacks", is_flag=True, help="Lint every stack in the catalogue.")
@options.as_json("findings")
@click.option("--no-docker", is_flag=True, help="Only the checks that need no Docker (no image, compose or port).")
@pass_ctx
def lint(ctx: Ctx, stacks: tuple[str, ...], all_stacks: bool, as_json: bool, no_docker: bool) -> int:
    node = ctx.node
    if all_stacks == bool(stacks):
        raise UserError("name stacks or give --all (not both)", fix="e.g. b70deploy lint eagle3, or lint --all")
    names = node.catalogue().names() if all_stacks else list(stacks)
    results = lint_stacks(node, names, docker=not no_docker)
    errors = sum(f.severity == "error" for fs, _ in results.values() for f in fs)
    warnings = sum(f.severity == "warning" for fs, _ in results.values() for f in fs)
    if as_json:
        emit_json({"stacks": {n: {"findings": [f.to_dict() for f in fs], "skipped": sk}
                              for n, (fs, sk) in results.items()},
                   "errors": errors, "warnings": warnings})
    else:
        for name, (_, skipped) in results.items():
            for s in skipped:
                click.echo(f"note: {name}: {s}", err=True)
        verdict = "ok" if errors == 0 else "NOT ready to deploy"
        echo_lines([*(f.one_line() for fs, _ in results.values() for f in fs),
                    f"lint: {len(results)} stack(s), {errors} error(s), {warnings} warning(s): {verdict}"])
    return EXIT_BAD_INPUT if errors else 0


def diagnose_revision(ctx: Ctx, rev: str) -> tuple[list[str], Stack | None, str | None]:
    """The container log kept with revision REV (a failed boot keeps its own), the stack it
    was rendered from when the revision recorded it, and why it failed, as recorded (a smoke
    test's failure is in no log line)."""
    if not rev.isdigit():
        raise UserError(f"{rev!r} is not a revision number", fix="`b70deploy history` lists the revisions")
    text = logs(ctx.node, int(rev))
    revision = RevisionStore(ctx.node.state_dir).get(int(rev))
    doc = revision.meta.stack_doc
    return text.splitlines(), Stack.model_validate(doc) if doc else None, revision.status.failure


def _container_lines(name: str) -> list[str]:
    import docker  # only `diagnose --container` talks to the engine

    try:
        client = docker.from_env()
        container = client.containers.get(name)
        data = container.logs(stdout=True, stderr=True)
    except docker.errors.NotFound:
        raise UserError(f"no container named {name!r}", fix="see `docker ps -a`") from None
    except docker.errors.DockerException as e:
        raise OperationError(f"cannot read the logs of {name}: {e}",
                             fix=f"check the engine answers (docker logs {name})") from None
    return [str(ln) for ln in data.decode("utf-8", "replace").splitlines()]


@click.command(epilog="Examples:\n\n  b70deploy diagnose --log /tmp/vllm.log\n\n"
                    "  b70deploy diagnose --container b70-vllm-1 --json\n\n"
                    "  b70deploy diagnose --log /tmp/vllm.log --stack w4a16\n\n"
                    "Exit codes: 0 no fatal signature, 1 a fatal signature found, 2 bad input.")
@click.argument("rev", required=False, shell_complete=revision_numbers)
@click.option("--log", "log_file", metavar="FILE", help="Read a saved boot log ('-' for stdin).")
@click.option("--container", metavar="NAME", help="Read a container's log through Docker.")
@click.option("--stack", "stack_name", metavar="STACK",
              help="The stack the log came from: the fix is checked against it (REV knows its own).")
@options.as_json("the diagnosis and boot facts")
@pass_ctx
def diagnose(ctx: Ctx, rev: str | None, log_file: str | None, container: str | None, stack_name: str | None,
             as_json: bool) -> int:
    if sum(x is not None for x in (rev, log_file, container)) != 1:
        raise UserError("give exactly one of REV, --log FILE or --container NAME",
                        fix="e.g. b70deploy diagnose --log vllm.log")
    stack = ctx.node.catalogue().load(stack_name) if stack_name is not None else None
    failure = None
    if log_file is not None:
        try:
            text = sys.stdin.read() if log_file == "-" else Path(log_file).read_text(errors="replace")
        except OSError as e:
            raise UserError(f"cannot read {log_file}: {e.strerror}", fix="check the path") from None
        lines = text.splitlines()
    elif container is not None:
        lines = _container_lines(container)
    else:
        lines, recorded, failure = diagnose_revision(ctx, rev or "")
        stack = stack or recorded
    found = run_diagnosis(lines, stack)
    facts = parse_boot_facts(lines)
    if as_json:
        emit_json({"diagnosis": found.to_dict() if found else None, "boot_facts": facts.to_dict(),
                   "lines": len(lines), "failure": failure})
    elif found is None:
        known = {k: v for k, v in facts.to_dict().items() if v not in (None, False, [])}
        click.echo("boot facts: " + (", ".join(f"{k}={v}" for k, v in known.items()) or "none stated"))
        click.echo(f"diagnose: no fatal signature in {len(lines)} line(s)")
        if failure:  # e.g. a smoke test: the log is clean, the revision still failed
            click.echo(f"revision {rev} failed: {failure}")
    else:
        click.echo(f"line {found.line_number}: {found.line}")
        click.echo(f"diagnose: {found.title} [{found.id}]; fix: {found.fix}")
    return EXIT_FAILED if found else 0


@click.group(epilog="Example: b70deploy draft fix /models/Qwen/Qwen3-30B-A3B-EAGLE3 --max-position-embeddings 262144")
def draft() -> None:
    pass  # a group: its summary is in COMMANDS (base.py), its commands below


@draft.command("fix", epilog="Example: b70deploy draft fix /models/Qwen/Qwen3-30B-A3B-EAGLE3 "
                             "--max-position-embeddings 262144")
@click.argument("path", type=click.Path(file_okay=False, path_type=Path))
@click.option("--max-position-embeddings", "n", type=click.IntRange(1, 10_485_760), required=True,
              help="The value the copy's config.json gets (the target's max_model_len).")
@options.as_json("the result")
def draft_fix(path: Path, n: int, as_json: bool) -> None:
    """Write a copy of the draft at PATH with max_position_embeddings raised; PATH is untouched.

    Weights are hard-linked (no extra space); the copy is PATH.b70-mpeN beside it.
    """
    src = path.absolute()
    dest = src.parent / Path(copy_name(src.name, n)).name
    made = make_draft_copy(src, dest, n)
    if as_json:
        emit_json({"source": str(src), "copy": str(dest), "max_position_embeddings": n, "created": made})
        return
    click.echo(f"draft fix: {dest} {'written' if made else 'already up to date'} "
               f"(max_position_embeddings {n}); {src} untouched")
