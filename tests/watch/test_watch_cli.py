"""watch's command line without an engine: the systemd unit, and bad watch/notify settings."""

from __future__ import annotations

import json
import select
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
import simkit
import yaml
from simkit import CLI, cli_env, run_cli


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


@pytest.mark.docker
def test_json_lines_and_a_clean_stop_on_sigterm(tmp_path: Path, docker_engine: None) -> None:
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "s"), "deploy_dir": str(tmp_path / "d"),
                                      "project": simkit.unique("j")}))
    proc = subprocess.Popen([*CLI, "watch", "--json", "--interval", "0.2"], env=cli_env(config),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # SIGTERM once it has said it is watching (an event: a fixed sleep ended it during its
        # imports on a loaded machine, before its handler was there)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        first = proc.stdout.readline() if ready else ""
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in (first + out).splitlines()]
    assert [e["event"] for e in events] == ["watch.start", "watch.stop"]
    assert events[1]["text"] == "stopped (Terminated)" and "Traceback" not in err
    assert "bake window: 900 s after a switch" in err  # what it will do, on stderr
