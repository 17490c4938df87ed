"""Helpers for tests on the real Docker Engine: unique names, compose projects, HTTP polling.

Everything a test session creates is named `<SESSION>-...` and, for plain containers,
labelled `b70test.session=<SESSION>`, so teardown and the end-of-suite leak check touch only
this session's objects on an engine other sessions share. Fixtures live in conftest.py.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import json
import os
import secrets
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
# Variables from the developer's shell that would steer a CLI run elsewhere (another engine,
# node, config, catalogue), make it print tracebacks or kill it (fault injection): a test
# passes its own when it wants them.
AMBIENT = ("DOCKER_HOST", "DOCKER_CONTEXT", "B70DEPLOY_CONFIG", "B70DEPLOY_NODE", "B70DEPLOY_STACKS",
           "B70DEPLOY_FAULT", "B70DEPLOY_DEBUG")


def run_cli(config: Path | None, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120,
            check: bool = False, in_process: bool = False, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The one way tests run the CLI: `b70deploy ARGS` as an operator would, with B70DEPLOY_CONFIG
    set to `config` (None: unset; pass `--config` in args to test the flag) and none of AMBIENT
    from the developer's shell. Returns returncode, stdout and stderr apart.

    Default: `python -m b70deploy.cli` in a subprocess in `cwd` (a SIGKILL shows as returncode -9).
    in_process=True: `b70deploy.cli.main` in this process (milliseconds instead of a
    start-up; `timeout` does not apply), for the many tests of plain input/output.
    check: raise AssertionError with both streams unless it exits 0.
    """
    if in_process:
        result = _run_in_process(list(args), _wanted(config, env))
    else:
        result = subprocess.run(CLI + list(args), capture_output=True, text=True, env=cli_env(config, env),
                                timeout=timeout, check=False, cwd=cwd)
    if check and result.returncode != 0:
        raise AssertionError(f"b70deploy {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n"
                             f"{result.stderr}")
    return result


CLI = [sys.executable, "-m", "b70deploy.cli"]
# Commands the kit's json helpers (SimNode.json, Fleet.json) run in process: they only look, and
# the node tests look after every step.
READ_ONLY = ("status", "history", "audit")


def run_json(config: Path, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120) -> Any:
    """`b70deploy ARGS --json` (exit 0 required) as data; in process when ARGS[0] is READ_ONLY."""
    quick = args[0] in READ_ONLY
    return json.loads(run_cli(config, *args, "--json", env=env, timeout=timeout, check=True,
                              in_process=quick).stdout)


def _wanted(config: Path | None, env: Mapping[str, str] | None) -> dict[str, str]:
    return {**({"B70DEPLOY_CONFIG": str(config)} if config is not None else {}), **(env or {})}


