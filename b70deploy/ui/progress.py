"""Showing long work: a live status line on a terminal, timestamped plain lines otherwise.

Both show the same things: elapsed time, the current phase, and the last log line.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Protocol, TextIO


class Reporter(Protocol):
    def phase(self, name: str, detail: str = "") -> None: ...
    def info(self, message: str) -> None: ...
    def log_line(self, line: str) -> None: ...
    def tick(self, status: str) -> None: ...
    def close(self) -> None: ...


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m:02d}:{s:02d}"


class PlainReporter:
    """For CI and pipes: one line per phase and message, a heartbeat while waiting."""

    def __init__(self, out: TextIO | None = None, heartbeat: float = 15.0) -> None:
        self.out = out or sys.stderr
        self.start = time.monotonic()
        self.heartbeat = heartbeat
        self._phase = ""
        self._last_beat = self.start
        self._last_line = ""
        self._lock = threading.Lock()

    def _emit(self, text: str) -> None:
        with self._lock:
            stamp = time.strftime("%H:%M:%S")
            self.out.write(f"{stamp} [{_clock(time.monotonic() - self.start)}] {text}\n")
            self.out.flush()

    def phase(self, name: str, detail: str = "") -> None:
        self._phase = name
        self._emit(f"{name}{': ' + detail if detail else ''}")

    def info(self, message: str) -> None:
        self._emit(f"  {message}")

    def log_line(self, line: str) -> None:
        if line.strip():
            self._last_line = line.strip()

    def tick(self, status: str) -> None:
        now = time.monotonic()
        if now - self._last_beat >= self.heartbeat:
            self._last_beat = now
            self._emit(f"  {self._phase}: {status}; last log: {self._last_line[:160]}")

    def close(self) -> None:
        pass


class LiveReporter:
    """For a terminal: a rich status line redrawn in place (rich is imported here: a pipe, CI
    and --json never need it)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console(stderr=True)
        self.start = time.monotonic()
        self._phase = ""
        self._status = ""
        self._last_line = ""
        # Live redraws `self` 4 times a second, so the clock ticks even while the log is quiet.
        self._live: Any = Live(self, console=self.console, refresh_per_second=4, transient=True)
        self._live.start()

    def __rich__(self) -> Any:
        return self._render()

    def _render(self) -> Any:
        from rich.text import Text

        text = Text()
        text.append(f"[{_clock(time.monotonic() - self.start)}] ", style="dim")
        text.append(self._phase, style="bold")
        if self._status:
            text.append(f"  {self._status}")
        if self._last_line:
            text.append(f"\n  {self._last_line[: self.console.width - 4]}", style="dim")
        return text

    def _refresh(self) -> None:
        self._live.refresh()

    def phase(self, name: str, detail: str = "") -> None:
        from rich.text import Text

        self._phase = name
        self._status = detail
        line = Text(_clock(time.monotonic() - self.start), style="dim")
        line.append(f" {name}" + (f": {detail}" if detail else ""))  # as text: a [..] in it is no markup
        self.console.print(line, highlight=False)
        self._refresh()

    def info(self, message: str) -> None:
        self.console.print(f"  {message}", highlight=False, markup=False)

    def log_line(self, line: str) -> None:
        if line.strip():
            self._last_line = line.strip()
            self._refresh()

    def tick(self, status: str) -> None:
        self._status = status
        self._refresh()

    def close(self) -> None:
        self._live.stop()


def make_reporter(*, quiet: bool = False) -> Reporter:
    if not quiet and sys.stderr.isatty():
        return LiveReporter()
    return PlainReporter()
