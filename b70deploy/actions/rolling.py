"""switch/rollback/status over an inventory: batch by batch, each node through the
single-node state machine (its lock, journal, health and smoke gate, automatic rollback).

Every node is prepared first (render, lint, image checks on its own engine), so bad input
stops the run before any node is drained. The nodes of a batch run at once, one thread each,
each thread pointed at its node's engine (endpoint.use); the next batch starts only when the
whole batch is back in the pool. The first failure stops the rollout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from ..config.node import Node
from ..deploy.rollout import NodePlan, Plan, expected_from
from ..deploy.steps import Deployment
from ..docker import endpoint
from ..errors import B70Error, UserError
from ..state.revisions import RevisionStore
from ..ui.progress import Reporter
from .switch import Options, Outcome, execute

State = Literal["switched", "rolled-back", "failed", "untouched", "reverted", "revert-failed"]


class NodeReporter:
    """Lines of one node's run, prefixed with its name, into a shared reporter."""

    def __init__(self, parent: Reporter, name: str) -> None:
        self.parent = parent
        self.name = name

    def phase(self, name: str, detail: str = "") -> None:
        self.parent.info(f"[{self.name}] {name}{': ' + detail if detail else ''}")

    def info(self, message: str) -> None:
        self.parent.info(f"[{self.name}] {message}")

    def log_line(self, line: str) -> None:
        pass  # a boot log per node interleaved is noise; failed boots keep theirs in the revision

    def tick(self, status: str) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class NodeResult:
    name: str
    state: State
    summary: str
    revision: int | None = None
    seconds: float = 0.0
    details: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.name, "state": self.state, "summary": self.summary, "revision": self.revision,
                "seconds": round(self.seconds, 2), "details": self.details}


@dataclass
class RollingOutcome:
    ok: bool
    plan: Plan
    results: list[NodeResult]
    summary: str
    exit_code: int = 0
    min_in_pool: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "summary": self.summary, "exit_code": self.exit_code, "plan": self.plan.to_dict(),
                "nodes": [r.to_dict() for r in self.results]}


Build = Callable[[Node, Reporter], Deployment]


def prepare(nodes: list[Node], build: Build, reporter: Reporter) -> list[Deployment]:
    """Each node's deployment, built against its own engine; nothing on any node changes."""
    out = []
    for node in nodes:
        with endpoint.use(node.docker_env):
            try:
                out.append(build(node, NodeReporter(reporter, node.label)))
            except UserError as e:
                raise UserError(f"node {node.label}: {e}") from None
    return out


def node_plan(d: Deployment) -> NodePlan:
    node = d.node
    cur = RevisionStore(node.state_dir).current()
    last = None
    if cur is not None:
        last = {"number": cur.number, "timings": cur.status.timings, "facts": cur.status.facts}
    expected, basis = expected_from(last)
    return NodePlan(name=node.label, endpoint=node.endpoint, address=node.address, port=node.config.ports.prod,
                    current=f"rev {cur.number} ({cur.meta.stack})" if cur else "nothing deployed",
                    expected=expected, basis=basis, health_timeout=d.timeout, rollback_timeout=d.rollback_timeout)


def make_plan(action: str, deployments: list[Deployment], *, max_unavailable: int, pause: float,
              rollback_all_on_failure: bool) -> Plan:
    return Plan(action=action, nodes=[node_plan(d) for d in deployments], max_unavailable=max_unavailable,
                pause=pause, rollback_all_on_failure=rollback_all_on_failure)


def _one(d: Deployment, command: str, opts: Options, take_stale: bool) -> NodeResult:
    name = d.node.label
    t0 = time.monotonic()
    with endpoint.use(d.node.docker_env):
        try:
            # Built (rendered and linted) before any node was drained; run under this node's lock.
            outcome: Outcome = execute(d.node, command, opts, lambda: d, take_stale=take_stale)
        except B70Error as e:  # the lock is held, the engine is unreachable: this node did not start
            return NodeResult(name, "failed", f"{name}: {e}", seconds=time.monotonic() - t0)
    if outcome.ok:
        return NodeResult(name, "switched", f"{name}: {outcome.summary}", outcome.revision,
                          time.monotonic() - t0, outcome.details)
    state: State = "rolled-back" if outcome.rolled_back else "failed"
    return NodeResult(name, state, f"{name}: {outcome.summary}", outcome.revision, time.monotonic() - t0,
                      outcome.details)


