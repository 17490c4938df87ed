"""Shared fixtures: a scratch node for tests without an engine, and tests on the real Docker Engine.

The engine is shared with other test sessions: everything made here is named after the
session (simkit.SESSION) and removed at teardown even when a test fails; the session ends by
asserting nothing it created is left (containers and networks, scoped to this session).

Fixtures
    docker_engine   (session) skip when no engine or Compose v2 answers
    sim_images      (session) build the sim images once (a file lock: once for all xdist workers):
                    {"bash-c": tag, "serve": tag, "bash-c-drift": tag, "standby": tag}
    free_port       () -> an unused 127.0.0.1 TCP port, handed out once machine-wide (kit/ports.py)
    compose_project a unique simkit.ComposeProject (name, folder): `down` + removal by label at teardown
    docker_run      (image, *args, env=, ports=, volumes=, entrypoint=) -> name of a detached container
    sim_node        (stack, env=, mounts=, companions=, up=, model_configs=) -> simkit.SimDeployment:
                    a shipped stack rendered with b70deploy for a demo-style node and `compose up`-ed
Fixtures without an engine (helpers in kit/scratch.py)
    scratch         a kit.scratch.Scratch node in tmp_path (cwd there, no b70deploy env vars)
    compose         (session) folder -> `docker compose config` of it as data (nothing created)
    dri             a fake /dev/dri (root only)
Helpers (import from simkit): run_cli (the one CLI runner), wait_status, wait_log, wait_exit,
container_logs, http_status, image_file.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kit import ports
from kit.scratch import Scratch, compose_available, make_dri
from simkit import (
    LABEL,
    SESSION,
    ComposeProject,
    SimDeployment,
    build_sim_images,
    demo_node_config,
    docker,
    leftovers,
    unavailable,
    unique,
)

_state = {"docker_used": False}


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


@pytest.fixture
def dri(tmp_path: Path) -> Path:
    try:
        return make_dri(tmp_path)
    except PermissionError as e:
        unavailable(str(e))


@pytest.fixture(scope="session")
def docker_engine() -> None:
    if shutil.which("docker") is None or docker("info", timeout=30).returncode != 0:
        unavailable("no Docker Engine answers (scripts/setup.sh starts one)")
    if docker("compose", "version", timeout=30).returncode != 0:
        unavailable("docker compose (v2) is missing (scripts/setup.sh links it)")
    _state["docker_used"] = True


@pytest.fixture(scope="session")
def sim_images(docker_engine: None) -> dict[str, str]:
    return build_sim_images()


@pytest.fixture
def free_port() -> Callable[[], int]:
    return ports.free_port


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


def _engine_answers() -> bool:
    return shutil.which("docker") is not None and docker("info", "--format", "{{.ID}}", timeout=20).returncode == 0


@pytest.fixture(scope="session", autouse=True)
def no_leaks_at_end(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite's last check: nothing this session created is left on the engine, counting
    the containers the tool starts outside Compose (image probes) for this session's state dirs.
    Runs whenever an engine answers: a test may reach the engine through the CLI (lint) alone."""
    yield
    if not _state["docker_used"] and not _engine_answers():
        return
    left = leftovers([tmp_path_factory.getbasetemp()])
    for kind, name in left:  # remove anyway, so one failure does not spill into other sessions
        argv = {"container": ["rm", "-f"], "network": ["network", "rm"], "volume": ["volume", "rm"],
                "image": ["rmi"]}[kind]
        docker(*argv, name)
    assert not left, f"test session {SESSION} left these on the engine: {left}"


@pytest.fixture(scope="session", autouse=True)
def sim_compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A sim run on the host keeps its torch.compile cache where vLLM would, ~/.cache/vllm,
    unless VLLM_CACHE_ROOT says otherwise: point it into the session's temp dir, so no test
    writes into the machine's home (sims in containers get the tool's own cache mount)."""
    before = os.environ.get("VLLM_CACHE_ROOT")
    os.environ["VLLM_CACHE_ROOT"] = str(tmp_path_factory.mktemp("vllm-cache"))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VLLM_CACHE_ROOT", None)
        else:
            os.environ["VLLM_CACHE_ROOT"] = before


# Fixtures of a node on an engine that the test switches, for seconds to a minute each.
SWITCHED_NODES = frozenset({"node", "watched", "hand_node", "fleet", "duo"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that switch a node first, the others (mostly milliseconds) after: with -n, the
    long ones do not start last and leave one worker busy alone at the end. A stable sort, the
    same on every worker (xdist requires one collection order)."""
    items.sort(key=lambda item: not SWITCHED_NODES.intersection(getattr(item, "fixturenames", ())))


# Modules whose tests must share one pytest-xdist worker: each starts extra engines with fixed
# subnets in a session fixture (tests/kit/engines.py), once, on that worker; a test of the module
# on another worker would wait for the subnets' lock until the first worker's session ends.
# Two scopes, so the two modules (the suite's longest chains) run side by side.
ONE_WORKER = {"tests/actions/test_rolling_engines.py": "fleet-engines", "tests/actions/test_ssh_node.py": "ssh-engine"}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Like `--dist load` (one test per work unit), except that each ONE_WORKER module goes to
    one worker, and tests marked xdist_group(NAME) to one worker per NAME. `--dist loadgroup` alone would do the latter,
    but pytest 9.2 silently broke it (pytest-xdist issue 1386)."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):
                return nodeid.rsplit("@", 1)[-1]
            return ONE_WORKER.get(nodeid.split("::", 1)[0], nodeid)

    return Scheduling(config, log)
