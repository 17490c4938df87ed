"""Catalogue commands: stacks, show, render, diff.

`stacks` and `show` read only the catalogue: the renderer, the engine client and the differ
are imported by the commands that use them (`stacks` over 1,000 stacks must stay fast)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import yaml

from ..actions.stacks import merged_document, summaries
from ..errors import EXIT_BAD_INPUT, UserError
from ..state.fsio import read_tree, write_tree
from ..ui.output import emit_json, note, table, warn
from . import options
from .base import Ctx, pass_ctx
from .complete import rollback_targets, stack_names


@click.command(epilog="Example: b70deploy stacks --json")
@options.as_json("the catalogue")
@pass_ctx
def stacks(ctx: Ctx, as_json: bool) -> None:
    rows, broken = summaries(ctx.node)
    if as_json:
        emit_json(rows)
    elif rows or not broken:
        table(["stack", "extends", "image", "model", "max len", "kv", "spec", "aliases"],
              [[r["name"], r["extends"] or "", r["image"], r["model"],
                f"{r['max_model_len']:,}" if r["max_model_len"] else "the model's",
                r["kv_cache_dtype"], r["speculative"] or "none", ", ".join(r["served_model_names"] or ["(its path)"])]
               for r in rows],
              optional=("aliases", "extends", "kv", "spec", "max len"))
    if broken:  # the good stacks are listed; each broken file gets its own line, and the exit says so
        click.echo("\n".join(f"error: {e}" for e in broken), err=True)
        sys.exit(EXIT_BAD_INPUT)


@click.command(epilog="Example: b70deploy show eagle3 --json")
@click.argument("stack", shell_complete=stack_names)
@options.as_json("the merged stack")
@pass_ctx
def show(ctx: Ctx, stack: str, as_json: bool) -> None:
    doc = merged_document(ctx.node, stack)
    if as_json:
        emit_json(doc)
    else:
        click.echo(yaml.safe_dump(doc, sort_keys=False), nl=False)


@click.command(epilog="Example: b70deploy render eagle3 --out /tmp/eagle3")
@click.argument("stack", shell_complete=stack_names)
@click.option("--out", metavar="DIR", help="Write the files into DIR instead of printing them.")
@options.as_json("the files (secrets masked)")
@click.option("--no-docker", is_flag=True, help="Do not ask the engine: plain render, no image pin, no patches.")
@pass_ctx
def render(ctx: Ctx, stack: str, out: str | None, as_json: bool, no_docker: bool) -> None:
    """With the image on the engine: compose, .env pinned to the image id, runtime env, the
    patched files and their mounts, the draft copy's path, exactly as a switch writes them.
    Without it: the plain render, and each thing it could not resolve."""
    from ..actions.prepare import switch_view
    from ..render.masking import modes

    view = switch_view(ctx.node, stack, docker=not no_docker)
    for w in view.warnings:
        warn(w)

    def remarks() -> None:
        for n in (*view.notes, *view.resolved):
            note(n)
        for u in view.unresolved:
            warn(f"not resolved: {u}")
        if view.lint_errors:
            warn(f"lint finds {view.lint_errors} error(s): a switch would stop at preflight (b70deploy lint {stack})")

    if out:
        dest = Path(out)
        write_tree(dest, view.files, modes(view.files))  # as a switch writes them: a secret 0600
        remarks()
        click.echo(f"wrote {len(view.files)} files for {stack} to {dest}"
                   + ("" if view.exact else " (plain render: see the warnings for what is not resolved)"))
        return
    if as_json:
        emit_json({"stack": stack, "files": {n: view.masked(n) for n in view.files}, "command": view.command,
                   "exact": view.exact, "resolved": view.resolved, "unresolved": view.unresolved,
                   "lint_errors": view.lint_errors, "notes": list(view.notes)})
        return
    for name in view.files:
        click.echo(f"# ---- {name}")
        click.echo(view.masked(name), nl=False)
    remarks()


@click.command(epilog="Examples: b70deploy diff eagle3 | b70deploy diff 3 7")
@click.argument("what", nargs=-1, required=True, metavar="STACK | REV_A REV_B", shell_complete=rollback_targets)
@options.as_json("the changed files and the diff")
@pass_ctx
def diff(ctx: Ctx, what: tuple[str, ...], as_json: bool) -> None:
    """E.g. KV tokens 453,184 -> 270,592, -40%. Secrets masked."""
    from ..actions.diff import diff_against_dir, switch_files
    from ..actions.inspect import diff_revisions

    if len(what) == 2 and all(w.isdigit() for w in what):
        text, rows = diff_revisions(ctx.node, int(what[0]), int(what[1]))
        if as_json:
            emit_json({"revisions": [int(what[0]), int(what[1])], "diff": text,
                       "facts": [dict(zip(["fact", "a", "b", "change"], r, strict=True)) for r in rows]})
            return
        click.echo(text if text else "files identical", nl=not text)
        if rows:
            table(["fact", f"rev {what[0]}", f"rev {what[1]}", "change"], rows)
        return
    if len(what) != 1:
        raise UserError(f"diff takes a stack or two revision numbers, got {' '.join(what)!r}",
                        fix="b70deploy diff eagle3, or b70deploy diff 3 7")

    stack = what[0]
    files, secrets, remark = switch_files(ctx.node, stack)
    if remark:
        note(remark)
    text = diff_against_dir(ctx.node.deploy_dir, files, secrets=secrets)
    if as_json:
        current = read_tree(ctx.node.deploy_dir, sorted(files))
        emit_json({"stack": stack, "deploy_dir": str(ctx.node.deploy_dir),
                   "changed": [n for n in sorted(files) if current.get(n) != files[n]], "diff": text})
        return
    click.echo(text if text else f"no changes: {ctx.node.deploy_dir} already holds {stack}", nl=not text)
