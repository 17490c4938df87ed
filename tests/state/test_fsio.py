"""Atomic writes: the mode is set before any byte lands, and no temp file survives an error."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from b70deploy.state import fsio


def test_write_atomic_sets_mode_and_content(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "vllm.env"
    fsio.write_atomic(target, b"HF_TOKEN=x\n", mode=0o600)
    assert target.read_bytes() == b"HF_TOKEN=x\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["vllm.env"]


def test_mode_is_set_before_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the moment of the first write, the temp file is already 0600 (a secret is never
    readable by others, not even for an instant), whatever the umask."""
    seen: list[int] = []
    real_fdopen = os.fdopen

    def spying_fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        fh = real_fdopen(fd, *args, **kwargs)
        real_write = fh.write

        def write(data: bytes) -> int:
            seen.append(stat.S_IMODE(os.fstat(fh.fileno()).st_mode))
            return real_write(data)

        fh.write = write
        return fh

    monkeypatch.setattr(fsio.os, "fdopen", spying_fdopen)
    old = os.umask(0)
    try:
        fsio.write_atomic(tmp_path / ".env", b"SECRET=1\n", mode=0o600)
    finally:
        os.umask(old)
    assert seen == [0o600]


def test_replace_keeps_old_bytes_until_rename(tmp_path: Path) -> None:
    target = tmp_path / "docker-compose.yml"
    target.write_bytes(b"old")
    fsio.write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_error_leaves_no_temp_file_and_old_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "docker-compose.yml"
    target.write_bytes(b"old")

    def boom(*_: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(fsio.os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        fsio.write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docker-compose.yml"]


def test_interrupt_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(fsio.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fsio.write_atomic(tmp_path / "x", b"data")
    assert list(tmp_path.iterdir()) == []


def test_write_tree_and_read_tree(tmp_path: Path) -> None:
    files = {"docker-compose.yml": b"a", ".env": b"b", "vllm.env": b"c"}
    fsio.write_tree(tmp_path, files, {".env": 0o600, "vllm.env": 0o600})
    assert fsio.read_tree(tmp_path, [*files, "absent"]) == files
    assert stat.S_IMODE((tmp_path / "vllm.env").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "docker-compose.yml").stat().st_mode) == 0o644


def test_append_jsonl_appends_whole_private_lines(tmp_path: Path) -> None:
    log = tmp_path / "state" / "journal.jsonl"
    fsio.append_jsonl(log, {"b": 1, "a": "x\ny"})
    fsio.append_jsonl(log, {"path": tmp_path})  # not JSON-native: written as its str()
    assert log.read_text().splitlines() == ['{"a": "x\\ny", "b": 1}', f'{{"path": "{tmp_path}"}}']
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_writing_the_deploy_dir_removes_a_killed_writes_temp_files(tmp_path: Path) -> None:
    """A SIGKILL inside write_atomic leaves `.NAME.*.tmp` beside the deploy files; the next
    write of the deploy dir (under the deploy lock) removes it, so the dir is exactly the files."""
    from b70deploy.deploy.deploydir import write_deployed

    (tmp_path / "patches" / "m").mkdir(parents=True)
    (tmp_path / ".docker-compose.yml.a1b2.tmp").write_bytes(b"half")
    (tmp_path / "patches" / "m" / ".x.py.c3d4.tmp").write_bytes(b"half")
    files = {"docker-compose.yml": b"services: {}\n", ".env": b"A=1\n", "patches/m/x.py": b"print(1)\n"}
    write_deployed(tmp_path, files)
    got = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert got == sorted(files)


def test_the_deploy_dir_drops_a_companions_secrets_file_the_new_compose_file_no_longer_reads(tmp_path: Path) -> None:
    """The rendered compose file reads webui.secrets.env; the hand-made one put back by a rollback
    does not, and has a password inline: the old env file goes, the new compose file is 0600."""
    from b70deploy.deploy.deploydir import write_deployed

    rendered = {"docker-compose.yml": b"services:\n  webui:\n    env_file:\n      - \"webui.secrets.env\"\n",
                "webui.secrets.env": b"WEBUI_SECRET_KEY='k'\n"}
    write_deployed(tmp_path, rendered)
    assert stat.S_IMODE((tmp_path / "webui.secrets.env").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "docker-compose.yml").stat().st_mode) == 0o644
    hand = {"docker-compose.yml": b"services:\n  webui:\n    environment:\n      WEBUI_SECRET_KEY: k\n"}
    write_deployed(tmp_path, hand)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docker-compose.yml"]
    assert stat.S_IMODE((tmp_path / "docker-compose.yml").stat().st_mode) == 0o600


def test_the_deploy_dir_gets_the_recorded_modes_and_never_opens_a_file_the_operator_closed(tmp_path: Path) -> None:
    """write_deployed with a revision's modes: the key 0600, the script executable; the same bytes
    written again with a looser record stay as the operator closed them (chmod 600 since)."""
    from b70deploy.deploy.deploydir import read_modes, write_deployed

    files = {"docker-compose.yml": b"services:\n  webui:\n    volumes: [./keys/node.pem:/k:ro, ./start.sh:/s:ro]\n",
             "keys/node.pem": b"KEY\n", "start.sh": b"#!/bin/sh\n"}
    write_deployed(tmp_path, files, modes={"keys/node.pem": 0o600, "start.sh": 0o755})
    assert read_modes(tmp_path) == {"docker-compose.yml": 0o644, "keys/node.pem": 0o600, "start.sh": 0o755}
    write_deployed(tmp_path, files, modes={"keys/node.pem": 0o644})  # a revision that recorded it before the chmod
    assert read_modes(tmp_path)["keys/node.pem"] == 0o600
    write_deployed(tmp_path, {**files, "keys/node.pem": b"ROTATED\n"}, modes={"keys/node.pem": 0o644})
    assert read_modes(tmp_path)["keys/node.pem"] == 0o644  # other bytes: the record's mode
