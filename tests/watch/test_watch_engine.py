"""watch on the real engine with the sim (issue 11's must-shows): a stack that dies some
seconds after a healthy switch is rolled back inside the bake window, and only alerted on
after it; a hanging or failing webhook does not hold up a switch by more than its timeout."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time

import pytest
import requests
from kit.simnode import docker
from watch.conftest import Watched

from b70deploy.state.lock import DeployLock

pytestmark = pytest.mark.docker


def served_aliases(port: int) -> set[str]:
    """Which stack answers, asked from outside: the failing stacks alone serve alias-late."""
    data = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
    return {m["id"] for m in data["data"]}


def running_stack(w: Watched) -> str:
    ids = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={w.node.project}",
                 "--filter", "label=com.docker.compose.service=vllm").stdout.split()
    assert len(ids) == 1, ids
    return docker("inspect", "-f", '{{index .Config.Labels "b70deploy.stack"}}', ids[0]).stdout.strip()


def stop_watch(w: Watched) -> None:
    proc = w.procs[-1]
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"watch did not stop within 30 s of SIGTERM; its last lines: {w.lines[-30:]}")
    assert code == 0, w.lines[-30:]
    time.sleep(0.2)  # the reader thread takes the last lines
    assert any(" watch.stop" in line for line in w.lines), w.lines


def test_a_stack_that_dies_inside_the_bake_window_is_rolled_back(watched: Watched) -> None:
    w, node = watched, watched.node
    node.cli("switch", "alpha", "--yes", check=True)
    w.start_watch()
    node.cli("switch", "dies", "--yes", check=True)  # healthy through the switch: it dies 4 s after ready
    switched = time.monotonic()
    assert "alias-late" in served_aliases(node.prod)
    body = w.hooks.wait_for("watch.rolled-back", timeout=90)
    print(f"rolled back and healthy {time.monotonic() - switched:.1f} s after the switch returned "
          "(the stack dies 4 s after ready)")
    assert body["revision"] == 2 and body["stack"] == "dies" and body["to"] == 1 and body["now_on"] == 3
    assert "[cpu-attention-unsupported]" in body["diagnosis"] and body["logs"] == "b70deploy logs 2"
    # The node serves the previous stack: asked from outside, not from our records.
    assert served_aliases(node.prod) == {"qwen3-30b-a3b-w4a16", "alias-b"}
    done = requests.post(f"http://127.0.0.1:{node.prod}/v1/completions", timeout=10, json={
        "model": "alias-b", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}).json()
    assert "Paris" in done["choices"][0]["text"]
    assert running_stack(w) == "alpha"
    hist = {h["number"]: h for h in node.json("history")}
    assert hist[3]["kind"] == "rollback" and hist[3]["restored_from"] == 1 and hist[3]["outcome"] == "deployed"
    assert hist[2]["outcome"] == "failed"
    assert "EngineDeadError" in node.cli("logs", "2", check=True).stdout
    assert json.loads((node.state / "watch.json").read_text()) == {"rolled_back": [2]}
    events = w.hooks.events()
    assert {"switch.succeeded", "rollback.started", "rollback.succeeded", "watch.rolled-back"} <= set(events)
    assert events.count("watch.rolled-back") == 1
    stop_watch(w)
    assert any("watch.rollback rev 2" in line and "rolling back to revision 1" in line for line in w.lines)


def test_the_same_failure_after_the_bake_window_alerts_and_does_not_act(watched: Watched) -> None:
    w, node = watched, watched.node
    node.cli("switch", "alpha", "--yes", check=True)
    w.start_watch()
    node.cli("switch", "dies-late", "--yes", check=True)  # bake 2 s; it dies 6 s after ready
    body = w.hooks.wait_for("watch.alert", timeout=90)
    assert body["revision"] == 2 and "after the 2 s bake window: not acting" in body["outcome"]
    assert "[cpu-attention-unsupported]" in body["diagnosis"]
    # The restart policy brings it back and it dies again: Docker's events show the deaths.
    w.wait_for_line("watch.alert rev 2: restart loop", timeout=60)
    assert any("watch.alert rev 2: the vllm container died" in line for line in w.lines)
    st = node.json("status")
    assert st["current"]["number"] == 2 and [h["number"] for h in node.json("history")] == [1, 2]
    assert "watch.rolled-back" not in w.hooks.events() and "rollback.started" not in w.hooks.events()
    assert running_stack(w) == "dies-late"  # the restart policy keeps bringing it back; nobody switched
    assert any("watch.baked rev 2: revision 2 passed its bake window" in line  # or first seen after it
               or ("watch.revision rev 2" in line and "bake window over" in line) for line in w.lines), w.lines
    stop_watch(w)


def after_steps(w: Watched, stack: str) -> float:
    """Seconds a `switch` process lives after its last step (the journal's run-ok): where it
    waits for its receivers. Start-up and the boot are left out: on a busy machine they vary
    by seconds, which would hide or fake the cost asked about."""
    w.node.cli("switch", stack, "--yes", check=True)
    ended = time.time()
    lines = [json.loads(line) for line in (w.node.state / "journal.jsonl").read_text().splitlines()]
    return ended - [e["ts"] for e in lines if e["event"] == "run-ok"][-1]


def test_a_hanging_or_failing_webhook_costs_a_switch_at_most_its_timeout(watched: Watched) -> None:
    w, node = watched, watched.node
    node.cli("switch", "alpha", "--yes", check=True)
    baseline = after_steps(w, "beta")
    timeout = 2.0
    w.write_config(webhooks=[w.hooks.url("hang"), w.hooks.url("fail")], timeout=timeout, retries=2)
    hung = after_steps(w, "alpha")
    print(f"switch after its last step: {baseline:.2f} s without receivers, {hung:.2f} s with a hanging "
          f"and a failing webhook (notify.timeout {timeout:g} s)")
    assert hung - baseline < timeout + 1.0, (baseline, hung)
    assert w.hooks.hits["hang"] >= 1 and w.hooks.hits["fail"] >= 3  # they were called, and retried
    audit = [a for a in node.json("audit") if a["command"] == "notify"]
    assert {a["outcome"] for a in audit} == {"gave up", "failed"}
    assert [a["command"] for a in node.json("audit") if a["command"] != "notify"] == \
        ["switch alpha", "switch beta", "switch alpha"]
    assert "alias-b" in served_aliases(node.prod) and running_stack(w) == "alpha"


def test_a_stack_whose_smoke_starts_failing_inside_the_bake_window_is_rolled_back(watched: Watched) -> None:
    w, node = watched, watched.node
    node.cli("switch", "alpha", "--yes", check=True)
    w.start_watch()
    node.cli("switch", "nonsense", "--yes", check=True)  # sense through the switch, word-salad 4 s after ready
    body = w.hooks.wait_for("watch.rolled-back", timeout=90)
    assert body["revision"] == 2 and body["to"] == 1
    assert served_aliases(node.prod) == {"qwen3-30b-a3b-w4a16", "alias-b"} and running_stack(w) == "alpha"
    stop_watch(w)
    assert any("smoke failed" in line and "garbage output" in line for line in w.lines), w.lines


def test_a_container_started_by_hand_is_drift_and_is_not_acted_on(watched: Watched) -> None:
    w, node = watched, watched.node
    node.cli("switch", "alpha", "--yes", check=True)
    w.start_watch()
    # Someone runs compose by hand from a copy of the deploy dir, with the stack label changed.
    hand = node.root / "by-hand"
    shutil.copytree(node.deploy, hand)
    compose = hand / "docker-compose.yml"
    compose.write_text(compose.read_text().replace('b70deploy.stack: "alpha"', 'b70deploy.stack: "handmade"'))
    up = subprocess.run(["docker", "compose", "--project-directory", str(hand), "-p", node.project,
                         "--profile", "gpu", "up", "-d", "--force-recreate", "vllm"],
                        capture_output=True, text=True, timeout=120, check=False)
    assert up.returncode == 0, up.stderr
    body = w.hooks.wait_for("watch.drift", timeout=60)
    assert body["revision"] == 1 and "runs stack handmade" in body["outcome"]
    time.sleep(2)
    assert "rollback.started" not in w.hooks.events() and running_stack(w) == "handmade"
    assert [h["number"] for h in node.json("history")] == [1]
    stop_watch(w)


def test_a_drain_inside_the_bake_window_is_not_a_failure(watched: Watched) -> None:
    w, node = watched, watched.node
    node.cli("switch", "alpha", "--yes", check=True)
    w.start_watch()
    node.cli("switch", "beta", "--yes", check=True)
    node.cli("drain", check=True)
    w.wait_for_line("vllm was stopped on purpose", timeout=30)
    time.sleep(2)
    assert [h["number"] for h in node.json("history")] == [1, 2]
    assert not any(e.startswith(("watch.", "rollback.")) for e in w.hooks.events())
    node.cli("restore", check=True)
    assert "alias-b" in served_aliases(node.prod) and running_stack(w) == "beta"
    stop_watch(w)


def test_watch_does_not_act_while_a_deploy_holds_the_lock(watched: Watched) -> None:
    w, node = watched, watched.node
    node.cli("switch", "alpha", "--yes", check=True)
    w.start_watch()
    node.cli("switch", "dies", "--yes", check=True)
    lock = DeployLock(node.state, "switch other").acquire()  # as a switch starting now would
    try:
        # The stack dies 4 s after ready, and again after its restart: watch sees it and holds off.
        w.wait_for_line("`switch other`", timeout=90)
        assert any("a deploy holds the lock" in line and "`switch other`" in line for line in w.lines), w.lines
        assert "rollback.started" not in w.hooks.events() and [h["number"] for h in node.json("history")] == [1, 2]
    finally:
        lock.release()
    w.hooks.wait_for("watch.rolled-back", timeout=60)  # still inside the bake window: now it acts
    assert running_stack(w) == "alpha"
    stop_watch(w)
