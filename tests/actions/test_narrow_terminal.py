"""Issue 39, point 3: on a terminal of 80 columns (a pty, COLUMNS=80) history, status, stacks and lint --all
print no line over 80: history's header is whole on one line, cells are cut and the least important
columns left out (a note names them); the failure text is whole in `history N` and --json, as
status.json keeps it. Point 7 on the way: `docker compose config --services` run by hand in the deploy
dir lists the rendered services (no profile hides them)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import termios

import pytest
import simkit
from kit.simnode import SimNode

pytestmark = pytest.mark.docker


def narrow(node: SimNode, *args: str) -> tuple[int, list[str], str]:
    """`b70deploy ARGS` with stdout on an 80-column terminal: its exit code, stdout's lines, stderr."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen([*simkit.CLI, *args], stdout=terminal, stderr=subprocess.PIPE, text=True,
                            env={**simkit.cli_env(node.config), "COLUMNS": "80"}, close_fds=True)
    os.close(terminal)
    seen = b""
    try:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(controller)
    return proc.returncode, seen.decode().replace("\r\n", "\n").splitlines(), err


def test_history_status_stacks_and_lint_fit_80_columns(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", "-m", "first deploy: W4A16 + fp8 KV at 131K, a message long enough to "
             "need cutting at eighty columns", check=True)
    # Point 7: no profile hides the rendered services from `docker compose` run by hand in the deploy dir.
    services = subprocess.run(["docker", "compose", "config", "--services"], cwd=node.deploy, capture_output=True,
                              text=True, timeout=60, check=True).stdout.split()
    assert "vllm" in services and len(services) >= 2, services  # vllm and its companion
    failed = node.cli("switch", "crash", "--yes")
    assert failed.returncode == 1, failed.stderr
    shown = {}
    for args in (("history",), ("status",), ("stacks",), ("lint", "--all")):
        code, lines, err = narrow(node, *args)
        assert code in (0, 2), err  # lint exits 2 on a stack with errors
        assert lines and not [line for line in lines if len(line) > 80], (args, lines)
        shown[args[0]] = (lines, err)
    header, *rows = shown["history"][0]
    assert header.split()[:2] == ["rev", "stack"] and "why it failed" in header, header
    assert len(rows) == 2 and rows[1].split()[:2] == ["2", "crash"], rows  # one line per revision
    assert " failed " in rows[1] and " ".join(node.json("history", "2")["created"][:16].split("T")) in rows[1]
    assert len(rows[1].split("  ")[-1]) >= 20, rows  # why it failed has room
    assert "left out at 80 columns:" in shown["history"][1]
    whole = json.loads(node.cli("history", "2", "--json", check=True).stdout)["failure"]
    status = json.loads((node.state / "revisions" / "000002" / "status.json").read_text())
    stored = status["failure"]
    assert whole == stored and len(whole) > 80
    listed = json.loads(node.cli("history", "--json", check=True).stdout)
    assert next(r for r in listed if r["number"] == 2)["failure"] == (status["diagnosis"] or stored)
    code, one, _ = narrow(node, "history", "2")
    assert code == 0 and all(len(line) <= 80 for line in one) and any(line.startswith("failure:") for line in one)
    assert " ".join(" ".join(one).split()).count(" ".join(stored.split()[:6])) == 1
