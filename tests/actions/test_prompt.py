"""The switch's question on a real terminal (a pty): it reads `[y/N]` (the live status line
once drew over it, and rich took "[y/N]" for markup and dropped it), and a "no" is audited as
declined, with nothing changed on the node."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest
import simkit
import yaml
from kit.simnode import SimNode

pytestmark = pytest.mark.docker


def _read_until(fd: int, wanted: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while wanted not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
    return seen


def test_the_prompt_says_y_n_and_a_no_is_audited_as_declined(node: SimNode) -> None:
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([*simkit.CLI, "switch", "alpha"], stdin=terminal, stdout=terminal, stderr=terminal,
                            env=simkit.cli_env(node.config), close_fds=True)
    os.close(terminal)
    try:
        shown = _read_until(controller, b"[y/N]: ", 120)
        assert b"switch to alpha? [y/N]: " in shown, shown[-500:]
        os.write(controller, b"n\n")
        rest = _read_until(controller, b"nothing changed", 30)
        assert proc.wait(30) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(controller)
    assert b"declined at the prompt; nothing changed" in rest, rest
    last = json.loads((node.state / "audit.log").read_text().splitlines()[-1])
    assert last["command"] == "switch alpha" and last["outcome"] == "declined", last
    assert node.containers("vllm") == [] and not (node.deploy / "docker-compose.yml").exists()


def test_the_prompt_waits_without_holding_the_deploy_lock(node: SimNode) -> None:
    """Issue 39, point 6: the trial's prompt held the lock for 12 minutes. While it waits, `status` names no
    lock and another command could run; a "no" is still audited as declined."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([*simkit.CLI, "switch", "alpha"], stdin=terminal, stdout=terminal, stderr=terminal,
                            env=simkit.cli_env(node.config), close_fds=True)
    os.close(terminal)
    try:
        shown = _read_until(controller, b"[y/N]: ", 120)
        assert b"switch to alpha? [y/N]: " in shown, shown[-500:]
        status = json.loads(node.cli("status", "--json", check=True).stdout)
        assert status["lock"] is None, status["lock"]
        os.write(controller, b"n\n")
        _read_until(controller, b"nothing changed", 30)
        assert proc.wait(30) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(controller)
    last = json.loads((node.state / "audit.log").read_text().splitlines()[-1])
    assert last["command"] == "switch alpha" and last["outcome"] == "declined", last


def test_switch_json_warnings_rollback_dry_run_and_drain_yes(node: SimNode) -> None:
    """Issue 39, point 6: `switch --json` carries the lint warning in "warnings" (its word said once);
    `rollback --dry-run` says the target and its plan and changes nothing (asked of the node); `drain --yes`
    exists and drains."""
    stacks = Path(yaml.safe_load(node.config.read_text())["stacks_dir"])
    (stacks / "other.yaml").write_text(yaml.safe_dump({"extends": "alpha", "model_family": "qwen3-32b"}))
    node.cli("switch", "alpha", "--yes", check=True)
    done = node.cli("switch", "other", "--yes", "--json")
    assert done.returncode == 0, done.stderr
    warned = json.loads(done.stdout)["warnings"]
    assert any(w.startswith("other: [production-aliases] ") for w in warned), warned
    assert "warning [" not in done.stderr and "warning: warning" not in done.stderr, done.stderr
    preview = node.cli("rollback", "--dry-run")
    assert preview.returncode == 0, preview.stderr
    assert preview.stdout.startswith("rollback to revision 1 (alpha): plan (dry run, nothing changed)"), preview.stdout
    assert "activate" in preview.stdout and "-max-model-len" not in preview.stdout  # same alpha bytes, its steps
    assert node.answers() == "other"
    assert json.loads(node.cli("status", "--json", check=True).stdout)["current"]["number"] == 2
    drained = node.cli("drain", "--yes")
    assert drained.returncode == 0 and "node drained" in drained.stdout, drained.stderr
    assert node.containers("vllm") == []  # running ones: none
    node.cli("restore", check=True)
    assert node.answers() == "other"
