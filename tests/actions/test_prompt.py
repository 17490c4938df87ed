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

import pytest
import simkit
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
