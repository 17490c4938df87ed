"""A stack's `compose:` keys merged into the rendered vllm service (render/passthrough.py): the
merged file passes the real `docker compose config`; a key b70deploy owns is refused in one line,
exit 2, nothing changed; the dark project leaves production's static addresses alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kit.scratch import Scratch
from simkit import run_cli

from b70deploy.config.compose_keys import OWNED
from b70deploy.config.node import load_node
from b70deploy.errors import UserError
from b70deploy.render import devices
from b70deploy.render.files import COMPOSE_FILE, render
from b70deploy.render.passthrough import merge
from b70deploy.state.fsio import write_tree

Config = Callable[[Path], dict[str, Any]]
BASE = {"image": "vllm/vllm-openai:v0.10.1", "entrypoint_style": "vllm-serve", "model": {"path": "Qwen/M"},
        "served_model_names": ["m"], "max_model_len": 4096}
PASSTHROUGH = {
    "ulimits": {"memlock": -1, "stack": 67108864}, "mem_limit": "48g", "pids_limit": 4096, "cap_drop": ["ALL"],
    "cap_add": ["SYS_NICE"], "security_opt": ["seccomp=unconfined"], "ipc": "private", "shm_size": "2g",
    "healthcheck": {"test": ["CMD", "curl", "-fsS", "http://localhost:8000/health"], "interval": "30s"},
    "expose": ["8000"], "environment": {"VLLM_CPU_KVCACHE_SPACE": "8", "PRICE": "$$5"},
    "networks": {"default": {"ipv4_address": "172.31.88.10"}},
}
NETWORKS = {"default": {"ipam": {"config": [{"subnet": "172.31.88.0/24"}]}}}


def _node(scratch: Scratch, **config: Any) -> None:
    (scratch.root / "models").mkdir(exist_ok=True)
    scratch.write_config(config)


@pytest.mark.docker
def test_merged_file_passes_compose_config_with_every_key(scratch: Scratch, compose: Config) -> None:
    waits = {"depends_on": {"vllm": {"condition": "service_healthy"}}, "cap_drop": ["ALL"]}
    _node(scratch, networks=NETWORKS, companions=[{"name": "proxy", "image": "caddy:2", "port": 8443,
                                                   "container_port": 443, "compose": waits}])
    scratch.write_stack("p", {**BASE, "compose": PASSTHROUGH})
    node = load_node(str(scratch.config))
    rendered = render(node.catalogue().load("p"), node, devices.scan(None))
    text = rendered.files[COMPOSE_FILE].decode()
    # Edited, not re-dumped: the comments and the label line other code reads stay.
    assert text.count('b70deploy.stack: "p"') == 1 and text.startswith("# Written by b70deploy")
    write_tree(scratch.root / "r", rendered.files)
    doc = compose(scratch.root / "r")
    vllm = doc["services"]["vllm"]
    assert vllm["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert vllm["mem_limit"] == str(48 * 2**30) and vllm["pids_limit"] == 4096
    assert vllm["cap_drop"] == ["ALL"] and vllm["cap_add"] == ["SYS_NICE"]
    assert vllm["security_opt"] == ["seccomp=unconfined"] and vllm["ipc"] == "private"
    assert vllm["shm_size"] == str(2 * 2**30) and vllm["expose"] == ["8000"]
    assert vllm["healthcheck"]["test"][-1] == "http://localhost:8000/health"
    assert vllm["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "8" and vllm["environment"]["PRICE"] == "$$5"
    assert vllm["networks"] == {"default": {"ipv4_address": "172.31.88.10"}}
    assert doc["networks"]["default"]["ipam"] == {"config": [{"subnet": "172.31.88.0/24"}]}
    # What b70deploy owns is still its own: the published port, the labels, the weights bind.
    assert vllm["labels"]["b70deploy.role"] == "vllm" and vllm["ports"][0]["target"] == 8000
    assert vllm["volumes"][0]["target"] == "/models"
    # A companion's passthrough: it waits on the vllm service's healthcheck.
    proxy = doc["services"]["proxy"]
    assert proxy["depends_on"]["vllm"]["condition"] == "service_healthy" and proxy["cap_drop"] == ["ALL"]


def test_lists_gain_mappings_merge_scalars_are_the_stacks() -> None:
    text = ('name: "b70"\nservices:\n  vllm:\n    image: "x"\n    environment:\n      A: "1"\n    devices:\n'
            '      - "/dev/dri:/dev/dri"\n    ipc: host\n    labels:\n      b70deploy.role: "vllm"\n'
            '  open-webui:\n    image: "y"\n')
    out, _ = merge(text, {"devices": ["/dev/kfd:/dev/kfd", "/dev/dri:/dev/dri"], "environment": ["B=2"],
                          "ipc": "private", "ulimits": {"memlock": -1}})
    assert out.splitlines()[:3] == ['name: "b70"', "services:", "  vllm:"]
    assert '    devices: ["/dev/dri:/dev/dri", "/dev/kfd:/dev/kfd"]' in out
    assert '    environment: {"A": "1", "B": "2"}' in out and '    ipc: "private"' in out
    assert out.endswith('    ulimits: {"memlock": -1}\n  open-webui:\n    image: "y"\n')
    with pytest.raises(UserError, match=r"compose\.environment\.A is '2', but b70deploy renders '1'"):
        merge(text, {"environment": {"A": "2"}})
    with pytest.raises(UserError, match=r"compose\.environment\.HF_TOKEN looks like a secret"):
        merge(text, {"environment": {"HF_TOKEN": "hf_x"}})


def test_the_dark_project_leaves_static_addresses_to_production() -> None:
    text = 'name: "b70-dark"\nservices:\n  vllm:\n    image: "x"\n'
    out, notes = merge(text, {"networks": {"default": {"ipv4_address": "172.31.88.10"}}}, networks=NETWORKS,
                       dark=True)
    assert '    networks: {"default": null}' in out and out.endswith('networks: {"default": {}}\n')
    assert "dark project" in notes[0]


def test_a_companion_key_said_by_its_own_key_is_refused(scratch: Scratch) -> None:
    scratch.write_config({"companions": [{"name": "proxy", "image": "caddy:2", "compose": {"ports": ["443:443"]}}]})
    result = run_cli(scratch.config, "render", "x", "--no-docker", in_process=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "companions[0].compose: compose.ports is a key b70deploy renders itself" in result.stderr
    assert "fix: set the companion's port: and container_port:" in result.stderr


@pytest.mark.parametrize("key", sorted(OWNED))
def test_a_key_b70deploy_owns_is_refused_exit_2_nothing_changed(scratch: Scratch, key: str) -> None:
    _node(scratch)
    scratch.write_stack("owned", {**BASE, "compose": {key: ["x"]}})
    before = {p: p.read_bytes() for p in scratch.root.rglob("*") if p.is_file()}
    for argv in (("render", "owned", "--no-docker"), ("switch", "owned", "--yes")):
        result = run_cli(scratch.config, *argv, in_process=True)
        assert result.returncode == 2, (argv, result.stdout, result.stderr)
        line = result.stderr.strip()
        assert "\n" not in line and f"compose.{key} is a key b70deploy renders itself" in line, line
        assert str(scratch.stacks / "owned.yaml") in line and line.endswith(f"; fix: {OWNED[key]}")
    after = {p: p.read_bytes() for p in scratch.root.rglob("*") if p.is_file()}
    # Only the lock and the node's settings cache may appear (as for any bad input): no revision,
    # journal, audit line or deploy file.
    assert {p: after[p] for p in before} == before
    assert {p.relative_to(scratch.root).as_posix() for p in set(after) - set(before)} <= \
        {"state/lock", "state/node-cache.json"}
    assert not (scratch.root / "deploy").exists()


def test_render_json_shows_the_merged_service(scratch: Scratch) -> None:
    _node(scratch)
    scratch.write_stack("p", {**BASE, "compose": {"pids_limit": 512}})
    result = run_cli(scratch.config, "render", "p", "--no-docker", in_process=True)
    assert result.returncode == 0, result.stderr
    assert "    pids_limit: 512" in result.stdout


def test_a_merged_key_takes_its_whole_comment_along() -> None:
    """Issue 39: the template's two-line comment above `environment` lost only its last line when the key was
    merged; its first line was left cut mid-sentence above `cap_add`. Both lines now stand above the merged key."""
    comment = ["    # Warm boots: this platform's compile caches of this image id (docs/warm-boots.md), and\n",
               "    # the GPU selection's visible-devices mask (docs/platforms.md).\n"]
    text = ('name: "b70"\nservices:\n  vllm:\n    image: "x"\n' + "".join(comment)
            + '    environment:\n      A: "1"\n    cap_add:\n      - "SYS_NICE"\n    ipc: host\n')
    out, _ = merge(text, {"environment": {"HF_HOME": "/hf"}})
    lines = out.splitlines(keepends=True)
    assert lines[4:] == ['    cap_add:\n', '      - "SYS_NICE"\n', "    ipc: host\n", *comment,
                         '    environment: {"A": "1", "HF_HOME": "/hf"}\n']


ROUTER = {"traefik.enable": "true", "traefik.http.routers.llm.rule": "Host(`llm.example.org`)",
          "traefik.http.middlewares.llm.basicauth.users": "${API_USERS}"}


@pytest.mark.docker
def test_the_operators_labels_are_rendered_beside_the_tools(scratch: Scratch, compose: Config) -> None:
    """Issue 33's promise: a switch keeps the labels the operator gave the vllm service and a companion
    (a Traefik router's), the basic-auth one as the `${VAR}` of the 0600 .env, and `b70deploy.*` stays the
    tool's, byte for byte; the real `docker compose config` reads them all."""
    _node(scratch, compose={"labels": ROUTER}, variables={"API_USERS": "admin:$apr1$xy"},
          secret_variables=["API_USERS"],
          companions=[{"name": "ui", "image": "caddy:2",
                       "compose": {"labels": ["traefik.http.routers.ui.rule=PathPrefix(`/`)"]}}])
    scratch.write_stack("p", BASE)
    node = load_node(str(scratch.config))
    rendered = render(node.catalogue().load("p"), node, devices.scan(None))
    text = rendered.files[COMPOSE_FILE].decode()
    assert text.count('      b70deploy.stack: "p"\n') == 1 and "admin:$apr1$xy" not in text
    assert rendered.files[".env"].decode().count("API_USERS='admin:$apr1$xy'") == 1
    assert "admin:$apr1$xy" not in rendered.masked(".env")
    write_tree(scratch.root / "r", rendered.files)
    doc = compose(scratch.root / "r")
    assert doc["services"]["vllm"]["labels"] == {**ROUTER, "b70deploy.stack": "p", "b70deploy.role": "vllm",
                                                 "traefik.http.middlewares.llm.basicauth.users": "admin:$$apr1$$xy"}
    assert doc["services"]["ui"]["labels"] == {"traefik.http.routers.ui.rule": "PathPrefix(`/`)",
                                               "b70deploy.role": "companion"}
    dark, notes = merge(text, {"labels": ROUTER}, dark=True)
    assert dark == text and any("labels left out" in n for n in notes)


@pytest.mark.parametrize(("where", "config"), [
    ("compose", {"compose": {"labels": {"b70deploy.stack": "mine"}}}),
    ("companions[0].compose", {"companions": [{"name": "ui", "image": "caddy:2",
                                                "compose": {"labels": ["b70deploy.role=proxy"]}}]}),
])
def test_a_label_in_the_tools_namespace_is_refused_in_one_line(scratch: Scratch, where: str,
                                                                config: dict[str, Any]) -> None:
    _node(scratch, **config)
    scratch.write_stack("p", BASE)
    result = run_cli(scratch.config, "render", "p", "--no-docker", in_process=True)
    line = result.stderr.strip()
    assert result.returncode == 2 and "\n" not in line, result.stderr
    assert str(scratch.config) in line and f"{where}: compose.labels.b70deploy." in line, line
    assert "b70deploy's own label namespace" in line and "fix: rename the label" in line


def test_a_secret_label_in_clear_is_refused_not_rendered(scratch: Scratch) -> None:
    _node(scratch, compose={"labels": {"traefik.http.middlewares.a.basicauth.users": "admin:$$apr1$$xy"}})
    scratch.write_stack("p", BASE)
    result = run_cli(scratch.config, "render", "p", "--no-docker", in_process=True)
    line = result.stderr.strip()
    assert result.returncode == 2 and "\n" not in line and "apr1" not in result.stdout + line, result.stderr
    assert "compose.labels.traefik.http.middlewares.a.basicauth.users holds a secret in clear" in line
