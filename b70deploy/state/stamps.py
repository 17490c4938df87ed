"""When and who: the one timestamp format and the one operator identity the state records.

Revisions (created/updated), the lock's holder and the audit log all stamp with these, so
`history`, `status` and `audit` show times and people the same way.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from dataclasses import dataclass


def now_iso() -> str:
    """Local time with its UTC offset, to the second: 2025-07-04T12:00:00+0200."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass(frozen=True)
class Identity:
    """Who runs this process: the lock names its holder by it, the audit log its author."""

    user: str
    host: str
    pid: int

    def __str__(self) -> str:
        return f"{self.user}@{self.host}"


def whoami() -> Identity:
    return Identity(user=getpass.getuser(), host=socket.gethostname(), pid=os.getpid())


def operator() -> str:
    """The operator identity recorded with a revision: user@host."""
    return str(whoami())
