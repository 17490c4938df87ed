"""`switch STACK`: render a new revision and move the node onto it behind the health gate."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from ..config.node import Node
from ..config.schema import Stack
from ..deploy.companions import kept_running
from ..deploy.deploydir import read_deployed
from ..deploy.driver import Driver, Outcome
from ..deploy.plan import DeployPlan, ImageInfo, StandbyPlan, Waits
from ..deploy.steps import plan_lines
from ..docker.node import DockerNode
from ..errors import UserError
from ..render import standby as standby_rules
from ..render.files import COMPOSE_FILE
from ..render.masking import opaque
from ..state.revisions import Revision
from ..state.statedir import StateDir
from ..ui.notice import node_secrets
from ..ui.progress import Reporter
from .diff import as_written, kept_line, tree_modes, unified
from .mutating import Mutation, mutating
from .prepare import prepare, prepare_deploy

Confirm = Callable[[DeployPlan], None]  # raises to refuse; the CLI asks on a terminal


class Preview(NamedTuple):
    """What `switch --dry-run` prints, and the refusal a switch would end in (exit 2 after it)."""

    lines: list[str]
    refusal: UserError | None


@dataclass
class DeployOptions:
    """What switch and rollback share: the flags of the health gate and the lock."""

    message: str = ""
    timeout: float | None = None           # the new stack's /health wait (node default)
    rollback_timeout: float | None = None  # the previous stack's, when it is brought back
    verify_wait: float = 30.0
    auto_rollback: bool = True
    lock_wait: float = 0.0

    def waits(self, node: Node) -> Waits:
        return Waits.of(node, health=self.timeout, rollback=self.rollback_timeout, verify=self.verify_wait)


def standby_plan(node: Node, stack: Stack, files: Mapping[str, bytes], *,
                 wake_slot: int | None = None) -> StandbyPlan | None:
    """Hot standby for a run whose files these are: they run vLLM with sleep mode behind the door
    (render/standby.py rendered them so), else None: the run stops the live stack first."""
    if not node.config.door.enabled or not standby_rules.rendered_to_sleep(files.get(COMPOSE_FILE, b"")):
        return None
    return StandbyPlan(level=standby_rules.level_of(stack, node), count=standby_rules.standby_of(stack, node).count,
                       wake_slot=wake_slot)


def kept_companions(node: Node, files: Mapping[str, bytes]) -> tuple[str, ...]:
    """The companions a stop-first drain from the deploy dir's live files to `files` leaves running (a
    standby drain stops none)."""
    live = read_deployed(node.deploy_dir, node.compose_files)
    return kept_running(files, live or None, compose_files=node.compose_files, vllm=node.service,
                        companions=node.companions)


def asleep_line(node: Node, plan: DeployPlan, cur: Revision | None) -> list[str]:
    """What a dry run says of the live stack under hot standby, asked of the engine: it sleeps only
    when it runs in a standby slot (the slots run with sleep mode); a stack started another way (an
    adopted one, without --enable-sleep-mode) is stopped by the drain, as without standby."""
    if plan.standby is None or cur is None:
        return []
    slots = DockerNode.production(node).slots()
    live = next((n for n, state in slots.items() if state == "live"), None)
    if live is not None:
        return [f"  standby: revision {live}'s slot falls asleep (level {plan.standby.level}) while "
                f"{plan.stack.name} boots beside it"]
    compose = cur.files_dir / COMPOSE_FILE
    ran = compose.read_bytes() if compose.is_file() else b""
    how = "" if standby_rules.rendered_to_sleep(ran) else " and without --enable-sleep-mode"
    return [f"  standby: revision {cur.number} ({cur.meta.stack}) runs outside the standby slots{how}: the drain "
            f"STOPS it, it does not sleep; {plan.stack.name} boots in a slot of its own, which the next switch "
            "puts to sleep"]


def driver(node: Node, reporter: Reporter) -> Driver:
    """The production deploy dir of `node`, its state dir and its engine."""
    return Driver(StateDir(node.state_dir), DockerNode.production(node), reporter,
                  keep_revisions=node.config.keep_revisions)


def deploy(node: Node, command: str, plan: DeployPlan, reporter: Reporter, m: Mutation, *, planned_in: float = 0.0,
           confirm: Confirm | None = None) -> Outcome:
    """A built switch or rollback plan driven through the steps on `node`, under the lock `m` holds."""
    # on_step is the lock's own: the runner names each step in it without calling back up here.
    return m.ended_with(driver(node, reporter).execute(command, plan, planned_in=planned_in,
                                                      on_step=m.lock.set_step, confirm=confirm))


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
        standby = standby_plan(self.node, ready.stack, ready.files)
        return DeployPlan(kind="switch", stack=ready.stack, files=ready.files, image=ready.image,
                          message=self.opts.message, companions=self.node.companions,
                          kept=() if standby else kept_companions(self.node, ready.files),
                          waits=self.opts.waits(self.node), auto_rollback=self.opts.auto_rollback,
                          lint_errors=errors, warnings=tuple(f.as_warning() for f in ready.findings
                                                             if f.severity != "error"),
                          secrets=ready.secrets, platform=self.node.config.platform,
                          standby=standby)

    def preview(self) -> Preview:
        """--dry-run: the image, the current revision, the steps and the diff of the files. With
        the image not on the engine, the plain render's plan and the refusal the switch would end in."""
        from ..docker.engine import image_info

        refusal: UserError | None = None
        try:
            image_info(self.node.catalogue().load(self.stack).image)
        except UserError as e:
            refusal = e
        plan = self.plan() if refusal is None else self._plain_plan()
        cur = StateDir(self.node.state_dir).revisions.current()
        live, kept = as_written(self.node.deploy_dir, plan.files, self.node.compose_files,
                                cur.meta.files if cur else ())
        hidden = opaque(cur.modes() if cur else {}, plan.modes, tree_modes(self.node.deploy_dir, live),
                        compose_files=self.node.compose_files)
        text = unified(live, plan.files, old_label="deployed", new_label=f"switch-{self.stack}",
                       secrets=plan.secrets | node_secrets(self.node), hidden=hidden)
        pinned = f"= {plan.image.id}" if refusal is None else \
            "is not on this engine: the files below name the tag, not the image id a switch pins"
        lines = [f"switch {self.stack}: plan (dry run, nothing changed)",
                 f"  image {plan.image.ref} {pinned}",
                 f"  current: {f'revision {cur.number} ({cur.meta.stack})' if cur else 'nothing deployed'}",
                 *asleep_line(self.node, plan, cur),
                 *kept_line(kept), ""]
        return Preview([*lines, *plan_lines(plan), "", text.rstrip("\n") if text else "(no file changes)"], refusal)

    def _plain_plan(self) -> DeployPlan:
        """The plan as far as it is known without the image: the plain render, no pin, no lint."""
        plain = prepare(self.node, self.stack)
        return DeployPlan(kind="switch", stack=plain.stack, files=plain.rendered.files,
                          image=ImageInfo(ref=plain.stack.image, id="", repo_digest=None, tags=()),
                          message=self.opts.message, companions=self.node.companions,
                          kept=kept_companions(self.node, plain.rendered.files),
                          waits=self.opts.waits(self.node), auto_rollback=self.opts.auto_rollback,
                          secrets=plain.rendered.secrets)

    def run(self, reporter: Reporter, *, confirm: Confirm | None = None) -> Outcome:
        """Lock first (a second run fails at once), then plan, then the steps."""
        with mutating(self.node, self.command, wait=self.opts.lock_wait, step="plan",
                      announce=("switch", self.stack)) as m:
            t0 = time.monotonic()
            plan = self.plan()
            return deploy(self.node, self.command, plan, reporter, m, planned_in=time.monotonic() - t0,
                          confirm=confirm)
