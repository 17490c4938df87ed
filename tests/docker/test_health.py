"""wait_healthy's stall watch on a fake clock: a boot that goes quiet ends with the stall
diagnosis at `stall_after`, not at the health timeout, and no test waits for it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from b70deploy.deploy.nodeio import WaitResult
from b70deploy.docker import health
from b70deploy.docker.containers import ContainerState
from b70deploy.errors import OperationError
from b70deploy.ui.progress import PlainReporter
from b70deploy.vllmlog.diagnosis import COMPILE_STALL, LOG_STALL, diagnose

LOAD = "INFO [gpu_model_runner.py:2602] Starting to load model /models/x..."
COMPILE = "INFO [backends.py:548] Dynamo bytecode transform time: 8.21 s"
COMPILED = "INFO [monitor.py:53] torch.compile took 82.14 s in total"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Script:
    """The container's log as (arrival time, line), and when /health starts answering 200."""

    clock: FakeClock
    lines: list[tuple[float, str]]
    healthy_at: float | None = None
    probes: list[float] = field(default_factory=list)


class FakeChanged:
    """The follower's `changed` event: waiting advances the fake clock, delivering the lines due."""

    def __init__(self, follower: FakeFollower) -> None:
        self.follower = follower

    def clear(self) -> None:
        pass

    def wait(self, seconds: float) -> bool:
        """Until the next line arrives (as the real event is set by it) or `seconds` pass."""
        pending = self.follower.pending
        until = self.follower.script.clock.now + seconds
        self.follower.deliver_until(min(until, pending[0][0]) if pending else until)
        return True


class FakeFollower:
    script: Script  # set per test

    def __init__(self, container: Any, on_line: Callable[[str], None]) -> None:
        self.on_line = on_line
        self.lines: list[str] = []
        self.pending = sorted(self.script.lines)
        self.changed = FakeChanged(self)
        self.ended = type("Ended", (), {"is_set": staticmethod(lambda: False),
                                        "wait": staticmethod(lambda seconds: False)})()

    def start(self) -> FakeFollower:
        self.deliver_until(self.script.clock.now)
        return self

    def settle(self, seconds: float) -> list[str]:
        self.deliver_until(self.script.clock.now + seconds)
        return self.lines

    def deliver_until(self, t: float) -> None:
        clock = self.script.clock
        while self.pending and self.pending[0][0] <= t:
            at, line = self.pending.pop(0)
            clock.now = max(clock.now, at)
            self.lines.append(line)
            self.on_line(line)
        clock.now = max(clock.now, t)


@pytest.fixture
def boot(monkeypatch: pytest.MonkeyPatch) -> Callable[..., WaitResult]:
    def run(lines: list[tuple[float, str]], *, healthy_at: float | None = None, stall_after: float | None = 600,
            timeout: float = 3600, exit_at: float | None = None, exit_code: int = 0) -> WaitResult:
        clock = FakeClock()
        script = Script(clock, [(clock.now + t, line) for t, line in lines],
                        None if healthy_at is None else clock.now + healthy_at)

        def probe(url: str, *, timeout: float = 2.0) -> int | None:
            script.probes.append(clock.now)
            return 200 if script.healthy_at is not None and clock.now >= script.healthy_at else 503

        FakeFollower.script = script
        monkeypatch.setattr(health, "find_container", lambda project, service: object())
        def state(c: object) -> ContainerState:
            if exit_at is not None and clock.now >= clock_start + exit_at:
                return ContainerState("exited", exit_code, 0, "", "sha256:x")
            return ContainerState("running", None, 0, "", "sha256:x")

        clock_start = clock.now
        monkeypatch.setattr(health, "state_of", state)
        monkeypatch.setattr(health, "LogFollower", FakeFollower)
        monkeypatch.setattr(health, "probe_health", probe)
        return health.wait_healthy(project="p", service="vllm", health_url="http://x/health", timeout=timeout,
                                   max_interval=2.0, reporter=PlainReporter(heartbeat=1e9), diagnose=diagnose,
                                   stall_after=stall_after, clock=clock)
    return run


