"""A router in front whose config names the served model keeps right through a switch between
variants (issue 33, item 5), on the real engine: a Caddy companion binds the deploy dir's
companions/caddy/Caddyfile, each stack carries its own (companion_files), and after every switch
and rollback the router, asked from outside, answers for that stack's served name and says it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
import yaml
from kit.simnode import SimNode, docker

from b70deploy.sim import door_image

pytestmark = pytest.mark.docker


def caddyfile(served: str) -> str:
    return f":2080 {{\n  header X-Served-Model {served}\n  reverse_proxy vllm:8000\n}}\n"


def _router(port: int, served: str) -> None:
    url = f"http://127.0.0.1:{port}/v1"
    models = _first_answer(f"{url}/models")
    assert models.headers.get("X-Served-Model") == served, models.headers
    assert [m["id"] for m in models.json()["data"]] == [served]
    done = requests.post(f"{url}/completions", timeout=30,
                         json={"model": served, "prompt": "The capital of France is", "max_tokens": 4})
    assert done.status_code == 200 and "Paris" in done.json()["choices"][0]["text"], done.text


def _first_answer(url: str) -> requests.Response:
    """The router's first answer. The drain stopped it and the tool's last step started it again;
    Caddy binds its port a moment after its container runs, and Docker's proxy takes the connection
    before that and closes it, so the first tries may find nobody home. The router declares no
    healthcheck the tool could wait for."""
    deadline = time.monotonic() + 15
    while True:
        try:
            return requests.get(url, timeout=10)
        except requests.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_each_stack_brings_its_routers_file(node: SimNode, free_port: Callable[[], int]) -> None:
    caddy = door_image.build(tag=f"{node.project}/caddy:2").tag
    try:
        port = free_port()
        cfg = yaml.safe_load(node.config.read_text())
        cfg["companions"].append({
            "name": "router", "image": caddy, "port": port, "container_port": 2080,
            "command": ["run", "--config", "/etc/caddy/Caddyfile", "--adapter", "caddyfile"],
            "volumes": [f"{node.deploy}/companions/caddy/Caddyfile:/etc/caddy/Caddyfile:ro"]})
        node.config.write_text(yaml.safe_dump(cfg))
        for name, base in (("routed-a", "alpha"), ("routed-b", "beta")):
            served = f"chat-{name[-1]}"
            (Path(cfg["stacks_dir"]) / f"{name}.yaml").write_text(yaml.safe_dump({
                "extends": base, "served_model_names": [served],
                "companion_files": {"caddy/Caddyfile": caddyfile(served)}}))

        for step in (("switch", "routed-a"), ("switch", "routed-b"), ("rollback", "routed-a")):
            r = node.cli(*step, "--yes", timeout=180)
            assert r.returncode == 0, r.stdout + r.stderr
            served = f"chat-{step[1][-1]}"
            assert (node.deploy / "companions" / "caddy" / "Caddyfile").read_text() == caddyfile(served)
            _router(port, served)
    finally:
        docker("rm", "-f", *node.containers("router"), check=False)
        docker("rmi", caddy, check=False)
