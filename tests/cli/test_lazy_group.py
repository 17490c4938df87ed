"""The lazy root group: every command is found, and the short help the root `--help` shows
without importing a command's module is the command's own."""

from __future__ import annotations

import click
import pytest

from b70deploy.cli.base import COMMANDS, cli


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_root_help_line_is_the_commands_own(name: str) -> None:
    ctx = click.Context(cli)
    command = cli.get_command(ctx, name)
    assert command is not None and command.name == name
    assert COMMANDS[name][1] == command.get_short_help_str(limit=1000), name


def test_unknown_command_is_not_found() -> None:
    assert cli.get_command(click.Context(cli), "no-such") is None
