"""The bench refuses what the report says hangs the server."""

from __future__ import annotations

from pathlib import Path

import yaml
from simkit import run_cli

from b70deploy.bench.guards import SUFFIX_DEADLOCK_C, suffix_deadlock
from b70deploy.state.revisions import RevisionStore

SUFFIX = {"name": "tq-256k", "speculative": {"method": "suffix"}}


def test_suffix_on_xpu_at_16_is_refused_with_the_reports_numbers() -> None:
    why = suffix_deadlock(SUFFIX, 16, xpu=True)
    assert why is not None and "tq-256k" in why and "C >= 16" in why and "C=16" in why
    assert SUFFIX_DEADLOCK_C == 16


def test_below_16_off_xpu_or_without_suffix_it_runs() -> None:
    assert suffix_deadlock(SUFFIX, 15, xpu=True) is None
    assert suffix_deadlock(SUFFIX, 64, xpu=False) is None
    assert suffix_deadlock({"name": "ngram", "speculative": {"method": "ngram"}}, 64, xpu=True) is None
    assert suffix_deadlock(None, 64, xpu=True) is None  # nothing deployed: nothing known


def test_the_cli_refuses_before_the_first_request(tmp_path: Path) -> None:
    """A node whose current revision is a suffix stack, its device_dir set (an XPU node): a sweep up
    to C=16 exits 2 naming the deadlock; nothing listens on the port, so any request would fail."""
    state = tmp_path / "state"
    store = RevisionStore(state)
    rev = store.create(stack="tq-256k", kind="switch", files={"docker-compose.yml": b"services: {}\n"},
                       image_ref="vllm-xpu:0.19.0-tr5", image_id=None, repo_digest=None, operator="test",
                       message="", created="2026-12-01T00:00:00Z",
                       stack_doc={"name": "tq-256k", "speculative": {"method": "suffix"}})
    store.set_current(rev.number)
    (tmp_path / "dri").mkdir()
    cfg = tmp_path / "node.yaml"
    cfg.write_text(yaml.safe_dump({"project": "guard", "deploy_dir": str(tmp_path / "deploy"), "state_dir": str(state),
                                   "device_dir": str(tmp_path / "dri"), "bind_address": "127.0.0.1",
                                   "ports": {"prod": 9, "dark": 10}}))
    r = run_cli(cfg, "bench", "sweep", "--concurrency", "1,4,16", "--ctx", "64")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "deadlocks on XPU at C >= 16" in r.stderr and "--concurrency" in r.stderr and "C <= 15" in r.stderr
