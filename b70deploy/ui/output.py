"""Printing data: rich tables on a terminal, plain aligned rows otherwise, JSON on request.

rich is imported only for a terminal: laying out a 10,000-row table with it takes seconds,
and a pipe gets plain rows either way."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None) -> None:
    if not sys.stdout.isatty():
        plain_rows(headers, rows, title=title)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=False)
    t = Table(title=title, show_edge=False, header_style="bold", box=None,
              pad_edge=False)
    for h in headers:
        t.add_column(h, overflow="fold")
    for row in rows:
        t.add_row(*["" if v is None else str(v) for v in row])
    console.print(t)


def plain_rows(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None) -> None:
    """Columns padded to their widest cell, two spaces apart (as the rich table lays them out
    without a box), one line per row, never folded: for pipes and grep."""
    cells = [list(headers), *(["" if v is None else str(v) for v in row] for row in rows)]
    widths = [max(map(len, column)) for column in zip(*cells, strict=True)]
    pad = "  ".join(f"{{:<{w}}}" for w in widths)  # one format per line: 10,000 rows of 10 cells
    lines = (pad.format(*r).rstrip() for r in cells)
    sys.stdout.write("".join(f"{line}\n" for line in _titled(title, lines)))


def _titled(title: str | None, lines: Iterable[str]) -> Iterable[str]:
    if title:
        yield title
    yield from lines


def note(message: str) -> None:
    """A side remark for the operator: stderr, so stdout stays clean data."""
    sys.stderr.write(f"note: {message}\n")


def warn(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")
