"""One mutating command at a time on a node.

The lock is an flock (filelock) on state_dir/lock, which the kernel drops if we die, plus a
details file naming the holder. A details file whose pid is gone marks a stale lock: the
run that held it was killed. That is reported, never silently taken over; `resume`,
`rollback` and `unlock` take it over explicitly.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..errors import OperationError
from .fsio import sweep_temp, write_atomic
from .revisions import RevisionStore
from .stamps import now_iso, whoami

if TYPE_CHECKING:
    import filelock

# filelock and psutil (0.1 s of imports) are imported where a lock is taken or a pid looked up:
# `status` and `watch` only read the details file (holder_info), on every call.


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    user: str
    command: str
    step: str
    since: str
    started_at: float  # the process's create time, so a reused pid is not mistaken for the holder

    def alive(self) -> bool:
        if self.host != whoami().host:
            return True  # cannot tell from here: assume it runs
        import psutil

        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.started_at) < 1.0
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    def describe(self) -> str:
        return (f"pid {self.pid} on {self.host} ({self.user}): `{self.command}`, "
                f"step {self.step or '-'}, since {self.since}")


DETAILS = "lock.json"


class LockBusy(OperationError):
    pass


class StaleLock(OperationError):
    def __init__(self, holder: Holder) -> None:
        self.holder = holder
        super().__init__(
            f"stale lock: {holder.describe()} is no longer running (the run was interrupted)",
            fix="`b70deploy status` shows where it stopped; `b70deploy resume` finishes or undoes it, "
                "`b70deploy rollback` restores the previous revision, `b70deploy unlock` clears the lock")


class DeployLock:
    def __init__(self, state_dir: Path, command: str, *, wait: float = 0.0, take_stale: bool = False) -> None:
        self.dir = state_dir
        self.details = state_dir / DETAILS
        self.command = command
        self.wait = wait
        self.take_stale = take_stale
        self._lock: filelock.FileLock | None = None  # made by the first acquire
        self.taken_over: Holder | None = None
        self.swept: list[str] = []  # what a killed run left in the state dir, removed on acquire

    def read_holder(self) -> Holder | None:
        return _read_holder(self.details)

    def acquire(self, step: str = "") -> DeployLock:
        """Take the lock, the details naming `step` as the holder's first (one write, not two)."""
        import filelock

        self.dir.mkdir(parents=True, exist_ok=True)
        if self._lock is None:  # one FileLock per DeployLock: it counts re-entrant acquires
            self._lock = filelock.FileLock(str(self.dir / "lock"))
        deadline = time.monotonic() + self.wait
        unnamed = 0  # tries past the deadline while the holder's details were missing
        while True:
            try:
                self._lock.acquire(timeout=0)
                break
            except filelock.Timeout:
                if time.monotonic() >= deadline:
                    # The holder writes its details just after it takes the flock and removes
                    # them just before it lets go: one without them is waited for briefly
                    # (it may be done in a moment), so the refusal can name it.
                    holder = self.read_holder()
                    if holder is not None or unnamed >= 10:
                        who = holder.describe() if holder else (
                            f"another b70deploy process (its pid, command and step could not be read from "
                            f"{self.details}: {_unreadable(self.details)})")
                        raise LockBusy(f"the node is locked by {who}",
                                       fix="wait for it, or pass --lock-wait SECONDS") from None
                    unnamed += 1
                    time.sleep(0.1)
                    continue
                time.sleep(0.2)
        stale = self.read_holder()
        if stale is not None:
            # We hold the flock, yet a details file remains: its writer died without releasing.
            if not self.take_stale:
                self._lock.release()
                raise StaleLock(stale)
            self.taken_over = stale
        self.set_step(step)  # first: a refused rival names us
        # Every writer of the state dir holds this lock: temp files and half-made revision
        # folders older than now were left by a killed run (SIGKILL runs no cleanup).
        self.swept = [*RevisionStore(self.dir).sweep(time.time()), *sweep_temp(self.dir, time.time())]
        return self

    def set_step(self, step: str) -> None:
        """Name `step` in the details file. A write that fails (a full disk) keeps the old
        details: they inform, and must not fail the run."""
        import psutil

        me = whoami()
        holder = Holder(pid=me.pid, host=me.host, user=me.user, command=self.command, step=step, since=now_iso(),
                        started_at=psutil.Process(me.pid).create_time())
        with contextlib.suppress(OSError):
            write_atomic(self.details, (json.dumps(asdict(holder)) + "\n").encode(), mode=0o644)

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.details)
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> DeployLock:
        return self.acquire()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def holder_info(state_dir: Path) -> dict[str, Any] | None:
    """For `status`: who holds the lock now, and whether that process still runs."""
    holder = _read_holder(state_dir / DETAILS)
    if holder is None:
        return None
    return {**asdict(holder), "alive": holder.alive()}


def _read_holder(details: Path) -> Holder | None:
    try:
        return Holder(**json.loads(details.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _unreadable(details: Path) -> str:
    try:
        json.loads(details.read_text())
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return str(e.strerror or e)
    except ValueError:
        return "not valid JSON"
    return "not a lock holder's details"
