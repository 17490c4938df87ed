"""The options several commands share, each defined once with its help (pip's cmdoptions idea):
a command takes `@options.LOCK_WAIT` instead of spelling the flag out again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def as_json(what: str = "the result") -> Callable[[F], F]:
    """`--json`: print `what` as JSON instead of lines or a table."""
    return click.option("--json", "as_json", is_flag=True, help=f"Print {what} as JSON.")


LOCK_WAIT = click.option("--lock-wait", type=float, default=0.0, metavar="SECONDS",
                         help="Wait this long for another b70deploy run to finish (default: fail at once).")
MESSAGE = click.option("--message", "-m", default="", help="A note kept with the revision.")
VERIFY_WAIT = click.option("--verify-wait", type=float, default=30.0, show_default=True, metavar="SECONDS",
                           help="Seconds to wait for the node to go idle after draining.")
