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


def width() -> int | None:
    """The columns to fit output to on a terminal ($COLUMNS, else the terminal's size); None for a
    pipe (plain rows, for grep and scripts)."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size((160, 24)).columns


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str | None = None,
          optional: Sequence[str] = ()) -> None:
    """The rows fitted to the terminal (see `fitted`); `optional`: the columns that may be left out
    when the rest do not fit, the least important first (a note on stderr names them)."""
    columns = width()
    if columns is None:
        plain_rows(headers, rows, title=title)
        return
    lines, dropped = fitted(headers, rows, columns, optional=optional)
    sys.stdout.write("".join(f"{line}\n" for line in _titled(title, lines)))
    if dropped:
        note(f"left out at {columns} columns: {', '.join(dropped)} (wider, or --json, shows them)")


def echo_lines(lines: Iterable[str]) -> None:
    """Lines of prose fitted to the terminal: a long one goes on, indented, on the next lines
    (broken at spaces; a word longer than the whole line is the only thing cut)."""
    columns = width()
    out: list[str] = []
    for line in lines:
        if columns is None or len(line) <= columns:
            out.append(line)
        else:
            out += textwrap.wrap(line, columns, subsequent_indent="    ") or [""]
    sys.stdout.write("".join(f"{line}\n" for line in out))


WHOLE = 24  # a column of single words up to this long is kept whole ("superse/ded" was unreadable)
FLOOR = 10  # the narrowest a column is cut to, never below its header


def fitted(headers: Sequence[str], rows: Sequence[Sequence[Any]], width: int, *,
           optional: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """The table laid out in `width` columns, one line per row and the header whole: free-text
    columns (a cell of three words or more) are cut first, the widest first, with an ellipsis, then word
    columns (an image ref), none below FLOOR or its header; when that is not enough, `optional`
    columns are left out, the first named first, and the rest laid out again. Returns the lines
    and the headers left out."""
    cells = [list(headers), *(["" if v is None else str(v) for v in row] for row in rows)]
    natural = [max(len(c[i]) for c in cells) for i in range(len(headers))]
    # a value of one or two words ("2026-12-01 23:49") is kept whole before free text is
    words = [natural[i] <= WHOLE and not any(c[i].count(" ") > 1 for c in cells[1:]) for i in range(len(headers))]
    keep = list(range(len(headers)))
    dropped: list[str] = []
    left = list(dict.fromkeys(h for h in optional if h in headers))
    while True:  # free text cut first; then a column left out; word columns cut only when none is left
        widths = _cut_to(width, keep, list(natural), words, headers, word_cuts=not left)
        if sum(widths[i] for i in keep) + 2 * (len(keep) - 1) <= width or not left:
            break
        name = left.pop(0)
        keep.remove(headers.index(name))
        dropped.append(name)
    lines = ["  ".join(_cut(row[i], widths[i]).ljust(widths[i]) for i in keep).rstrip() for row in cells]
    return lines, dropped


def _cut_to(width: int, keep: list[int], widths: list[int], words: list[bool], headers: Sequence[str], *,
            word_cuts: bool) -> list[int]:
    def total() -> int:
        return sum(widths[i] for i in keep) + 2 * (len(keep) - 1)

    # Free text down to a readable WHOLE; with no column left to leave out, word columns and then
    # free text down to FLOOR: each pass the widest first, none below its header.
    passes = ((False, WHOLE), (True, FLOOR), (False, FLOOR)) if word_cuts else ((False, WHOLE),)
    for of_words, floor in passes:
        for i in sorted(keep, key=lambda i: -widths[i]):
            if total() > width and words[i] == of_words:
                widths[i] = max(min(widths[i], max(floor, len(headers[i]))), widths[i] - (total() - width))
    return widths


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


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
