"""Progress with an ETA on stderr: one rewritten line on a terminal, a line per step otherwise."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO


def eta_seconds(done: int, total: int, elapsed: float) -> float | None:
    """Remaining time assuming the pace so far holds; None before the first step."""
    if done <= 0 or total <= done:
        return None if done <= 0 else 0.0
    return elapsed / done * (total - done)


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = round(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Progress:
    def __init__(self, label: str, total: int, *, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.failed = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.start = time.monotonic()
        self._lock = threading.Lock()

    def step(self, ok: bool = True, detail: str = "") -> None:
        with self._lock:
            self.done += 1
            if not ok:
                self.failed += 1
            if not self.enabled:
                return
            elapsed = time.monotonic() - self.start
            eta = eta_seconds(self.done, self.total, elapsed)
            failed = f", {self.failed} failed" if self.failed else ""
            line = (f"{self.label}: {self.done}/{self.total}{failed}, {fmt_duration(elapsed)} elapsed, "
                    f"ETA {fmt_duration(eta)}" + (f"  {detail}" if detail else ""))
            if self.tty:
                self.stream.write("\r\x1b[2K" + line)
                if self.done >= self.total:
                    self.stream.write("\n")
            else:
                self.stream.write(line + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self.done < self.total:
            self.stream.write("\n")
            self.stream.flush()
