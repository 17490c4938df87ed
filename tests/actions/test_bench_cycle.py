"""`up --dark` guards and `bench cycle` on the real engine with the sim image (issue 11 item 5):
the dark stack never starts beside a running production unless forced, and a cycle cut by
SIGINT in the middle of the bench still leaves production restored and healthy."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

import pytest
import requests
from kit.simnode import SimNode, docker
from simkit import CLI, cli_env

from b70deploy.state.lock import DeployLock

pytestmark = pytest.mark.docker


def project_containers(project: str) -> list[str]:
    return docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={project}").stdout.split()


def production_serves(node: SimNode) -> str:
    """Asked of the node (SimNode.answers), and its companion runs again."""
    assert len(node.containers("webui")) == 1, "the companion was not started again"
    return node.answers()


def test_up_dark_takes_the_lock_and_refuses_while_production_holds_the_gpu(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    r = node.cli("up", "beta", "--dark")
    assert r.returncode == 1 and "holds the GPU" in r.stderr and "b70deploy drain" in r.stderr, r.stderr
    assert project_containers(f"{node.project}-dark") == []
    with DeployLock(node.state, "switch gamma"):
        r = node.cli("up", "beta", "--dark", "--force")
        assert r.returncode == 1 and "locked by" in r.stderr and "switch gamma" in r.stderr, r.stderr
    r = node.cli("up", "beta", "--dark", "--force", check=True)
    assert requests.get(f"http://127.0.0.1:{node.dark}/health", timeout=5).status_code == 200
    node.cli("down", "--dark", check=True)
    assert production_serves(node) == "alpha"


def test_bench_cycle_bad_bench_args_fail_before_the_drain(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    started = docker("inspect", "-f", "{{.State.StartedAt}}", f"{node.project}-vllm-1").stdout
    for args, why in ((["--endpoint", "http://x"], "--endpoint"), (["--ctx", "512"], "which metric"),
                      (["--metric", "decode", "--no-such-flag"], "No such option")):
        r = node.cli("bench", "cycle", "beta", "--", *args)
        assert r.returncode == 2 and why in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert docker("inspect", "-f", "{{.State.StartedAt}}", f"{node.project}-vllm-1").stdout == started


def _generated(port: int) -> float:
    """vllm:generation_tokens_total of the server on `port` (vLLM's metric, as the sim serves it)."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:generation_tokens_total"))


def test_bench_cycle_sigint_mid_bench_restores_production_then_a_full_cycle_runs(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    out = node.root / "cut.json"
    cycle = subprocess.Popen([*CLI, "bench", "cycle", "beta", "--", "--metric", "decode", "--ctx", "512",
                              "--n-prompts", "60", "--max-tokens", "256", "--output", str(out)],
                             env=cli_env(node.config, node.extra_env), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # the lock names the cycle's phase
            holder = node.state / "lock.json"
            if holder.is_file() and json.loads(holder.read_text()).get("step") == "bench":
                break
            assert cycle.poll() is None, cycle.communicate()
            time.sleep(0.1)
        else:
            pytest.fail("the cycle never reached the bench")
        # In the middle of the bench, by the dark stack's own counter: more tokens than the warm-up
        # and the first measured request (256 each, one at a time) hold, so the second is under way
        # and one sample was gathered; the calibration's one-token probes cannot fill a request.
        while time.monotonic() < deadline and _generated(node.dark) <= 3 * 256:
            assert cycle.poll() is None, cycle.communicate()
            time.sleep(0.1)
        cycle.send_signal(signal.SIGINT)
        stdout, stderr = cycle.communicate(timeout=120)
    finally:
        if cycle.poll() is None:
            cycle.kill()
            cycle.wait()
    assert cycle.returncode == 130, stdout + stderr
    assert "bench exited 130 (interrupted); production restored and healthy" in stdout, stdout + stderr
    assert production_serves(node) == "alpha"
    assert project_containers(f"{node.project}-dark") == []
    assert not (node.state / "lock.json").exists()
    kept = json.loads(out.read_text())  # the bench kept what it measured before the signal
    assert kept["interrupted"] is True and 0 < len(kept["samples"]) < 60
    assert kept["environment"]["stack"] == "beta"
    assert kept["environment"]["endpoint"] == f"http://127.0.0.1:{node.dark}"

    r = node.cli("bench", "cycle", "beta", "--json", "--", "--metric", "decode", "--ctx", "512", "--n-prompts",
                 "2", "--max-tokens", "16", "--output", str(node.root / "full.json"), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(r.stdout[r.stdout.rindex('{\n  "ok"'):])  # after the bench's own lines
    assert result["ok"] and result["restored"] and result["bench_exit"] == 0, r.stdout
    assert json.loads((node.root / "full.json").read_text())["result"]["value"] > 0
    assert production_serves(node) == "alpha"
    assert [a["command"] for a in node.json("audit")][-2:] == ["bench cycle beta", "bench cycle beta"]


def test_bench_cycle_restores_production_after_a_dark_crash_and_after_sigterm_during_the_dark_boot(
        node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    r = node.cli("bench", "cycle", "crash", "--", "--metric", "decode", "--ctx", "512", timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "failed at up --dark: dark crash did not become healthy" in r.stdout
    assert "production restored and healthy" in r.stdout
    assert production_serves(node) == "alpha" and project_containers(f"{node.project}-dark") == []

    cycle = subprocess.Popen([*CLI, "bench", "cycle", "held", "--", "--metric", "decode", "--ctx", "512"],
                             env=cli_env(node.config, node.extra_env), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120  # a bound on a broken run: the held boot lasts until the signal
        while time.monotonic() < deadline:
            holder = node.state / "lock.json"
            if holder.is_file() and json.loads(holder.read_text() or "{}").get("step") == "up --dark" \
                    and project_containers(f"{node.project}-dark"):
                break
            assert cycle.poll() is None, cycle.communicate()
            time.sleep(0.1)
        else:
            pytest.fail("the cycle never started the dark stack")
        cycle.send_signal(signal.SIGTERM)  # while the dark stack boots (held: it never gets past it)
        stdout, stderr = cycle.communicate(timeout=120)
    finally:
        if cycle.poll() is None:
            cycle.kill()
            cycle.wait()
    assert cycle.returncode == 143, stdout + stderr
    assert "interrupted (SIGTERM) at up --dark; production restored and healthy" in stdout, stdout + stderr
    assert production_serves(node) == "alpha" and project_containers(f"{node.project}-dark") == []


def test_up_dark_on_a_taken_port_is_one_line_with_the_real_argv_and_leaves_no_container(node: SimNode) -> None:
    """Issue 39, point 2: the dark port held by another program. Docker's error comes in one line naming the
    whole `docker compose ... up ...` command, the fix names ports.dark, and no `Created` container stays."""
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("0.0.0.0", node.dark))
        held.listen()
        r = node.cli("up", "beta", "--dark")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    error = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and f"dark port {node.dark} is taken" in error[0], r.stderr
    assert f"-p {node.project}-dark " in error[0] and " up -d " in error[0] and "--force-recreate vllm`" in error[0]
    assert error[0].count("fix:") == 1, error[0]
    assert "set ports.dark in" in r.stderr
    assert project_containers(f"{node.project}-dark") == []
