"""The post's node_dark procedure: drain, verify, restore (restore is not a rollback)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config.node import Node
from ..deploy.companions import kept_running
from ..deploy.deploydir import read_deployed
from ..deploy.nodeio import Reading
from ..deploy.steps import restore
from ..docker.node import DockerNode
from ..docker.verify import load_bound
from ..errors import OperationError
from ..state.statedir import StateDir
from ..ui.progress import Reporter
from .mutating import mutating


@dataclass
class Drain:
    node: Node
    lock_wait: float = 0.0

    def plan(self) -> list[str]:
        """The services the drain stops: vllm and its companions but the ones a switch's drain keeps running
        too (deploy/companions.py: a backing service that cannot reach vllm)."""
        live = read_deployed(self.node.deploy_dir, self.node.compose_files)
        kept = kept_running(live, live or None, compose_files=self.node.compose_files, vllm=self.node.service,
                            companions=self.node.companions)
        return [self.node.service, *(c for c in self.node.companions if c not in kept)]

    def run(self, reporter: Reporter) -> list[str]:
        io = DockerNode.production(self.node)
        if not io.has_compose_file():
            raise OperationError(f"nothing deployed in {self.node.deploy_dir}; nothing to drain",
                                 fix="`b70deploy switch STACK` deploys one")
        services = self.plan()
        with mutating(self.node, "drain", wait=self.lock_wait) as m:
            reporter.phase("drain", f"stop {' '.join(services)}")
            io.door_close()  # a front door holds new requests meanwhile (`restore` releases them)
            io.stop(services)
            m.ended("ok", services=services)
        return services


@dataclass
class Verify:
    node: Node
    wait: float = 0.0

    def plan(self) -> str:
        cfg = self.node.config
        return (f"read the socket table for :{cfg.ports.prod}, {len(cfg.feeders)} feeder(s) and the load "
                f"(threshold {load_bound(cfg.load_threshold):g}) for up to {self.wait:g} s")

    def run(self) -> tuple[bool, list[Reading]]:
        """Readings until the node is idle or `wait` seconds pass; (idle, last readings)."""
        io = DockerNode.production(self.node)
        deadline = io.monotonic() + self.wait
        while True:
            got = io.idle_readings()
            if all(r.ok for r in got) or io.monotonic() >= deadline:
                return all(r.ok for r in got), got
            io.sleep(1.0)


@dataclass
class Restore:
    node: Node
    timeout: float | None = None
    lock_wait: float = 0.0

    def plan(self) -> str:
        then = ", ".join(self.node.companions) or "-"
        return f"start the current revision's {self.node.service}, wait for /health, then {then}"

    def run(self, reporter: Reporter) -> float:
        with mutating(self.node, "restore", wait=self.lock_wait) as m:
            reporter.phase("restore", "start the current revision and wait for /health")
            result = restore(DockerNode.production(self.node), reporter, companions=self.node.companions,
                             timeout=self.timeout or self.node.config.timeouts.restore,
                             revision=StateDir(self.node.state_dir).revisions.current_number())
            m.ended("ok", seconds=round(result.elapsed, 2))
        return result.elapsed
