"""The lazy root group: every command is found, and COMMANDS is the one source of its summary:
the root `--help` shows it without importing the command's module, and the command's own
`--help` starts with it."""

from __future__ import annotations

import click
import pytest
from simkit import run_cli

from b70deploy.cli.base import COMMANDS, cli


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_root_help_line_is_the_commands_own(name: str) -> None:
    ctx = click.Context(cli)
    command = cli.get_command(ctx, name)
    assert command is not None and command.name == name
    assert COMMANDS[name].summary == command.get_short_help_str(limit=1000), name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_commands_help_starts_with_its_summary(name: str) -> None:
    r = run_cli(None, name, "--help", in_process=True, check=True)
    usage, summary = r.stdout.split("\n\n")[:2]
    assert usage.startswith(f"Usage: b70deploy {name}"), r.stdout
    assert " ".join(summary.split()) == COMMANDS[name].summary, r.stdout


def test_unknown_command_is_not_found() -> None:
    assert cli.get_command(click.Context(cli), "no-such") is None
