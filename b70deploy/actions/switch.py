"""`switch STACK`: render a new revision and move the node onto it behind the health gate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config.node import Node
from ..deploy.driver import Driver, Outcome
from ..deploy.plan import DeployPlan, Timeouts
from ..deploy.steps import plan_lines
from ..docker.node import DockerNode
from ..errors import B70Error
from ..state.fsio import read_tree
from ..state.statedir import StateDir
from ..ui.notice import make_event
from ..ui.notify import Notifier
from ..ui.progress import Reporter
from .diff import unified
from .prepare import prepare_deploy

Confirm = Callable[[DeployPlan], None]  # raises to refuse; the CLI asks on a terminal


@dataclass
class DeployOptions:
    """What switch and rollback share: the flags of the health gate and the lock."""

    message: str = ""
    timeout: float | None = None           # the new stack's /health wait (node default)
    rollback_timeout: float | None = None  # the previous stack's, when it is brought back
    verify_wait: float = 30.0
    auto_rollback: bool = True
    lock_wait: float = 0.0

    def timeouts(self, node: Node) -> Timeouts:
        return Timeouts.of(node, health=self.timeout, rollback=self.rollback_timeout, verify=self.verify_wait)


def announced(node: Node, verb: str, stack: str, run: Callable[[], Outcome]) -> Outcome:
    """`run` a switch or rollback, telling the node's receivers it started and how it ended
    (fail-open: a receiver costs at most notify.timeout, and never changes the outcome)."""
    notifier = Notifier.of(node)
    if not notifier.receivers:
        return run()
    notifier.send(make_event(node, f"{verb}.started", stack=stack, revision=None, outcome=f"{verb} {stack} started"))
    try:
        outcome = run()
    except (B70Error, KeyboardInterrupt) as e:
        notifier.send(make_event(node, f"{verb}.failed", stack=stack, revision=None,
                                 outcome=str(e) or type(e).__name__))
        raise
    else:
        name = "succeeded" if outcome.ok else "rolled-back" if outcome.rolled_back else "failed"
        notifier.send(make_event(node, f"{verb}.{name}", stack=outcome.stack, revision=outcome.revision,
                                 outcome=outcome.summary, diagnosis=outcome.diagnosis))
        return outcome
    finally:
        notifier.close()


def driver(node: Node, reporter: Reporter, opts: DeployOptions) -> Driver:
    """The production deploy dir of `node`, its state dir and its engine."""
    return Driver(StateDir(node.state_dir), DockerNode.production(node), reporter,
                  keep_revisions=node.config.keep_revisions, lock_wait=opts.lock_wait)


@dataclass
class Switch:
    node: Node
    stack: str
    opts: DeployOptions

    @property
    def command(self) -> str:
        return f"switch {self.stack}"

    def plan(self) -> DeployPlan:
        """Everything the switch will write, linted; nothing on the node changes."""
        ready = prepare_deploy(self.node, self.stack)
        errors = tuple(f"[{f.id}] {f.message}" for f in ready.findings if f.severity == "error")
        return DeployPlan(kind="switch", stack=ready.stack, files=ready.files, image=ready.image,
                          message=self.opts.message, companions=self.node.companions,
                          timeouts=self.opts.timeouts(self.node), auto_rollback=self.opts.auto_rollback,
                          lint_errors=errors, warnings=tuple(f.one_line() for f in ready.findings
                                                             if f.severity != "error"),
                          secret_keys=ready.secret_keys)

    def preview(self) -> list[str]:
        """--dry-run: the image, the current revision, the steps and the diff of the files."""
        plan = self.plan()
        cur = StateDir(self.node.state_dir).revisions.current()
        live = read_tree(self.node.deploy_dir, sorted(set(plan.files) | set(cur.meta.files if cur else [])))
        text = unified(live, plan.files, old_label="deployed", new_label=f"switch-{self.stack}",
                       secret_keys=plan.secret_keys)
        lines = [f"switch {self.stack}: plan (dry run, nothing changed)",
                 f"  image {plan.image.ref} = {plan.image.id}",
                 f"  current: {f'revision {cur.number} ({cur.meta.stack})' if cur else 'nothing deployed'}", ""]
        return [*lines, *plan_lines(plan), "", text.rstrip("\n") if text else "(no file changes)"]

    def run(self, reporter: Reporter, *, confirm: Confirm | None = None) -> Outcome:
        return announced(self.node, "switch", self.stack, lambda: driver(self.node, reporter, self.opts).execute(
            self.command, self.plan, confirm=confirm))
