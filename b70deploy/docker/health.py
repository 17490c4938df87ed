"""Waiting for a freshly started vllm container to become healthy, or to fail.

Two things run at once: a poller asks GET /health (tenacity, capped back-off), and a log
follower reads the container's log. A fatal log line or the container exiting wakes the
poller at once, so a crash is reported in about a second, not after the timeout. Once the log says
the API server starts, /health is asked every 0.05 s: readiness is seen within that of the engine's. Each line
also goes, with the time it arrived, to a StallWatch: a log that goes quiet for the node's
`timeouts.stall` ends the wait with the compile-stall (quiet inside torch.compile) or the
log-stall diagnosis, long before the health timeout.

While it waits, the container's restarts are held off (restart policy "no", the compose file's
policy back once healthy): a crash during the boot ends the wait anyway, and the engine would
otherwise be busy restarting the crashed container for ~0.5 s, which the rollback's removal of
it waits out (benchmarks/README.md, `downtime.py`). A run killed inside the wait leaves "no"
until the next wait on that container (resume, restore) ends healthy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState, RetryError, Retrying, retry_if_result, wait_exponential

from ..deploy.nodeio import WaitResult
from ..errors import OperationError
from ..vllmlog.bootlog import server_starting
from ..vllmlog.diagnosis import Diagnosis, StallWatch
from .engine import LogFollower, find_container, set_restart_policy, state_of
from .probe import probe_health

if TYPE_CHECKING:
    from ..ui.progress import Reporter  # an annotation only: importing this module needs no rich

Diagnose = Callable[[Sequence[str]], Diagnosis | None]
SETTLE_SECONDS = 1.0
# /health's poll once the log says the API server starts (vllmlog/bootlog.py server_starting): the
# clients wait behind the door for this boot, so its readiness is seen within this, not a back-off's step.
READY_POLL = 0.05


class BootFailed(Exception):
    def __init__(self, reason: str, finding: Diagnosis | None = None, exit_code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.finding = finding
        self.exit_code = exit_code


def restart_policy(compose: bytes, service: str) -> dict[str, Any] | None:
    """The `restart:` of `service` in a compose file, as the engine API spells it; None when
    the container is not restarted ("no", absent) or the file does not say it plainly."""
    import yaml  # only a wait that holds restarts parses the file

    try:
        value = yaml.safe_load(compose)["services"][service].get("restart")
    except (yaml.YAMLError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(value, str):
        return None
    name, _, count = value.partition(":")
    if name in ("always", "unless-stopped") and not count:
        return {"Name": name}
    if name == "on-failure" and (count.isdigit() or not count):
        return {"Name": name, "MaximumRetryCount": int(count or 0)}
    return None


def wait_healthy(*, project: str, service: str, health_url: str, timeout: float, max_interval: float,
                 reporter: Reporter, diagnose: Diagnose | None = None, stall_after: float | None = None,
                 restarts_from: Path | None = None, clock: Callable[[], float] = time.monotonic) -> WaitResult:
    """Wait until `health_url` answers 200, the container fails, the log stalls for
    `stall_after` seconds (None: never), or `timeout` passes. `restarts_from` is the compose file
    whose restart policy the container gets back once healthy (held off until then); None
    leaves it alone. `clock` is monotonic seconds (a test passes a fake one; the poller's waits
    go through the log follower)."""
    start = clock()
    container = None
    for _ in range(50):  # compose has just created it; give the API a moment
        container = find_container(project, service)
        if container is not None:
            break
        time.sleep(0.1)
    if container is None:
        return WaitResult(False, clock() - start, f"no {service} container in project {project}")
    first = state_of(container)
    held = restart_policy(restarts_from.read_bytes(), service) \
        if restarts_from is not None and restarts_from.is_file() else None
    if held is not None:
        try:
            set_restart_policy(container, {"Name": "no"})
        except OperationError:  # an engine that refuses: it restarts a crash as before, the rollback waits it out
            held = None
    # One threshold for both stalls: timeouts.stall is "seconds without boot progress".
    watch = StallWatch(stall_after, quiet_seconds=stall_after, start=clock()) if stall_after is not None else None

    def on_line(line: str) -> None:
        if watch is not None:
            watch.feed(line, clock())  # stamped on arrival, not when the poller next looks
        reporter.log_line(line)

    follower = LogFollower(container, on_line=on_line).start()
    first_fatal: list[float] = []
    serving = [False]  # the log said the API server starts

    def attempt() -> bool | None:
        lines = follower.lines
        if diagnose is not None and lines and diagnose(lines) is not None:
            # The first fatal line is often the generic one ("EngineCore failed to start");
            # the specific cause follows within moments, so settle briefly, then diagnose.
            if not first_fatal:
                first_fatal.append(clock())
            if follower.ended.is_set() or clock() - first_fatal[0] >= SETTLE_SECONDS:
                found = diagnose(follower.lines)
                assert found is not None
                raise BootFailed(f"fatal line in the log: {found.title}", found)
        st = state_of(container)
        if st.status in ("exited", "dead", "missing") or st.restart_count > first.restart_count \
                or st.status == "restarting":
            lines = follower.settle(1.0)  # let the last lines in
            found = diagnose(lines) if diagnose is not None else None
            raise BootFailed(f"the {service} container exited (code {st.exit_code})", found, st.exit_code)
        stalled = watch.check(clock()) if watch is not None else None
        if stalled is not None:
            raise BootFailed(f"the boot stalled: {stalled.title}", stalled)
        code = probe_health(health_url)
        reporter.tick(f"/health: {code or 'refused'}")
        return True if code == 200 else None

    def sleep(seconds: float) -> None:
        follower.changed.clear()
        if serving[0] or any(server_starting(line) for line in follower.lines[-20:]):
            serving[0] = True  # the server binds next: readiness is seen within one fast poll
            seconds = min(seconds, READY_POLL)
        follower.changed.wait(seconds)  # a new log line or the end of the log wakes us early

    def out_of_time(_: RetryCallState) -> bool:
        return clock() - start >= timeout  # on `clock`, not tenacity's own, so a fake clock drives it

    retrying = Retrying(stop=out_of_time, wait=wait_exponential(multiplier=0.1, max=max_interval),
                        retry=retry_if_result(lambda ok: ok is None), sleep=sleep, reraise=True)
    try:
        retrying(attempt)
        if held is not None:
            set_restart_policy(container, held)
        return WaitResult(True, clock() - start, "healthy", log_lines=list(follower.lines))
    except BootFailed as e:
        return WaitResult(False, clock() - start, e.reason, e.finding, e.exit_code, list(follower.lines),
                          ended=follower.ended.is_set())
    except RetryError:
        found = diagnose(follower.lines) if diagnose is not None else None
        return WaitResult(False, clock() - start, f"not healthy after {timeout:.0f} s", found,
                          log_lines=list(follower.lines))
