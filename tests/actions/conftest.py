"""Fixtures for the actions end to end on real engines (the switch and rollback on one node, the
rolling switch over three engines, a node behind a real sshd): `node` (kit.simnode), `engines`
and `fleet` (kit.engines), `ssh_engine` (kit.sshd: an engine of its own behind sshd on loopback)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import simkit
import yaml
from kit.engines import FLEET, SSH_ENGINE, Engine, Fleet, started
from kit.engines import write_stacks as write_fleet_stacks
from kit.ports import free_port
from kit.simnode import OWN_LABEL, SimNode, docker, write_stacks
from kit.sshd import SSH, SSHD, SshServer
from kit.sshd import start as start_sshd
from kit.sshd import stop as stop_sshd
from simkit import unavailable

from b70deploy.sim.box import write_models
from b70deploy.sim.image import TAGS as SIM_TAGS


@pytest.fixture
def node(tmp_path: Path, sim_images: dict[str, str], free_port: Callable[[], int]) -> Iterator[SimNode]:
    project = simkit.unique("d")  # named after the session: the end-of-suite leak check sees it
    tags = {"bash-c": f"{project}/vllm:bash-c", "serve": f"{project}/vllm:serve"}
    for variant, tag in tags.items():
        docker("tag", sim_images[variant], tag)
    root = tmp_path
    write_models(root / "models")
    write_stacks(root / "stacks", "intel/vllm:latest")
    prod, dark = free_port(), free_port()
    cfg = {
        "project": project, "deploy_dir": str(root / "deploy"), "state_dir": str(root / "state"),
        "stacks_dir": str(root / "stacks"), "models_dir": str(root / "models"), "device_dir": None,
        "bind_address": "127.0.0.1", "ports": {"prod": prod, "dark": dark}, "load_threshold": 1000,
        "image_map": {"intel/vllm:latest": tags["bash-c"], "vllm-xpu:0.19.0-tr5": tags["serve"]},
        "stack_overlay": {"env": {"B70SIM_BOOT_SECONDS": "0.6", "B70SIM_DECODE_TPS": "500"}, "settle_seconds": 0.5},
        "timeouts": {"health": 40, "rollback": 40, "poll_interval": 0.2},
        "companions": [{"name": "webui", "image": tags["bash-c"], "command": ["sim-webui", "--port", "8080"]}],
    }
    config = root / "node.yaml"
    config.write_text(yaml.safe_dump(cfg))
    tn = SimNode(root=root, project=project, prod=prod, dark=dark, tags=tags, config=config)
    try:
        yield tn
    finally:
        for proj in (project, f"{project}-dark"):
            simkit.remove_by_project(proj)
        docker("rmi", *tags.values(), check=False)
        # The images tn.own_image built: once untagged, only their label finds them.
        simkit.remove_keep_tags(project)
        volumes = [v for v in docker("volume", "ls", "-q").stdout.split() if v.startswith(f"{project}-")]
        if volumes:  # companions' named volumes, which the tool itself never removes
            docker("volume", "rm", *volumes, check=False)
        own = docker("images", "-q", "--filter", f"label={OWN_LABEL}={project}").stdout.split()
        if own:
            docker("rmi", "-f", *sorted(set(own)), check=False)


@pytest.fixture(scope="session")
def engines(sim_images: dict[str, str]) -> Iterator[list[Engine]]:
    """The three engines of the rolling tests (kit/engines.py FLEET), started once per worker."""
    require_engines()
    with started(FLEET, sim_images["bash-c"]) as three:
        yield three


def require_engines() -> None:
    if os.geteuid() != 0 or shutil.which("dockerd") is None or shutil.which("ip") is None:
        unavailable("extra Docker Engines need root, dockerd and ip")


@pytest.fixture
def fleet(engines: list[Engine], tmp_path: Path) -> Iterator[Fleet]:
    """An inventory of three nodes, one per engine; node b's catalogue has a gamma that crashes."""
    project = f"b70mn-{uuid.uuid4().hex[:8]}"
    write_models(tmp_path / "models")
    write_fleet_stacks(tmp_path / "stacks", "intel/vllm:latest")
    write_fleet_stacks(tmp_path / "stacks-b", "intel/vllm:latest", gamma_crashes=True)
    names = ["a", "b", "c"]
    ports = {n: free_port() for n in names}
    nodes: dict[str, Any] = {}
    for n, e in zip(names, engines, strict=True):
        nodes[n] = {"docker_host": e.host, "ports": {"prod": ports[n], "dark": free_port()}}
    nodes["b"]["stacks_dir"] = str(tmp_path / "stacks-b")
    cfg = {
        "project": project, "deploy_dir": str(tmp_path / "deploy"), "state_dir": str(tmp_path / "state"),
        "stacks_dir": str(tmp_path / "stacks"), "models_dir": str(tmp_path / "models"), "device_dir": None,
        "bind_address": "127.0.0.1", "load_threshold": 1000,
        "image_map": {"intel/vllm:latest": SIM_TAGS["bash-c"]},
        "stack_overlay": {"env": {"B70SIM_BOOT_SECONDS": "1.0"}, "settle_seconds": 0.5},
        "timeouts": {"health": 40, "rollback": 40, "poll_interval": 0.2},
        "nodes": nodes,
    }
    config = tmp_path / "fleet.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    fl = Fleet(tmp_path, config, engines, names, ports, project)
    try:
        yield fl
    finally:
        for e in engines:
            ids = e.docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={project}").stdout.split()
            if ids:
                e.docker("rm", "-f", *ids)
            nets = e.docker("network", "ls", "-q", "--filter",
                            f"label=com.docker.compose.project={project}").stdout.split()
            if nets:
                e.docker("network", "rm", *nets)
            simkit.remove_keep_tags(project, e.docker)


@pytest.fixture(scope="session")
def ssh_engine(sim_images: dict[str, str]) -> Iterator[tuple[Engine, SshServer]]:
    """An engine of its own (kit/engines.py SSH_ENGINE) reached over ssh://root@127.0.0.1:PORT
    through a real OpenSSH server (kit/sshd.py)."""
    require_engines()
    missing = [p for p in (SSHD, SSH) if not os.access(p, os.X_OK)]
    if shutil.which("ssh-keygen") is None:
        missing.append("ssh-keygen")
    if missing:
        unavailable(f"an ssh node needs openssh-server and openssh-client ({', '.join(missing)} missing; "
                    "scripts/setup.sh installs them)")
    import docker.transport

    if not hasattr(docker.transport, "SSHHTTPAdapter"):
        unavailable("the docker SDK has no ssh:// support here (paramiko missing: pip install -e .)")
    root = Path(tempfile.mkdtemp(prefix="b70ssh-", dir="/tmp"))
    server = None
    with started(SSH_ENGINE, sim_images["bash-c"]) as (engine,):
        try:
            try:
                server = start_sshd(root, engine.sock)
            except RuntimeError as e:
                unavailable(str(e))
            yield engine, server
        finally:
            if server is not None:
                stop_sshd(server)
            shutil.rmtree(root, ignore_errors=True)
