"""LogFollower.settle on the real engine: a container that ended before its log stream began
(a remote engine under load starts the stream late) still gives its log, by one read."""

from __future__ import annotations

import pytest
from simkit import docker, unique

from b70deploy.docker.engine import LogFollower, client

pytestmark = pytest.mark.docker


def test_settle_reads_the_log_of_an_ended_container_whose_stream_never_started(
        sim_images: dict[str, str]) -> None:
    name = unique("logs")
    try:
        ran = docker("run", "--name", name, "--entrypoint", "/bin/busybox", sim_images["bash-c"], "sh", "-c",
                     "echo first; echo 'RuntimeError: the fatal line' >&2; exit 1")
        assert ran.returncode == 1
        follower = LogFollower(client().containers.get(name))  # never started: no stream yet
        lines = sorted(follower.settle(0.1))  # stdout and stderr: the engine keeps no order between them
        assert lines == ["RuntimeError: the fatal line", "first"]
        follower._emit("late")  # the stream, were it to start now, must not repeat what was read
        assert sorted(follower.lines) == lines
    finally:
        docker("rm", "-f", name)
