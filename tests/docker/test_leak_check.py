"""The end-of-suite leak check (simkit.leftovers) sees every container the suite or the tool
starts: session-named and session-labelled ones, and the tool's own image probes when they
belong to a state dir of this session; another session's probe is never flagged."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from simkit import LABEL, SESSION, TOOL_ROLE_LABEL, TOOL_STATE_LABEL, docker, leftovers, unique

from b70deploy.docker.image_inspect import LABEL as PROBE_LABEL
from b70deploy.docker.image_inspect import LABEL_VALUE, STATE_DIR_LABEL, ImageInspector

pytestmark = pytest.mark.docker


def test_the_simkit_labels_are_the_tools() -> None:
    assert (TOOL_ROLE_LABEL, TOOL_STATE_LABEL) == (PROBE_LABEL, STATE_DIR_LABEL)


def test_a_probe_left_by_the_tool_is_a_leak_of_the_session_that_owns_its_state_dir(
        sim_images: dict[str, str], tmp_path: Path) -> None:
    insp = ImageInspector(tmp_path / "state")
    try:
        probe = insp._probe_container(sim_images["bash-c"])  # what lint leaves if it is killed mid-probe
        probe.reload()
        assert probe.labels[PROBE_LABEL] == LABEL_VALUE
        assert probe.labels[STATE_DIR_LABEL] == str((tmp_path / "state").absolute())
        assert not probe.name.startswith(SESSION)  # the tool names it; only the label ties it to us
        assert ("container", probe.name) in leftovers([tmp_path])
        assert ("container", probe.name) not in leftovers([tmp_path / "elsewhere"])
    finally:
        insp.close()
    assert ("container", probe.name) not in leftovers([tmp_path])


def test_another_sessions_probe_is_not_ours(sim_images: dict[str, str], tmp_path: Path) -> None:
    other = tmp_path.parent / f"other-session-{secrets.token_hex(3)}"
    name = f"b70deploy-probe-{secrets.token_hex(5)}"
    made = docker("create", "--name", name, "--label", f"{PROBE_LABEL}={LABEL_VALUE}",
                  "--label", f"{STATE_DIR_LABEL}={other / 'state'}", sim_images["bash-c"], "true")
    assert made.returncode == 0, made.stderr
    try:
        assert ("container", name) not in leftovers([tmp_path])
        assert ("container", name) in leftovers([other])
    finally:
        docker("rm", "-f", name)


def test_session_named_and_labelled_containers_are_seen(sim_images: dict[str, str]) -> None:
    named, labelled = unique("leak-"), f"b70test-other-{secrets.token_hex(4)}"
    try:
        for argv in (["--name", named], ["--name", labelled, "--label", f"{LABEL}={SESSION}"]):
            assert docker("create", *argv, sim_images["bash-c"], "true").returncode == 0
        left = leftovers()
        assert ("container", named) in left and ("container", labelled) in left
    finally:
        docker("rm", "-f", named, labelled)
