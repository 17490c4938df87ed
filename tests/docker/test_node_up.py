"""DockerNode.up against a daemon that is still finishing a killed `compose up` (no engine:
the compose run and the stray sweep are stand-ins that record what they were asked)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from b70deploy.config.schema import NodeConfig
from b70deploy.docker import node as node_mod
from b70deploy.docker.node import DockerNode
from b70deploy.errors import OperationError

CONFLICT = ('`docker compose -p p up -d --no-deps --pull never --force-recreate vllm` failed (exit 1): '
            'Error response from daemon: Conflict. The container name "/71c70f8b89e1_p-vllm-1" is already in use '
            'by container "f12e".')


def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: list[str]) -> tuple[DockerNode, list[str]]:
    calls: list[str] = []

    def run(argv: list[str], **kw: Any) -> None:
        calls.append("up")
        if failures:
            raise OperationError(failures.pop(0))

    def remove_strays(project: str, service: str) -> list[str]:
        calls.append(f"sweep {service}")
        return []

    monkeypatch.setattr(node_mod, "run", run)
    monkeypatch.setattr(node_mod.engine, "remove_strays", remove_strays)
    monkeypatch.setattr(node_mod.time, "sleep", lambda s: calls.append("wait"))
    node = SimpleNamespace(config=NodeConfig())  # the compose argv reads the project's files and profiles
    return DockerNode(deploy_dir=tmp_path, node=node, project="p", port=8000), calls  # type: ignore[arg-type]


def test_a_name_conflict_from_a_killed_up_is_swept_and_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/chaos.py found it: a SIGTERM in activate ends the running `compose up`
    (subprocess.run kills it), but the daemon still finishes its create of the replacement
    `<old id>_<project>-vllm-1` after the undo's stray sweep looked, so the undo's own `up`
    failed on the name, the switch said "rollback FAILED: the node may be serving nothing",
    and `status` advised `rollback N`. The `up` now sweeps again and retries."""
    n, calls = make(tmp_path, monkeypatch, [CONFLICT])
    n.up(["vllm"])
    assert calls == ["sweep vllm", "up", "wait", "sweep vllm", "up"]


def test_other_failures_and_a_lasting_conflict_still_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n, calls = make(tmp_path, monkeypatch, ["docker compose ... failed (exit 1): no such image"])
    with pytest.raises(OperationError, match="no such image"):
        n.up(["vllm"])
    assert calls == ["sweep vllm", "up"]
    n, calls = make(tmp_path, monkeypatch, [CONFLICT] * 5)
    with pytest.raises(OperationError, match="Conflict"):
        n.up(["vllm"])
    assert calls.count("up") == 3
