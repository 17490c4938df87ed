"""Notifications are fail-open: a receiver that hangs or fails costs at most notify.timeout,
its failure is in the audit log, the others still get every event, secrets are masked."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import yaml
from kit.hooks import receiver

from b70deploy.config.node import load_node
from b70deploy.state.audit import AuditLog
from b70deploy.ui.notice import make_event
from b70deploy.ui.notify import Notifier

SECRET = "hf_AbCdEfGh12345678"


def test_hanging_and_failing_receivers_cost_at_most_the_timeout(tmp_path: Path) -> None:
    (tmp_path / "secrets.env").write_text(f"HF_TOKEN={SECRET}\n")
    (tmp_path / "secrets.env").chmod(0o600)
    got = tmp_path / "command-got.jsonl"
    with receiver() as hooks:
        cfg = {"state_dir": str(tmp_path / "state"), "deploy_dir": str(tmp_path / "deploy"),
               "secrets_env_file": str(tmp_path / "secrets.env"),
               "notify": {"webhooks": [hooks.url("hang"), hooks.url("fail"), hooks.url("ok")], "timeout": 1.5,
                          "retries": 2,
                          "command": [sys.executable, "-c",
                                      f"import sys; open({str(got)!r}, 'a').write(sys.stdin.read() + '\\n')"]}}
        (tmp_path / "node.yaml").write_text(yaml.safe_dump(cfg))
        node = load_node(str(tmp_path / "node.yaml"))
        notifier = Notifier.of(node)
        start = time.monotonic()
        for name in ("switch.started", "switch.failed"):
            notifier.send(make_event(node, name, stack="beta", revision=3,
                                     outcome=f"boot failed with HF_TOKEN={SECRET} in the env",
                                     diagnosis=f"token {SECRET} rejected"))
        sent = time.monotonic() - start
        notifier.close()
        closed = time.monotonic() - start
        # Bounds that tell the behaviours apart on a loaded machine: waiting on the hung receiver
        # would take its 1.5 s timeout, and its retries (3 x 1.5 s) would be 4.5 s.
        assert sent < 1.5  # send never waits on a receiver
        assert closed < 3.5, closed  # close waits at most notify.timeout in all
        assert hooks.events() == ["switch.started", "switch.failed"]
        assert hooks.hits["fail"] >= 3  # the first event: one attempt and two retries
        body = hooks.bodies[1]
    assert body["node"] == "b70" and body["stack"] == "beta" and body["revision"] == 3
    assert body["logs"] == "b70deploy logs 3"
    lines = [json.loads(line) for line in got.read_text().splitlines() if line.strip()]
    assert [b["event"] for b in lines] == ["switch.started", "switch.failed"]
    everything = json.dumps([*hooks.bodies, *lines]) + (tmp_path / "state" / "audit.log").read_text()
    assert SECRET not in everything and "****(sha256:" in body["outcome"] and "****(sha256:" in body["diagnosis"]
    audit = AuditLog(tmp_path / "state").entries()
    by_outcome = {(a["outcome"], a["receiver"]) for a in audit if a["command"] == "notify"}
    assert ("gave up", f"http://127.0.0.1:{hooks.port}") in by_outcome
    assert ("failed", f"http://127.0.0.1:{hooks.port}") in by_outcome
    assert "token-in-the-path" not in json.dumps(audit)  # a webhook's path may be its secret
