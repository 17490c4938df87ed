"""Loopback ports for the tests: handed out once, by every test process on this machine.

Binding port 0 gives a port free at that moment, which the kernel may give the next caller
too before the test's container has bound it: with four workers (and other checkouts on one
engine), two nodes got the same port and one switch met `port-in-use`. So ports come from a
counter shared through a file lock, below Linux's ephemeral range (32768-60999 by default),
where neither a bind to port 0 nor an outgoing connection lands; a port in use is skipped.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from filelock import FileLock

FIRST, LAST = 20000, 32767
_COUNTER = Path(tempfile.gettempdir()) / "b70test-ports.next"
_LOCK = FileLock(str(_COUNTER) + ".lock")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    span = LAST - FIRST + 1
    with _LOCK:
        try:
            n = int(_COUNTER.read_text())
        except (OSError, ValueError):
            n = os.getpid()  # a fresh machine: start anywhere
        for _ in range(span):
            port = FIRST + n % span
            n += 1
            if _bindable(port):
                break
        else:
            raise RuntimeError(f"no free loopback port in {FIRST}-{LAST}")
        _COUNTER.write_text(str(n % span))
    return port


def free_span(n: int) -> list[int]:
    """`n` consecutive loopback ports, each free now, handed out together (a range a node config names)."""
    with _LOCK:
        try:
            start = int(_COUNTER.read_text())
        except (OSError, ValueError):
            start = os.getpid()
        span = LAST - FIRST + 1 - n
        for i in range(span):
            first = FIRST + (start + i) % span
            if all(_bindable(p) for p in range(first, first + n)):
                _COUNTER.write_text(str((first - FIRST + n) % (LAST - FIRST + 1)))
                return list(range(first, first + n))
    raise RuntimeError(f"no {n} consecutive free loopback ports in {FIRST}-{LAST}")
