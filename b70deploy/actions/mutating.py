"""The one way a command changes the node or the state dir: `mutating(...)`.

Every mutating action runs its work inside this block (after Kamal's `mutating do`): the
node's deploy lock is taken first, so a second command fails at once with who holds it; the
audit log gets one line however the block ends (its outcome, or the error; bad input, refused
with nothing changed, leaves none); a switch or a rollback also tells the node's receivers it
started and how it ended (fail-open). A block
entered while this context already holds the node's lock (bench cycle's up, down and
restore) runs inside the outer one: one lock, one audit line. The CLI's half is
cli/base.py `mutate`: the reporter and the exit line.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import B70Error, Declined, UserError
from ..state.statedir import StateDir
from ..ui.output import warn

if TYPE_CHECKING:  # pin, prune and unlock import this module: as light as `history`
    from ..config.node import Node
    from ..deploy.driver import Outcome
    from ..state.lock import DeployLock
    from ..ui.notify import Notifier

_held: contextvars.ContextVar[Mutation | None] = contextvars.ContextVar("b70deploy_mutation", default=None)


@dataclass
class Mutation:
    """What a mutating block holds: the state dir, its lock, and the audit line it will end with."""

    state: StateDir
    lock: DeployLock
    command: str
    outcome: str = "ok"
    fields: dict[str, Any] = field(default_factory=dict)
    deployed: Outcome | None = None  # a switch's or rollback's result, for the notification

    def step(self, name: str) -> None:
        """Name the step in progress in the lock's details (`status` shows it)."""
        self.lock.set_step(name)

    def ended(self, outcome: str, **fields: Any) -> None:
        """What the audit line says (default: ok, no fields)."""
        self.outcome, self.fields = outcome, fields

    def ended_with(self, outcome: Outcome) -> Outcome:
        """The audit line and the notification of a switch, rollback or resume."""
        self.deployed = outcome
        after = {"signals_after_commit": outcome.signals} if outcome.signals else {}
        self.ended("ok" if outcome.ok else "failed", revision=outcome.revision, summary=outcome.summary, **after)
        return outcome


def refuse_defaults(node: Node) -> None:
    """The built-in defaults (project b70, 0.0.0.0:8000, /models) are a guess about this node:
    reading with them is harmless, changing the node with them is not."""
    if node.source is None:
        raise UserError("no node config found (--config, $B70DEPLOY_CONFIG, ./b70deploy.yaml, "
                        "/etc/b70deploy/node.yaml), so this command would change the node on built-in defaults",
                        where="built-in node defaults",
                        fix="run `b70deploy init` to write one for this node, or point --config at yours")


@contextlib.contextmanager
def mutating(node: Node, command: str, *, wait: float = 0.0, take_stale: bool = False, step: str = "",
             announce: tuple[str, str] | None = None) -> Iterator[Mutation]:
    """Hold `node`'s lock for `command` while the block runs, and audit how it ended.
    `announce` (switch, rollback: the verb and the stack) makes the started and ended events
    the node's receivers get; `step` is the lock's first step."""
    refuse_defaults(node)
    held = _held.get()
    if held is not None and held.state.path == node.state_dir:
        yield Mutation(held.state, held.lock, command)  # the outer block's lock; its audit line stands
        return
    with _announced(node, announce) as tell:
        state = StateDir(node.state_dir)
        lock = state.lock(command, wait=wait, take_stale=take_stale)
        lock.acquire(step=step)  # before anything else: a second command fails here, nothing done
        m = Mutation(state, lock, command)
        token = _held.set(m)
        try:
            yield m
        except UserError:
            raise  # bad input: refused with nothing changed (exit 2), so no audit line either
        except Declined:
            _audit(state, command, "declined", {}, warn)
            raise
        except BaseException as exc:
            _audit(state, command, "error", {"error": str(exc)[:500]}, warn)
            raise
        else:
            done = m.deployed
            # A full disk makes the audit line a warning of the outcome, never the command's error.
            _audit(state, command, m.outcome, m.fields,
                   warn if done is None else (done.warnings if done.ok else done.details).append)
        finally:
            _held.reset(token)
            lock.release()
        tell(m.deployed)


def _audit(state: StateDir, command: str, outcome: str, fields: dict[str, Any], say: Callable[[str], None]) -> None:
    from ..state import space

    space.best_effort(state.path, lambda: state.audit.record(command, outcome, **fields),
                      f"the audit log ({state.audit.path})", say)


class _Tell:
    """The ended event of one announced block."""

    def __init__(self, node: Node, verb: str, stack: str, notifier: Notifier) -> None:
        self.node, self.verb, self.stack, self.notifier = node, verb, stack, notifier

    def __call__(self, outcome: Outcome | None) -> None:
        if outcome is None or not self.notifier.receivers:
            return
        from ..ui.notice import make_event

        name = "succeeded" if outcome.ok else "rolled-back" if outcome.rolled_back else "failed"
        self.notifier.send(make_event(self.node, f"{self.verb}.{name}", stack=outcome.stack,
                                      revision=outcome.revision, outcome=outcome.summary,
                                      diagnosis=outcome.diagnosis))


def _silent(outcome: Outcome | None) -> None:
    return None


@contextlib.contextmanager
def _announced(node: Node, announce: tuple[str, str] | None) -> Iterator[Callable[[Outcome | None], None]]:
    """The started event, then the block, then how it ended (fail-open: a receiver costs at
    most notify.timeout, and never changes the outcome)."""
    if announce is None:
        yield _silent
        return
    from ..ui.notice import make_event
    from ..ui.notify import Notifier

    verb, stack = announce
    tell = _Tell(node, verb, stack, Notifier.of(node))
    if not tell.notifier.receivers:
        yield _silent
        return
    try:
        tell.notifier.send(make_event(node, f"{verb}.started", stack=stack, revision=None,
                                      outcome=f"{verb} {stack} started"))
        try:
            yield tell
        except (B70Error, KeyboardInterrupt) as e:
            tell.notifier.send(make_event(node, f"{verb}.failed", stack=stack, revision=None,
                                          outcome=str(e) or type(e).__name__))
            raise
    finally:
        tell.notifier.close()
