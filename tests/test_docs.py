"""Every `b70deploy ...` command the README and the docs/ pages show parses with the CLI as it is: the
command (and its subcommand) exists, and so does each option, with a value of the right type (issue 39:
the README is the reference an operator copies from; a renamed flag must fail here, not on the node).
The commands are parsed, not run: they name nodes, files and GPUs this machine does not have; what they
do is tested where the code is."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from b70deploy.cli.base import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A shown command: at the start of a code line, or inside backticks in prose.
_CODE = re.compile(r"^\s{4,}(?:\$ )?(b70deploy [^#\n]*)", re.M)
_INLINE = re.compile(r"`(b70deploy [^`]+)`")
_PLACEHOLDER = re.compile(r"\.\.\.|<[^>]*>|…|\bARGS\b")


_NUMBERS = re.compile(r"\b(?:REV|REVISION|N)\b")  # a synopsis's number placeholders


def shown(text: str) -> list[str]:
    """The commands, as a synopsis reads: `[--opt]` given, `a|b` the first, REV or N a number."""
    text = text.replace("\\\n", " ")  # a command continued on the next line
    commands = []
    for found in (*_CODE.findall(text), *_INLINE.findall(text)):
        for part in re.split(r"\s(?:\||&&|;|>)\s", " ".join(found.split())):
            part = re.sub(r"\[([^\]|]*)(?:\|[^\]]*)?\]", r"\1", part.strip())
            part = _NUMBERS.sub("1", part)
            if part.startswith("b70deploy ") and not _PLACEHOLDER.search(part):
                commands.append(part)
    return commands


CASES = [(page.name, command) for page in PAGES for command in dict.fromkeys(shown(page.read_text()))]


def parse(argv: list[str]) -> None:
    """Click's own parsing down to the leaf command, without invoking anything."""
    group: click.Command = cli
    ctx = group.make_context("b70deploy", argv, resilient_parsing=False)
    while isinstance(group, click.Group):
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            return
        name, sub, args = group.resolve_command(ctx, rest)
        assert sub is not None and name is not None, rest
        ctx = sub.make_context(name, args, parent=ctx)
        group = sub


def test_the_pages_show_commands() -> None:
    pages = {page for page, _ in CASES}
    assert len(CASES) > 50 and {"README.md", "switch.md", "bench.md", "stacks.md"} <= pages, pages


@pytest.mark.parametrize(("page", "command"), CASES, ids=[f"{p}:{c}" for p, c in CASES])
def test_each_shown_command_parses(page: str, command: str) -> None:
    try:
        argv = shlex.split(command)[1:]
    except ValueError:  # an unbalanced quote in the page
        pytest.fail(f"{page}: cannot split {command!r}")
    try:
        parse(argv)
    except click.exceptions.Exit:  # --help
        pass
    except click.UsageError as e:
        pytest.fail(f"{page}: `{command}`: {e.format_message()}")
