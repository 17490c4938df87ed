"""A backing companion keeps running through a switch and a rollback on the real engine (issue 35): the
node's client companion (webui, which names vllm) waits for a database-like companion (db) with
`condition: service_healthy`; the drain stops webui and leaves db running, so neither a switch, a
rollback, the `drain`/`restore` verbs nor a failed switch's undo waits for db's health interval again.
Checked from outside: docker inspect of both containers (id, StartedAt), a completion from the node,
webui answering on its port."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import requests
import yaml
from kit.simnode import SimNode, docker, service_box

pytestmark = pytest.mark.docker


def started(node: SimNode, service: str) -> tuple[str, str]:
    box = service_box(node.project, service)
    return box["Id"], box["State"]["StartedAt"]


def webui_answers(port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, f"webui does not answer on {port}"
        time.sleep(0.1)


def test_a_database_companion_keeps_running_through_switch_rollback_drain_restore_and_a_failed_switch(
        node: SimNode, free_port: Callable[[], int]) -> None:
    web = free_port()
    cfg = yaml.safe_load(node.config.read_text())
    image = node.tags["bash-c"]
    cfg["companions"] = [
        {"name": "db", "image": image, "command": ["sim-webui", "--port", "5432"],
         "compose": {"healthcheck": {"test": ["CMD-SHELL", "wget -q -O /dev/null http://127.0.0.1:5432/health"],
                                     "interval": "3s", "timeout": "2s", "retries": 5}}},
        {"name": "webui", "image": image, "command": ["sim-webui", "--port", "8080"], "port": web,
         "container_port": 8080, "environment": {"OPENAI_API_BASE_URL": "http://vllm:8000/v1"},
         "compose": {"depends_on": {"db": {"condition": "service_healthy"}}}}]
    node.config.write_text(yaml.safe_dump(cfg))

    node.cli("switch", "alpha", "--yes", check=True)  # nothing ran before: everything starts
    webui_answers(web)
    db, web_before = started(node, "db"), started(node, "webui")

    dry = node.cli("switch", "beta", "--dry-run", check=True).stdout
    assert "stop vllm, webui; db keep running" in dry, dry
    done = node.cli("switch", "beta", "--yes", check=True)
    out = done.stdout + done.stderr  # the run's lines go to stderr, the outcome to stdout
    assert "then stopped vllm, webui" in out and "kept db running" in out, out
    assert node.answers() == "beta"
    webui_answers(web)
    assert started(node, "db") == db  # the same container, never restarted
    web_after = started(node, "webui")
    assert web_after[0] == web_before[0] and web_after[1] > web_before[1]  # webui was stopped, then started

    done = node.cli("rollback", "--yes", check=True)
    out = done.stdout + done.stderr
    assert "kept db running" in out, out
    assert node.answers() == "alpha"
    webui_answers(web)
    assert started(node, "db") == db
    web_back = started(node, "webui")
    assert web_back[1] > web_after[1]

    node.cli("drain", check=True)  # the node procedure's drain keeps it too; restore starts webui again
    assert not node.containers("webui") and started(node, "db") == db
    node.cli("restore", check=True)
    webui_answers(web)
    assert started(node, "db") == db
    web_back = started(node, "webui")

    failed = node.cli("switch", "crash", "--yes")  # its boot crashes: the undo brings alpha and webui back
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert node.answers() == "alpha"
    webui_answers(web)
    assert started(node, "db") == db
    assert started(node, "webui")[1] > web_back[1]
    assert docker("inspect", "-f", "{{.State.Health.Status}}", db[0]).stdout.strip() == "healthy"


def test_a_changed_database_definition_is_recreated_from_the_new_files(node: SimNode) -> None:
    """Never an old definition left running: a companion whose definition changed stops in the drain and
    runs the new one."""
    cfg = yaml.safe_load(node.config.read_text())
    image = node.tags["bash-c"]
    db = {"name": "db", "image": image, "command": ["sim-webui", "--port", "5432"],
          "environment": {"DB_TUNING": "a"}}
    cfg["companions"] = [db, {"name": "webui", "image": image, "command": ["sim-webui", "--port", "8080"],
                              "compose": {"depends_on": ["db"]}}]
    node.config.write_text(yaml.safe_dump(cfg))
    node.cli("switch", "alpha", "--yes", check=True)
    first = started(node, "db")
    db["environment"] = {"DB_TUNING": "b"}
    node.config.write_text(yaml.safe_dump(cfg))
    done = node.cli("switch", "beta", "--yes", check=True)
    out = done.stdout + done.stderr  # the run's lines go to stderr, the outcome to stdout
    assert "then stopped vllm, db, webui" in out, out
    box = service_box(node.project, "db")
    assert box["Id"] != first[0] and "DB_TUNING=b" in box["Config"]["Env"]
    assert node.answers() == "beta"
