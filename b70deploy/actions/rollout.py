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
from ..deploy.plan import DeployPlan
from ..deploy.rollout import NodePlan, RolloutPlan, batches, expected_from
from ..docker import endpoint
from ..errors import B70Error, UserError
from ..state.statedir import StateDir
from ..ui.progress import Reporter
from .inspect import status
from .mutating import mutating
from .rollback import Rollback
from .switch import DeployOptions, Switch, deploy

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
    plan: RolloutPlan
    results: list[NodeResult]
    summary: str
    exit_code: int = 0
    min_in_pool: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "summary": self.summary, "exit_code": self.exit_code, "plan": self.plan.to_dict(),
                "nodes": [r.to_dict() for r in self.results]}


@dataclass(frozen=True)
class ReadyNode:
    """One node's plan, built against its own engine before any node is drained."""

    node: Node
    plan: DeployPlan
    reporter: Reporter


Verb = Callable[[Node], Switch | Rollback]


def prepare(nodes: list[Node], verb: Verb, reporter: Reporter) -> list[ReadyNode]:
    """Each node's plan, built against its own engine; nothing on any node changes."""
    out = []
    for node in nodes:
        rep = NodeReporter(reporter, node.label)
        with endpoint.use(node.docker_env):
            try:
                out.append(ReadyNode(node, verb(node).plan(), rep))
            except UserError as e:
                raise UserError(f"node {node.label}: {e.what}", fix=e.fix) from None
    return out


def node_plan(p: ReadyNode) -> NodePlan:
    node = p.node
    cur = StateDir(node.state_dir).revisions.current()
    last = None
    if cur is not None:
        last = {"number": cur.number, "timings": cur.status.timings, "facts": cur.status.facts}
    expected, basis = expected_from(last)
    return NodePlan(name=node.label, endpoint=node.endpoint, address=node.address, port=node.config.ports.prod,
                    current=f"rev {cur.number} ({cur.meta.stack})" if cur else "nothing deployed",
                    expected=expected, basis=basis, health_timeout=p.plan.waits.health,
                    rollback_timeout=p.plan.waits.rollback)


def make_plan(action: str, prepared: list[ReadyNode], *, max_unavailable: int, pause: float,
              rollback_all_on_failure: bool) -> RolloutPlan:
    return RolloutPlan(action=action, nodes=[node_plan(p) for p in prepared], max_unavailable=max_unavailable,
                pause=pause, rollback_all_on_failure=rollback_all_on_failure)


def _one(p: ReadyNode, command: str, opts: DeployOptions, take_stale: bool) -> NodeResult:
    name = p.node.label
    t0 = time.monotonic()
    with endpoint.use(p.node.docker_env):
        try:
            # Built (rendered and linted) before any node was drained; run under this node's lock.
            with mutating(p.node, command, wait=opts.lock_wait, take_stale=take_stale, step="plan",
                          announce=(p.plan.kind, p.plan.stack.name)) as m:
                outcome = deploy(p.node, command, p.plan, p.reporter, m)
        except B70Error as e:  # the lock is held, the engine is unreachable: this node did not start
            return NodeResult(name, "failed", f"{name}: {e}", seconds=time.monotonic() - t0)
    if outcome.ok:
        return NodeResult(name, "switched", f"{name}: {outcome.summary}", outcome.revision,
                          time.monotonic() - t0, outcome.details)
    state: State = "rolled-back" if outcome.rolled_back else "failed"
    return NodeResult(name, state, f"{name}: {outcome.summary}", outcome.revision, time.monotonic() - t0,
                      outcome.details)


def run(plan: RolloutPlan, prepared: list[ReadyNode], command: str, opts: DeployOptions, reporter: Reporter, *,
        revert: Verb | None = None, take_stale: bool = False) -> RollingOutcome:
    """Batch by batch; stop at the first failure. With `revert` (--rollback-all-on-failure),
    every node already switched is rolled back too, in batches of the same size."""
    by_name = {p.node.label: p for p in prepared}
    results: dict[str, NodeResult] = {}
    failed = False
    lock = threading.Lock()
    for i, batch in enumerate(plan.batches, 1):
        if failed:
            break
        if i > 1 and plan.pause > 0:
            reporter.info(f"pause {plan.pause:g} s before batch {i}")
            time.sleep(plan.pause)
        names = [n.name for n in batch]
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
        done = [p for p in prepared if results.get(p.node.label) is not None
                and results[p.node.label].state == "switched"]
        _revert(done, plan, revert, opts, reporter, results)
    ordered = [results.get(n.name) or NodeResult(n.name, "untouched", f"{n.name}: untouched (the rollout stopped)")
               for n in plan.nodes]
    return _summarize(plan, ordered, failed)


def _revert(done: list[ReadyNode], plan: RolloutPlan, revert: Verb, opts: DeployOptions, reporter: Reporter,
            results: dict[str, NodeResult]) -> None:
    reporter.phase("rollback-all", f"{len(done)} switched node(s) back to their previous revision")
    for batch in batches(list(reversed(done)), plan.max_unavailable):
        built: list[ReadyNode] = []
        for p in batch:
            with endpoint.use(p.node.docker_env):
                try:
                    built.append(ReadyNode(p.node, revert(p.node).plan(), p.reporter))
                except B70Error as e:
                    results[p.node.label] = NodeResult(p.node.label, "revert-failed", f"{p.node.label}: {e}")
        with ThreadPoolExecutor(max_workers=max(len(built), 1), thread_name_prefix="revert") as pool:
            futures = {r.node.label: pool.submit(_one, r, "rollback (rolling)", opts, True) for r in built}
            for n, fut in futures.items():
                res = fut.result()
                results[n] = NodeResult(n, "reverted" if res.state == "switched" else "revert-failed",
                                        res.summary, res.revision, res.seconds, res.details)
                reporter.info(res.summary)


def _summarize(plan: RolloutPlan, results: list[NodeResult], failed: bool) -> RollingOutcome:
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


@dataclass
class Rollout:
    """`switch|rollback --nodes`: a single-node verb on every selected node, in batches."""

    nodes: list[Node]
    action: str                 # "switch eagle3": the plan's title and each node's journal command
    verb: Verb                  # the single-node action for one node
    opts: DeployOptions
    max_unavailable: int = 1
    pause: float = 0.0
    rollback_all_on_failure: bool = False
    take_stale: bool = False

    def plan(self, reporter: Reporter) -> tuple[RolloutPlan, list[ReadyNode]]:
        """Every node prepared (rendered, linted, images checked on its own engine), and the batches."""
        prepared = prepare(self.nodes, self.verb, reporter)
        return make_plan(self.action, prepared, max_unavailable=self.max_unavailable, pause=self.pause,
                         rollback_all_on_failure=self.rollback_all_on_failure), prepared

    def run(self, reporter: Reporter, *, confirm: Callable[[RolloutPlan], None] | None = None) -> RollingOutcome:
        plan, prepared = self.plan(reporter)
        if confirm is not None:
            confirm(plan)
        opts = self.opts

        def revert(node: Node) -> Rollback:
            return Rollback(node, None, opts)

        return run(plan, prepared, self.action, opts, reporter,
                   revert=revert if self.rollback_all_on_failure else None, take_stale=self.take_stale)
