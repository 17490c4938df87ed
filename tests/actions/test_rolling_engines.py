"""Rolling switch and rollback over three real Docker Engines (issue 7's must-shows)."""

from __future__ import annotations

import json
import time

import pytest
from kit.engines import Fleet, Probe

# The three engines use fixed 10.213.x subnets: one xdist worker runs all of this module
# (tests/conftest.py ONE_WORKER).
pytestmark = pytest.mark.docker


def current(fleet: Fleet) -> dict[str, tuple[int | None, str | None, object]]:
    rows = fleet.json("status", "--nodes")
    return {r["node"]: (r["revision"], r["stack"], r["health"]) for r in rows}


def deploy_alpha(fleet: Fleet) -> None:
    r = fleet.cli("switch", "alpha", "--nodes", "all", "--max-unavailable", "3", "--yes", check=True)
    assert "all 3 node(s) done" in r.stdout, r.stdout
    assert current(fleet) == {n: (1, "alpha", 200) for n in fleet.names}


@pytest.mark.parametrize("k", [1, 2])
def test_rolling_switch_keeps_n_minus_k_healthy(fleet: Fleet, k: int) -> None:
    deploy_alpha(fleet)
    with Probe({n: fleet.url(n) for n in fleet.names}) as probe:
        r = fleet.cli("switch", "beta", "--nodes", "all", "--max-unavailable", str(k), "--yes")
        time.sleep(0.5)
    assert r.returncode == 0, r.stdout + r.stderr
    # The plan comes first: batches, timeouts, expected time from each node's last run.
    assert r.stdout.index("batch 1:") < r.stdout.index("all 3 node(s) done")
    assert "expected" in r.stdout and "last run (rev 1)" in r.stdout
    assert current(fleet) == {n: (2, "beta", 200) for n in fleet.names}
    assert len(probe.samples) > 20
    assert probe.minimum >= 3 - k, probe.samples
    assert probe.minimum == 3 - k, "no node ever left the pool: the probe saw nothing"
    # The engines really are separate: each runs exactly its own node's container.
    for e in fleet.engines:
        names = e.docker("ps", "--format", "{{.Names}}", "--filter",
                         f"label=com.docker.compose.project={fleet.project}").stdout.split()
        assert len(names) == 1, names
    # Each node's state store is on this machine, under <state_dir>/nodes/<name>.
    for n in fleet.names:
        assert (fleet.root / "state" / "nodes" / n / "revisions" / "000002" / "meta.json").is_file()
        assert (fleet.root / "deploy" / "nodes" / n / "docker-compose.yml").is_file()


def test_failure_on_node_two_stops_the_rollout(fleet: Fleet) -> None:
    deploy_alpha(fleet)
    r = fleet.cli("switch", "gamma", "--nodes", "all", "--max-unavailable", "1", "--yes", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    out = json.loads(r.stdout)
    states = {n["node"]: n["state"] for n in out["nodes"]}
    assert states == {"a": "switched", "b": "rolled-back", "c": "untouched"}
    assert "stopped at node b" in out["summary"]
    assert current(fleet) == {"a": (2, "gamma", 200), "b": (1, "alpha", 200), "c": (1, "alpha", 200)}
    hist_b = fleet.json("history", "--node", "b")
    assert [(h["stack"], h["outcome"]) for h in hist_b] == [("alpha", "deployed"), ("gamma", "failed")]
    hist_c = fleet.json("history", "--node", "c")
    assert [h["stack"] for h in hist_c] == ["alpha"]
    assert "gptq_marlin_repack" in fleet.cli("--node", "b", "logs", "2", check=True).stdout
    # Tables too.
    table = fleet.cli("status", "--nodes", check=True).stdout
    assert "3 of 3 node(s) healthy" in table and "gamma" in table
    # rollback --nodes a: node a back on alpha's bytes.
    r = fleet.cli("rollback", "--nodes", "a", "--yes", check=True)
    assert "all 1 node(s) done" in r.stdout
    assert current(fleet)["a"] == (3, "alpha", 200)


def test_rollback_all_on_failure_reverts_earlier_nodes(fleet: Fleet) -> None:
    deploy_alpha(fleet)
    r = fleet.cli("switch", "gamma", "--nodes", "all", "--max-unavailable", "1", "--rollback-all-on-failure",
                  "--yes", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    states = {n["node"]: n["state"] for n in json.loads(r.stdout)["nodes"]}
    assert states == {"a": "reverted", "b": "rolled-back", "c": "untouched"}
    now = current(fleet)
    assert {n: now[n][1:] for n in fleet.names} == {n: ("alpha", 200) for n in fleet.names}


def test_bad_input_on_any_node_changes_nothing(fleet: Fleet) -> None:
    r = fleet.cli("switch", "nosuch", "--nodes", "all", "--yes")
    assert r.returncode == 2 and "node a" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = fleet.cli("switch", "beta", "--nodes", "a,zz", "--yes")
    assert r.returncode == 2 and "unknown nodes zz" in r.stderr
    assert current(fleet) == {n: (None, None, "refused") for n in fleet.names}
    assert not list((fleet.root / "state").glob("nodes/*/revisions/*"))
