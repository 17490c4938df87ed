"""The revision index stays equal to the revisions on disk: rebuilt when missing or stale,
right under concurrent creates, valid after a writer is killed at any point of a change.

"Right" is always checked against the folders themselves: every revision's meta.json and
status.json read afresh (`from_disk`), not against what the store reports."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from b70deploy.state.revisions import RevisionStore, Summaries

FILES = {"docker-compose.yml": b"services: {}\n", ".env": b"VLLM_IMAGE='x'\n"}


def make(store: RevisionStore, stack: str = "w4a16") -> int:
    return store.create(stack=stack, kind="switch", files=FILES, image_ref="img:1", image_id="sha256:abc",
                        repo_digest=None, operator="me@host", message="m", created="2026-11-30T00:00:00").number


def from_disk(root: Path) -> list[dict[str, Any]]:
    """What the index must say, read from each revision folder with a fresh store object."""
    fresh = RevisionStore(root)
    return [fresh.get(n).summary() for n in fresh.numbers()]


def on_file(store: RevisionStore) -> list[dict[str, Any]]:
    entries = Summaries.parse(store.index_path.read_bytes())
    assert entries is not None, store.index_path.read_text()
    return entries.rows()


def test_missing_index_is_rebuilt_and_written(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    for _ in range(3):
        make(store)
    store.update_status(2, outcome="deployed", pinned=True)
    store.index_path.unlink()
    assert store.index() == from_disk(tmp_path)
    assert on_file(store) == from_disk(tmp_path)
    assert not store.dirty_path.exists()


def test_a_folder_the_index_lacks_is_added_reading_only_that_folder(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    for _ in range(4):
        make(store)
    full = on_file(store)
    store._write_index(full[:2])  # as if the writers of 3 and 4 died between rename and index
    (store.root / "000001" / "meta.json").write_text("not json")  # a rebuild would trip on it
    assert [e["number"] for e in store.index()] == [1, 2, 3, 4]
    assert on_file(store) == full


def test_a_killed_writers_marker_makes_the_next_reader_reread_that_revision(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    for _ in range(3):
        make(store)
    # status.json of 2 was replaced, then the writer died before rewriting the index:
    status_path = store.root / "000002" / "status.json"
    status_path.write_text(json.dumps({**json.loads(status_path.read_text()), "outcome": "failed"}))
    store.dirty_path.write_text("2\n")
    assert [e["outcome"] for e in store.index()] == ["pending", "failed", "pending"]
    assert on_file(store) == from_disk(tmp_path)
    assert not store.dirty_path.exists()


def test_entries_of_removed_folders_go_at_the_next_change(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    for _ in range(3):
        make(store)
    os.rename(store.root / "000002", store.root / ".trash-000002")  # a prune killed mid-way
    store.dirty_path.write_text("")
    assert [e["number"] for e in store.index()] == [1, 3]
    make(store)
    assert on_file(store) == from_disk(tmp_path)


def _create_many(root: str, stack: str, count: int) -> None:
    store = RevisionStore(Path(root))
    for _ in range(count):
        make(store, stack)
        store.update_status(store.numbers()[-1], facts={"by": stack})


def test_concurrent_creates_in_processes_and_threads_keep_it_right(tmp_path: Path) -> None:
    """Four processes and, in this one, two threads sharing one store object create at once:
    every number is used exactly once, and the index is what the folders say."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads
    procs = [ctx.Process(target=_create_many, args=(str(tmp_path), f"p{i}", 8)) for i in range(4)]
    for p in procs:
        p.start()
    shared = RevisionStore(tmp_path)
    threads = [threading.Thread(target=lambda s=f"t{i}": [make(shared, s) for _ in range(8)]) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    disk = from_disk(tmp_path)
    assert [e["number"] for e in disk] == list(range(1, 49))
    assert sorted(e["stack"] for e in disk) == sorted([f"p{i}" for i in range(4)] * 8 + ["t0", "t1"] * 8)
    assert on_file(shared) == disk
    assert RevisionStore(tmp_path).index() == disk
    assert not shared.dirty_path.exists()
    assert not [p.name for p in shared.root.iterdir() if p.name.startswith(".")], "no temp folder left"


# A child that dies by SIGKILL at one point of a change: after replacing status.json (before the
# index is written), inside the index's write_atomic (temp file written, not renamed), or after
# the rename of a new revision folder.
KILLER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from b70deploy.state import fsio, revisions
    store = revisions.RevisionStore(Path(sys.argv[1]))
    where = sys.argv[2]
    def die(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)
    if where == "before-index":
        revisions.RevisionStore._write_index = die
    elif where == "index-rename":
        real = os.replace
        def replace(src, dst):
            if str(dst).endswith("index.json"):
                die()
            real(src, dst)
        fsio.os.replace = replace
    elif where == "after-rename":
        revisions.RevisionStore._upsert_index = die
    if sys.argv[3] == "status":
        store.update_status(2, outcome="deployed", facts={"kv_cache_tokens": 7})
    else:
        store.create(stack="late", kind="switch", files={"a": b"1"}, image_ref="i", image_id=None,
                     repo_digest=None, operator="o", message="m", created="t")
""")


@pytest.mark.parametrize(("where", "change"), [("before-index", "status"), ("index-rename", "status"),
                                               ("before-index", "create"), ("index-rename", "create"),
                                               ("after-rename", "create")])
def test_a_killed_write_leaves_an_index_that_reads_right(tmp_path: Path, where: str, change: str) -> None:
    store = RevisionStore(tmp_path)
    for _ in range(3):
        make(store)
    before = store.index_path.read_bytes()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path), where, change], env=env, timeout=120,
                       check=False, capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert store.index_path.read_bytes() == before, "the index file is whole: the old one"
    assert store.dirty_path.exists(), "the killed writer's marker is left"
    fresh = RevisionStore(tmp_path)
    assert fresh.index() == from_disk(tmp_path)
    assert on_file(fresh) == from_disk(tmp_path)
    assert not fresh.dirty_path.exists()
    if change == "status":
        assert fresh.index()[1]["outcome"] == "deployed"
    else:
        assert [e["stack"] for e in fresh.index()][-1] == "late"


def test_reading_a_store_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path / "state")
    assert store.index() == []
    assert store.latest_healthy() is None
    assert not (tmp_path / "state").exists()


def test_an_index_in_the_format_before_columns_reads_the_same_and_is_left_as_it_is(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    for _ in range(3):
        make(store)
    rows = store.index()
    old = (json.dumps({"revisions": rows}, sort_keys=True, separators=(",", ":")) + "\n").encode()
    store.index_path.write_bytes(old)
    assert store.index() == rows == from_disk(tmp_path)
    assert store.index_path.read_bytes() == old, "a read writes nothing"
    make(store)
    assert on_file(store) == from_disk(tmp_path)  # the next change writes columns
    assert b'"columns"' in store.index_path.read_bytes()


@pytest.mark.parametrize("columns", [{"number": [1, 2, 3], "stack": ["w4a16"]},  # torn: columns differ in length
                                     {"number": [1, "2", 3]},                      # a number that is not one
                                     {"stack": ["w4a16"] * 3},                     # no numbers
                                     []])
def test_an_index_that_is_not_one_is_rebuilt(tmp_path: Path, columns: Any) -> None:
    store = RevisionStore(tmp_path)
    for _ in range(3):
        make(store)
    store.index_path.write_text(json.dumps({"columns": columns}))
    assert store.index() == from_disk(tmp_path)
    assert on_file(store) == from_disk(tmp_path)


def test_summaries_give_the_newest_rows_and_single_columns(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    for stack in ("a", "b", "c", "d"):
        make(store, stack)
    table = store.summaries()
    assert len(table) == 4 and table.numbers() == [1, 2, 3, 4]
    assert table.rows(2) == from_disk(tmp_path)[2:]
    assert table.column("stack") == ["a", "b", "c", "d"]
    assert table.column("no such key") == [None] * 4
