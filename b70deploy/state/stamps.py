"""Who and when: the stamps every record carries (revisions, lock, audit, results)."""

from __future__ import annotations

import getpass
import socket
import time


def now_iso() -> str:
    """Local time with its offset, to the second: what an operator reads in history."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def operator() -> str:
    """The operator identity recorded with a change: user@host."""
    return f"{getpass.getuser()}@{socket.gethostname()}"
