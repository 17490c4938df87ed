"""One timestamp and one operator identity for every state record (lock, audit, revisions)."""

from __future__ import annotations

import getpass
import re
import socket
from pathlib import Path

from b70deploy.state.audit import AuditLog
from b70deploy.state.lock import DeployLock
from b70deploy.state.stamps import now_iso, operator, whoami

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}$")


def test_now_iso_and_operator() -> None:
    assert ISO.match(now_iso())
    assert operator() == f"{getpass.getuser()}@{socket.gethostname()}" == str(whoami())


def test_lock_and_audit_stamp_the_same_way(tmp_path: Path) -> None:
    me = whoami()
    with DeployLock(tmp_path, "switch eagle3") as lock:
        holder = lock.read_holder()
        assert holder is not None and ISO.match(holder.since)
        assert (holder.user, holder.host, holder.pid) == (me.user, me.host, me.pid)
    log = AuditLog(tmp_path)
    log.record("switch eagle3", "ok", revision=3)
    [entry] = log.entries()
    assert ISO.match(entry["time"])
    assert entry | {"time": "-"} == {"time": "-", "user": me.user, "host": me.host, "pid": me.pid,
                                     "command": "switch eagle3", "outcome": "ok", "revision": 3}
