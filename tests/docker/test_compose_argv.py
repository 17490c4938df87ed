"""Every `docker compose` argv the tool builds (docker/compose.py) leaves volumes alone:
companions' named volumes hold user data (open-webui's) and are never the tool's to remove."""

from __future__ import annotations

from pathlib import Path

from b70deploy.docker.compose import Compose

REMOVES_VOLUMES = {"-v", "--volumes", "--rmi"}


def test_no_compose_call_removes_volumes() -> None:
    c = Compose(Path("/deploy"), "b70")
    calls = [c.config(), c.up(["vllm"]), c.up(["webui"], recreate=False), c.down(), c.logs("vllm", tail=10)]
    public = {name for name in vars(Compose) if not name.startswith("_") and callable(getattr(Compose, name))}
    assert public == {"base", "config", "up", "down", "logs"}, "a new compose call: add it above"
    for argv in calls:
        assert not REMOVES_VOLUMES & set(argv), argv
