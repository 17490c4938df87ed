"""Shell completion of what the node knows: stack names, revision numbers, inventory node names.

click completes commands and options by itself (`_B70DEPLOY_COMPLETE=bash_source b70deploy`,
README: "Shell completion"); these give the values. They read the node config the command line
names (its --config, --stacks-dir, --node, else the usual search) and never fail: a completion
that cannot read the node offers nothing rather than printing an error into the shell.
"""

from __future__ import annotations

from typing import Any

import click
from click.shell_completion import CompletionItem


def _node(ctx: click.Context) -> Any:
    from ..config.node import load_node

    root = ctx.find_root().params
    return load_node(root.get("config"), stacks_dir=root.get("stacks_dir"), name=root.get("node_name"))


def stack_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    try:
        names = _node(ctx).catalogue().names()
    except Exception:
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]


def revision_numbers(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    try:
        from ..state.revisions import RevisionStore

        table = RevisionStore(_node(ctx).state_dir).summaries()
        rows = zip(table.column("number"), table.column("stack"), table.column("outcome"), strict=True)
        found = [(str(n), f"{stack} ({outcome})") for n, stack, outcome in rows]
    except Exception:
        return []
    return [CompletionItem(n, help=h) for n, h in reversed(found) if n.startswith(incomplete)]


def rollback_targets(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """`rollback TARGET`: a stack name or a revision number."""
    return [*stack_names(ctx, param, incomplete), *revision_numbers(ctx, param, incomplete)]


def node_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    try:
        from ..config.node import find_config
        from ..config.yamlfile import read_yaml

        path = find_config(ctx.find_root().params.get("config"))
        nodes = read_yaml(path).get("nodes") if path is not None else None
    except Exception:
        return []
    return [CompletionItem(n) for n in (nodes or {}) if isinstance(n, str) and n.startswith(incomplete)]