def test_quiet_inside_torch_compile_is_a_compile_stall(boot: Callable[..., WaitResult]) -> None:
    r = boot([(0, LOAD), (30, COMPILE)])
    assert not r.healthy and r.finding is not None and r.finding.id == COMPILE_STALL
    assert "enforce_eager: true" in r.finding.fix and r.finding.line == COMPILE
    assert r.reason.startswith("the boot stalled: torch.compile made no progress for 60")
    assert 630 <= r.elapsed < 640  # ended by the stall, not by the 3600 s health timeout


def test_quiet_outside_compile_is_a_log_stall(boot: Callable[..., WaitResult]) -> None:
    r = boot([(0, LOAD), (30, COMPILE), (100, COMPILED)])
    assert not r.healthy and r.finding is not None and r.finding.id == LOG_STALL
    assert r.finding.line == COMPILED and 700 <= r.elapsed < 710


def test_a_slow_boot_that_keeps_logging_is_not_a_stall(boot: Callable[..., WaitResult]) -> None:
    r = boot([(t, f"{LOAD} {t}") for t in range(0, 2000, 500)], healthy_at=1900)
    assert r.healthy and r.finding is None and 1900 <= r.elapsed < 1910


def test_a_container_exiting_0_during_boot_is_a_failure(boot: Callable[..., WaitResult]) -> None:
    # vLLM 0.21's API server exits 0 when its engine dies (tests/fixtures/vllm-0.21.0-cpu/die-after-ready.log):
    # an exit during the wait fails the boot whatever the code.
    r = boot([(0, LOAD), (5, "(APIServer pid=1) INFO:     Finished server process [1]")], exit_at=6)
    assert not r.healthy and r.exit_code == 0 and r.reason == "the vllm container exited (code 0)"
    assert r.elapsed < 20


def test_without_stall_after_only_the_timeout_ends_a_quiet_boot(boot: Callable[..., WaitResult]) -> None:
    r = boot([(0, LOAD), (30, COMPILE)], stall_after=None, timeout=1200)
    assert not r.healthy and r.reason == "not healthy after 1200 s" and r.finding is None
    assert 1200 <= r.elapsed < 1210


# ---------------------------------------------------------------- on the simulator, real time


