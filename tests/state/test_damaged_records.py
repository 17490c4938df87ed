"""The store's records when they are damaged (issue 22), without an engine: stored bytes
checked against their recorded hashes, unreadable meta/status/journal named in one line,
damaged folders listed and never written to the index, numbers never given twice, and the
lock refusal that names its holder or says why it cannot."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from b70deploy.state.journal import Journal
from b70deploy.state.lock import DeployLock, LockBusy
from b70deploy.state.revisions import DamagedRecord, RevisionStore

FILES = {"docker-compose.yml": b"services: {vllm: {image: x}}\n", ".env": b"VLLM_MODEL=/m\n"}


def stored(tmp_path: Path, count: int = 2) -> RevisionStore:
    store = RevisionStore(tmp_path)
    for i in range(count):
        rev = store.create(stack=f"s{i}", kind="switch", files=FILES, image_ref="img", image_id=None,
                           repo_digest=None, operator="t@h", message="", created="2026-12-01T00:00:00+0000")
        store.update_status(rev.number, outcome="deployed")
        store.set_current(rev.number)
    return store


def test_verified_files_name_the_revision_and_the_changed_file(tmp_path: Path) -> None:
    store = stored(tmp_path)
    assert store.get(1).verified_files() == FILES
    (store.get(1).files_dir / ".env").write_bytes(b"VLLM_MODEL=/n\n")
    with pytest.raises(DamagedRecord) as bad:
        store.get(1).verified_files()
    text = str(bad.value)
    assert "revision 1" in text and str(store.get(1).files_dir / ".env") in text and "fsck" in text
    (store.get(1).files_dir / ".env").unlink()
    assert "missing" in (store.get(1).damage() or "")
    assert store.get(1).matches(FILES)  # the deploy dir's bytes are compared by the recorded hashes


def test_a_patch_record_whose_hash_is_not_the_stored_file_is_refused(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path)
    rev = store.create(stack="a", kind="adopt", files=FILES, image_ref="img", image_id=None, repo_digest=None,
                       operator="t@h", message="", created="2026-12-01",
                       patches=[{"file": ".env", "sha256": "0" * 64, "target": "/x", "original_sha256": "1" * 64}])
    with pytest.raises(DamagedRecord, match=r"patch record of \.env"):
        rev.verified_files()


@pytest.mark.parametrize("record,data", [("meta.json", b'{\n "created": "2026'), ("meta.json", b""),
                                         ("status.json", b'{"outcome": "depl'), ("meta.json", b"[]")])
def test_an_unreadable_record_is_one_line_naming_the_file(tmp_path: Path, record: str, data: bytes) -> None:
    store = stored(tmp_path)
    path = store.root / "000001" / record
    path.write_bytes(data)
    with pytest.raises(DamagedRecord) as bad:
        store.get(1)
    assert str(path) in str(bad.value) and "\n" not in str(bad.value) and "fsck --repair" in str(bad.value)
    assert store.current() is not None and store.current().number == 2  # type: ignore[union-attr]


def test_a_deleted_meta_json_is_damage_not_no_such_revision(tmp_path: Path) -> None:
    store = stored(tmp_path)
    (store.root / "000001" / "meta.json").unlink()
    with pytest.raises(DamagedRecord, match="record is missing"):
        store.get(1)
    rows = store.marked(store.index())
    assert "missing" in rows[0]["damage"] and "damage" not in rows[1]


def test_a_folder_the_index_lacks_is_listed_damaged_and_never_written_to_the_index(tmp_path: Path) -> None:
    store = stored(tmp_path, 3)
    (store.root / "000002" / "meta.json").write_bytes(b"{")
    store.index_path.write_bytes(b'{"columns": {"number": [1')  # torn: rebuilt from the folders
    rows = store.index()
    assert [r["number"] for r in rows] == [1, 2, 3] and rows[1]["outcome"] == "damaged"
    written = json.loads(store.index_path.read_bytes())["columns"]["number"]
    assert written == [1, 3]
    assert store.index_disagreement() == []  # a damaged folder is fsck's finding, not the index's


def test_the_index_disagreeing_with_a_folder_is_found_and_rebuilt(tmp_path: Path) -> None:
    store = stored(tmp_path)
    doc = json.loads(store.index_path.read_bytes())
    doc["columns"]["outcome"][0] = "failed"
    store.index_path.write_bytes(json.dumps(doc).encode())
    assert store.index_disagreement() == [f"{store.index_path}: revision 1's outcome differ from its folder"]
    store.rebuild_index()
    assert store.index_disagreement() == []


def test_a_set_aside_number_is_never_given_again(tmp_path: Path) -> None:
    store = stored(tmp_path)
    aside = store.set_aside(2, "20261201T000000")
    assert aside.is_dir() and store.numbers() == [1]
    rev = store.create(stack="s", kind="switch", files=FILES, image_ref="img", image_id=None, repo_digest=None,
                       operator="t@h", message="", created="2026-12-01")
    assert rev.number == 3 and store.current() is None  # `current` names the folder set aside


def test_an_unreadable_journal_is_one_line_naming_it(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.path.mkdir()
    with pytest.raises(DamagedRecord) as bad:
        journal.last_run()
    assert str(journal.path) in str(bad.value) and "fix:" in str(bad.value)


def test_the_lock_refusal_says_it_cannot_name_a_holder_without_details(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held, as by a run between its flock and its details
        with pytest.raises(LockBusy) as busy:
            DeployLock(tmp_path, "switch b").acquire()
        assert f"could not be read from {tmp_path / 'lock.json'}: no such file" in str(busy.value)
        (tmp_path / "lock.json").write_text("{not json")
        with pytest.raises(LockBusy) as busy:
            DeployLock(tmp_path, "switch b").acquire()
        assert "not valid JSON" in str(busy.value)
    finally:
        os.close(fd)
