"""`watch`: follow the current revision after each switch; inside its bake window a failure
rolls back through the same gated rollback as the switch (once per revision), after it an
alert; drift is reported. Foreground, one event per line, ends cleanly on SIGTERM."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import requests
from docker.errors import DockerException

from ..config.node import Node
from ..deploy import interrupts
from ..docker import engine
from ..errors import B70Error
from ..state.lock import LockBusy
from ..state.stamps import now_iso
from ..state.statedir import StateDir
from ..ui.notice import make_event
from ..ui.notify import Notifier
from ..ui.progress import PlainReporter
from ..watch import memory as saved
from ..watch.decide import Act, Look, Memory, Subject, decide, in_bake, remember
from ..watch.observe import Deaths, Observer
from .rollback import Rollback, stack_of
from .switch import DeployOptions

Emit = Callable[[dict[str, Any]], None]  # one event line


@dataclass
class WatchNode:
    node: Node
    interval: float | None = None  # seconds between looks (node watch.interval)

    @property
    def every(self) -> float:
        return self.interval if self.interval is not None else self.node.config.watch.interval

    def plan(self) -> list[str]:
        """What watch will follow and how it will act; nothing on the node changes."""
        cfg, notifier = self.node.config.watch, Notifier.of(self.node)
        return [f"watch {self.node.label}: a look every {self.every:g} s, a smoke request every {cfg.smoke_every:g} s",
                f"  failures: container deaths and restart loops ({cfg.restart_loop} in {cfg.restart_window:g} s), "
                f"/health not 200 for {cfg.unhealthy_looks} looks, smoke, fatal log lines, more than "
                f"{cfg.max_error_rate:.0%} errored requests",
                f"  bake window: {cfg.bake_seconds:g} s after a switch (a stack's bake_seconds overrides): "
                "a failure rolls back once; after it, alerts only",
                f"  receivers: {', '.join(r.name for r in notifier.receivers) or 'none (notify: in the node config)'}"]

    def run(self, emit: Emit) -> None:
        state = StateDir(self.node.state_dir)
        deaths = Deaths(self.node).start()
        observer = Observer(self.node, deaths, stack_of=stack_of)
        notifier = Notifier.of(self.node)
        mem = Memory(rolled_back=saved.rolled_back(state.path))
        watching: int | None = None
        baking = False
        try:
            # inside the try: a SIGTERM sent the moment this line is read is a clean stop too
            emit(_line("watch.start", None, f"watching {self.node.label} every {self.every:g} s"))
            while True:
                interrupts.check()  # a SIGTERM swallowed by a finalizer still stops watch
                try:
                    look = observer.look()
                except (B70Error, DockerException, requests.RequestException, OSError) as e:
                    # The engine restarting, a state file mid-replace: a supervisor keeps going.
                    emit(_line("watch.note", watching, f"cannot look at the node now: {e}"))
                    time.sleep(self.every)
                    continue
                s = look.subject
                if s is not None and s.revision != watching and look.busy is None:
                    watching, baking = s.revision, in_bake(look)
                    emit(_line("watch.revision", s.revision, _describe(s, look)))
                if s is not None and s.revision == watching and baking and not in_bake(look):
                    baking = False
                    emit(_line("watch.baked", s.revision, f"revision {s.revision} passed its bake window; "
                                                          "from now on watch alerts and does not act"))
                acts = decide(look, mem)
                for act in acts:
                    mem = self._carry_out(act, mem, notifier, emit)
                time.sleep(self.every)
        except KeyboardInterrupt as e:  # SIGTERM (errors.Terminated) or Ctrl-C: a clean stop
            emit(_line("watch.stop", watching, f"stopped ({type(e).__name__})"))
        finally:
            deaths.stop()
            notifier.close()

    def _carry_out(self, act: Act, mem: Memory, notifier: Notifier, emit: Emit) -> Memory:
        after = remember(mem, [act])
        if act.what == "note":
            emit(_line("watch.note", act.revision, act.text))
            return after
        if act.what != "rollback":
            event = "watch.drift" if act.what == "drift" else "watch.alert"
            emit(_line(event, act.revision, act.text, act.diagnosis))
            self._tell(notifier, event, act, act.text)
            return after
        assert act.revision is not None and act.to is not None
        state = StateDir(self.node.state_dir)
        saved.save_rolled_back(state.path, after.rolled_back)  # before acting: at most once, even if we die
        emit(_line("watch.rollback", act.revision, f"{act.text}: rolling back to revision {act.to}", act.diagnosis))
        self._keep_log(state, act)
        try:
            outcome = Rollback(self.node, str(act.to), DeployOptions(message=f"watch: {act.text}"[:500])).run(
                PlainReporter(sys.stderr))
        except LockBusy as e:  # a deploy started meanwhile: it decides what runs; nothing was done
            saved.save_rolled_back(state.path, mem.rolled_back)
            emit(_line("watch.note", act.revision, f"not rolling back: {e.what}"))
            return mem
        except B70Error as e:
            emit(_line("watch.alert", act.revision, f"automatic rollback failed: {e}", act.diagnosis))
            self._tell(notifier, "watch.alert", act, f"automatic rollback to revision {act.to} failed: {e}")
            return after
        if outcome.exit_code in (130, 143):
            raise KeyboardInterrupt  # the rollback was interrupted by our own SIGTERM: stop watching
        if outcome.ok:
            state.revisions.update_status(act.revision, outcome="failed", failure=f"watch: {act.text}",
                                          diagnosis=act.diagnosis, updated=now_iso())
        event = "watch.rolled-back" if outcome.ok else "watch.alert"
        emit(_line(event, act.revision, outcome.summary, act.diagnosis))
        self._tell(notifier, event, act, outcome.summary, to=act.to, now_on=outcome.revision)
        if outcome.signals:  # a SIGTERM or Ctrl-C after the rollback's commit: said, now watching stops
            raise KeyboardInterrupt
        return after

    def _keep_log(self, state: StateDir, act: Act) -> None:
        """The failed container's log goes with its revision (`logs REV`): the rollback replaces it."""
        assert act.revision is not None
        with contextlib.suppress(DockerException, B70Error):  # best effort: the rollback matters more
            container = engine.find_container(self.node.project, self.node.service)
            text = engine.container_log(container) if container is not None else ""
            if text:
                state.revisions.save_log(act.revision, text)

    def _tell(self, notifier: Notifier, event: str, act: Act, outcome: str, **extra: Any) -> None:
        stack = StateDir(self.node.state_dir).revisions.get(act.revision).meta.stack if act.revision else None
        notifier.send(make_event(self.node, event, stack=stack, revision=act.revision, outcome=outcome,
                                 diagnosis=act.diagnosis, **extra))


def _describe(s: Subject, look: Look) -> str:
    text = f"watching revision {s.revision} ({s.stack}, {s.kind})"
    if s.committed_at is None:
        return text + "; commit time unknown: alerts only"
    end = s.committed_at + s.bake_seconds
    if look.at >= end:
        return text + "; bake window over: alerts only"
    return text + f"; bake window until {datetime.fromtimestamp(end).strftime('%H:%M:%S')}"


def _line(event: str, revision: int | None, text: str, diagnosis: str | None = None) -> dict[str, Any]:
    return {"time": now_iso(), "event": event, "revision": revision, "text": text, "diagnosis": diagnosis}