class ProcContainer:
    """The simulator run on the host, shown to wait_healthy as a container: its stdout is the log."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def logs(self, **_: Any) -> Iterator[bytes]:
        out = self.proc.stdout
        assert out is not None
        yield from iter(out.readline, b"")

    def state(self) -> ContainerState:
        code = self.proc.poll()
        return ContainerState("running" if code is None else "exited", code, 0, "", None)


def test_the_simulator_hanging_in_torch_compile_ends_the_wait_as_a_compile_stall(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "B70SIM_FAIL": "compile-hang",
           "B70SIM_BOOT_SECONDS": "0.5"}
    proc = subprocess.Popen([sys.executable, "-m", "b70deploy.sim.server", "serve", "/models/Qwen3-30B-A3B-W4A16",
                             "--host", "127.0.0.1", "--port", str(port), "--kv-cache-dtype", "fp8"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    box = ProcContainer(proc)
    monkeypatch.setattr(health, "find_container", lambda project, service: box)
    monkeypatch.setattr(health, "state_of", lambda c: c.state())
    try:
        r = health.wait_healthy(project="p", service="vllm", health_url=f"http://127.0.0.1:{port}/health",
                                timeout=60, max_interval=0.5, reporter=PlainReporter(heartbeat=1e9),
                                diagnose=diagnose, stall_after=1.5)
    finally:
        proc.kill()
        proc.wait()
    assert not r.healthy and r.finding is not None and r.finding.id == COMPILE_STALL, r
    assert "Dynamo bytecode transform time" in r.finding.line and r.elapsed < 10


# ---------------------------------------------------------------- restarts held off during the wait


def json_yaml(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()  # JSON is YAML


@pytest.mark.parametrize("restart,policy", [
    ("unless-stopped", {"Name": "unless-stopped"}), ("always", {"Name": "always"}),
    ("on-failure:3", {"Name": "on-failure", "MaximumRetryCount": 3}),
    ("on-failure", {"Name": "on-failure", "MaximumRetryCount": 0}),
    ("no", None), (None, None), ("${RESTART}", None)])
def test_the_restart_policy_given_back_is_the_compose_files(restart: str | None, policy: dict[str, Any] | None) -> None:
    service = {"image": "x"} if restart is None else {"image": "x", "restart": restart}
    compose = json_yaml({"services": {"vllm": service}})
    assert health.restart_policy(compose, "vllm") == policy
    assert health.restart_policy(b"services: [", "vllm") is None  # not YAML: left alone


@pytest.mark.parametrize("healthy,refused", [(True, False), (False, False), (True, True)])
def test_a_boot_waits_with_restarts_off_and_gets_them_back_once_healthy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, healthy: bool, refused: bool) -> None:
    """A crash during the boot ends the wait, so the engine must not spend ~0.5 s restarting the
    container that the rollback then removes (it waits for that restart); a healthy stack gets
    the compose file's policy back, a failed one is left not restarting for the rollback. An
    engine that refuses the change keeps its policy and the wait goes on as before."""
    compose = tmp_path / "docker-compose.yml"
    compose.write_bytes(json_yaml({"services": {"vllm": {"image": "x", "restart": "unless-stopped"}}}))
    clock = FakeClock()
    FakeFollower.script = Script(clock, [(clock.now, LOAD)], clock.now + 5 if healthy else None)
    policies: list[dict[str, Any]] = []
    monkeypatch.setattr(health, "find_container", lambda project, service: object())
    monkeypatch.setattr(health, "state_of", lambda c: ContainerState("running", None, 0, "", "sha256:x")
                        if healthy or clock.now < 1010 else ContainerState("exited", 1, 0, "", "sha256:x"))
    def set_policy(container: object, policy: dict[str, Any]) -> None:
        if refused:
            raise OperationError("update refused")
        policies.append(policy)

    monkeypatch.setattr(health, "set_restart_policy", set_policy)
    monkeypatch.setattr(health, "LogFollower", FakeFollower)
    monkeypatch.setattr(health, "probe_health", lambda url, timeout=2.0: 200
                        if FakeFollower.script.healthy_at is not None and clock.now >= FakeFollower.script.healthy_at
                        else 503)
    r = health.wait_healthy(project="p", service="vllm", health_url="http://x/health", timeout=60, max_interval=2.0,
                            reporter=PlainReporter(heartbeat=1e9), diagnose=diagnose, restarts_from=compose,
                            clock=clock)
    assert r.healthy is healthy
    assert policies == ([] if refused else [{"Name": "no"}, {"Name": "unless-stopped"}] if healthy
                        else [{"Name": "no"}])


def test_readiness_is_seen_within_a_tenth_of_a_second_once_the_server_starts(boot: Callable[..., WaitResult]) -> None:
    """Issue 35: the poll backs off to poll_interval (2 s) while the engine loads, and /health is asked every
    0.05 s once the log says the API server starts: a 200 is seen within 0.1 s of the engine's, not 2 s.
    The lines are vLLM 0.24.0's on the real H200 (shared/reference/logs, api_server.py and uvicorn's)."""
    got = boot([(0.0, LOAD), (30.0, "(APIServer pid=685) INFO 12-06 04:25:34 [api_server.py:581] Starting vLLM "
                                     "server on http://0.0.0.0:8000"),
                (30.2, "(APIServer pid=685) INFO:     Application startup complete.")], healthy_at=30.37)
    assert got.healthy
    assert 30.37 <= got.elapsed <= 30.37 + 0.1, got.elapsed
