"""Hot standby in the rendered files (render/standby.py): a stack that may sleep renders vLLM's flag and
dev-mode variable; without the door it is refused in one line; where the image's vLLM cannot sleep on the
node's platform it renders without them, with a note."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kit.scratch import MINIMAL_STACK, Scratch
from simkit import run_cli

from b70deploy.actions.prepare import prepare
from b70deploy.config.node import load_node
from b70deploy.errors import UserError
from b70deploy.render.files import COMPOSE_FILE
from b70deploy.render.standby import can_sleep
from b70deploy.sim.server import sleep_mode_available

DOOR = {"door": {"enabled": True}}


def _vllm(files: dict[str, bytes]) -> dict[str, Any]:
    svc: dict[str, Any] = yaml.safe_load(files[COMPOSE_FILE])["services"]["vllm"]
    return svc


def test_a_stack_that_may_sleep_renders_the_flag_and_dev_mode(scratch: Scratch) -> None:
    scratch.write_stack("s", {**MINIMAL_STACK, "standby": "sleep"})
    scratch.write_stack("plain", MINIMAL_STACK)
    node = load_node(str(scratch.write_config({**DOOR, "platform": "cpu"})))
    scratch.write_config({**DOOR, "platform": "cuda"})
    cuda = load_node(str(scratch.config))
    r = prepare(cuda, "s").rendered
    svc = _vllm(r.files)
    assert svc["command"][-1] == "--enable-sleep-mode" and svc["environment"]["VLLM_SERVER_DEV_MODE"] == "1"
    plain_files = prepare(cuda, "plain").rendered.files
    plain = _vllm(plain_files)
    assert "--enable-sleep-mode" not in plain["command"] and "VLLM_SERVER_DEV_MODE" not in plain.get("environment", {})
    # The door: in the project network in front of a stack that sleeps (its standby slots take the service's
    # name in turn), on the host's network in front of one that does not (render/door.py)
    assert b"network_mode: host" not in r.files[COMPOSE_FILE] and b"DOOR_VLLM_ADDRESS" not in r.files[".env"]
    assert b"network_mode: host" in plain_files[COMPOSE_FILE] and b"DOOR_VLLM_ADDRESS" in plain_files[".env"]
    # CPU: vLLM never sleeps there; rendered without, and the note says the switch stops first
    r = prepare(node, "s").rendered
    assert "--enable-sleep-mode" not in _vllm(r.files)["command"]
    [note] = [n for n in r.notes if n.startswith("standby:")]
    assert "platform cpu" in note and "stops the live stack first" in note and "\n" not in note


def test_node_standby_applies_to_its_stacks_and_a_stack_may_turn_it_off(scratch: Scratch) -> None:
    scratch.write_stack("plain", MINIMAL_STACK)
    scratch.write_stack("off", {**MINIMAL_STACK, "standby": "off"})
    node = load_node(str(scratch.write_config({**DOOR, "platform": "rocm", "standby": {"mode": "sleep", "level": 1}})))
    assert "--enable-sleep-mode" in _vllm(prepare(node, "plain").rendered.files)["command"]
    assert "--enable-sleep-mode" not in _vllm(prepare(node, "off").rendered.files)["command"]


def test_node_standby_without_the_door_is_refused_in_one_line(scratch: Scratch) -> None:
    path = scratch.write_config({"standby": "sleep"})
    with pytest.raises(UserError) as caught:
        load_node(str(path)).config  # noqa: B018
    line = str(caught.value)
    assert str(path) in line and "standby" in line and "fix: set door.enabled: true" in line and "\n" not in line
    scratch.write_stack("plain", MINIMAL_STACK)
    res = run_cli(None, "--config", str(path), "render", "plain", "--no-docker", in_process=True)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "door.enabled" in res.stderr and "Traceback" not in res.stderr


def test_stack_standby_without_the_door_is_refused_in_one_line(scratch: Scratch) -> None:
    scratch.write_stack("s", {**MINIMAL_STACK, "standby": "sleep"})
    res = run_cli(None, "--config", str(scratch.config), "render", "s", "--no-docker", in_process=True)
    assert res.returncode == 2, res.stderr
    [line] = res.stderr.strip().splitlines()
    assert "stack s: standby" in line and f"set door.enabled: true in {scratch.config}" in line


@pytest.mark.parametrize("bad", ["on", "nap", 3])
def test_bad_standby_values(scratch: Scratch, bad: Any) -> None:
    path = scratch.write_config({**DOOR, "standby": bad})
    with pytest.raises(UserError) as caught:
        load_node(str(path)).config  # noqa: B018
    assert "standby" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("platform", ["cuda", "rocm", "xpu", "cpu"])
@pytest.mark.parametrize("version", ["0.21.0", "0.21.1.dev17+g0a4756bb5", "0.22.0", "0.23.0", "0.32.0"])
def test_the_render_rule_is_the_sims(platform: str, version: str) -> None:
    """One rule, vLLM's: the render's answer and the sim's (which imitates vLLM) agree everywhere."""
    assert can_sleep(platform, version) is sleep_mode_available(platform, version)
