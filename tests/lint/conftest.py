"""Fixtures for lint tests (helpers in lint_helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.lintnode import sim_images_present, write_node
from simkit import build_sim_images

from b70deploy.config.node import Node, load_node
from b70deploy.sim.box import write_models


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    return write_models(tmp_path / "models")


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
        build_sim_images()
