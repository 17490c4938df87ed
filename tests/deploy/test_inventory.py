"""The inventory, endpoints and the rolling plan, without Docker."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from simkit import run_cli

from b70deploy.actions import rollout as act
from b70deploy.config.node import load_node, load_nodes
from b70deploy.deploy.rollout import ASSUMED_BOOT, NodePlan, RolloutPlan, batches, expected_from
from b70deploy.docker import endpoint, proc
from b70deploy.errors import OperationError, UserError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, doc: dict[str, Any]) -> str:
    p = tmp_path / "node.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def inventory(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"project": "fleet", "state_dir": str(tmp_path / "state"), "deploy_dir": str(tmp_path / "deploy"),
            "ports": {"prod": 8000, "dark": 8001},
            "nodes": {"gpu1": {"docker_host": "ssh://ops@gpu1", "address": "192.168.0.61"},
                      "gpu2": {"docker_context": "gpu2", "address": "192.168.0.62",
                               "ports": {"prod": 9000, "dark": 9001}, "state_dir": str(tmp_path / "s2")},
                      "local": {"docker_host": "unix:///run/other.sock", "ports": {"prod": 8100, "dark": 8101}}},
            **extra}


def test_config_without_nodes_is_the_single_node_as_before(tmp_path: Path) -> None:
    node = load_node(write(tmp_path, {"state_dir": str(tmp_path / "s"), "deploy_dir": str(tmp_path / "d")}))
    assert node.name is None and node.docker_env == {} and node.address == "127.0.0.1"
    assert node.state_dir == tmp_path / "s" and node.on_this_host
    with pytest.raises(UserError, match="no inventory"):
        load_nodes(write(tmp_path, {}))


def test_inventory_nodes_have_their_own_endpoint_ports_and_dirs(tmp_path: Path) -> None:
    path = write(tmp_path, inventory(tmp_path))
    nodes = load_nodes(path)
    assert [n.name for n in nodes] == ["gpu1", "gpu2", "local"]
    gpu1, gpu2, local = nodes
    # The state store of every node lives on this machine, one folder per node.
    assert gpu1.state_dir == tmp_path / "state" / "nodes" / "gpu1"
    assert gpu1.deploy_dir == tmp_path / "deploy" / "nodes" / "gpu1"
    assert gpu2.state_dir == tmp_path / "s2"
    assert gpu1.docker_env == {"DOCKER_HOST": "ssh://ops@gpu1"} and not gpu1.on_this_host
    assert gpu2.docker_env == {"DOCKER_CONTEXT": "gpu2"} and gpu2.config.ports.prod == 9000
    assert local.docker_env == {"DOCKER_HOST": "unix:///run/other.sock"} and local.on_this_host
    assert gpu1.project == gpu2.project == "fleet"
    assert [n.name for n in load_nodes(path, select="local,gpu1")] == ["local", "gpu1"]
    assert load_node(path, name="gpu2").state_dir == tmp_path / "s2"


def test_tls_endpoint(tmp_path: Path) -> None:
    doc = inventory(tmp_path)
    doc["nodes"] = {"t": {"docker_host": "tcp://gpu3:2376", "tls_dir": "certs"}}
    node = load_nodes(write(tmp_path, doc))[0]
    assert node.docker_env == {"DOCKER_HOST": "tcp://gpu3:2376", "DOCKER_TLS_VERIFY": "1",
                               "DOCKER_CERT_PATH": str(tmp_path / "certs")}


@pytest.mark.parametrize("nodes,msg", [
    ({"GPU1": {}}, "node name 'GPU1' is not allowed"),
    ({"a": {"docker_host": "http://x"}}, "is not a Docker endpoint"),
    ({"a": {"docker_host": "tcp://x:2375"}}, "has no tls_dir"),
    ({"a": {"docker_host": "ssh://u@x", "docker_context": "c"}}, "both docker_host and docker_context"),
    ({"a": {"nodes": {}}}, "inventories do not nest"),
    ({"a": {"ports": {"prod": "80"}}}, "nodes.a"),
    ({"a": {}, "b": {}}, "share"),
    ({}, "nodes is empty"),
])
def test_bad_inventories_are_one_line_errors(tmp_path: Path, nodes: dict[str, Any], msg: str) -> None:
    doc = inventory(tmp_path)
    doc["nodes"] = nodes
    with pytest.raises(UserError, match=msg) as err:
        load_nodes(write(tmp_path, doc))
    assert "\n" not in str(err.value) and "fix:" in str(err.value)


def test_selection_errors(tmp_path: Path) -> None:
    path = write(tmp_path, inventory(tmp_path))
    with pytest.raises(UserError, match="unknown nodes zz"):
        load_nodes(path, select="gpu1,zz")
    with pytest.raises(UserError, match="one twice"):
        load_nodes(path, select="gpu1,gpu1")
    with pytest.raises(UserError, match="say which node"):
        load_node(path)


def test_cli_exit_2_and_one_line(tmp_path: Path) -> None:
    doc = inventory(tmp_path)
    doc["nodes"]["gpu1"]["docker_host"] = "gpu1:22"
    r = run_cli(Path(write(tmp_path, doc)), "status", "--nodes", timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "docker_host" in r.stderr
    good = write(tmp_path, inventory(tmp_path))
    r = run_cli(Path(good), "history", timeout=60)
    assert r.returncode == 2 and "--node NAME" in r.stderr
    r = run_cli(Path(good), "switch", "alpha", "--max-unavailable", "2", timeout=60)
    assert r.returncode == 2 and "need --nodes" in r.stderr


def test_endpoint_reaches_subprocesses_and_sdk_clients_per_thread() -> None:
    from b70deploy.docker.engine import client

    assert "DOCKER_HOST=unix:///tmp/x.sock" not in proc.run(["env"]).stdout
    with endpoint.use({"DOCKER_HOST": "unix:///tmp/x.sock"}):
        assert "DOCKER_HOST=unix:///tmp/x.sock" in proc.run(["env"]).stdout
        assert "DOCKER_HOST=unix:///tmp/x.sock" in proc.run(["env"], env={"PATH": os.environ["PATH"]}).stdout
        with pytest.raises(OperationError, match=r"at unix:///tmp/x\.sock: .*No such file"):
            client()  # the SDK went to that socket (there is no engine there)
    seen: dict[str, dict[str, str]] = {}

    def work(name: str) -> None:
        with endpoint.use({"DOCKER_HOST": f"unix:///tmp/{name}.sock"}):
            time.sleep(0.05)
            seen[name] = endpoint.current()

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"a": {"DOCKER_HOST": "unix:///tmp/a.sock"}, "b": {"DOCKER_HOST": "unix:///tmp/b.sock"}}
    assert endpoint.current() == {}


def test_ssh_endpoint_without_paramiko_names_the_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK imports paramiko for every ssh:// client (use_ssh_client too); without it the error
    says so instead of blaming the engine."""
    from b70deploy.docker.engine import client

    monkeypatch.delattr("docker.api.client.SSHHTTPAdapter")  # what the SDK lacks without paramiko
    with endpoint.use({"DOCKER_HOST": "ssh://ops@127.0.0.1:1"}), \
            pytest.raises(OperationError, match=r"paramiko is not installed") as err:
        client()
    assert "docker[ssh]" in str(err.value.fix)


