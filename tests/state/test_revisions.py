"""The revision store on real files: immutability, atomic creation, index, pins, prune."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from b70deploy.errors import UserError
from b70deploy.state.revisions import RevisionStore, Summaries, sha256

FILES = {"docker-compose.yml": b"services: {}\n", ".env": b"VLLM_IMAGE='x'\n", "vllm.env": b"HF_TOKEN='s'\n",
         "patches/marlin/marlin_utils.py": b"print(1)\n"}


def make(store: RevisionStore, stack: str = "w4a16", **kw: object) -> int:
    kw = {"kind": "switch", **kw}
    rev = store.create(stack=stack, files=FILES, image_ref="img:1", image_id="sha256:abc",
                       repo_digest=None, operator="me@host", message="m", created="2026-11-29T00:00:00", **kw)  # type: ignore[arg-type]
    return rev.number


def test_create_numbers_files_modes_and_hashes(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    assert [make(store), make(store), make(store)] == [1, 2, 3]
    rev = store.get(2)
    assert rev.read_files() == FILES
    assert rev.meta.files == {n: sha256(d) for n, d in FILES.items()}
    assert stat.S_IMODE(os.stat(rev.files_dir / "vllm.env").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(rev.files_dir / ".env").st_mode) == 0o600
    assert rev.status.outcome == "pending"
    assert not [p for p in store.root.iterdir() if p.name.startswith(".")], "no temp dirs left"


def test_a_killed_creations_temp_folder_is_removed_by_the_next_create(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    make(store)
    torn = store.root / ".new-000002-abc123"
    (torn / "files").mkdir(parents=True)
    (torn / "files" / ".env").write_bytes(b"half")
    assert make(store) == 2
    assert not [p for p in store.root.iterdir() if p.name.startswith(".new-")]
    assert store.get(2).read_files() == FILES


def test_parent_is_current_and_status_updates_keep_files(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    a = make(store)
    store.update_status(a, outcome="deployed")
    store.set_current(a)
    b = make(store, stack="eagle3")
    assert store.get(b).meta.parent == a
    before = (store.get(a).path / "meta.json").read_bytes()
    store.update_status(a, outcome="superseded", facts={"kv_cache_tokens": 270592})
    assert (store.get(a).path / "meta.json").read_bytes() == before, "meta.json never changes"
    assert store.get(a).status.facts == {"kv_cache_tokens": 270592}
    assert store.latest_healthy("w4a16").number == a  # type: ignore[union-attr]
    assert store.latest_healthy("eagle3") is None  # pending is not healthy


def test_index_rebuilds_when_missing_or_torn(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    for _ in range(3):
        make(store)
    expected = store.index()
    store.index_path.write_text("{torn")
    assert store.index() == expected
    store.index_path.unlink()
    assert [e["number"] for e in store.index()] == [1, 2, 3]
    assert Summaries.parse(store.index_path.read_bytes()).rows() == expected  # type: ignore[union-attr]


def test_prune_keeps_last_n_pins_and_current(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    for _ in range(10):
        make(store)
    store.update_status(2, pinned=True)
    store.set_current(4)
    gone = store.prune(3)
    assert gone == [1, 3, 5, 6, 7]
    assert store.numbers() == [2, 4, 8, 9, 10]
    assert [e["number"] for e in store.index()] == [2, 4, 8, 9, 10]


def test_prune_keeps_a_revision_asleep_as_a_hot_standby(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    for _ in range(6):
        make(store)
    store.set_current(6)
    assert store.prune_plan(2, asleep={3})[1][3].startswith("asleep as a hot standby")
    assert store.prune(2, asleep={3}) == [1, 2, 4]
    assert store.numbers() == [3, 5, 6]


def test_prune_keeps_the_adopted_revision_and_imports_that_never_ran_unless_forced(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    make(store, kind="adopt")                       # 1: the hand-made node, the one way back to it
    make(store, stack="old", kind="import")         # 2: a saved copy, never run
    store.update_status(2, outcome="unproven")
    make(store, stack="old", kind="import")         # 3: a saved copy that ran
    store.update_status(3, outcome="superseded")
    for _ in range(4):
        make(store)                                 # 4-7
    store.set_current(7)
    doomed, kept = store.prune_plan(2)
    assert doomed == [3, 4, 5] and set(kept) == {1, 2}, (doomed, kept)
    assert "adopted" in kept[1] and "unproven import" in kept[2]
    assert store.numbers() == [1, 2, 3, 4, 5, 6, 7]  # a plan deletes nothing
    assert store.prune(2) == [3, 4, 5]
    assert store.prune(2, force=True) == [1, 2]
    assert store.numbers() == [6, 7]


def test_of_two_adopted_revisions_prune_keeps_the_newer(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    make(store, kind="adopt")
    make(store, kind="adopt")
    make(store)
    store.set_current(3)
    assert store.prune(1) == [1]


def test_unknown_revision_is_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no revision 7"):
        RevisionStore(tmp_path).get(7)


def test_thousands_of_revisions_history_reads_one_file(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    store.root.mkdir(parents=True)
    entries = [{"number": n, "stack": "s", "kind": "switch", "parent": n - 1, "restored_from": None,
                "created": "t", "image_ref": "i", "image_id": "x", "outcome": "superseded", "pinned": False,
                "message": "", "kv_cache_tokens": None, "time_to_healthy": None, "vllm_version": None}
               for n in range(1, 5001)]
    store._write_index(entries)
    assert len(store.index()) == 5000  # no revision directory was read


def test_prune_dry_run_says_what_it_would_delete_and_why_it_keeps_the_rest(tmp_path: Path) -> None:
    from simkit import run_cli

    store = RevisionStore(tmp_path / "state")
    make(store, kind="adopt")
    for _ in range(3):
        make(store)
    store.set_current(4)
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\ndeploy_dir: {tmp_path / 'deploy'}\n")
    r = run_cli(cfg, "prune", "--keep", "1", "--dry-run", in_process=True)
    assert r.returncode == 0 and "would delete 2 revision(s): 2, 3 (dry run, nothing deleted)" in r.stdout, r.stdout
    assert "keeping revision 1: the newest adopted revision" in r.stderr, r.stderr
    assert store.numbers() == [1, 2, 3, 4]
    r = run_cli(cfg, "prune", "--keep", "1", "--force", "--yes", in_process=True)
    assert r.returncode == 0 and "pruned 3 revisions: 1, 2, 3" in r.stdout, r.stdout
    assert store.numbers() == [4]


def test_each_stored_file_has_the_mode_it_was_given_and_meta_records_it(tmp_path: Path) -> None:
    """An operator's key given 0600 is stored 0600 and recorded so (what a rollback and fsck write
    it back with); a revision made before modes were recorded reads its stored copies' modes."""
    store = RevisionStore(tmp_path)
    files = {**FILES, "keys/node.pem": b"-----BEGIN PRIVATE KEY-----\n", "start.sh": b"#!/bin/sh\n"}
    rev = store.create(stack="s", kind="import", files=files, image_ref="i", image_id=None, repo_digest=None,
                       operator="o", message="m", created="2026-11-29T00:00:00",
                       modes={"keys/node.pem": 0o600, "start.sh": 0o755})
    assert stat.S_IMODE(os.stat(rev.files_dir / "keys/node.pem").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(rev.files_dir / "start.sh").st_mode) == 0o755
    assert store.get(rev.number).modes() == {**{n: 0o644 for n in files}, ".env": 0o600, "vllm.env": 0o600,
                                             "keys/node.pem": 0o600, "start.sh": 0o755}
    meta = rev.path / "meta.json"
    doc = json.loads(meta.read_text())
    del doc["modes"]
    meta.write_text(json.dumps(doc))
    assert store.get(rev.number).meta.modes is None
    assert store.get(rev.number).modes()["keys/node.pem"] == 0o600  # the stored copy's own mode
    store.mend_file(rev.number, "start.sh", files["start.sh"], mode=0o700)  # no record: the caller's mode
    assert stat.S_IMODE(os.stat(rev.files_dir / "start.sh").st_mode) == 0o700
