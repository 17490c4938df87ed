"""Dark mode: a stack on the dark port under its own compose project, for benchmarking
while production is drained. Never touches the deploy dir, revisions or current pointer."""

from __future__ import annotations

from pathlib import Path

from ..config.node import Node
from ..deploy import health
from ..deploy.steps import VLLM, write_deploy_files
from ..docker import proc
from ..docker.compose import Compose
from ..errors import OperationError, UserError
from ..render.files import COMPOSE_FILE
from ..ui.progress import Reporter
from ..vllmlog.diagnosis import diagnose
from .checks import ensure_draft
from .prepare import prepare_deploy


def dark_dir(node: Node) -> Path:
    return node.state_dir / "dark"


def up(node: Node, name: str, reporter: Reporter, *, timeout: float | None = None) -> str:
    port = node.config.ports.dark
    reporter.phase("preflight", "render with patches, lint")
    ready = prepare_deploy(node, name, port=port, project=node.dark_project)
    errors = [f for f in ready.findings if f.severity == "error"]
    if errors:
        raise UserError(f"lint found {len(errors)} error(s): " + "; ".join(f.one_line() for f in errors),
                        fix=f"`b70deploy lint {name}` explains each")
    ensure_draft(node, ready.stack, reporter)
    files = ready.files
    where = dark_dir(node)
    write_deploy_files(where, files)
    compose = Compose(where, node.dark_project)
    reporter.phase("up", f"{name} on port {port} as project {node.dark_project}")
    proc.run(compose.up([VLLM]), timeout=300)
    result = health.wait_healthy(project=node.dark_project, service=VLLM,
                                 health_url=f"http://{node.address}:{port}/health",
                                 timeout=timeout or node.config.timeouts.health,
                                 max_interval=node.config.timeouts.poll_interval, reporter=reporter,
                                 diagnose=diagnose)
    if not result.healthy:
        tail = "\n".join(f"  | {line}" for line in result.tail(10))
        raise OperationError(f"dark {name} did not become healthy: {result.reason}"
                             + (f"; {result.finding.one_line()}" if result.finding else "") + f"\n{tail}")
    return f"http://{node.address}:{port}"


def down(node: Node) -> bool:
    where = dark_dir(node)
    if not (where / COMPOSE_FILE).is_file():
        return False
    proc.run(Compose(where, node.dark_project).down(), timeout=120)
    return True
