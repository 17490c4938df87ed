"""The front door in the rendered files (render/door.py): the door service has the node's port,
vllm keeps a loopback port for the tool's probes, companions talk to the door; Caddy's config
forwards the client API, refuses the rest, holds for the bound. Through a real `docker compose
config`, so Compose reads the door's command and config exactly as written."""

from __future__ import annotations

import io
import ipaddress
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dotenv import dotenv_values
from kit.scratch import Scratch

from b70deploy.actions.prepare import prepare
from b70deploy.config.node import load_node
from b70deploy.config.schema import Door
from b70deploy.docker.door import hold_of
from b70deploy.errors import UserError
from b70deploy.render.door import (
    ADMIN,
    DEFAULT_IMAGE,
    DEV_ENDPOINTS,
    Where,
    caddy_config,
    config_text,
    digest_in,
    image_in,
    subnet,
    vllm_address,
    where_of,
)
from b70deploy.state.fsio import write_tree

WEBUI = {"name": "open-webui", "image": "ghcr.io/open-webui/open-webui:main", "port": 3000, "container_port": 8080}


@pytest.mark.docker
def test_the_door_has_the_nodes_port_and_vllm_a_loopback_one(scratch: Scratch,
                                                               compose: Callable[[Path], dict[str, Any]]) -> None:
    scratch.copy_shipped()
    node = load_node(str(scratch.write_config({"companions": [WEBUI], "door": {
        "enabled": True, "hold_seconds": 90, "retry_after": 11, "probe_port": 8012}})))
    r = prepare(node, "tq-256k").rendered
    write_tree(scratch.root / "deploy", r.files, {n: r.mode(n) for n in r.files})
    doc = compose(scratch.root / "deploy")
    door, vllm = doc["services"]["door"], doc["services"]["vllm"]
    assert door["image"] == DEFAULT_IMAGE == "b70deploy/door:caddy-2.11.7"
    assert door["labels"]["b70deploy.role"] == "door"
    assert image_in(r.files["docker-compose.yml"]) == DEFAULT_IMAGE
    assert door["labels"]["b70deploy.door"] == digest_in(r.files["docker-compose.yml"])
    # On the host's network, no published port: its config listens on the node's address and port.
    assert door["network_mode"] == "host" and "ports" not in door
    assert door["labels"]["b70deploy.door.local"] == "127.0.0.1:8000"
    assert (vllm["ports"][0]["host_ip"], vllm["ports"][0]["published"]) == ("127.0.0.1", "8012")
    # vllm keeps the project network (the companions' vllm:8000) and has a fixed address on the door's.
    net = subnet(node.config.door, node.project)
    assert net.prefixlen == 29 and net.subnet_of(ipaddress.IPv4Network("198.19.0.0/16"))
    assert vllm["networks"] == {"default": None, "b70door": {"ipv4_address": vllm_address(net)}}
    assert doc["networks"]["b70door"]["ipam"]["config"] == [{"subnet": str(net)}]
    assert "environment" not in doc["services"]["open-webui"]  # the operator points it, not the door
    # The config is the node's, loaded through the admin API: not in the revision's files.
    assert door["entrypoint"] == ["caddy", "run", "--resume"] and door["environment"] == {"CADDY_ADMIN": ADMIN}
    assert b"hold_seconds" not in r.files["docker-compose.yml"] and b"90s" not in r.files["docker-compose.yml"]
    env = {k: v or "" for k, v in dotenv_values(stream=io.StringIO(r.files[".env"].decode())).items()}
    where = where_of(env, r.files["docker-compose.yml"], "vllm")
    assert where == Where((":8000",), "127.0.0.1:8000", f"{vllm_address(net)}:8000")
    assert json.loads(config_text(node.config.door, where)) == caddy_config(hold_seconds=90, retry_after=11,
                                                                            where=where)


