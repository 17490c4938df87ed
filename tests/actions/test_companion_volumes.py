"""Companion volumes on the real engine with the sim image (issue 11 item 4): the open-webui
stand-in keeps webui.db in a named volume and in a bind; a switch, a drain/restore and a
rollback later, the data it made first is still there."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from kit.simnode import SimNode, docker

pytestmark = pytest.mark.docker


def webui_db(node: SimNode) -> list[str]:
    """webui.db as the running companion reads it from its named volume."""
    ids = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={node.project}",
                 "--filter", "label=com.docker.compose.service=webui").stdout.split()
    assert len(ids) == 1, ids
    # A companion that compose just (re)started may not have written its start line yet: wait
    # for a line at or after the container's own start (one clock: the host's).
    stamp = docker("inspect", "-f", "{{.State.StartedAt}}", ids[0]).stdout.strip()  # RFC 3339, UTC, ns
    since = datetime.fromisoformat(stamp[:19]).replace(tzinfo=UTC).timestamp() - 1.0
    deadline = time.monotonic() + 15
    while True:
        lines = docker("exec", ids[0], "cat", "/app/backend/data/webui.db", check=False).stdout.splitlines()
        if (lines and float(lines[-1].split()[1]) >= since) or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def test_companion_data_survives_switch_drain_restore_and_rollback(node: SimNode, tmp_path: Path) -> None:
    volume = f"{node.project}-webui"
    bind = tmp_path / "webui-bind"  # not made here: the bind creates it, as `docker run -v` would
    cfg = yaml.safe_load(node.config.read_text())
    cfg["companions"] = [{"name": "webui", "image": node.tags["bash-c"],
                          "command": ["sim-webui", "--port", "8080", "--data", "/app/backend/data", "--data", "/bind"],
                          "volumes": [f"{volume}:/app/backend/data", f"{bind}:/bind"]}]
    node.config.write_text(yaml.safe_dump(cfg))

    node.cli("switch", "alpha", "--yes", check=True)
    first = webui_db(node)
    assert first[0].startswith("created ") and len(first) == 2
    made_in_bind = (bind / "webui.db").read_text().splitlines()[0]

    node.cli("switch", "beta", "--yes", check=True)
    node.cli("drain", check=True)
    node.cli("restore", check=True)
    r = node.cli("rollback", "--yes", check=True)
    assert "node on revision 3 (alpha)" in r.stdout

    now = webui_db(node)
    assert now[0] == first[0], "the named volume lost the companion's data"
    assert len([line for line in now if line.startswith("start ")]) == 4  # alpha, beta, restore, rollback
    assert (bind / "webui.db").read_text().splitlines()[0] == made_in_bind
    # The engine keeps the volume under the name the operator wrote, not a project-prefixed one.
    assert docker("volume", "inspect", "-f", "{{.Name}}", volume).stdout.strip() == volume
