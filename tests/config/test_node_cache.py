"""The node config's validated settings cached by content hash (config/node_cache.py): a second
load validates nothing until the whole config is asked for and gives the same node; an edit,
other code or a broken store is validated again; a bad config fails the same way every run."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.scratch import Scratch
from simkit import run_cli

from b70deploy.config import node as node_mod
from b70deploy.config import node_cache
from b70deploy.config.node import load_node
from b70deploy.errors import UserError


def validations(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The node names load_node validates a config for, from now on."""
    seen: list[str | None] = []
    real = node_mod._node_config

    def counting(raw: dict[str, Any], path: Path | None, name: str | None, where: str) -> Any:
        seen.append(name)
        return real(raw, path, name, where)

    monkeypatch.setattr(node_mod, "_node_config", counting)
    return seen


@pytest.fixture
def state(scratch: Scratch) -> Path:
    (scratch.root / "state").mkdir()
    return scratch.root / "state"


def test_a_second_load_validates_only_when_the_config_is_asked_for(scratch: Scratch, state: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    scratch.write_config({"project": "p1", "ports": {"prod": 9100, "dark": 9101}, "address": "localhost",
                          "docker_host": "ssh://me@gpu1", "cache_dir": "caches", "patches_dir": "patches"})
    first = load_node(str(scratch.config))
    store = state / node_cache.FILE_NAME
    assert stat.S_IMODE(os.stat(store).st_mode) == 0o600
    seen = validations(monkeypatch)
    second = load_node(str(scratch.config))
    assert seen == []
    assert second == first  # every path and setting (the config loader is not compared)
    assert (second.project, second.address, second.settings.prod_port, second.docker_env) == \
        ("p1", "localhost", 9100, {"DOCKER_HOST": "ssh://me@gpu1"})
    assert second.cache_dir == scratch.root / "caches" and second.patches_dir == scratch.root / "patches"
    assert second.config == first.config
    assert seen == [None]


def test_an_edit_is_validated_again_and_a_bad_one_fails_every_run(scratch: Scratch, state: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    load_node(str(scratch.config))
    seen = validations(monkeypatch)
    scratch.write_config({"project": "p2"})
    assert load_node(str(scratch.config)).project == "p2"
    assert seen == [None]
    scratch.write_config({"ports": {"prod": "8000"}})
    for _ in range(2):
        r = run_cli(None, "--config", str(scratch.config), "status", in_process=True)
        assert r.returncode == 2
        assert r.stderr.startswith(f"error: {scratch.config}: ports.prod: ") and "fix: " in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_other_code_validates_again(scratch: Scratch, state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    load_node(str(scratch.config))
    seen = validations(monkeypatch)
    monkeypatch.setattr(node_cache, "code_hash", lambda: "another version")
    load_node(str(scratch.config))
    assert seen == [None]


@pytest.mark.parametrize("stored", ["not json", json.dumps({"version": 1, "code": "x", "nodes": []}),
                                    "settings of the wrong shape"])
def test_a_broken_store_is_not_used_and_is_written_anew(scratch: Scratch, state: Path, stored: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    first = load_node(str(scratch.config))
    store = state / node_cache.FILE_NAME
    if stored == "settings of the wrong shape":
        data = json.loads(store.read_text())
        for entry in data["nodes"].values():
            entry["settings"]["prod_port"] = "8000"
        stored = json.dumps(data)
    store.write_text(stored)
    seen = validations(monkeypatch)
    assert load_node(str(scratch.config)) == first
    assert load_node(str(scratch.config)) == first
    assert seen == [None]  # the first load stored it again


def test_an_inventory_caches_each_node_and_still_refuses_a_missing_name(scratch: Scratch, state: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    scratch.write_config({"nodes": {"a": {"ports": {"prod": 9000, "dark": 9001}},
                                    "b": {"docker_host": "ssh://me@b", "ports": {"prod": 9002, "dark": 9003}}}})
    first = load_node(str(scratch.config), name="a")
    assert first.state_dir == state / "nodes" / "a"
    seen = validations(monkeypatch)
    assert load_node(str(scratch.config), name="a") == first
    assert load_node(str(scratch.config), name="b").docker_env == {"DOCKER_HOST": "ssh://me@b"}
    assert load_node(str(scratch.config), name="b").settings.prod_port == 9002
    for _ in range(2):
        with pytest.raises(UserError, match="has an inventory"):
            load_node(str(scratch.config))
    assert seen == ["b", None, None]


def test_a_read_makes_no_state_dir(scratch: Scratch) -> None:
    load_node(str(scratch.config))
    assert not (scratch.root / "state").exists()


def test_every_setting_reads_the_same_from_the_cache(scratch: Scratch, state: Path) -> None:
    """Every key the settings hold, as a validation and the cache give them."""
    doc = yaml.safe_load(scratch.config.read_text()) | {
        "docker_host": "tcp://gpu1:2376", "tls_dir": "tls", "secrets_env_file": "secrets.env",
        "device_dir": "dri", "models_dir": "models", "deploy_dir": "deploy"}
    scratch.write_config(doc)
    first = load_node(str(scratch.config))
    second = load_node(str(scratch.config))
    assert second == first and second.settings == node_cache.Settings.of(first.config)
    assert second.docker_env == first.docker_env == {
        "DOCKER_HOST": "tcp://gpu1:2376", "DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(scratch.root / "tls")}


def test_a_node_whose_state_dir_is_made_later_is_cached_when_remembered(scratch: Scratch,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first command on a node makes its state dir after loading the config: the CLI calls
    remember() as the command ends (cli/base.py), so the next command, a dry run, writes nothing."""
    first = load_node(str(scratch.config))
    (scratch.root / "state").mkdir()
    first.remember()
    stored = (scratch.root / "state" / node_cache.FILE_NAME).read_bytes()
    seen = validations(monkeypatch)
    second = load_node(str(scratch.config))
    second.remember()
    assert second == first and seen == []
    assert (scratch.root / "state" / node_cache.FILE_NAME).read_bytes() == stored
