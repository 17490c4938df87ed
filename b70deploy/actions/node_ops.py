"""The post's node_dark procedure: drain, verify, restore (restore is not a rollback)."""

from __future__ import annotations

import time

from ..config.node import Node
from ..deploy.steps import VLLM, restore_services
from ..deploy.verify import Reading, readings, remote_readings
from ..docker import proc
from ..docker.compose import Compose
from ..errors import OperationError
from ..render.files import COMPOSE_FILE
from ..state.audit import AuditLog
from ..state.lock import DeployLock
from ..ui.progress import Reporter
from ..vllmlog.diagnosis import diagnose


def drain(node: Node, reporter: Reporter, *, lock_wait: float = 0.0) -> list[str]:
    if not (node.deploy_dir / COMPOSE_FILE).is_file():
        raise OperationError(f"nothing deployed in {node.deploy_dir}; nothing to drain")
    services = [VLLM, *(c.name for c in node.config.companions)]
    with DeployLock(node.state_dir, "drain", wait=lock_wait):
        reporter.phase("drain", f"compose stop {' '.join(services)}")
        proc.run(Compose(node.deploy_dir, node.project).stop(services), timeout=120)
    AuditLog(node.state_dir).record("drain", "ok", services=services)
    return services


def verify(node: Node, *, wait: float = 0.0) -> tuple[bool, list[Reading]]:
    """Readings until the node is idle or `wait` seconds pass; (idle, last readings)."""
    cfg = node.config
    deadline = time.monotonic() + wait
    while True:
        if node.on_this_host:
            got = readings(port=cfg.ports.prod, feeders=cfg.feeders, load_threshold=cfg.load_threshold)
        else:
            got = remote_readings(node.address, cfg.ports.prod)
        if all(r.ok for r in got) or time.monotonic() >= deadline:
            return all(r.ok for r in got), got
        time.sleep(1.0)


def restore(node: Node, reporter: Reporter, *, timeout: float | None = None, lock_wait: float = 0.0) -> float:
    with DeployLock(node.state_dir, "restore", wait=lock_wait):
        reporter.phase("restore", "start the current revision and wait for /health")
        result = restore_services(node, reporter, timeout=timeout or node.config.timeouts.restore,
                                  diagnose=diagnose)
    AuditLog(node.state_dir).record("restore", "ok", seconds=round(result.elapsed, 2))
    return result.elapsed
