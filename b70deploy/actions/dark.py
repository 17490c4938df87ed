"""Dark mode: a stack on the dark port under its own compose project, for benchmarking
while production is drained. Never touches the deploy dir, revisions or current pointer.

Only one vLLM fits on the GPU: `up --dark` takes the deploy lock (no switch starts
production under it) and refuses while production's vllm container runs, unless forced."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config.node import Node
from ..docker.node import DockerNode
from ..errors import OperationError, UserError
from ..ui.progress import Reporter
from ..vllmlog.diagnosis import for_stack
from .mutating import mutating
from .prepare import Deployable, prepare_deploy


def dark_dir(node: Node) -> Path:
    return node.state_dir / "dark"


HOLDS_GPU = ("running", "restarting")


@dataclass
class DarkUp:
    node: Node
    stack: str
    timeout: float | None = None
    force: bool = False   # the operator knows both fit (e.g. a small model), or production is elsewhere
    lock_wait: float = 0.0

    @property
    def io(self) -> DockerNode:
        return DockerNode.dark(self.node, dark_dir(self.node))

    def plan(self) -> Deployable:
        """The stack rendered for the dark port and project, patched and linted."""
        ready = prepare_deploy(self.node, self.stack, port=self.node.config.ports.dark,
                               project=self.node.dark_project)
        errors = [f for f in ready.findings if f.severity == "error"]
        if errors:
            raise UserError(f"lint found {len(errors)} error(s) in {self.stack}: "
                            + "; ".join(f"[{f.id}] {f.message}" for f in errors),
                            fix=f"`b70deploy lint {self.stack}` gives the fix for each")
        return ready

    def run(self, reporter: Reporter) -> str:
        """The dark URL, once healthy (inside bench cycle's lock when it runs this)."""
        with mutating(self.node, f"up --dark {self.stack}", wait=self.lock_wait):
            return self._up(reporter)

    def _up(self, reporter: Reporter) -> str:
        reporter.phase("preflight", "render with patches, lint, production drained")
        ready = self.plan()
        held = DockerNode.production(self.node).container_status()
        if held in HOLDS_GPU and not self.force:
            raise OperationError(f"production's vllm ({self.node.project}) is {held}: it holds the GPU, and only one "
                                 "vLLM fits; nothing was started",
                                 fix="`b70deploy drain` first (`b70deploy restore` after), or --force if both fit")
        if held in HOLDS_GPU:
            reporter.info(f"warning: production's vllm is {held}; starting the dark stack anyway (--force)")
        io = self.io
        done = io.ensure_draft(ready.stack)
        if done:
            reporter.info(done)
        io.write_deployed(ready.files)
        reporter.phase("up", f"{self.stack} on port {io.port} as project {io.project}")
        try:
            io.up([io.service])
        except OperationError as e:  # e.g. the dark port taken: no `Created` container is left behind
            io.discard(io.service)
            if "port is already allocated" in str(e) or "address already in use" in str(e):
                where = self.node.source or "the node config"
                raise OperationError(f"dark port {io.port} is taken: {e.what}",
                                     fix=f"set ports.dark in {where} to a free port (`ss -ltn` lists those in use)"
                                     ) from None
            raise
        result = io.wait_healthy(timeout=self.timeout or self.node.config.timeouts.health, reporter=reporter)
        result.finding = for_stack(result.finding, ready.stack)
        if not result.healthy:
            tail = "\n".join(f"  | {line}" for line in result.tail(10))
            raise OperationError(f"dark {self.stack} did not become healthy: {result.reason}"
                                 + (f"; {result.finding.one_line()}" if result.finding else "") + f"\n{tail}")
        return io.base_url


@dataclass
class DarkDown:
    node: Node

    def plan(self) -> bool:
        """Whether there is a dark stack to remove."""
        return DockerNode.dark(self.node, dark_dir(self.node)).has_compose_file()

    def run(self) -> bool:
        with mutating(self.node, "down --dark") as m:
            if not self.plan():
                m.ended("ok", summary="no dark stack")
                return False
            DockerNode.dark(self.node, dark_dir(self.node)).down()
            return True
