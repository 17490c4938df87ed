"""Issue 39, point 3: at 80 columns (COLUMNS=80, as `COLUMNS=80 b70deploy history | less` asks) history,
status, stacks and lint --all print no line over 80: history's header is whole on one line, cells are
cut and the least important columns left out (a note names them); the failure text is whole in
`history N` and --json, as status.json keeps it."""

from __future__ import annotations

import json

import pytest
from kit.simnode import SimNode

pytestmark = pytest.mark.docker

NARROW = {"COLUMNS": "80"}


def test_history_status_stacks_and_lint_fit_80_columns(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", "-m", "first deploy: W4A16 + fp8 KV at 131K, a message long enough to "
             "need cutting at eighty columns", check=True)
    failed = node.cli("switch", "crash", "--yes")
    assert failed.returncode == 1, failed.stderr
    shown = {}
    for args in (("history",), ("status",), ("stacks",), ("lint", "--all")):
        r = node.cli(*args, env=NARROW)
        assert r.returncode in (0, 2), r.stderr  # lint exits 2 on a stack with errors
        long = [line for line in r.stdout.splitlines() if len(line) > 80]
        assert not long, (args, long)
        shown[args[0]] = r
    header, *rows = shown["history"].stdout.splitlines()
    assert header.split()[:2] == ["rev", "stack"] and "why it failed" in header, header
    assert len(rows) == 2 and rows[1].split()[:2] == ["2", "crash"], rows  # one line per revision
    assert " failed " in rows[1] and " ".join(node.json("history", "2")["created"][:16].split("T")) in rows[1]
    assert len(rows[1].split("  ")[-1]) >= 20, rows  # why it failed has room
    assert "left out at 80 columns:" in shown["history"].stderr
    whole = json.loads(node.cli("history", "2", "--json", check=True).stdout)["failure"]
    status = json.loads((node.state / "revisions" / "000002" / "status.json").read_text())
    stored = status["failure"]
    assert whole == stored and len(whole) > 80
    listed = json.loads(node.cli("history", "--json", check=True).stdout)
    assert next(r for r in listed if r["number"] == 2)["failure"] == (status["diagnosis"] or stored)
    one = node.cli("history", "2", env=NARROW, check=True).stdout
    assert all(len(line) <= 80 for line in one.splitlines()) and "failure:" in one
    assert " ".join(one.split()).count(" ".join(stored.split()[:6])) == 1
