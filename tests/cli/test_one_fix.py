"""Every failure prints one fix, on one line: the CLI over the failure cases that cost no boot.

Each case runs the real CLI against a scratch node and checks stderr's `error:` line: one line,
exactly one "fix:" (a message that carries its own fix and also passes fix= prints two).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from kit.scratch import MINIMAL_STACK, Scratch
from simkit import run_cli
from test_bad_inputs import CASES, Case, _setup

# (id, argv); `{log}` is a boot log with the Marlin crash, `{file}` a plain file.
NO_ENGINE: list[tuple[str, tuple[str, ...]]] = [
    ("lint-nothing", ("lint",)),
    ("diagnose-nothing", ("diagnose",)),
    ("diagnose-not-a-number", ("diagnose", "abc")),
    ("diagnose-no-log-file", ("diagnose", "--log", "/nonexistent/vllm.log")),
    ("diagnose-unknown-stack", ("diagnose", "--log", "{log}", "--stack", "nosuch")),
    ("diagnose-unknown-revision", ("diagnose", "7")),
    ("logs-unknown", ("logs", "9")),
    ("diff-unknown", ("diff", "1", "2")),
    ("rollback-nothing", ("rollback", "--yes")),
    ("rollback-unknown-stack", ("rollback", "nope", "--yes")),
    ("switch-unknown-stack", ("switch", "nosuch", "--yes")),
    ("render-unknown-stack", ("render", "nosuch")),
    ("show-unknown-stack", ("show", "nosuch")),
    ("pin-unknown", ("pin", "3")),
    ("unpin-unknown", ("unpin", "4")),
    ("drain-nothing-deployed", ("drain",)),
    ("restore-nothing-deployed", ("restore",)),
    ("replay-not-a-capture", ("replay", "{file}")),
    ("lint-all-and-names", ("lint", "ok", "--all")),
]


def _one_fix(result: subprocess.CompletedProcess[str], what: object) -> str:
    assert result.returncode in (1, 2), (what, result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, (what, result.stderr)
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, (what, result.stderr)
    assert errors[0].count("fix:") == 1, (what, errors[0])
    assert result.stderr.count("fix:") == 1, (what, result.stderr)  # no fix on another line either
    return errors[0]


def _args(argv: tuple[str, ...], scratch: Scratch) -> list[str]:
    log = scratch.root / "boot.log"
    log.write_text("INFO loading weights\nAttributeError: '_OpNamespace' '_C' object has no attribute "
                   "'gptq_marlin_repack'\n")
    plain = scratch.root / "plain.txt"
    plain.write_text("not a capture\n")
    return [a.format(log=log, file=plain) for a in argv]


@pytest.mark.parametrize("argv", [c[1] for c in NO_ENGINE], ids=[c[0] for c in NO_ENGINE])
def test_a_failure_prints_one_fix(argv: tuple[str, ...], scratch: Scratch) -> None:
    scratch.write_stack("ok", MINIMAL_STACK)
    _one_fix(run_cli(scratch.config, *_args(argv, scratch), in_process=True), argv)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_prints_one_fix(case: Case, scratch: Scratch) -> None:
    out_dir = _setup(scratch, case)
    argv = list(case.argv)
    argv += ["--out", str(out_dir)] if argv[0] == "render" else []
    _one_fix(run_cli(None, "--config", str(scratch.config), *argv, in_process=True), case)


def test_folder_and_config_errors_print_one_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"state_dir: {blocker}/state\ndeploy_dir: {tmp_path}/deploy\n")
    _one_fix(run_cli(None, "--config", str(cfg), "pin", "3"), "state dir under a file")
    _one_fix(run_cli(None, "--config", str(tmp_path / "absent.yaml"), "status", in_process=True), "no config")


def test_engine_failures_print_one_fix(docker_engine: None, scratch: Scratch) -> None:
    """The cheap ones that ask the engine: an unknown container, a stack whose image is absent."""
    scratch.write_stack("ok", {**MINIMAL_STACK, "image": "b70test-absent/vllm:never"})
    _one_fix(run_cli(scratch.config, "diagnose", "--container", "b70test-no-such-container"), "container")
    line = _one_fix(run_cli(scratch.config, "switch", "ok", "--yes"), "image absent")
    assert "b70test-absent/vllm:never" in line


def test_a_missing_compose_plugin_is_named_as_such(docker_engine: None, scratch: Scratch, tmp_path: Path) -> None:
    bare = tmp_path / "docker-config"  # a docker config folder with no cli-plugins in it
    bare.mkdir()
    env = {"DOCKER_CONFIG": str(bare)}
    if subprocess.run(["docker", "compose", "version"], env={**os.environ, **env}, capture_output=True,
                      check=False).returncode == 0:
        pytest.skip("this machine has Compose installed system-wide: it cannot be taken away here")
    scratch.write_stack("ok", MINIMAL_STACK)
    line = _one_fix(run_cli(scratch.config, "lint", "ok", env=env), "no compose plugin")
    assert "the Docker Compose v2 plugin is missing" in line and "docker --help" not in line, line


def test_a_dead_docker_host_is_named_and_status_does_not_advise_a_restore(scratch: Scratch, tmp_path: Path) -> None:
    dead = f"unix://{tmp_path}/no-engine.sock"
    r = run_cli(scratch.config, "status", env={"DOCKER_HOST": dead})
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    assert f"UNKNOWN: cannot reach the Docker Engine at {dead} ($DOCKER_HOST)" in r.stdout, r.stdout
    assert "restore" not in r.stdout and "rollback" not in r.stdout, r.stdout
    r = run_cli(scratch.config, "status", "--json", env={"DOCKER_HOST": dead})
    assert r.returncode == 1 and dead in json.loads(r.stdout)["container"]["engine_error"]


def test_the_docker_clis_words_for_no_compose_plugin_are_named_everywhere() -> None:
    """Runs on every machine (the engine test above cannot take away a system-wide plugin): the
    docker CLI's own output without the plugin, as docker 28.2 prints it here, both shapes."""
    from b70deploy.docker.proc import explain

    as_command = "docker: unknown command: docker compose\n\nRun 'docker --help' for more information\n"
    flag_first = ("unknown flag: --project-directory\n\nUsage:  docker [OPTIONS] COMMAND\n\n"
                  "A self-sufficient runtime for containers\n")
    for stderr in (as_command, flag_first):
        found = explain(["docker", "compose", "--project-directory", "/x", "config"], stderr)
        assert found is not None and "Compose v2 plugin is missing" in str(found), stderr
    assert explain(["docker", "ps"], flag_first) is None  # only a compose call is about the plugin
