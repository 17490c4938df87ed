"""Parsed stack files cached by content hash: a second run parses nothing unchanged, an edit
is seen whatever the mtime says, a broken file is reported on every run and never stored."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from kit.scratch import Scratch
from simkit import run_cli

from b70deploy.config import doc_cache
from b70deploy.config.catalogue import Catalogue
from b70deploy.config.doc_cache import DocCache
from b70deploy.config.resources import data_dir
from b70deploy.errors import UserError


def catalogue(tmp_path: Path) -> Catalogue:
    return Catalogue(tmp_path / "stacks", cache=DocCache(tmp_path / "state"))


@pytest.fixture
def stacks(tmp_path: Path) -> Path:
    folder = tmp_path / "stacks"
    folder.mkdir()
    for p in data_dir("stacks").glob("*.yaml"):
        (folder / p.name).write_bytes(p.read_bytes())
    (tmp_path / "state").mkdir()
    return folder


def no_parse(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    parsed: list[str] = []
    real = doc_cache.parse_yaml

    def counting(text: str, path: Path) -> dict[str, Any]:
        parsed.append(path.name)
        return real(text, path)

    monkeypatch.setattr(doc_cache, "parse_yaml", counting)
    return parsed


def test_second_load_parses_nothing_and_gives_the_same_stacks(tmp_path: Path, stacks: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    uncached = Catalogue(stacks).load_all()
    first = catalogue(tmp_path).load_all()
    assert first == uncached
    stored = json.loads((tmp_path / "state" / doc_cache.FILE_NAME).read_text())["files"]
    assert sorted(Path(k).name for k in stored) == sorted(p.name for p in stacks.glob("*.yaml"))
    assert stat.S_IMODE(os.stat(tmp_path / "state" / doc_cache.FILE_NAME).st_mode) == 0o600
    parsed = no_parse(monkeypatch)
    assert catalogue(tmp_path).load_all() == uncached
    assert parsed == []


def test_an_edit_is_parsed_again_even_with_the_old_size_and_mtime(tmp_path: Path, stacks: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    catalogue(tmp_path).load_all()
    path = stacks / "w4a16-131k.yaml"
    before = os.stat(path)
    text = path.read_text()
    assert "max_model_len: 131072" in text
    path.write_text(text.replace("max_model_len: 131072", "max_model_len: 131073"))  # same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    parsed = no_parse(monkeypatch)
    assert catalogue(tmp_path).load("w4a16-131k").max_model_len == 131073
    assert parsed == ["w4a16-131k.yaml"]


def test_a_broken_file_is_reported_every_time_and_never_stored(tmp_path: Path, stacks: Path) -> None:
    catalogue(tmp_path).load_all()
    (stacks / "ngram.yaml").write_text('extends: w4a16\nenv: {A: "\\x1b"}\n')
    for _ in range(2):
        cat = catalogue(tmp_path)
        with pytest.raises(UserError, match="control character") as e:
            cat.load_all()
        assert "ngram.yaml" in str(e.value)
        cat.save_cache()
        stored = json.loads((tmp_path / "state" / doc_cache.FILE_NAME).read_text())["files"]
        assert stored[str(stacks / "ngram.yaml")]["doc"].get("env") is None  # still the old, good bytes


def test_a_torn_cache_is_ignored_and_replaced(tmp_path: Path, stacks: Path) -> None:
    (tmp_path / "state" / doc_cache.FILE_NAME).write_text('{"version": 1, "files": {"x": ')
    assert catalogue(tmp_path).load_all() == Catalogue(stacks).load_all()
    assert json.loads((tmp_path / "state" / doc_cache.FILE_NAME).read_text())["version"] == doc_cache.VERSION


def test_no_state_dir_no_cache_file(tmp_path: Path, stacks: Path) -> None:
    (tmp_path / "state").rmdir()
    catalogue(tmp_path).load_all()
    assert not (tmp_path / "state").exists()


def test_stacks_names_a_broken_file_with_a_warm_cache(scratch: Scratch) -> None:
    scratch.copy_shipped()
    (scratch.root / "state").mkdir()
    assert run_cli(None, "--config", str(scratch.config), "stacks", in_process=True).returncode == 0
    assert (scratch.root / "state" / doc_cache.FILE_NAME).is_file()
    scratch.write_stack("eagle3", "extends: w4a16\nmax_model_len: [\n")
    r = run_cli(None, "--config", str(scratch.config), "stacks", in_process=True)
    assert r.returncode == 2
    assert "eagle3.yaml" in r.stderr and "YAML syntax error" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
