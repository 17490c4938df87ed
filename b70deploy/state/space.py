"""Room in the state dir, and writes that must not stop an undo.

A run is refused before the drain when the state dir's filesystem has less free space than
it will write (`check`: the new revision's files plus a margin for status, journal and index
rewrites). Something else can still fill the disk during the run, so a reserve file is kept
beside the records: a bookkeeping write of the failure and undo paths that meets a full disk
frees it and tries once more (`best_effort`), so the revision's outcome, the journal's end and
`current` are still written; a write that fails even then is a warning, never an exception
that skips the undo behind it.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import OperationError

RESERVE = "reserve"            # in the state dir: zeros, deleted only to let failure bookkeeping through
RESERVE_BYTES = 256 * 1024     # a status.json, the journal's last lines and an index of some hundred revisions
MARGIN = 256 * 1024            # what a run writes beside its revision's files (status, journal, audit, lock)
BLOCK = 4096                   # a file takes whole blocks: a 10-byte .env costs 4 KiB
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_FIX = ("free space on that filesystem (`b70deploy prune --keep N` removes old revisions, `b70deploy gc` "
            "what they kept), then run the command again")


class StateDirFull(OperationError):
    """Too little room in the state dir for a run: refused before anything stopped."""


def need(sizes: list[int], index_bytes: int) -> int:
    """What a run that stores files of `sizes` writes at most: each file and its meta rounded up
    to whole blocks, the index rewritten twice over (a temp copy beside the old one), a margin."""
    return sum(-(-s // BLOCK) * BLOCK for s in sizes) + 2 * BLOCK + 2 * index_bytes + MARGIN


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def check(state_dir: Path, wanted: int) -> None:
    """Refuse (StateDirFull) unless `wanted` bytes are free beside a full reserve file."""
    state_dir.mkdir(parents=True, exist_ok=True)
    reserved = ensure_reserve(state_dir)
    free = free_bytes(state_dir)
    if not reserved or free < wanted:
        raise StateDirFull(f"the state dir {state_dir} is full: {free // 1024} KiB free, this run needs "
                           f"{wanted // 1024} KiB beside a {RESERVE_BYTES // 1024} KiB reserve; nothing was changed",
                           fix=FULL_FIX)


def ensure_reserve(state_dir: Path) -> bool:
    """Make the reserve file whole (real blocks: zeros written, not a sparse file); False when the
    disk has no room for it."""
    path = state_dir / RESERVE
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_size >= RESERVE_BYTES:
            return True
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, bytes(RESERVE_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        with contextlib.suppress(OSError):
            path.unlink()
        if e.errno in FULL_ERRNOS:
            return False
        raise
    return True


def release_reserve(state_dir: Path) -> bool:
    """Delete the reserve file; whether there was one to free."""
    try:
        (state_dir / RESERVE).unlink()
    except FileNotFoundError:
        return False
    return True


def causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and what it wraps (a StepFailed's error, __cause__, __context__), each once."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [getattr(e, "error", None), e.__cause__, e.__context__]


def is_full(exc: BaseException) -> bool:
    """Whether `exc` is, or wraps, a full disk (ENOSPC, or a quota)."""
    return any(isinstance(e, OSError) and e.errno in FULL_ERRNOS for e in causes(exc))


def full_line(state_dir: Path) -> str:
    """What the output says when a write met a full disk."""
    return f"the state dir {state_dir} is full (no space left on device); fix: {FULL_FIX}"


def best_effort(state_dir: Path, write: Callable[[], object], what: str, warn: Callable[[str], None], *,
                reserve: bool = True) -> bool:
    """Run `write`; on a full disk free the reserve (unless not `reserve`: a container log must not
    spend what the failure's records need) and run it once more. A failure is `warn`ed (naming
    `what` could not be written and why), never raised: whether it was written."""
    try:
        write()
        return True
    except OSError as e:
        error = e
    if error.errno in FULL_ERRNOS and reserve and release_reserve(state_dir):
        try:
            write()
            return True
        except OSError as e:
            error = e
    full = " (the state dir is full)" if error.errno in FULL_ERRNOS else ""
    warn(f"warning: could not write {what}{full}: {error.strerror or error}"
         + (f": {error.filename}" if error.filename else ""))
    return False
