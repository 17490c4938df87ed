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
import threading
from collections.abc import Iterator

from ..errors import Terminated

_seen: list[int] = []  # the signals raised since `installed()` began
_after_commit: list[int] = []  # the signals noted, not raised, once a run committed (`hold`)
_active: list[bool] = []  # inside `installed()`: the handlers are ours to change


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


def _note(signum: int, frame: object) -> None:
    _after_commit.append(signum)


def hold() -> None:
    """From now to the end of the command, Ctrl-C and SIGTERM are noted, not raised: the run has
    committed (the node serves the new revision), and the command ends with that outcome, exit 0,
    instead of an undo or an "interrupted" that would not be true (issue 35). Only inside
    `installed()`, in the main thread: elsewhere the handlers are not ours."""
    if _active and threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, _note)


def held() -> list[str]:
    """The signals that came after the commit, by name; the hold ends with the run that asked for it
    (a long-running command, `watch`, runs several and must stop on the next SIGTERM)."""
    names = [signal.Signals(s).name for s in _after_commit]
    _after_commit.clear()
    if _active and threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, _raise)
    return names


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """While the block runs, Ctrl-C raises KeyboardInterrupt and SIGTERM Terminated, and both
    are remembered; the handlers before are put back after it (main may run inside the tests)."""
    _seen.clear()
    _after_commit.clear()
    before = {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM)}
    _active.append(True)
    try:
        yield
    finally:
        _active.pop()
        for s, handler in before.items():
            signal.signal(s, handler)
        _seen.clear()
        _after_commit.clear()
