"""`bench cycle STACK -- BENCH ARGS`: the report's whole benchmarking cycle as one command.

    drain -> verify -> up --dark STACK -> bench -> down --dark -> restore

under one deploy lock, so no switch starts production while the dark stack holds the GPU.
The dark stack is rendered and linted before anything stops. Whatever ends the middle part
(a failure, a bench that exits non-zero, Ctrl-C, SIGTERM), the dark stack is removed and
production restored, with further signals held until that is done (deploy/runner.py
`deferred_interrupts`): a drained node is never left behind.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config.node import Node
from ..deploy.runner import deferred_interrupts
from ..deploy.steps import restore
from ..docker.node import DockerNode
from ..errors import B70Error, OperationError, Terminated
from ..state.statedir import StateDir
from ..ui.progress import Reporter
from .dark import DarkDown, DarkUp
from .mutating import mutating
from .node_ops import Drain, Verify

Bench = Callable[[str], int]  # the dark stack's base URL -> the bench's exit code


@dataclass
class CycleResult:
    ok: bool
    stack: str
    summary: str                       # one line: how the cycle ended and what production does now
    exit_code: int = 0
    phase: str = ""                    # where it ended
    bench_exit: int | None = None
    restored: bool = False
    details: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "stack": self.stack, "summary": self.summary, "exit_code": self.exit_code,
                "phase": self.phase, "bench_exit": self.bench_exit, "restored": self.restored,
                "details": self.details}


@dataclass
class BenchCycle:
    node: Node
    stack: str
    bench: Bench
    verify_wait: float = 30.0
    timeout: float | None = None       # the dark stack's /health wait (node default)
    restore_timeout: float | None = None
    lock_wait: float = 0.0

    def plan(self) -> list[str]:
        """The phases, once the dark stack renders and lints and production has a deployment to
        restore; nothing on the node changes."""
        DarkUp(self.node, self.stack).plan()
        if not DockerNode.production(self.node).has_compose_file():
            raise OperationError(f"nothing deployed in {self.node.deploy_dir}: there is no production to drain "
                                 "and restore", fix="`b70deploy up STACK --dark` benches without a cycle")
        ports = self.node.config.ports
        return [f"drain: stop {' '.join(Drain(self.node).plan())}",
                f"verify: {Verify(self.node, self.verify_wait).plan()}",
                f"up --dark: {self.stack} on :{ports.dark} as project {self.node.dark_project}",
                "bench: against the dark stack",
                "down --dark: remove the dark stack",
                f"restore: production on :{ports.prod}, wait for /health (always, even after a failure or Ctrl-C)"]

    def run(self, reporter: Reporter) -> CycleResult:
        self.plan()  # bad input fails here, before the drain
        prod = DockerNode.production(self.node)
        drained = dark = False
        phase, bench_exit = "lock", None
        stopped: BaseException | None = None
        with mutating(self.node, f"bench cycle {self.stack}", wait=self.lock_wait) as m:
            def announce(name: str, detail: str) -> None:
                m.step(name)  # `status` names the phase of a cycle in progress
                reporter.phase(name, detail)

            def enter(name: str, detail: str) -> None:
                nonlocal phase
                phase = name  # where the cycle ends, if it ends here
                announce(name, detail)

            try:
                try:
                    enter("drain", f"stop {' '.join(Drain(self.node).plan())}")
                    drained = True  # before the stop: a stop cut short still needs the restore
                    prod.stop(Drain(self.node).plan())
                    enter("verify", f"up to {self.verify_wait:g} s")
                    idle, readings = Verify(self.node, self.verify_wait).run()
                    if not idle:
                        raise OperationError("node not idle after the drain: " + "; ".join(
                            f"{r.name}: {r.detail}" for r in readings if not r.ok),
                            fix="wait for clients, or --verify-wait")
                    enter("up --dark", self.stack)
                    dark = True  # a boot cut short leaves containers too
                    url = DarkUp(self.node, self.stack, timeout=self.timeout).run(reporter)  # under this lock
                    enter("bench", url)
                    bench_exit = self.bench(url)
                except (B70Error, KeyboardInterrupt) as e:
                    stopped = e
            finally:  # also when a signal lands between the two: the node is put back, then it acts
                details, restored, seen = self._put_back(prod, reporter, dark=dark, drained=drained, announce=announce)
            if stopped is None and seen:
                stopped = Terminated() if signal.SIGTERM in seen else KeyboardInterrupt()
            result = self._result(phase, bench_exit, stopped, drained, restored, details)
            m.ended("ok" if result.ok else "failed", summary=result.summary)
        return result

    def _put_back(self, prod: DockerNode, reporter: Reporter, *, dark: bool, drained: bool,
                  announce: Callable[[str, str], None]) -> tuple[list[str], bool, list[int]]:
        """down --dark, then restore: each tried whatever the other did; signals wait."""
        errors: list[str] = []
        restored = False
        with deferred_interrupts() as seen:
            if dark:
                announce("down --dark", self.node.dark_project)
                try:
                    DarkDown(self.node).run()
                except B70Error as e:
                    errors.append(f"down --dark failed: {e}")
            if drained:
                announce("restore", "production, wait for /health")
                try:
                    restore(prod, reporter, companions=self.node.companions,
                            timeout=self.restore_timeout or self.node.config.timeouts.restore,
                            revision=StateDir(self.node.state_dir).revisions.current_number())
                    restored = True
                except B70Error as e:
                    errors.append(f"restore failed: {e}")
        if seen:
            reporter.info(f"signal {', '.join(map(str, seen))} during the restore: finished the restore first")
        return errors, restored, seen

    def _result(self, phase: str, bench_exit: int | None, stopped: BaseException | None, drained: bool,
                restored: bool, details: list[str]) -> CycleResult:
        if restored:
            prod = f"production restored and healthy on :{self.node.config.ports.prod}"
        else:
            prod = "production NOT restored; fix: b70deploy restore" if drained else "production untouched"
        code = 0
        if isinstance(stopped, KeyboardInterrupt):
            code = 143 if isinstance(stopped, Terminated) else 130
            head = f"interrupted ({'SIGTERM' if code == 143 else 'Ctrl-C'}) at {phase}"
        elif isinstance(stopped, B70Error):
            code = stopped.exit_code
            head = f"failed at {phase}: {stopped}"
        elif bench_exit:
            code = bench_exit
            head = f"bench exited {bench_exit}" + (" (interrupted)" if bench_exit == 130 else "")
        else:
            head = f"bench of {self.stack} done"
        if details and not code:
            code = 1
        return CycleResult(ok=code == 0, stack=self.stack, summary=f"{head}; {prod}", exit_code=code, phase=phase,
                           bench_exit=bench_exit, restored=restored, details=details)