@pytest.mark.docker
def test_a_standby_node_keeps_the_door_on_the_project_network(scratch: Scratch,
                                                              compose: Callable[[Path], dict[str, Any]]) -> None:
    """Its slots take the service's name there in turn (docker/standby.py): the door dials the name."""
    scratch.copy_shipped()
    node = load_node(str(scratch.write_config({"door": {"enabled": True, "probe_port": 8012},
                                               "standby": {"mode": "sleep"}})))
    r = prepare(node, "tq-256k").rendered
    write_tree(scratch.root / "deploy", r.files, {n: r.mode(n) for n in r.files})
    doc = compose(scratch.root / "deploy")
    door = doc["services"]["door"]
    assert "network_mode" not in door and door["ports"][0]["published"] == "8000"
    assert "b70door" not in doc["networks"] and door["labels"]["b70deploy.door.local"] == "127.0.0.1:8080"
    assert b"DOOR_VLLM_ADDRESS" not in r.files[".env"]


@pytest.mark.docker
def test_an_operators_own_network_for_vllm_stays_and_the_doors_joins_it(
        scratch: Scratch, compose: Callable[[Path], dict[str, Any]]) -> None:
    """shelldandy/homelab's vllm (tests/fixtures/operators/shelldandy-homelab-vllm, commit 3a86dae) is on
    `networks: [backend]`, an external network, and not on the project's default one; `init` keeps both
    as Compose resolves them (actions/init.py `_node_wide`). Behind the host door vllm stays on `backend`
    alone, as written, and gains the door's network beside it."""
    scratch.copy_shipped()
    node = load_node(str(scratch.write_config({
        "door": {"enabled": True, "probe_port": 8012}, "compose": {"networks": {"backend": None}},
        "networks": {"backend": {"name": "backend", "external": True}}})))
    r = prepare(node, "tq-256k").rendered
    write_tree(scratch.root / "deploy", r.files, {n: r.mode(n) for n in r.files})
    doc = compose(scratch.root / "deploy")
    net = subnet(node.config.door, node.project)
    assert doc["services"]["vllm"]["networks"] == {"backend": None, "b70door": {"ipv4_address": vllm_address(net)}}
    assert (doc["networks"]["backend"]["name"], doc["networks"]["backend"]["external"]) == ("backend", True)
    assert doc["networks"]["b70door"]["ipam"]["config"] == [{"subnet": str(net)}]


def test_the_door_listens_where_the_node_says_and_its_subnet_is_the_nodes_when_set(scratch: Scratch) -> None:
    assert Where.host("10.1.2.3", 8000, "198.19.0.2").listen == ("10.1.2.3:8000", "127.0.0.1:8000")
    assert Where.host("127.0.0.1", 8000, "198.19.0.2").listen == ("127.0.0.1:8000",)
    assert Where.host("fd00::7", 8000, "198.19.0.2").listen == ("[fd00::7]:8000", "127.0.0.1:8000")
    node = load_node(str(scratch.write_config({"door": {"subnet": "198.19.200.8/29"}})))
    assert str(subnet(node.config.door, "any")) == "198.19.200.8/29"
    assert subnet(Door(), "b70-a") != subnet(Door(), "b70-b")
    for bad in ("198.19.200.9/29", "198.19.200.8/30", "nope"):
        with pytest.raises(UserError) as caught:
            load_node(str(scratch.write_config({"door": {"subnet": bad}}))).config  # noqa: B018
        assert "door.subnet" in str(caught.value) and "fix:" in str(caught.value)


def test_a_door_key_means_the_door_is_on(scratch: Scratch) -> None:
    """`door: {}` (or a bare `door:`) is the door with its defaults; `enabled: false` turns it off."""
    assert load_node(str(scratch.write_config({"door": {}}))).config.door.enabled
    assert load_node(str(scratch.write_config({"door": None}))).config.door.enabled
    assert load_node(str(scratch.write_config({"door": {"hold_seconds": 30}}))).config.door.enabled
    assert not load_node(str(scratch.write_config({"door": {"enabled": False}}))).config.door.enabled
    assert not load_node(str(scratch.write_config({}))).config.door.enabled


