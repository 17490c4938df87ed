"""tests/docker/ mirrors b70deploy/docker/ but must never hide the Docker SDK: pytest puts tests/ on
sys.path (pyproject: pythonpath = ["tests"]), so a tests/docker/__init__.py would make
`import docker` find this folder instead of the `docker` package b70deploy depends on."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_import_docker_is_the_sdk() -> None:
    import docker

    assert hasattr(docker, "from_env") and hasattr(docker, "DockerClient"), docker
    assert docker.__file__ is not None and not Path(docker.__file__).resolve().is_relative_to(TESTS), docker.__file__


def test_no_test_folder_is_a_package() -> None:
    """No __init__.py in any test folder: each would shadow a same-named import (docker, config,
    deploy, ...) for the whole run. Shared test code lives in tests/kit/ and tests/simkit.py."""
    packages = sorted(str(p.relative_to(TESTS)) for p in TESTS.glob("*/__init__.py") if p.parent.name != "kit")
    assert packages == []
