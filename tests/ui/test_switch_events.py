"""A switch tells the receivers it started and how it ended, with the diagnosis of a failed
boot, on the real engine with the sim."""

from __future__ import annotations

import pytest
from watch.conftest import Watched

pytestmark = pytest.mark.docker


def test_a_failed_switch_sends_rolled_back_with_its_diagnosis(watched: Watched) -> None:
    w, node = watched, watched.node
    node.cli("switch", "alpha", "--yes", check=True)
    r = node.cli("switch", "crash", "--yes")
    assert r.returncode == 1 and "node back on revision 1" in r.stdout
    body = w.hooks.wait_for("switch.rolled-back", timeout=10)  # sent before the command ended
    assert w.hooks.events() == ["switch.started", "switch.succeeded", "switch.started", "switch.rolled-back"]
    assert body["stack"] == "crash" and body["revision"] == 2 and body["logs"] == "b70deploy logs 2"
    assert "node back on revision 1 (alpha)" in body["outcome"]
    assert "Marlin" in body["diagnosis"] and "fix:" in body["diagnosis"]
    assert body["node"] == node.project and body["time"]
