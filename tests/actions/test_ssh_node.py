"""A remote node over ssh:// against a real OpenSSH server (issue 14, item 6).

The inventory has two nodes: `here`, the local default engine, and `far`,
`docker_host: ssh://root@127.0.0.1:PORT`, which sshd on loopback forwards (forced command
`docker system dial-stdio`) to an engine of its own, the `ssh_engine` fixture's (see
kit/sshd.py for the key, known_hosts and the ssh wrapper). Everything is checked from outside
the tool: which stack answers a completion on the node's port (/v1/models' max_model_len tells
alpha 131072, beta 262144), which containers with which `b70deploy.stack` label run on each
engine, asked over the engine's own unix socket rather than through ssh, which revision's files
are in the node's deploy dir, and that sshd accepted the sessions.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import simkit
import yaml
from kit.engines import Engine, Fleet, Probe, write_stacks
from kit.ports import free_port
from kit.sshd import SshServer

from b70deploy.sim.box import write_models

# The ssh engine has fixed 10.213.x subnets: one xdist worker runs all of this module
# (tests/conftest.py ONE_WORKER).
pytestmark = pytest.mark.docker

MAX_LEN = {"alpha": 131072, "beta": 262144}


class Duo(Fleet):
    """Nodes `here` (the local default engine) and `far` (the ssh engine behind sshd)."""

    ssh: SshServer
    far: Engine


@pytest.fixture
def duo(ssh_engine: tuple[Engine, SshServer], sim_images: dict[str, str], tmp_path: Path) -> Iterator[Duo]:
    far_engine, server = ssh_engine
    # Named after the test session: the end-of-suite leak check also covers the local engine.
    project = simkit.unique("ssh")
    # The image under a tag of our own on both engines: another test session rebuilding the
    # shared b70sim tags must not take the image away between the preflight and `compose up`.
    tag = f"{project}/vllm:bash-c"
    simkit.docker("tag", sim_images["bash-c"], tag)
    far_engine.docker("tag", sim_images["bash-c"], tag, check=True)
    write_models(tmp_path / "models")
    write_stacks(tmp_path / "stacks", "intel/vllm:latest", gamma_crashes=True)
    ports = {"here": free_port(), "far": free_port()}
    cfg: dict[str, Any] = {
        "project": project, "deploy_dir": str(tmp_path / "deploy"), "state_dir": str(tmp_path / "state"),
        "stacks_dir": str(tmp_path / "stacks"), "models_dir": str(tmp_path / "models"), "device_dir": None,
        "bind_address": "127.0.0.1", "load_threshold": 1000,
        "image_map": {"intel/vllm:latest": tag},
        "stack_overlay": {"env": {"B70SIM_BOOT_SECONDS": "1.0"}, "settle_seconds": 0.5},  # as the fleet: 5 s by default
        "timeouts": {"health": 40, "rollback": 40, "poll_interval": 0.2},
        # Started inside the settle window, from a thread: it must still reach the node's engine.
        "companions": [{"name": "webui", "image": tag, "command": ["sim-webui", "--port", "8080"]}],
        "nodes": {
            "here": {"ports": {"prod": ports["here"], "dark": free_port()}},
            "far": {"docker_host": server.docker_host, "ports": {"prod": ports["far"], "dark": free_port()}},
        },
    }
    config = tmp_path / "duo.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    duo = Duo(tmp_path, config, [far_engine], ["here", "far"], ports, project, env=server.env)
    duo.ssh, duo.far = server, far_engine
    try:
        yield duo
    finally:
        simkit.remove_by_project(project)
        simkit.remove_by_project(f"{project}-dark")
        for proj in (project, f"{project}-dark"):
            label = f"label=com.docker.compose.project={proj}"
            ids = far_engine.docker("ps", "-aq", "--filter", label).stdout.split()
            if ids:
                far_engine.docker("rm", "-f", *ids)
            nets = far_engine.docker("network", "ls", "-q", "--filter", label).stdout.split()
            if nets:
                far_engine.docker("network", "rm", *nets)
        simkit.remove_keep_tags(project)
        simkit.remove_keep_tags(project, far_engine.docker)
        simkit.docker("rmi", tag)
        far_engine.docker("rmi", tag)


def serving(duo: Duo, name: str) -> tuple[int, bool]:
    """(max_model_len, whether a completion says Paris) as answered on the node's prod port."""
    models = requests.get(f"{duo.url(name)}/v1/models", timeout=5).json()["data"]
    done = requests.post(f"{duo.url(name)}/v1/completions", timeout=10, json={
        "model": models[0]["id"], "prompt": "The capital of France is", "max_tokens": 4}).json()
    return int(models[0]["max_model_len"]), "Paris" in done["choices"][0]["text"]


