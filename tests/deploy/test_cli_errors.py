"""Mistakes in the node's folders end in one line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "b70deploy.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, check=False)


def test_a_state_dir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"state_dir: {blocker}/state\ndeploy_dir: {tmp_path}/deploy\n")
    r = run("--config", str(cfg), "pin", "3")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert str(blocker) in r.stderr and "fix:" in r.stderr
    debug = run("--config", str(cfg), "pin", "3", env={"B70DEPLOY_DEBUG": "1"})
    assert "Traceback" in debug.stderr


def test_unknown_revision_and_stack_are_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"state_dir: {tmp_path}/state\ndeploy_dir: {tmp_path}/deploy\n")
    for args in (("logs", "9"), ("diff", "1", "2"), ("rollback", "nope", "--yes"), ("rollback", "--yes")):
        r = run("--config", str(cfg), *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, (args, r.stderr)
