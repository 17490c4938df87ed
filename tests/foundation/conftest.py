"""Fixtures for the foundation tests: a scratch node, stack folders, and the real CLI entry point."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from simkit import unavailable

from b70deploy.config.resources import data_dir

SHIPPED_STACKS = sorted(p.stem for p in data_dir("stacks").glob("*.yaml"))

# The smallest stack that loads: the tests add to it or break it.
MINIMAL_STACK: dict[str, Any] = {
    "image": "intel/vllm:latest",
    "model": {"path": "Qwen/Qwen3-30B-A3B-W4A16"},
    "served_model_names": ["qwen3-30b-a3b-w4a16"],
    "max_model_len": 131072,
}


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@dataclass
class Scratch:
    """A temp node: config file, stacks folder, deploy/state dirs that must stay untouched."""

    root: Path
    config: Path
    stacks: Path

    def write_stack(self, name: str, doc: dict[str, Any] | str) -> Path:
        path = self.stacks / f"{name}.yaml"
        path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
        return path

    def write_config(self, doc: dict[str, Any] | str) -> Path:
        if isinstance(doc, dict):
            doc = {**self.base_config(), **doc}
            self.config.write_text(yaml.safe_dump(doc, sort_keys=False))
        else:
            self.config.write_text(doc)
        return self.config

    def base_config(self) -> dict[str, Any]:
        return {
            "deploy_dir": str(self.root / "deploy"),
            "state_dir": str(self.root / "state"),
            "stacks_dir": str(self.stacks),
            "models_dir": str(self.root / "models"),
            "device_dir": None,
        }

    def copy_shipped(self) -> None:
        for path in data_dir("stacks").glob("*.yaml"):
            shutil.copy(path, self.stacks / path.name)


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scratch:
    """A node config in a temp dir; the process runs there with no b70deploy env vars."""
    for var in ("B70DEPLOY_CONFIG", "B70DEPLOY_STACKS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    s = Scratch(root=tmp_path, config=tmp_path / "node.yaml", stacks=stacks)
    s.write_config({})
    return s


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Call the console script's function, `b70deploy.cli.main`, in this process."""
    from b70deploy.cli import main

    def run(*argv: str) -> CliResult:
        capsys.readouterr()
        try:
            main(list(argv))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def compose_available() -> bool:
    try:
        return subprocess.run(["docker", "compose", "version"], capture_output=True,
                              timeout=30, check=False).returncode == 0 \
            and subprocess.run(["docker", "info"], capture_output=True,
                               timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def compose() -> Iterator[Callable[[Path], dict[str, Any]]]:
    """`docker compose config` of a rendered folder under a unique project name, as data.

    Config only parses and interpolates: no container, network or volume is created.
    """
    if not compose_available():
        unavailable("no Docker Engine with Compose v2")
    import json

    from b70deploy.docker.compose import Compose
    from b70deploy.docker.proc import run

    def config(folder: Path) -> dict[str, Any]:
        project = f"b70t-{uuid.uuid4().hex[:10]}"
        result = run(Compose(folder, project).config(fmt="json"), timeout=60,
                     env={k: v for k, v in os.environ.items() if not k.startswith("VLLM_") and k != "MODELS_DIR"})
        data: dict[str, Any] = json.loads(result.stdout)
        return data

    yield config


def _mknod(path: Path, gid: int) -> None:
    os.mknod(path, 0o660 | stat.S_IFCHR, os.makedev(226, 128))
    os.chown(path, 0, gid)


def make_dri(parent: Path) -> Path:
    """A fake /dev/dri: character devices owned by gids 992 and 44, plus entries to ignore.
    Raises PermissionError where this user may not mknod."""
    if os.geteuid() != 0:
        raise PermissionError("mknod of a character device needs root")
    d = parent / "dri"
    d.mkdir()
    _mknod(d / "renderD128", 992)
    _mknod(d / "card0", 44)
    _mknod(d / "card1", 44)
    (d / "by-path").mkdir()
    (d / "not-a-device").write_text("regular file: ignored")
    return d


@pytest.fixture
def dri(tmp_path: Path) -> Path:
    try:
        return make_dri(tmp_path)
    except PermissionError as e:
        unavailable(str(e))
