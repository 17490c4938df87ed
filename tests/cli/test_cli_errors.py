"""Mistakes in the node's folders end in one line, never a traceback."""

from __future__ import annotations

from pathlib import Path

from simkit import run_cli


def test_a_state_dir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"state_dir: {blocker}/state\ndeploy_dir: {tmp_path}/deploy\n")
    r = run_cli(None, "--config", str(cfg), "pin", "3")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert str(blocker) in r.stderr and "fix:" in r.stderr
    debug = run_cli(None, "--config", str(cfg), "pin", "3", env={"B70DEPLOY_DEBUG": "1"})
    assert "Traceback" in debug.stderr


def test_unknown_revision_and_stack_are_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"state_dir: {tmp_path}/state\ndeploy_dir: {tmp_path}/deploy\n")
    for args in (("logs", "9"), ("diff", "1", "2"), ("rollback", "nope", "--yes"), ("rollback", "--yes")):
        r = run_cli(None, "--config", str(cfg), *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, (args, r.stderr)
