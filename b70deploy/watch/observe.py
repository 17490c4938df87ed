"""Looking at the node for watch: the current revision, the lock, the vllm container (Docker
events for deaths and restart loops, its state, its log's fatal signatures), /health, a
periodic smoke request and the error rate in /metrics. Reads only; decide.py says what to do.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import requests

from ..bench.metrics import finished_requests
from ..config.node import Node
from ..deploy.deploydir import WORKING_DIR, drift
from ..docker import engine, standby
from ..docker.containers import ContainerState
from ..docker.node import DockerNode
from ..docker.probe import probe_health
from ..docker.smoke import run_smoke
from ..state.lock import holder_info
from ..state.revisions import HEALTHY_OUTCOMES, Revision
from ..state.statedir import StateDir
from ..vllmlog.diagnosis import diagnose
from .decide import Look, Problem, Subject

if TYPE_CHECKING:
    from ..config.schema import Stack

LOG_TAIL = 400        # lines of the container log a look diagnoses
KILLED_WITHIN = 30.0  # a die this soon after a kill of the same container was a stop, not a crash


def committed_at(rev: Revision) -> float | None:
    """When the run that made `rev` committed it: status.updated, which commit stamps."""
    try:
        return datetime.strptime(rev.status.updated or "", "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


@dataclass
class Deaths:
    """The vllm container's deaths, from Docker's event stream (a thread): crashes only, not
    stops (a `kill` event of the same container just before the `die`: a drain, docker stop).
    `stopped` holds the containers stopped that way and not started since."""

    node: Node
    times: deque[float] = field(default_factory=lambda: deque(maxlen=1000))
    codes: deque[str] = field(default_factory=lambda: deque(maxlen=1000))
    kills: dict[str, float] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stream: Any = None
    thread: threading.Thread | None = None

    def start(self) -> Deaths:
        # The project's vllm and its hot-standby slots (projects <project>-r<N>, docker/standby.py), told
        # apart in _run: by Compose's own label, which a hand-made adopted file's containers carry too.
        self.stream = engine.client().events(decode=True, filters={
            "type": "container", "event": ["die", "kill", "start"],
            "label": [f"com.docker.compose.service={self.node.service}"]})
        self.thread = threading.Thread(target=self._run, name="watch-events", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        with contextlib.suppress(Exception):  # closed by stop(), or the engine went away
            for ev in self.stream:
                attrs = (ev.get("Actor") or {}).get("Attributes", {})
                if not standby.ours(self.node.project, str(attrs.get("com.docker.compose.project", ""))):
                    continue
                box, at = str(ev.get("id", "")), float(ev.get("timeNano", time.time_ns())) / 1e9
                action = ev.get("Action")
                with self.lock:
                    if action == "start":
                        self.stopped.discard(box)
                    elif action == "kill":
                        self.kills[box] = at
                    elif at - self.kills.pop(box, float("-inf")) <= KILLED_WITHIN:
                        self.stopped.add(box)
                    else:
                        self.times.append(at)
                        self.codes.append(str((ev.get("Actor") or {}).get("Attributes", {}).get("exitCode", "?")))

    def since(self, t: float) -> list[tuple[float, str]]:
        with self.lock:
            return [(at, code) for at, code in zip(self.times, self.codes, strict=True) if at >= t]

    def stopped_on_purpose(self, container_id: str) -> bool:
        with self.lock:
            return container_id in self.stopped

    def stop(self) -> None:
        if self.stream is not None:
            with contextlib.suppress(Exception):
                self.stream.close()


@dataclass
class Observer:
    """One node's looks; keeps what spans looks (consecutive bad /health, the last smoke and its
    failures, the /metrics counters), reset when the current revision changes."""

    node: Node
    deaths: Deaths
    # The stack a revision serves (actions.rollback.stack_of, handed in by actions/watch.py: a
    # room below actions cannot import it); only the fatal-log check needs it.
    stack_of: Callable[[Node, Revision], Stack] | None = None
    last_look: float = field(default_factory=time.time)
    unhealthy: int = 0
    last_smoke: float = 0.0
    smoke_failed: list[str] = field(default_factory=list)
    finished: dict[str, float] | None = None
    revision: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.node.address}:{self.node.config.ports.prod}"

    def look(self) -> Look:
        now = time.time()
        since, self.last_look = self.last_look, now
        state = StateDir(self.node.state_dir)
        holder = holder_info(self.node.state_dir)
        if holder is not None:
            who = f"pid {holder['pid']} `{holder['command']}`"
            busy = f"a deploy holds the lock ({who})" if holder["alive"] else \
                f"a killed run left the deploy lock ({who}); `b70deploy status` says how to finish it"
            return Look(now, self._subject(state), busy=busy)
        cur = state.revisions.current()
        if cur is None:
            return Look(now, None)
        if cur.number != self.revision:  # a new revision: nothing carried over from the last one
            self.revision, self.unhealthy, self.finished, self.last_smoke = cur.number, 0, None, 0.0
            self.smoke_failed = []
            since = max(since, committed_at(cur) or since)
        container = standby.live_container(self.node.project, self.node.service)
        if container is not None and standby.asleep(container):  # a switch's, killed: not a death
            return Look(now, self._subject(state), busy="vllm is asleep as a hot standby (a killed switch left it "
                                                         "so); `b70deploy status` says how to finish it")
        st = engine.state_of(container)
        labels = dict(container.labels) if container is not None else {}
        box = {"stack": labels.get("b70deploy.stack"), "image_id": st.image_id, "working_dir": labels.get(WORKING_DIR)}
        found = tuple(drift(self.node, cur, box))
        if found:
            return Look(now, self._subject(state), drift=found)
        if st.status != "running" and container is not None and self.deaths.stopped_on_purpose(container.id):
            return Look(now, self._subject(state), busy="vllm was stopped on purpose (drain, docker stop)")
        return Look(now, self._subject(state), problems=tuple(self._problems(cur, container, st, since, now)))

    def _subject(self, state: StateDir) -> Subject | None:
        cur = state.revisions.current()
        if cur is None:
            return None
        parent = cur.meta.parent
        healthy = parent is not None and state.revisions.exists(parent) and \
            state.revisions.get(parent).status.outcome in HEALTHY_OUTCOMES
        bake = (cur.meta.stack_doc or {}).get("bake_seconds")
        return Subject(cur.number, cur.meta.stack, cur.meta.kind, parent, healthy, committed_at(cur),
                       float(bake) if isinstance(bake, int | float) else self.node.config.watch.bake_seconds)

    def _problems(self, cur: Revision, container: Any, st: ContainerState, since: float,
                  now: float) -> list[Problem]:
        cfg = self.node.config.watch
        out: list[Problem] = []
        # The deaths first, then the log: a death seen here came after the process wrote its last
        # line, so the log read next holds the fatal line that explains it.
        died = self.deaths.since(since)
        loop = self.deaths.since(now - cfg.restart_window)
        log = engine.container_log(container, tail=LOG_TAIL).splitlines() if container is not None else []
        assert self.stack_of is not None, "actions/watch.py hands the Observer its stack_of"
        stack = self.stack_of(self.node, cur)
        finding = diagnose(log, stack, self.node.config.platform)
        diagnosis = finding.one_line() if finding else None
        if finding is not None:
            out.append(Problem("fatal-log", f"fatal line in the vllm log: {finding.title}", diagnosis))
        if died:
            codes = ", ".join(code for _, code in died)
            out.append(Problem("died", f"the vllm container died {len(died)} time(s) (exit {codes})", diagnosis))
        if len(loop) >= cfg.restart_loop:
            out.append(Problem("restart-loop", f"restart loop: {len(loop)} deaths in {cfg.restart_window:g} s",
                               diagnosis))
        if st.status != "running":
            self.unhealthy = 0
            out.append(Problem("down", f"the vllm container is {st.status}"
                               + (f" (exit {st.exit_code})" if st.exit_code is not None else ""), diagnosis))
            return out
        probed = self._probed(stack, now)
        if probed and finding is None and container is not None:
            # What the probes saw came after the log was read: an engine that died meanwhile has
            # written its cause by now (vLLM logs it before the API server is told, core.py
            # run_engine_core: logger.exception, then _send_engine_dead).
            again = diagnose(engine.container_log(container, tail=LOG_TAIL).splitlines(), stack,
                             self.node.config.platform)
            diagnosis = again.one_line() if again else None
        return out + [Problem(kind, detail, diagnosis) for kind, detail in probed]

    def _probed(self, stack: Stack, now: float) -> list[tuple[str, str]]:
        """What /health, the smoke tests and the error rate say is wrong: (kind, detail)."""
        cfg = self.node.config.watch
        code = probe_health(f"{self.base_url}/health")
        self.unhealthy = 0 if code == 200 else self.unhealthy + 1
        if self.unhealthy >= cfg.unhealthy_looks:
            return [("unhealthy", f"/health {code or 'refused'} for {self.unhealthy} looks in a row")]
        if code != 200:
            return []
        found: list[tuple[str, str]] = []
        if now - self.last_smoke >= cfg.smoke_every:
            self.last_smoke = now
            _, self.smoke_failed = run_smoke(self.base_url, stack, timeout=min(self.node.config.timeouts.smoke, 30.0),
                                             key=DockerNode.production(self.node).api_key())
        if self.smoke_failed:
            found.append(("smoke", "smoke failed: " + "; ".join(self.smoke_failed)))
        rate = self._error_rate()
        if rate is not None:
            found.append(("error-rate", rate))
        return found

    def _error_rate(self) -> str | None:
        """The share of requests finished with an error since the last look, if above the limit."""
        cfg = self.node.config.watch
        try:
            resp = requests.get(f"{self.base_url}/metrics", timeout=5)
            now = finished_requests(resp.text) if resp.status_code == 200 else None
        except (requests.RequestException, ValueError):
            now = None
        before, self.finished = self.finished, now
        if before is None or now is None:
            return None
        delta = {k: v - before.get(k, 0.0) for k, v in now.items()}
        total, errors = sum(delta.values()), delta.get("error", 0.0)
        if total >= cfg.min_requests and errors / total > cfg.max_error_rate:
            return f"{errors:.0f} of {total:.0f} requests since the last look ended in an error"
        return None
