"""Mistakes in the node's folders end in one line, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from simkit import run_cli

from b70deploy.actions import inspect
from b70deploy.cli import main
from b70deploy.errors import Terminated


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


@pytest.mark.parametrize(("exc", "code", "said"), [(KeyboardInterrupt(), 130, "interrupted"),
                                                   (Terminated("signal 15"), 143, "terminated")])
def test_an_interrupt_outside_the_steps_says_so_and_exits_130_or_143(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        exc: BaseException, code: int, said: str) -> None:
    """benchmarks/chaos.py found it: click turns a KeyboardInterrupt (Ctrl-C, or SIGTERM as
    Terminated) raised while a command plans (render, lint, lock) into Abort, and the CLI said
    "aborted", exit 1, as if the operator had refused a prompt."""
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"state_dir: {tmp_path}/state\ndeploy_dir: {tmp_path}/deploy\n")
    monkeypatch.setenv("B70DEPLOY_CONFIG", str(cfg))

    def interrupted(node: object) -> None:
        raise exc

    monkeypatch.setattr(inspect, "status", interrupted)
    with pytest.raises(SystemExit) as ended:
        main(["status"])
    assert ended.value.code == code
    assert capsys.readouterr().err.strip().splitlines()[-1] == said
