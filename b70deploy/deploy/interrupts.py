"""Ctrl-C and SIGTERM as exceptions that are not lost.

Python turns a signal into an exception wherever the main thread is at that instant. When
that is a finalizer (an object's `__del__`, a weakref callback: a socket or a connection
pool being collected), Python prints "Exception ignored in ..." and carries on as if no
signal had come: `watch` once ran on after a SIGTERM that way. So the handler also remembers
the signal, and loops that must stop call `check()` between units of work.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from ..errors import Terminated

_seen: list[int] = []  # the signals raised since `installed()` began


def _raise(signum: int, frame: object) -> None:
    _seen.append(signum)
    _raise_for(signum)


def _raise_for(signum: int) -> None:
    if signum == signal.SIGTERM:
        raise Terminated(f"signal {signum}")
    raise KeyboardInterrupt


def check() -> None:
    """Raise the first interrupt again if one came (and may have been swallowed on its way).
    Call it where going on would be wrong after an interrupt, not inside an undo."""
    if _seen:
        _raise_for(_seen[0])


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """While the block runs, Ctrl-C raises KeyboardInterrupt and SIGTERM Terminated, and both
    are remembered; the handlers before are put back after it (main may run inside the tests)."""
    _seen.clear()
    before = {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        _seen.clear()
