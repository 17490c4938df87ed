"""The deploy lock with real processes: busy, holder named, stale after SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from b70deploy.state.lock import DeployLock, LockBusy, StaleLock, holder_info

HOLD = """
import sys, time
from pathlib import Path
from b70deploy.state.lock import DeployLock
lock = DeployLock(Path(sys.argv[1]), "switch eagle3").acquire()
lock.set_step("wait-healthy")
print("held", flush=True)
time.sleep(60)
"""


def _holder(state: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(state)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_second_locker_fails_at_once_naming_the_holder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = _holder(tmp_path)
    try:
        with monkeypatch.context() as m:  # at once: no wait at all, whatever the machine's load
            m.setattr(time, "sleep", lambda s: pytest.fail(f"the second locker slept {s} s"))
            with pytest.raises(LockBusy) as info:
                DeployLock(tmp_path, "switch ngram").acquire()
        msg = str(info.value)
        assert f"pid {proc.pid}" in msg and "switch eagle3" in msg and "wait-healthy" in msg
        assert holder_info(tmp_path)["alive"] is True  # type: ignore[index]
    finally:
        proc.kill()
        proc.wait()


def test_lock_wait_gets_the_lock_when_the_holder_finishes(tmp_path: Path) -> None:
    with DeployLock(tmp_path, "a"):
        pass
    lock = DeployLock(tmp_path, "b", wait=2.0).acquire()
    lock.release()


def test_killed_holder_leaves_a_stale_lock_that_is_reported_not_stolen(tmp_path: Path) -> None:
    proc = _holder(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with pytest.raises(StaleLock) as info:
        DeployLock(tmp_path, "switch ngram").acquire()
    assert f"pid {proc.pid}" in str(info.value) and "no longer running" in str(info.value)
    assert holder_info(tmp_path)["alive"] is False  # type: ignore[index]
    taker = DeployLock(tmp_path, "resume", take_stale=True).acquire()
    assert taker.taken_over is not None and taker.taken_over.pid == proc.pid
    taker.release()
    assert holder_info(tmp_path) is None


def test_taking_the_lock_sweeps_what_a_killed_run_left(tmp_path: Path) -> None:
    """benchmarks/chaos.py found it: a SIGKILL between write_atomic's write and its rename left
    `state/revisions/.index.json.*.tmp` for good (and a kill in `record` a `.new-NNNNNN-*`
    folder). Every writer of the state dir holds the lock, so the next one to take it removes
    them; a temp file newer than the taking (an index rebuild by `status` beside us) stays."""
    revs = tmp_path / "revisions"
    (revs / "000001").mkdir(parents=True)
    (revs / "000001" / "meta.json").write_text("{}")
    old = [revs / ".new-000002-abcd", revs / ".trash-000001x", revs / ".index.json.k2j3.tmp",
           revs / "000001" / ".status.json.q1w2.tmp", tmp_path / ".lock.json.e4r5.tmp"]
    for p in old:
        if p.name.endswith(".tmp"):
            p.write_bytes(b"half")
        else:
            (p / "files").mkdir(parents=True)
    fresh = revs / ".current.z9x8.tmp"
    fresh.write_bytes(b"being written")
    os.utime(fresh, (time.time() + 60, time.time() + 60))
    lock = DeployLock(tmp_path, "switch a").acquire()
    lock.release()
    assert [p for p in old if p.exists()] == []
    assert fresh.exists() and (revs / "000001" / "meta.json").exists()
    assert sorted(lock.swept) == sorted([".new-000002-abcd", ".trash-000001x", ".index.json.k2j3.tmp",
                                         "000001/.status.json.q1w2.tmp", ".lock.json.e4r5.tmp"])
