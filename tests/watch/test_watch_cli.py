"""watch's command line without an engine: the systemd unit, and bad watch/notify settings."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from simkit import run_cli


def test_unit_runs_watch_for_this_config_and_stops_with_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "s"), "deploy_dir": str(tmp_path / "d"),
                                      "timeouts": {"rollback": 300}}))
    r = run_cli(config, "watch", "--unit", in_process=True, check=True)
    lines = r.stdout.splitlines()
    exec_start = next(line for line in lines if line.startswith("ExecStart="))
    argv = shlex.split(exec_start.removeprefix("ExecStart="))
    assert argv[1:] == ["-m", "b70deploy.cli", "--config", str(config.resolve()), "watch"]
    assert "KillSignal=SIGTERM" in lines and "TimeoutStopSec=360" in lines  # room to undo a rollback
    assert "WantedBy=multi-user.target" in lines and "Restart=on-failure" in lines


@pytest.mark.parametrize(("notify", "says"), [
    ({"webhooks": ["ftp://x/y"]}, "notify.webhooks: a webhook is not an http(s) URL"),
    ({"command": "page ops"}, "notify.command"),
    ({"timeout": 0}, "notify.timeout"),
    ({"webhook": ["https://x"]}, "notify.webhook"),
])
def test_bad_notify_settings_are_one_line_and_exit_2(tmp_path: Path, notify: dict[str, object], says: str) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "s"), "notify": notify}))
    r = run_cli(config, "watch", "--unit", in_process=True)
    assert r.returncode == 2 and r.stdout == ""
    [line] = r.stderr.splitlines()
    assert str(config) in line and says in line and "fix:" in line
    assert not (tmp_path / "s").exists()  # nothing changed
