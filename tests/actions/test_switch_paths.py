"""The switch's other failure paths, driven through the real CLI on the real engine: a node
that will not go idle, a health timeout on a 503, a boot that stalls inside torch.compile,
--no-auto-rollback, and patch drift. After each, the node is asked which stack it serves."""

from __future__ import annotations

import json
import threading
import time

import requests
import yaml
from kit.simnode import SimNode, docker

from b70deploy.sim.image import TAGS as SIM_TAGS


def serves(node: SimNode) -> str | None:
    ids = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={node.project}",
                 "--filter", "label=com.docker.compose.service=vllm").stdout.split()
    if not ids:
        return None
    return docker("inspect", "-f", '{{index .Config.Labels "b70deploy.stack"}}', ids[0]).stdout.strip()


def add_stack(node: SimNode, name: str, doc: dict[str, object]) -> None:
    (node.root / "stacks" / f"{name}.yaml").write_text(yaml.safe_dump(doc))


def set_config(node: SimNode, **changes: object) -> None:
    cfg = yaml.safe_load(node.config.read_text())
    for key, value in changes.items():
        if isinstance(value, dict):
            cfg[key] = {**cfg.get(key, {}), **value}
        else:
            cfg[key] = value
    node.config.write_text(yaml.safe_dump(cfg))


def last_run_steps(node: SimNode) -> list[tuple[str, str]]:
    """(event, step) of the newest run in the journal."""
    lines = [json.loads(x) for x in (node.state / "journal.jsonl").read_text().splitlines()]
    start = max(i for i, e in enumerate(lines) if e["event"] == "run-start")
    return [(e["event"], e.get("step", "")) for e in lines[start:]]


def test_a_busy_host_refuses_the_switch_before_the_drain_and_a_client_sees_no_error(node: SimNode) -> None:
    """The load is read before the drain (issue 35): on a busy host the switch refuses while alpha still
    serves; a client asking all along is answered every time."""
    set_config(node, load_threshold=0.001)  # a loaded test machine is never that idle
    r = node.cli("switch", "alpha", "--yes", "--verify-wait", "1")
    # nothing served before alpha: no client to cut off, so the load does not hold the switch up
    assert r.returncode == 0 and "nothing is serving: load check skipped" in r.stdout + r.stderr, r.stderr
    url = f"http://127.0.0.1:{node.prod}/v1/completions"
    model = requests.get(f"http://127.0.0.1:{node.prod}/v1/models", timeout=10).json()["data"][0]["id"]
    answers: list[int | str] = []
    done = threading.Event()

    def ask() -> None:
        while not done.is_set():
            try:
                answers.append(requests.post(url, json={"model": model, "prompt": "Hi", "max_tokens": 1},
                                             timeout=30).status_code)
            except requests.RequestException as e:
                answers.append(type(e).__name__)
            time.sleep(0.05)

    client = threading.Thread(target=ask, daemon=True)
    client.start()
    try:
        r = node.cli("switch", "beta", "--yes", "--verify-wait", "1")
    finally:
        done.set()
        client.join(timeout=60)
    assert r.returncode == 1 and "switch refused before the drain" in r.stderr, r.stderr
    out = r.stdout + r.stderr
    assert "waiting up to 1 s for the node to go idle" in out  # said while it waits, not only at the end
    assert "load_threshold in the node config" in r.stderr and "timeouts.verify" not in r.stderr  # a real key
    steps = last_run_steps(node)
    assert ("step-failed", "idle") in steps and not [s for e, s in steps if s == "drain"], steps
    assert answers and set(answers) == {200}, sorted(set(map(str, answers)))
    assert serves(node) == "alpha" and node.json("status")["differs"] == []


def test_a_503_until_the_timeout_fails_and_rolls_back(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    add_stack(node, "sick", {"extends": "alpha", "env": {"B70SIM_FAIL": "unhealthy"}})
    r = node.cli("switch", "sick", "--yes", "--timeout", "4")
    assert r.returncode == 1 and "not healthy after 4 s" in r.stderr, r.stderr
    assert "node back on revision 1 (alpha)" in r.stdout
    assert serves(node) == "alpha" and node.json("status")["differs"] == []


def test_a_boot_that_goes_quiet_in_torch_compile_is_a_compile_stall(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    # 10 s: a container that starts slowly on a loaded machine is a log stall before it is a compile one
    set_config(node, timeouts={"stall": 10})
    add_stack(node, "stalls", {"extends": "alpha", "enforce_eager": False, "env": {"B70SIM_FAIL": "compile-hang"}})
    r = node.cli("switch", "stalls", "--yes")
    assert r.returncode == 1 and "compile-stall" in r.stderr and "enforce_eager" in r.stderr, r.stderr
    assert serves(node) == "alpha"


def test_no_auto_rollback_leaves_the_failed_stack_and_status_names_the_fix(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    r = node.cli("switch", "crash", "--yes", "--no-auto-rollback")
    assert r.returncode == 1 and "--no-auto-rollback" in r.stdout, r.stdout + r.stderr
    assert serves(node) in (None, "crash")  # the crashed container is left for a look (restarting)
    st = node.json("status")
    assert st["health"] != 200
    assert st["current"]["stack"] == "alpha" and st["fix"] == "b70deploy rollback 1 (its exact files and image, " \
        "recreated)", st
    node.cli("rollback", "1", "--yes", check=True)
    assert serves(node) == "alpha" and node.json("status")["differs"] == []


def test_patch_drift_stops_the_switch_before_anything_stops(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    before = {p.name: p.read_bytes() for p in node.deploy.iterdir() if p.is_file()}
    docker("tag", SIM_TAGS["bash-c-drift"], f"{node.project}/vllm:drift")
    try:
        set_config(node, image_map={"intel/vllm:drift": f"{node.project}/vllm:drift"})
        add_stack(node, "drifted", {"extends": "alpha", "image": "intel/vllm:drift"})
        r = node.cli("switch", "drifted", "--yes")
    finally:
        docker("rmi", f"{node.project}/vllm:drift", check=False)
    assert r.returncode == 2 and "patch-does-not-apply" in r.stderr, r.stderr
    assert serves(node) == "alpha"
    assert {p.name: p.read_bytes() for p in node.deploy.iterdir() if p.is_file()} == before
    assert ("step-start", "drain") not in last_run_steps(node)