def test_a_dark_stack_has_no_door_and_a_door_off_node_none(scratch: Scratch) -> None:
    scratch.copy_shipped()
    node = load_node(str(scratch.write_config({"door": {"enabled": True}})))
    dark = prepare(node, "tq-256k", port=node.config.ports.dark, project="b70-dark").rendered
    assert b"\n  door:\n" not in dark.files["docker-compose.yml"] and b"DOOR_PORT" not in dark.files[".env"]
    off = load_node(str(scratch.write_config({})))
    assert image_in(prepare(off, "tq-256k").rendered.files["docker-compose.yml"]) is None


def test_the_probe_port_may_not_be_the_prod_port(scratch: Scratch) -> None:
    with pytest.raises(UserError) as caught:
        load_node(str(scratch.write_config({"door": {"enabled": True, "probe_port": 8000}}))).config  # noqa: B018
    line = str(caught.value)
    assert "door.probe_port 8000" in line and "fix:" in line and "\n" not in line


def test_caddy_config_forwards_the_api_refuses_the_rest_and_holds_for_the_bound() -> None:
    servers = caddy_config(hold_seconds=180, retry_after=30)["apps"]["http"]["servers"]
    assert list(servers) == ["door"]  # one server, one hop
    routes = servers["door"]["routes"]
    assert routes[0]["match"] == [{"path": ["/gate"], "remote_ip": {"ranges": ["127.0.0.1/32"]}}]
    admin = routes.pop(1)  # the tool's reads of the admin API: GET only, from loopback, to its socket
    assert admin["match"] == [{"path": ["/admin/*"], "method": ["GET"], "remote_ip": {"ranges": ["127.0.0.1/32"]}}]
    assert admin["handle"][-1]["upstreams"] == [{"dial": "unix//tmp/door/admin.sock"}]
    assert routes[1]["match"] == [{"path": ["/health"]}] and "load_balancing" not in routes[1]["handle"][0]
    assert routes[2]["match"] == [{"path": ["/v1/*", "/health", "/metrics", "/version"]}]
    held = routes[2]["handle"][0]
    assert held["upstreams"] == [{"dial": "vllm:8000"}]
    assert held["load_balancing"] == {"try_duration": "180s", "try_interval": "20ms"} and held["flush_interval"] == -1
    assert held["transport"]["keep_alive"] == {"enabled": True, "idle_timeout": "2s"}
    standby = caddy_config(hold_seconds=180, retry_after=30, keep_alive=False)["apps"]["http"]["servers"]["door"]
    assert standby["routes"][3]["handle"][0]["transport"]["keep_alive"] == {"enabled": False}
    assert routes[3] == {"handle": [{"handler": "static_response", "status_code": 403,
                                     "body": "not served through the door\n"}]}
    assert not any(p.startswith(d) for d in DEV_ENDPOINTS for p in routes[2]["match"][0]["path"])
    busy = servers["door"]["errors"]["routes"][0]["handle"][0]
    assert busy["status_code"] == 503 and busy["headers"] == {"Retry-After": ["30"]}


def _line(uri: str, arrived: float, took: float, status: int = 200) -> str:
    return json.dumps({"ts": arrived + took, "duration": took, "status": status, "request": {"uri": uri}})


def test_the_last_hold_counts_requests_that_arrived_while_the_gate_was_closed() -> None:
    lines = [_line("/v1/completions", 99.0, 0.5),         # before the window: not held
             _line("/v1/completions", 100.5, 4.0),        # held 3.5 s, then served
             _line("/v1/chat/completions", 101.0, 3.2),   # held 3 s
             _line("/v1/models", 102.0, 180.0, 503),      # past the bound
             _line("/health", 101.0, 0.001, 503),         # a router's probe: not a held request
             "not json", _line("/v1/completions", 104.0, 0.2)]
    got = hold_of(lines, 100.0, 104.0)
    assert (got.held, got.refused, got.longest, got.seconds) == (3, 1, 3.5, 4.0)


def test_a_door_needs_the_tool_on_the_nodes_host(scratch: Scratch) -> None:
    with pytest.raises(UserError) as caught:
        load_node(str(scratch.write_config({"address": "192.168.0.7", "door": {"enabled": True}}))).config  # noqa: B018
    line = str(caught.value)
    assert "address 192.168.0.7" in line and "fix: run b70deploy on the node" in line and "\n" not in line
