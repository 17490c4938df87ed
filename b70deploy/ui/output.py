"""Printing data: rich tables on a terminal, plain aligned text otherwise, JSON on request."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None) -> None:
    console = Console(soft_wrap=False) if sys.stdout.isatty() else Console(width=200, color_system=None)
    t = Table(title=title, show_edge=False, header_style="bold", box=None,
              pad_edge=False)
    for h in headers:
        t.add_column(h, overflow="fold")
    for row in rows:
        t.add_row(*["" if v is None else str(v) for v in row])
    console.print(t)


def note(message: str) -> None:
    """A side remark for the operator: stderr, so stdout stays clean data."""
    sys.stderr.write(f"note: {message}\n")


def warn(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")