def run(plan: Plan, deployments: list[Deployment], command: str, opts: Options, reporter: Reporter, *,
        revert: Callable[[Node, Reporter], Deployment] | None = None, take_stale: bool = False) -> RollingOutcome:
    """Batch by batch; stop at the first failure. With `revert` (--rollback-all-on-failure),
    every node already switched is rolled back too, in batches of the same size."""
    by_name = {d.node.label: d for d in deployments}
    results: dict[str, NodeResult] = {}
    failed = False
    lock = threading.Lock()
    for i, batch in enumerate(plan.batches, 1):
        if failed:
            break
        if i > 1 and plan.pause > 0:
            reporter.info(f"pause {plan.pause:g} s before batch {i}")
            time.sleep(plan.pause)
        names = [p.name for p in batch]
        reporter.phase(f"batch {i}/{len(plan.batches)}", ", ".join(names))
        with ThreadPoolExecutor(max_workers=len(batch), thread_name_prefix="rolling") as pool:
            futures = {n: pool.submit(_one, by_name[n], command, opts, take_stale) for n in names}
            for n, fut in futures.items():
                res = fut.result()
                with lock:
                    results[n] = res
                reporter.info(res.summary)
        failed = any(results[n].state != "switched" for n in names)
    if failed and revert is not None:
        done = [d for d in deployments if results.get(d.node.label) is not None
                and results[d.node.label].state == "switched"]
        _revert(done, plan, revert, opts, reporter, results)
    ordered = [results.get(p.name) or NodeResult(p.name, "untouched", f"{p.name}: untouched (the rollout stopped)")
               for p in plan.nodes]
    return _summarize(plan, ordered, failed)


def _revert(done: list[Deployment], plan: Plan, revert: Callable[[Node, Reporter], Deployment], opts: Options,
            reporter: Reporter, results: dict[str, NodeResult]) -> None:
    from ..deploy.rollout import batches

    reporter.phase("rollback-all", f"{len(done)} switched node(s) back to their previous revision")
    for batch in batches(list(reversed(done)), plan.max_unavailable):
        built = []
        for d in batch:
            with endpoint.use(d.node.docker_env):
                try:
                    built.append(revert(d.node, NodeReporter(reporter, d.node.label)))
                except B70Error as e:
                    results[d.node.label] = NodeResult(d.node.label, "revert-failed", f"{d.node.label}: {e}")
        with ThreadPoolExecutor(max_workers=max(len(built), 1), thread_name_prefix="revert") as pool:
            futures = {r.node.label: pool.submit(_one, r, "rollback (rolling)", opts, True) for r in built}
            for n, fut in futures.items():
                res = fut.result()
                results[n] = NodeResult(n, "reverted" if res.state == "switched" else "revert-failed",
                                        res.summary, res.revision, res.seconds, res.details)
                reporter.info(res.summary)


def _summarize(plan: Plan, results: list[NodeResult], failed: bool) -> RollingOutcome:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.state] = counts.get(r.state, 0) + 1
    tally = ", ".join(f"{v} {k}" for k, v in counts.items())
    if not failed:
        return RollingOutcome(True, plan, results, f"{plan.action}: all {len(results)} node(s) done ({tally})")
    first = next(r for r in results if r.state in ("rolled-back", "failed"))
    return RollingOutcome(False, plan, results, f"{plan.action} stopped at node {first.name}: {tally}", exit_code=1)


def status_rows(nodes: list[Node]) -> list[dict[str, Any]]:
    """Each node's status (read-only), asked of its own engine."""
    from .inspect import status

    rows = []
    for node in nodes:
        with endpoint.use(node.docker_env):
            st = status(node)
        cur = st.get("current") or {}
        rows.append({"node": node.label, "endpoint": node.endpoint,
                     "address": f"{node.address}:{node.config.ports.prod}",
                     "revision": cur.get("number"), "stack": cur.get("stack"), "outcome": cur.get("outcome"),
                     "container": st["container"].get("status"), "health": st["health"],
                     "time_to_healthy": (st.get("facts") or {}).get("time_to_healthy"),
                     "lock": bool(st.get("lock")), "interrupted": bool(st.get("interrupted")),
                     "state_dir": st["state_dir"]})
    return rows
