"""The front door on the real engine with the sim (render/door.py, docker/door.py): clients keep
being answered through a switch, a request held past the bound gets 503 with Retry-After,
development endpoints stay on the project network, SSE chunks pass as vLLM sends them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
import yaml
from kit.clients import Clients
from kit.simnode import SimNode, docker

from b70deploy.sim.door_image import build as build_door


@pytest.fixture(scope="session")
def door_image(sim_images: dict[str, str]) -> str:
    return build_door().tag


def enable_door(node: SimNode, image: str, probe: int, *, hold: float = 60, dev_mode: bool = False) -> None:
    tag = f"{node.project}/door:caddy"  # the node fixture removes the project's images by tag
    docker("tag", image, tag)
    node.tags["door"] = tag
    cfg = yaml.safe_load(node.config.read_text())
    cfg["door"] = {"enabled": True, "image": tag, "hold_seconds": hold, "retry_after": 7, "probe_port": probe}
    if dev_mode:
        cfg["stack_overlay"]["env"]["VLLM_SERVER_DEV_MODE"] = "1"
    node.config.write_text(yaml.safe_dump(cfg))


@pytest.fixture
def door_node(node: SimNode, door_image: str, free_port: Callable[[], int]) -> Iterator[SimNode]:
    enable_door(node, door_image, free_port(), dev_mode=True)
    yield node
    docker("rmi", node.tags["door"], check=False)


def door_container(node: SimNode) -> str:
    ids = node.containers("door")
    assert len(ids) == 1, ids
    return ids[0]


def test_a_switch_through_the_door_fails_no_client_request(door_node: SimNode) -> None:
    node = door_node
    node.cli("switch", "alpha", "--yes", check=True)
    assert node.answers() == "alpha"
    clients = Clients(node.prod)
    clients.during(lambda: node.cli("switch", "beta", "--yes", check=True))
    assert clients.failed == [] and clients.ok > 0
    assert node.answers() == "beta"
    shown = node.json("door")
    assert shown["points_at"] == node.json("status")["current_number"] and shown["holding"] == 0
    last = shown["last_switch"]
    assert last["refused"] == 0 and last["held"] > 0 and last["longest_hold_s"] > 0, last  # clients waited
    print(node.cli("door").stdout)


def test_without_the_door_the_same_loop_counts_refused_requests(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    clients = Clients(node.prod)
    clients.during(lambda: node.cli("switch", "beta", "--yes", check=True))
    assert clients.failed and clients.ok > 0, (clients.ok, clients.failed)
    assert node.json("door") is None  # no front door in the deployed revision


def test_a_request_held_past_the_bound_gets_503_with_retry_after(node: SimNode, door_image: str,
                                                                  free_port: Callable[[], int]) -> None:
    enable_door(node, door_image, free_port(), hold=1)
    node.cli("switch", "alpha", "--yes", check=True)
    node.cli("drain", check=True)  # the door holds; no stack is live behind it
    r = requests.get(f"http://127.0.0.1:{node.prod}/v1/models", timeout=60)
    assert r.status_code == 503 and r.headers.get("Retry-After") == "7", (r.status_code, r.headers)
    assert requests.get(f"http://127.0.0.1:{node.prod}/health", timeout=10).status_code == 503
    node.cli("restore", check=True)
    assert node.answers() == "alpha"


def test_dev_endpoints_are_refused_at_the_door_and_reachable_on_the_project_network(door_node: SimNode) -> None:
    node = door_node
    node.cli("switch", "alpha", "--yes", check=True)
    assert requests.get(f"http://127.0.0.1:{node.prod}/is_sleeping", timeout=10).status_code == 403
    assert requests.post(f"http://127.0.0.1:{node.prod}/sleep?level=1", timeout=10).status_code == 403
    # The door is on the host's network; a companion on the project network reaches vllm by its name.
    inside = docker("exec", node.containers("webui")[0], "wget", "-qO-", "http://vllm:8000/is_sleeping").stdout
    assert json.loads(inside) == {"is_sleeping": False}
    # The door's read-only route to its admin API: GET from loopback only; a config load is refused there.
    assert requests.get(f"http://127.0.0.1:{node.prod}/admin/config/admin/listen", timeout=10).json() == \
        "unix//tmp/door/admin.sock"
    assert requests.post(f"http://127.0.0.1:{node.prod}/admin/load", json={}, timeout=10).status_code == 403


def _stream(port: int, prompt: str = "The capital of France is", max_tokens: int = 24) -> list[str]:
    texts = []
    with requests.post(f"http://127.0.0.1:{port}/v1/completions", stream=True, timeout=60,
                       json={"model": "qwen3-30b-a3b-w4a16", "prompt": prompt,
                             "max_tokens": max_tokens, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                texts.append(json.loads(line[6:])["choices"][0]["text"])
    return texts


def test_an_sse_stream_through_the_door_has_the_same_chunks_in_the_same_order(door_node: SimNode) -> None:
    node = door_node
    node.cli("switch", "alpha", "--yes", check=True)
    cfg = yaml.safe_load(node.config.read_text())
    direct, through = _stream(cfg["door"]["probe_port"]), _stream(node.prod)
    assert len(through) > 3 and through == direct


def test_status_names_a_door_that_holds_while_the_current_revision_serves(door_node: SimNode) -> None:
    node = door_node
    node.cli("switch", "alpha", "--yes", check=True)
    docker("exec", door_container(node), "rm", "-f", "/tmp/door/gate")
    out = node.cli("status").stdout
    assert "door" in out and "b70deploy restore" in out, out
    node.cli("restore", check=True)
    assert node.answers() == "alpha"


def test_standby_where_vllm_cannot_sleep_falls_back_to_stop_first(door_node: SimNode) -> None:
    """standby: sleep on the sim's XPU node with vLLM 0.21 (no sleep mode on XPU before 0.23): the switch
    says so in one line and stops first; the container runs without --enable-sleep-mode, so it boots."""
    node = door_node
    cfg = yaml.safe_load(node.config.read_text())
    cfg["standby"] = "sleep"
    node.config.write_text(yaml.safe_dump(cfg))
    done = node.cli("switch", "alpha", "--yes", check=True)
    said = [ln for ln in (done.stdout + done.stderr).splitlines() if "standby-cannot-sleep" in ln]
    assert len(said) == 1 and "vLLM 0.21.1.dev17+g0a4756bb5 has no sleep mode on platform xpu" in said[0], said
    assert node.answers() == "alpha"
    box = json.loads(docker("inspect", node.containers("vllm")[0]).stdout)[0]
    assert "--enable-sleep-mode" not in " ".join(box["Config"]["Cmd"] or [])


def _set_hold(node: SimNode, seconds: float) -> None:
    cfg = yaml.safe_load(node.config.read_text())
    cfg["door"]["hold_seconds"] = seconds
    node.config.write_text(yaml.safe_dump(cfg))


def _running_hold(node: SimNode) -> str:
    """The hold bound of the config the door runs, asked of Caddy's admin API (the door's route to it)."""
    path = "config/apps/http/servers/door/routes/3/handle/0/load_balancing/try_duration"
    return str(requests.get(f"http://127.0.0.1:{node.prod}/admin/{path}", timeout=10).json())


def test_a_door_config_change_cuts_neither_a_stream_nor_a_held_request(door_node: SimNode) -> None:
    """The node's door settings change (hold_seconds) and `restore` gives the door its new config:
    loaded through the admin API in the same container, while a stream runs (every chunk arrives,
    the sim's own), and while a request is held (it is answered once the door releases it; the
    config loads after, since a reload would end a held request: render/door.py)."""
    node = door_node
    cfg = yaml.safe_load(node.config.read_text())
    # A stream of 240 tokens at 20 tokens/s takes ~12 s (the sim cycles its filler text to max_tokens for a
    # prompt it has no answer for), while the switch's smoke (its 40-token coherence probe) takes 2 s.
    cfg["stack_overlay"]["env"]["B70SIM_DECODE_TPS"] = "20"
    node.config.write_text(yaml.safe_dump(cfg))
    node.cli("switch", "alpha", "--yes", check=True)
    box = door_container(node)
    assert _running_hold(node) == "60s"
    streamed: dict[str, Any] = {}
    long = {"prompt": "Tell me about the river", "max_tokens": 240}
    # The sim's own chunks, asked of it directly at the same time as the door's stream.
    direct = threading.Thread(target=lambda: streamed.update(sims=_stream(cfg["door"]["probe_port"], **long)))
    reader = threading.Thread(target=lambda: streamed.update(chunks=_stream(node.prod, **long)))
    direct.start()
    reader.start()
    time.sleep(0.5)
    _set_hold(node, 45)
    restored: dict[str, Any] = {}
    restore = threading.Thread(target=lambda: restored.update(r=node.cli("restore")))
    restore.start()
    while _running_hold(node) != "45s":
        assert restore.is_alive(), "restore ended without loading the new config"
        time.sleep(0.1)
    assert reader.is_alive()  # the reload came while the stream ran
    restore.join(timeout=120)
    reader.join(timeout=60)
    direct.join(timeout=60)
    assert restored["r"].returncode == 0, restored["r"].stdout + restored["r"].stderr
    assert len(streamed["sims"]) > 5 and streamed["chunks"] == streamed["sims"]
    assert _running_hold(node) == "45s" and door_container(node) == box  # in place, not recreated

    node.cli("drain", check=True)  # the door holds; no stack is live behind it
    held: dict[str, Any] = {}

    def ask() -> None:
        r = requests.post(f"http://127.0.0.1:{node.prod}/v1/completions", timeout=120,
                          json={"model": "qwen3-30b-a3b-w4a16", "prompt": "The capital of France is", "max_tokens": 4})
        held.update(status=r.status_code, text=r.json()["choices"][0]["text"] if r.status_code == 200 else r.text)

    asker = threading.Thread(target=ask)
    asker.start()
    deadline = time.monotonic() + 10
    while node.json("door")["holding"] < 1:
        assert time.monotonic() < deadline, node.json("door")
        time.sleep(0.2)
    _set_hold(node, 50)
    node.cli("restore", check=True)
    asker.join(timeout=60)
    assert held["status"] == 200 and "Paris" in held["text"], held
    assert _running_hold(node) == "50s" and door_container(node) == box


def test_a_rollback_to_a_revision_made_without_the_door_is_refused_and_no_client_sees_an_error(
        node: SimNode, door_image: str, free_port: Callable[[], int]) -> None:
    """The door is the node's: revision 1 was made before the door was enabled (as an adopted one
    is); `rollback 1` refuses before anything stops, naming the fix, and the clients' loop through
    the door sees no connection error."""
    node.cli("switch", "alpha", "--yes", check=True)
    enable_door(node, door_image, free_port())
    node.cli("switch", "beta", "--yes", check=True)
    box = door_container(node)
    clients = Clients(node.prod)
    said: dict[str, Any] = {}

    def roll_back() -> None:
        clients.answered(10)  # the clients run through the door before the rollback
        said["r"] = node.cli("rollback", "1", "--yes")
        clients.answered(clients.ok + 10)  # and after it was refused

    clients.during(roll_back, n=4)
    r = said["r"]
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "made without the front door" in out and "nothing was stopped" in out, out
    assert "fix:" in out and "door.enabled: false" in out
    assert clients.failed == [] and clients.ok > 0, (clients.ok, clients.failed[:5])
    assert node.answers() == "beta" and door_container(node) == box
