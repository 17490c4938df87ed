"""Every `docker compose` argv the tool builds (docker/compose.py) leaves volumes alone:
companions' named volumes hold user data (open-webui's) and are never the tool's to remove."""

from __future__ import annotations

from pathlib import Path

from b70deploy.docker.compose import Compose

REMOVES_VOLUMES = {"-v", "--volumes", "--rmi"}


def test_no_compose_call_removes_volumes() -> None:
    c = Compose(Path("/deploy"), "b70")
    calls = [c.config(), c.up(["vllm"]), c.up(["webui"], recreate=False), c.create(["vllm"], stop_timeout=30),
             c.down(), c.logs("vllm", tail=10), c.networks_for("vllm")]
    public = {name for name in vars(Compose) if not name.startswith("_") and callable(getattr(Compose, name))}
    assert public == {"base", "config", "up", "create", "down", "logs", "networks_for"}, \
        "a new compose call: add it above"
    for argv in calls:
        assert not REMOVES_VOLUMES & set(argv), argv


def test_the_networks_call_leaves_the_container_as_it_is() -> None:
    argv = Compose(Path("/deploy"), "b70").networks_for("vllm")
    assert argv[argv.index("up"):] == ["up", "--no-start", "--no-recreate", "--no-deps", "--pull", "never", "vllm"]


def test_the_drains_create_replaces_the_container_without_starting_it_or_its_dependencies() -> None:
    argv = Compose(Path("/deploy"), "b70").create(["vllm"], stop_timeout=30)
    up = argv.index("up")
    assert argv[up:] == ["up", "--no-start", "--no-deps", "--pull", "never", "--force-recreate", "--timeout", "30",
                         "vllm"]