def containers(duo: Duo, where: str) -> list[tuple[str, str, str]]:
    """(service, b70deploy.stack label, state) of the project's containers, asked of the engine
    directly: the far engine over its unix socket, not through ssh."""
    argv = ["ps", "-a", "--filter", f"label=com.docker.compose.project={duo.project}", "--format",
            '{{.Label "com.docker.compose.service"}}\t{{.Label "b70deploy.stack"}}\t{{.State}}']
    if where == "far":
        out = duo.far.docker(*argv, check=True).stdout
    else:
        out = subprocess.run(["docker", *argv], capture_output=True, text=True, check=True).stdout
    return sorted(tuple(line.split("\t")) for line in out.splitlines())  # type: ignore[misc]


def deployed_revision(duo: Duo, name: str) -> int:
    """The revision whose compose file is byte-equal to the node's deploy dir."""
    live = (duo.root / "deploy" / "nodes" / name / "docker-compose.yml").read_bytes()
    revs = sorted((duo.root / "state" / "nodes" / name / "revisions").glob("[0-9]*"))
    same = [int(r.name) for r in revs if (r / "files" / "docker-compose.yml").read_bytes() == live]
    assert same, f"node {name}: the deploy dir matches no revision"
    return same[-1]


def status(duo: Duo) -> dict[str, tuple[int | None, str | None, object]]:
    rows = duo.json("status", "--nodes")
    return {r["node"]: (r["revision"], r["stack"], r["health"]) for r in rows}


def assert_serves(duo: Duo, name: str, stack: str, revision: int) -> None:
    assert serving(duo, name) == (MAX_LEN[stack], True), name
    assert [(service, state) for service, _stack, state in containers(duo, name)] == [
        ("vllm", "running"), ("webui", "running")], name
    assert [label for service, label, _state in containers(duo, name) if service == "vllm"] == [stack], name
    assert deployed_revision(duo, name) == revision


def test_switch_and_rollback_on_the_ssh_node(duo: Duo) -> None:
    before = duo.ssh.accepted()
    r = duo.cli("--node", "far", "switch", "alpha", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "revision 1 (alpha)" in r.stdout, r.stdout
    assert duo.ssh.accepted() > before, "the switch never went through sshd"
    assert_serves(duo, "far", "alpha", 1)
    assert containers(duo, "here") == [], "the ssh node's switch touched the local engine"

    r = duo.cli("--node", "far", "switch", "beta", "--yes", check=True)
    assert "revision 2 (beta)" in r.stdout, r.stdout
    assert_serves(duo, "far", "beta", 2)

    r = duo.cli("--node", "far", "rollback", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert_serves(duo, "far", "alpha", 3)
    hist = duo.json("history", "--node", "far")
    assert [(h["stack"], h["outcome"]) for h in hist] == [("alpha", "superseded"), ("beta", "superseded"),
                                                          ("alpha", "deployed")]
    assert status(duo) == {"here": (None, None, "refused"), "far": (3, "alpha", 200)}

    # A crash at boot (gamma) is seen in the log streamed over ssh, diagnosed and rolled back.
    r = duo.cli("--node", "far", "switch", "gamma", "--yes")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "marlin" in r.stdout + r.stderr
    assert_serves(duo, "far", "alpha", 3)
    assert "gptq_marlin_repack" in duo.cli("--node", "far", "logs", "4", check=True).stdout
    assert status(duo)["far"] == (3, "alpha", 200)
    assert containers(duo, "here") == []


def test_rolling_switch_across_a_local_and_an_ssh_node(duo: Duo) -> None:
    r = duo.cli("switch", "alpha", "--nodes", "all", "--max-unavailable", "2", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ssh://root@127.0.0.1" in r.stdout, "the plan names each node's endpoint"
    for name in duo.names:
        assert_serves(duo, name, "alpha", 1)
    before = duo.ssh.accepted()
    with Probe({n: duo.url(n) for n in duo.names}) as probe:
        r = duo.cli("switch", "beta", "--nodes", "all", "--max-unavailable", "1", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all 2 node(s) done" in r.stdout, r.stdout
    assert duo.ssh.accepted() > before
    for name in duo.names:  # each engine runs only its own node's containers (no dark leftovers either)
        assert_serves(duo, name, "beta", 2)
    assert status(duo) == {"here": (2, "beta", 200), "far": (2, "beta", 200)}
    assert len(probe.samples) > 10
    assert probe.minimum == 1, probe.samples  # one node out of the pool at a time, and one was

