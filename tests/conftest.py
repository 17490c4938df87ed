"""Shared fixtures for tests on the real Docker Engine (the sim helper owns this file).

The engine is shared with other test sessions: everything made here is named after the
session (simkit.SESSION) and removed at teardown even when a test fails; the session ends by
asserting nothing it created is left (containers and networks, scoped to this session).

Fixtures
    docker_engine   (session) skip when no engine or Compose v2 answers
    sim_images      (session) build the sim images once: {"bash-c": tag, "serve": tag, "bash-c-drift": tag}
    free_port       () -> an unused 127.0.0.1 TCP port
    compose_project a unique simkit.ComposeProject (name, folder): `down` + removal by label at teardown
    docker_run      (image, *args, env=, ports=, volumes=, entrypoint=) -> name of a detached container
    sim_node        (stack, env=, mounts=, companions=, up=, model_configs=) -> simkit.SimDeployment:
                    a shipped stack rendered with b70deploy for a demo-style node and `compose up`-ed
Helpers (import from simkit): wait_status, wait_log, wait_exit, container_logs, http_status, image_file.
"""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from simkit import (
    LABEL,
    SESSION,
    ComposeProject,
    SimDeployment,
    demo_node_config,
    docker,
    leftovers,
    unavailable,
    unique,
)

_state = {"docker_used": False}


@pytest.fixture(scope="session")
def docker_engine() -> None:
    if shutil.which("docker") is None or docker("info", timeout=30).returncode != 0:
        unavailable("no Docker Engine answers (scripts/setup.sh starts one)")
    if docker("compose", "version", timeout=30).returncode != 0:
        unavailable("docker compose (v2) is missing (scripts/setup.sh links it)")
    _state["docker_used"] = True


@pytest.fixture(scope="session")
def sim_images(docker_engine: None) -> dict[str, str]:
    from b70deploy.sim.image import TAGS, build

    build()
    return dict(TAGS)


@pytest.fixture
def free_port() -> Callable[[], int]:
    def pick() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    return pick


@pytest.fixture
def compose_project(docker_engine: None, tmp_path: Path) -> Iterator[ComposeProject]:
    name = unique("p")
    folder = tmp_path / name
    folder.mkdir()
    project = ComposeProject(name, folder)
    try:
        yield project
    finally:
        project.down()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def docker_run(docker_engine: None) -> Iterator[Callable[..., str]]:
    names: list[str] = []

    def start(image: str, *args: str, env: Mapping[str, str] | None = None, ports: Mapping[int, int] | None = None,
              volumes: Sequence[str] = (), entrypoint: str | None = None) -> str:
        name = unique("c")
        names.append(name)
        argv = ["run", "-d", "--name", name, "--label", f"{LABEL}={SESSION}"]
        for k, v in (env or {}).items():
            argv += ["-e", f"{k}={v}"]
        for host, inner in (ports or {}).items():
            argv += ["-p", f"127.0.0.1:{host}:{inner}"]
        for vol in volumes:
            argv += ["-v", vol]
        if entrypoint is not None:
            argv += ["--entrypoint", entrypoint]
        result = docker(*argv, image, *args)
        assert result.returncode == 0, f"docker run failed: {result.stderr}"
        return name

    yield start
    if names:
        docker("rm", "-f", *names)


@pytest.fixture
def sim_node(sim_images: dict[str, str], compose_project: ComposeProject, free_port: Callable[[], int],
             tmp_path: Path) -> Callable[..., SimDeployment]:
    def deploy(stack_name: str, *, env: Mapping[str, str] | None = None, mounts: Mapping[str, bytes] | None = None,
               companions: bool = False, up: bool = True,
               model_configs: Mapping[str, dict[str, Any]] | None = None) -> SimDeployment:
        """Render `stack_name` for a demo-style node and `compose up` it.

        mounts: {absolute path in the container: bytes}, bind-mounted read-only (e.g. a patched file).
        model_configs: {model path below models_dir: config.json content}.
        """
        from b70deploy.config.node import load_node
        from b70deploy.render import devices
        from b70deploy.render.files import Mount, render
        from b70deploy.state.fsio import write_atomic, write_tree

        port = free_port()
        node_file = demo_node_config(tmp_path / "node", project=compose_project.name, port=port, env=env,
                                     companions=companions)
        node = load_node(str(node_file))
        for rel, conf in (model_configs or {}).items():
            (node.models_dir / rel).mkdir(parents=True, exist_ok=True)
            (node.models_dir / rel / "config.json").write_text(json.dumps(conf))
        stack = node.catalogue().load(stack_name)
        mount_list = []
        for i, (target, data) in enumerate((mounts or {}).items()):
            source = f"patches/{i}-{Path(target).name}"
            write_atomic(compose_project.dir / source, data)
            mount_list.append(Mount(source=source, target=target))
        rendered = render(stack, node, devices.scan(None), port=port, project=compose_project.name,
                          mounts=tuple(mount_list))
        write_tree(compose_project.dir, rendered.files, {n: rendered.mode(n) for n in rendered.files})
        if up:
            compose_project.run("up", "-d", "--pull", "never")
        return SimDeployment(compose_project, port, stack, rendered, node_file)

    return deploy


@pytest.fixture(scope="session", autouse=True)
def no_leaks_at_end() -> Iterator[None]:
    """The suite's last check: nothing this session created is left on the engine."""
    yield
    if not _state["docker_used"]:
        return
    left = leftovers()
    for kind, name in left:  # remove anyway, so one failure does not spill into other sessions
        docker("rm", "-f", name) if kind == "container" else docker("network", "rm", name)
    assert not left, f"test session {SESSION} left these on the engine: {left}"
