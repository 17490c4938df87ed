"""The command line: a thin layer that parses flags and calls b70deploy.actions.

Heavy imports (pydantic, docker, requests) happen inside commands, so `--help` is fast.
Exit codes: 0 ok, 1 the operation failed, 2 bad input (nothing changed).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from .errors import EXIT_BAD_INPUT, EXIT_FAILED, B70Error

if TYPE_CHECKING:
    from .node import Node

EPILOG_EXIT = "Exit codes: 0 ok, 1 operation failed, 2 bad input (nothing changed)."


class Ctx:
    def __init__(self, config: str | None, stacks_dir: str | None) -> None:
        self.config_path = config
        self.stacks_dir = stacks_dir
        self._node: Node | None = None

    @property
    def node(self) -> Node:
        if self._node is None:
            from .node import load_node

            self._node = load_node(self.config_path, stacks_dir=self.stacks_dir)
        return self._node


pass_ctx = click.make_pass_decorator(Ctx)


@click.group(epilog=EPILOG_EXIT, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config", metavar="FILE", envvar="B70DEPLOY_CONFIG",
              help="Node config (default: $B70DEPLOY_CONFIG, ./b70deploy.yaml, /etc/b70deploy/node.yaml).")
@click.option("--stacks-dir", metavar="DIR", envvar="B70DEPLOY_STACKS",
              help="Stack catalogue folder (default: node config's stacks_dir, else the shipped one).")
@click.version_option(package_name="b70deploy")
@click.pass_context
def cli(click_ctx: click.Context, config: str | None, stacks_dir: str | None) -> None:
    """Deploy vLLM Compose stacks on a GPU node: health-gated switch, one-command rollback.

    \b
    Example:
      b70deploy stacks
      b70deploy render eagle3
    """
    click_ctx.obj = Ctx(config, stacks_dir)


@cli.command(epilog="Example: b70deploy stacks --json")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@pass_ctx
def stacks(ctx: Ctx, as_json: bool) -> None:
    """List the stack catalogue."""
    from .actions.stacks import summaries
    from .output import emit_json, table

    rows = summaries(ctx.node)
    if as_json:
        emit_json(rows)
        return
    table(["stack", "extends", "image", "model", "max len", "kv", "spec", "aliases"],
          [[r["name"], r["extends"] or "", r["image"], r["model"], f"{r['max_model_len']:,}", r["kv_cache_dtype"],
            r["speculative"] or "none", ", ".join(r["served_model_names"])] for r in rows])


@cli.command(epilog="Example: b70deploy show eagle3 --json")
@click.argument("stack")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of YAML.")
@pass_ctx
def show(ctx: Ctx, stack: str, as_json: bool) -> None:
    """Show STACK after `extends:` and the node's overlay are merged."""
    from .actions.stacks import merged_document
    from .output import emit_json

    doc = merged_document(ctx.node, stack)
    if as_json:
        emit_json(doc)
    else:
        import yaml

        click.echo(yaml.safe_dump(doc, sort_keys=False), nl=False)


@cli.command(epilog="Example: b70deploy render eagle3 --out /tmp/eagle3")
@click.argument("stack")
@click.option("--out", metavar="DIR", help="Write the files into DIR instead of printing them.")
@click.option("--json", "as_json", is_flag=True, help="Print the files as JSON (secrets masked).")
@pass_ctx
def render(ctx: Ctx, stack: str, out: str | None, as_json: bool) -> None:
    """Render STACK into compose, .env and runtime env files; nothing on the node is touched."""
    from pathlib import Path

    from .actions.prepare import prepare
    from .output import emit_json, note, warn

    prepared = prepare(ctx.node, stack)
    rendered = prepared.rendered
    for w in prepared.warnings:
        warn(w)
    if out:
        from .fsio import write_tree

        dest = Path(out)
        write_tree(dest, rendered.files, {n: rendered.mode(n) for n in rendered.files})
        for n in rendered.notes:
            note(n)
        click.echo(f"wrote {len(rendered.files)} files for {stack} to {dest}")
        return
    if as_json:
        emit_json({"stack": stack, "files": {n: rendered.masked(n) for n in rendered.files},
                   "command": rendered.command, "notes": list(rendered.notes)})
        return
    for name in rendered.files:
        click.echo(f"# ---- {name}")
        click.echo(rendered.masked(name), nl=False)
    for n in rendered.notes:
        note(n)


@cli.command(epilog="Example: b70deploy diff eagle3")
@click.argument("stack")
@pass_ctx
def diff(ctx: Ctx, stack: str) -> None:
    """Show what `switch STACK` would change in the deploy dir (secrets masked)."""
    from .actions.diff import diff_against_dir
    from .actions.prepare import prepare

    prepared = prepare(ctx.node, stack)
    text = diff_against_dir(ctx.node.deploy_dir, prepared.rendered.files)
    click.echo(text if text else f"no changes: {ctx.node.deploy_dir} already holds {stack}", nl=not text)


def main(argv: list[str] | None = None) -> Any:
    try:
        return cli.main(args=argv, prog_name="b70deploy", standalone_mode=False)
    except B70Error as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_FAILED)
    except click.ClickException as e:
        e.show()
        sys.exit(EXIT_BAD_INPUT if e.exit_code == 2 else e.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
