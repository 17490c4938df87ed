"""Fixtures for the actions end to end on real engines (the switch and rollback on one node, the
rolling switch over three engines, a node behind a real sshd): `node` (kit.simnode), `engines`
and `fleet` (kit.engines), `ssh_engine` (kit.sshd: engine 1 behind sshd on loopback)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import simkit
import yaml
from filelock import FileLock
from kit.engines import ENGINES, Engine, Fleet, _start, _stop, _unmount_under, free_port
from kit.engines import write_stacks as write_fleet_stacks
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
    if os.geteuid() != 0 or shutil.which("dockerd") is None or shutil.which("ip") is None:
        unavailable("three extra Docker Engines need root, dockerd and ip")
    had_docker0 = Path("/sys/class/net/docker0").exists()
    # A short path: a unix socket path is limited to 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="b70mn-", dir="/tmp"))
    tag = uuid.uuid4().hex[:6]
    bridges = [f"b70mn{tag}{i}" for i in range(1, ENGINES + 1)]  # at most 15 characters
    started: list[Engine] = []
    # Fixed subnets (10.213.x): one set of three engines on this machine at a time, also across
    # test sessions; a second session waits here instead of failing on a taken address.
    subnets = FileLock(os.path.join(tempfile.gettempdir(), "b70test-engines.lock"))
    subnets.acquire(timeout=900)
    try:
        for i, bridge in enumerate(bridges, 1):
            started.append(_start(i, root, bridge))
        deadline = time.monotonic() + 60
        for e in started:
            while e.docker("version", "--format", "{{.Server.Version}}", timeout=10).returncode != 0:
                if e.proc.poll() is not None or time.monotonic() > deadline:
                    log = (root / f"d{e.index}.log").read_text(errors="replace")[-2000:]
                    unavailable(f"dockerd {e.index} did not start: {log}")
                time.sleep(0.3)
        # The shared engine's default bridge must survive our engines (see the module docstring).
        assert Path("/sys/class/net/docker0").exists() or not had_docker0, "an extra dockerd removed docker0"
        image = subprocess.run(["docker", "save", sim_images["bash-c"]], capture_output=True, check=True).stdout
        for e in started:
            subprocess.run(["docker", "-H", e.host, "load"], input=image, capture_output=True, check=True)
        yield started
    finally:
        for e in started:
            _stop(e)
        _unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)
        for bridge in bridges:
            subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
        subnets.release()


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
def ssh_engine(engines: list[Engine]) -> Iterator[tuple[Engine, SshServer]]:
    """Engine 1 reached over ssh://root@127.0.0.1:PORT through a real OpenSSH server (kit/sshd.py)."""
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
    try:
        try:
            server = start_sshd(root, engines[0].sock)
        except RuntimeError as e:
            unavailable(str(e))
        yield engines[0], server
    finally:
        if server is not None:
            stop_sshd(server)
        shutil.rmtree(root, ignore_errors=True)