def test_a_remote_endpoint_negotiates_its_api_version_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over ssh:// every SDK request is an ssh session: version="auto" is paid once per endpoint."""
    from b70deploy.docker import engine

    asked: list[tuple[str | None, str]] = []

    def from_env(*, version: str, environment: dict[str, str] | None = None, **_: Any) -> Any:
        asked.append(((environment or {}).get("DOCKER_HOST"), version))
        return SimpleNamespace(api=SimpleNamespace(api_version="1.41"))

    monkeypatch.setattr(engine.docker, "from_env", from_env)
    monkeypatch.setattr(engine, "_api_versions", {})
    for host in ("ssh://ops@gpu1", "ssh://ops@gpu1", "ssh://ops@gpu2"):
        with endpoint.use({"DOCKER_HOST": host}):
            engine.client()
    engine.client()
    assert asked == [("ssh://ops@gpu1", "auto"), ("ssh://ops@gpu1", "1.41"), ("ssh://ops@gpu2", "auto"),
                     (None, "auto")]


def nplan(name: str, expected: float) -> NodePlan:
    return NodePlan(name, "local engine", "127.0.0.1", 8000, "rev 1 (a)", expected, "test", 720, 720)


def test_plan_batches_and_expected_duration() -> None:
    assert batches([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    with pytest.raises(ValueError):
        batches([1], 0)
    plan = RolloutPlan("switch eagle3", [nplan("a", 240), nplan("b", 300), nplan("c", 250)], 2, 30, False)
    assert [[p.name for p in b] for b in plan.batches] == [["a", "b"], ["c"]]
    assert plan.expected_seconds == 300 + 30 + 250
    text = "\n".join(plan.lines())
    assert "2 batch(es) of at most 2" in text and "at least 1 of 3 stay in the pool" in text
    assert "batch 2: c" in text and "9m40s" in text
    assert plan.to_dict()["batches"] == [["a", "b"], ["c"]]
    assert expected_from(None) == (ASSUMED_BOOT + 15.0, "no boot on record: assumed")
    assert expected_from({"number": 4, "timings": {"record": 0.1, "drain": 1.0, "wait-healthy": 231.0,
                                                   "check": 2.0}})[0] == 234.0
    assert expected_from({"number": 4, "facts": {"time_to_healthy": 231.0}})[0] == 246.0


def test_run_stops_at_first_failure_and_keeps_k_out_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["n1", "n2", "n3", "n4", "n5"]
    out_now, peak, ran = [0], [0], []
    guard = threading.Lock()

    def fake_one(d: Any, command: str, opts: Any, take_stale: bool) -> act.NodeResult:
        with guard:
            out_now[0] += 1
            peak[0] = max(peak[0], out_now[0])
            ran.append(d.node.label)
        time.sleep(0.05)
        with guard:
            out_now[0] -= 1
        bad = d.node.label == "n3"
        return act.NodeResult(d.node.label, "rolled-back" if bad else "switched", d.node.label)

    monkeypatch.setattr(act, "_one", fake_one)
    deps: Any = [SimpleNamespace(node=SimpleNamespace(label=n)) for n in names]
    plan = RolloutPlan("switch x", [nplan(n, 1) for n in names], 2, 0, False)
    out = act.run(plan, deps, "switch x", Any, _Quiet())  # type: ignore[arg-type]
    assert peak[0] == 2 and sorted(ran) == ["n1", "n2", "n3", "n4"]
    assert [r.state for r in out.results] == ["switched", "switched", "rolled-back", "switched", "untouched"]
    assert not out.ok and out.exit_code == 1 and "stopped at node n3" in out.summary


class _Quiet:
    def phase(self, name: str, detail: str = "") -> None: ...
    def info(self, message: str) -> None: ...
    def log_line(self, line: str) -> None: ...
    def tick(self, status: str) -> None: ...
    def close(self) -> None: ...
