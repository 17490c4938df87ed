"""`watch --unit`: a systemd unit that keeps `b70deploy watch` running for this node."""

from __future__ import annotations

import shlex
import sys

from ..config.node import Node


def unit_text(node: Node) -> str:
    argv = [sys.executable, "-m", "b70deploy.cli"]
    if node.source is not None:
        argv += ["--config", str(node.source.resolve())]
    if node.name is not None:
        argv += ["--node", node.name]
    argv.append("watch")
    # SIGTERM interrupts a rollback in flight like Ctrl-C: the runner undoes it, which may take
    # a boot of the previous stack, so systemd waits that long before it kills.
    stop_seconds = int(node.config.timeouts.rollback) + 60
    return "\n".join([
        "[Unit]",
        f"Description=b70deploy watch of {node.label} (project {node.project}): bake window, rollback, alerts",
        "After=docker.service network-online.target",
        "Wants=docker.service network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={shlex.join(argv)}",
        "Environment=PYTHONUNBUFFERED=1",
        "Restart=on-failure",
        "RestartSec=10",
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={stop_seconds}",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])
