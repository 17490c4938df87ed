"""Printing data: tables fitted to the terminal's width, plain aligned rows otherwise, JSON on
request."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..render.masking import Secrets


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None) -> None:
    if not sys.stdout.isatty():
        plain_rows(headers, rows, title=title)
        return
    width = shutil.get_terminal_size((160, 24)).columns
    sys.stdout.write("".join(f"{line}\n" for line in _titled(title, fitted(headers, rows, width))))


WHOLE = 24  # a column of single words up to this long is kept whole ("superse/ded" was unreadable)
FLOOR = 10  # the narrowest a column is made: a free-text column wraps to it, a word column is cut to it


def fitted(headers: Sequence[str], rows: Sequence[Sequence[Any]], width: int) -> list[str]:
    """The table laid out in `width` columns, no column dropped: free-text columns wrap at
    spaces first; then the widest word columns are cut with an ellipsis (an image ref, a
    timestamp), never below FLOOR; what still does not fit is printed unfitted, the terminal
    wrapping the lines, rather than lose a cell."""
    cells = [list(headers), *(["" if v is None else str(v) for v in row] for row in rows)]
    columns = list(zip(*cells, strict=True))
    widths = [max(map(len, c)) for c in columns]
    words = [widths[i] <= WHOLE and not any(" " in c for c in col[1:]) for i, col in enumerate(columns)]

    def total() -> int:
        return sum(widths) + 2 * (len(widths) - 1)

    # Free text wraps first (to a readable WHOLE), then word columns are cut, then free text
    # wraps further: each pass the widest column first, none below its floor or its header.
    for of_words, floor in ((False, WHOLE), (True, FLOOR), (False, FLOOR)):
        for i in sorted(range(len(widths)), key=lambda i: -widths[i]):
            if total() > width and words[i] == of_words:
                least = min(widths[i], max(floor, len(headers[i])))
                widths[i] = max(least, widths[i] - (total() - width))
    lines: list[str] = []
    for row in cells:
        parts = [_cell(text, widths[i], wrap=not words[i]) for i, text in enumerate(row)]
        for k in range(max(len(p) for p in parts)):
            line = "  ".join((p[k] if k < len(p) else "").ljust(widths[i]) for i, p in enumerate(parts))
            lines.append(line.rstrip())
    return lines


def _cell(text: str, width: int, *, wrap: bool) -> list[str]:
    if len(text) <= width:
        return [text]
    if wrap:
        return textwrap.wrap(text, width) or [""]
    return [text[: width - 1] + "…"]


def plain_rows(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None) -> None:
    """Columns padded to their widest cell, two spaces apart (as `fitted` lays them out
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


class _Masked:
    """A text stream that masks the node's secret values in whatever passes through it: the last
    guard behind every command's own masking (an error quoting a value, a container's log line).
    No `buffer`: click would write around the guard to it."""

    def __init__(self, inner: Any, secrets: Secrets) -> None:
        self.inner, self.secrets = inner, secrets
        self.encoding = str(inner.encoding)  # click asks these to decide whether to wrap the stream
        self.errors = getattr(inner, "errors", None)

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError("a text stream")  # click probes for a binary writer with write(b"")
        self.inner.write(self.secrets.values_in(s))
        return len(s)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return bool(self.inner.isatty())

    def fileno(self) -> int:
        return int(self.inner.fileno())

    def writable(self) -> bool:
        return True


def guard(secrets: Secrets) -> None:
    """From now on this process's stdout and stderr mask `secrets`' values (render/masking.mask)."""
    if not secrets.values:
        return
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        inner = stream.inner if isinstance(stream, _Masked) else stream
        setattr(sys, name, _Masked(inner, secrets))