def cli_env(config: Path | None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment run_cli gives a CLI subprocess (for the few tests that need a Popen of
    `CLI + args` running alongside, e.g. a lock holder)."""
    full = {k: v for k, v in os.environ.items() if k not in AMBIENT}
    full.update({"PYTHONPATH": str(REPO), **_wanted(config, env)})
    return full


def _run_in_process(argv: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    from click.testing import CliRunner

    from b70deploy.cli import main

    runner = CliRunner()
    overrides: dict[str, str | None] = {**dict.fromkeys(AMBIENT), **env}
    with runner.isolation(env=overrides) as streams:
        try:
            # In a context of its own: a `--node` run activates that node's endpoint (a context
            # variable, docker/endpoint.py) for the rest of the context, which here is the test's.
            contextvars.copy_context().run(main, argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        out, err = streams[0].getvalue(), streams[1].getvalue()
    return subprocess.CompletedProcess(["b70deploy", *argv], code, out.decode(errors="replace"),
                                       err.decode(errors="replace"))


def build_sim_images() -> dict[str, str]:
    """Build the sim images (skipped per image when its inputs are unchanged) and return
    {variant: tag}. Under a file lock: pytest-xdist workers, and other test sessions on this
    engine, each call this, and only the first one builds."""
    from filelock import FileLock

    from b70deploy.sim.image import TAGS, build

    with FileLock(os.path.join(tempfile.gettempdir(), "b70test-sim-images.lock"), timeout=900):
        build()
    return dict(TAGS)


def unavailable(reason: str) -> NoReturn:
    """A test that needs something this machine lacks: skipped on a developer's machine, failed
    in CI (CI=true), where set-up must have provided it; a skip there would hide a broken set-up."""
    if os.environ.get("CI"):
        pytest.fail(f"CI needs this: {reason}")
    pytest.skip(reason)


SESSION = f"b70t{secrets.token_hex(3)}"
LABEL = "b70test.session"


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def unique(prefix: str = "") -> str:
    return f"{SESSION}-{prefix}{secrets.token_hex(3)}"


def remove_by_project(name: str) -> None:
    label = f"label=com.docker.compose.project={name}"
    ids = docker("ps", "-aq", "--filter", label).stdout.split()
    if ids:
        docker("rm", "-f", *ids)
    nets = docker("network", "ls", "-q", "--filter", label).stdout.split()
    if nets:
        docker("network", "rm", *nets)


def remove_keep_tags(project: str, run: Callable[..., subprocess.CompletedProcess[str]] = docker) -> None:
    """The keep tags b70deploy gave the revisions of `project` (b70deploy/docker/keep.py), on the
    engine `run` talks to: a test's revisions must not keep its images alive after it."""
    from b70deploy.docker.keep import REPO, is_keep_tag

    refs = [ref for ref in run("images", "--format", "{{.Repository}}:{{.Tag}}", REPO).stdout.split()
            if is_keep_tag(project, ref)]
    if refs:
        run("rmi", *refs)


@dataclass
class ComposeProject:
    name: str
    dir: Path

    def argv(self, *args: str) -> list[str]:
        return ["docker", "compose", "--project-directory", str(self.dir), "-p", self.name, "--profile", "gpu", *args]

    def run(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(self.argv(*args), capture_output=True, text=True,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"compose {' '.join(args)} failed ({result.returncode}): {result.stderr[-2000:]}")
        return result

    def logs(self, service: str = "vllm") -> str:
        return self.run("logs", "--no-color", "--no-log-prefix", service, check=False).stdout

    def container(self, service: str = "vllm") -> str:
        return self.run("ps", "-aq", service).stdout.strip()

    def down(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.run("down", "--remove-orphans", "--volumes", "--timeout", "2", check=False)
        remove_by_project(self.name)


@dataclass
class SimDeployment:
    """A shipped stack rendered for the demo-style node and (usually) brought up."""

    project: ComposeProject
    port: int
    stack: Any          # b70deploy.config.schema.Stack
    rendered: Any       # b70deploy.render.files.Rendered
    node_file: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.project.logs("vllm")


def demo_node_config(root: Path, *, project: str, port: int, env: Mapping[str, str] | None = None,
                     companions: bool = False) -> Path:
    """demo/node.yaml with its folders under `root`, the given port and extra stack env (boot 1 s)."""
    doc = yaml.safe_load((REPO / "demo" / "node.yaml").read_text())
    doc.update(project=project, ports={"prod": port, "dark": port - 1 if port > 1 else port + 1})
    doc["stack_overlay"] = {**doc["stack_overlay"],
                            "env": {**doc["stack_overlay"]["env"], "B70SIM_BOOT_SECONDS": "1", **(env or {})}}
    if not companions:
        doc["companions"] = []
    for sub in ("models", "deploy", "state"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    path = root / "node.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def wait_exit(name: str, timeout: float = 30) -> int:
    """The container's exit code once it stops."""
    result = docker("wait", name, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


def container_logs(name: str) -> str:
    result = docker("logs", name)
    return result.stdout + result.stderr


def container_state(name: str) -> dict[str, Any]:
    out = docker("inspect", "--format", "{{json .State}}", name).stdout
    state: dict[str, Any] = json.loads(out)
    return state


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of GET url, or None when nothing answers (refused or reset)."""
    import requests

    try:
        return requests.get(url, timeout=timeout).status_code
    except requests.RequestException:
        return None


def wait_status(url: str, want: int, timeout: float = 20.0, interval: float = 0.1) -> list[int | None]:
    """Poll url until it answers `want`; returns the distinct statuses seen in order."""
    seen: list[int | None] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = http_status(url)
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == want:
            return seen
        time.sleep(interval)
    raise AssertionError(f"{url} never answered {want} in {timeout} s (saw {seen})")


def wait_log(read: Any, needle: str, timeout: float = 20.0) -> str:
    """Poll read() (a logs function) until `needle` appears; returns the text."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = read()
        if needle in text:
            return str(text)
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} not in the log after {timeout} s:\n{text[-3000:]}")


def image_file(image: str, path: str) -> bytes:
    """A file's bytes from inside an image (the container is removed)."""
    name = unique("x")
    try:
        created = docker("create", "--name", name, "--label", f"{LABEL}={SESSION}", image, timeout=60)
        assert created.returncode == 0, created.stderr
        out = subprocess.run(["docker", "cp", f"{name}:{path}", "-"], capture_output=True,
                             timeout=60, check=True).stdout
    finally:
        docker("rm", "-f", name)
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        fh = tar.extractfile(tar.getmembers()[0])
        assert fh is not None
        return fh.read()


# Labels the tool itself puts on containers it starts outside Compose (the image probes):
# the leak check attributes them to this session by the state dir they name.
TOOL_ROLE_LABEL = "b70deploy.role"
TOOL_STATE_LABEL = "b70deploy.state_dir"


def _under(path: str, roots: Sequence[Path]) -> bool:
    real = Path(os.path.realpath(path))
    return any(real.is_relative_to(os.path.realpath(root)) for root in roots)


def leftovers(own_dirs: Sequence[Path] = ()) -> list[tuple[str, str]]:
    """(kind, name) of every container, network, volume and image reference of this session
    still on the engine.

    A container is this session's when its name or Compose project starts with SESSION, when it
    carries LABEL=SESSION, or when the tool made it (a `b70deploy.role` label, e.g. an image
    probe) for a state dir under one of `own_dirs` (the session's pytest temp folder): so lint
    and probe containers count, and another session's, whose state dirs live elsewhere, do not."""
    left: list[tuple[str, str]] = []
    fmt = "\t".join(["{{.Names}}", '{{.Label "com.docker.compose.project"}}', '{{.Label "' + LABEL + '"}}',
                     '{{.Label "' + TOOL_ROLE_LABEL + '"}}', '{{.Label "' + TOOL_STATE_LABEL + '"}}'])
    for row in docker("ps", "-a", "--format", fmt).stdout.splitlines():
        name, project, session, role, state_dir = [*row.split("\t"), "", "", "", ""][:5]
        ours = name.startswith(SESSION) or project.startswith(SESSION) or session == SESSION
        made_for_us = bool(role) and bool(state_dir) and _under(state_dir, own_dirs)
        if ours or made_for_us:
            left.append(("container", name))
    left += [("network", n) for n in docker("network", "ls", "--format", "{{.Name}}").stdout.split()
             if n.startswith(SESSION)]
    left += [("volume", v) for v in docker("volume", "ls", "--format", "{{.Name}}").stdout.split()
             if v.startswith(SESSION)]
    # Image references naming the session: test tags, and the tool's keep tags of session projects.
    left += [("image", ref) for ref in docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
             if SESSION in ref]
    return left


def up_by_hand(folder: Path, health_url: str) -> None:
    """Bring a hand-made project up as its operator does (`docker compose --profile gpu up -d` in its
    folder) and wait for vLLM's /health: the layout the tool then finds, adopts and switches."""
    up = subprocess.run(["docker", "compose", "--profile", "gpu", "up", "-d"], cwd=folder, capture_output=True,
                        text=True, timeout=180, check=False)
    assert up.returncode == 0, up.stderr
    wait_status(health_url, 200, timeout=60)


@contextlib.contextmanager
def running_by_hand(folder: Path, health_url: str, project: str, *images: str) -> Iterator[None]:
    """up_by_hand for a test's while, then its containers, networks, keep tags and the images it
    built removed, also when the test fails."""
    try:
        up_by_hand(folder, health_url)
        yield
    finally:
        remove_by_project(project)
        remove_keep_tags(project)
        if images:
            docker("rmi", *images)
