"""Fixtures for lint tests (helpers in lint_helpers.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from lint_helpers import MODELS, sim_images_present, write_node

from b70deploy.node import Node, load_node


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for rel, cfg in MODELS.items():
        d = root / rel
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        with open(d / "model.safetensors", "wb") as fh:  # sparse: the draft's 366 MB head costs no disk
            fh.truncate(366_000_000 if "EAGLE" in rel else 1024)
    return root


@pytest.fixture
def node_path(tmp_path: Path, models_dir: Path) -> Path:
    return write_node(tmp_path, models_dir)


@pytest.fixture
def node(node_path: Path) -> Iterator[Node]:
    yield load_node(str(node_path))


@pytest.fixture(scope="session")
def sim_images() -> None:
    """The three sim images, built if missing (a few seconds, skipped when inputs match)."""
    if not sim_images_present():
        from b70deploy.sim.image import build

        build()
