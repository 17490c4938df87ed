"""A node of our own on the real engine for watch (kit.simnode's SimNode), with stacks that die
or talk nonsense some seconds after a healthy switch, and a webhook receiver on loopback."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import simkit
import yaml
from kit.hooks import Hooks, receiver
from kit.simnode import SimNode, docker, write_stacks
from simkit import CLI, cli_env

from b70deploy.sim.box import write_models

# alias-late is served by the failing stacks only: /v1/models says from outside which stack answers.
LATE = {"served_model_names": ["qwen3-30b-a3b-w4a16", "alias-late"]}


def write_late_stacks(folder: Path) -> None:
    """dies: healthy, then the engine dies by itself 4 s after ready (and again after each
    restart); dies-late: the same with a 2 s bake window and death at 6 s; nonsense: healthy,
    then every completion is word-salad after 4 s."""
    docs = {
        "dies": {"extends": "alpha", **LATE, "env": {"B70SIM_FAIL": "die-after-ready", "B70SIM_FAIL_AFTER": "4"}},
        "dies-late": {"extends": "alpha", **LATE, "bake_seconds": 2,
                      "env": {"B70SIM_FAIL": "die-after-ready", "B70SIM_FAIL_AFTER": "6"}},
        "nonsense": {"extends": "alpha", **LATE, "env": {"B70SIM_FAIL": "garbage", "B70SIM_FAIL_AFTER": "4"}},
    }
    for name, doc in docs.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(doc))


@dataclass
class Watched:
    node: SimNode
    hooks: Hooks
    write_config: Callable[..., Path]
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def start_watch(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([*CLI, "watch", "--interval", "0.5", *args], env=cli_env(self.node.config),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.procs.append(proc)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.lines.append(line.rstrip("\n"))
        threading.Thread(target=read, daemon=True).start()
        return proc

    def wait_for_line(self, text: str, timeout: float) -> None:
        """Until a line watch printed holds `text`; fails with every line after `timeout` s."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert time.monotonic() < deadline, self.lines
            time.sleep(0.5)


@pytest.fixture
def watched(tmp_path: Path, sim_images: dict[str, str], free_port: Callable[[], int]) -> Iterator[Watched]:
    project = simkit.unique("w")
    tag = f"{project}/vllm:bash-c"
    docker("tag", sim_images["bash-c"], tag)
    write_models(tmp_path / "models")
    write_stacks(tmp_path / "stacks", "intel/vllm:latest")
    write_late_stacks(tmp_path / "stacks")
    prod, dark = free_port(), free_port()
    config = tmp_path / "node.yaml"
    with receiver() as hooks:
        def write_config(**notify: Any) -> Path:
            cfg = {
                "project": project, "deploy_dir": str(tmp_path / "deploy"), "state_dir": str(tmp_path / "state"),
                "stacks_dir": str(tmp_path / "stacks"), "models_dir": str(tmp_path / "models"), "device_dir": None,
                "bind_address": "127.0.0.1", "ports": {"prod": prod, "dark": dark}, "load_threshold": 1000,
                "image_map": {"intel/vllm:latest": tag},
                "stack_overlay": {"env": {"B70SIM_BOOT_SECONDS": "0.6", "B70SIM_DECODE_TPS": "500"},
                                  "settle_seconds": 0.5},
                "timeouts": {"health": 40, "rollback": 40, "poll_interval": 0.2},
                "watch": {"bake_seconds": 60, "interval": 0.5, "smoke_every": 1, "unhealthy_looks": 2},
                "notify": notify or {"webhooks": [hooks.url("ok")], "timeout": 2, "retries": 1},
            }
            config.write_text(yaml.safe_dump(cfg))
            return config

        write_config()
        node = SimNode(root=tmp_path, project=project, prod=prod, dark=dark, tags={"bash-c": tag}, config=config)
        w = Watched(node, hooks, write_config)
        try:
            yield w
        finally:
            for proc in w.procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
            simkit.remove_by_project(project)
            simkit.remove_keep_tags(project)
            docker("rmi", tag, check=False)
