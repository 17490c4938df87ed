"""The door's kept shell (docker/door.py): scripts run in one `sh` exec kept open in the door container,
with the exit status and output a plain exec gives, a plain exec when the shell breaks, and no `sh` left
in the door once its socket closes. On the real engine, in a container of the door's own image."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from b70deploy.docker import door, engine
from b70deploy.sim.door_image import build as build_door


@pytest.fixture
def box(docker_engine: None) -> Iterator[Any]:
    image = build_door().tag
    # created, then started inside the try: a start that fails (docker-py's run would) leaves nothing behind
    made = engine.client().containers.create(image, name=f"b70t-doorshell-{uuid.uuid4().hex[:8]}",
                                             entrypoint=["caddy", "run"])
    try:
        made.start()
        yield made
    finally:
        shell = door._shells.pop(made.id, None)
        if shell is not None:
            shell.close()
        made.remove(force=True)


def shells_in(box: Any) -> int:
    return sum(1 for p in box.top()["Processes"] if p[-1] == "sh")


def test_the_kept_shell_answers_as_an_exec_and_a_broken_one_falls_back_to_one(box: Any) -> None:
    script = "echo out; echo err >&2; exit 3"
    assert door._exec(box, script) == (3, "out\nerr\n")
    assert box.id in door._shells  # the answer came from the kept shell
    assert door._exec(box, "printf 'a\\nb'") == (0, "a\nb")  # output without a last newline
    code, plain = box.exec_run(["sh", "-c", script], demux=False)
    # what a plain exec says of the same script; its stdout and stderr are two pipes, so their lines
    # may come in either order
    assert (code, sorted(plain.decode().splitlines())) == (3, ["err", "out"])

    door._shells[box.id].sock.shutdown(socket.SHUT_RDWR)  # broken under it: the next script runs as a plain exec
    code, text = door._exec(box, script)
    assert (code, sorted(text.splitlines())) == (3, ["err", "out"]) and box.id not in door._shells
    assert door._exec(box, "echo again") == (0, "again\n") and box.id in door._shells  # kept again


def test_the_kept_shell_ends_with_its_socket(box: Any) -> None:
    assert door._exec(box, "true") == (0, "")
    assert shells_in(box) == 1
    door._shells.pop(box.id).close()  # as the process's exit closes it
    deadline = time.monotonic() + 10
    while shells_in(box) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert shells_in(box) == 0


def test_a_door_with_its_local_label_is_loaded_through_its_socket_alone() -> None:
    """A door that may be on the host's network is never given Caddy's default admin address: there it is
    the host's loopback, where another Caddy's admin API may listen. Only a door from before the socket
    (no label: in the project network) may fall back to it."""
    labelled = door._load_script(SimpleNamespace(labels={door.LOCAL_LABEL: "127.0.0.1:8000"}), "/tmp/door/c.json")
    assert "--address unix//tmp/door/admin.sock " in labelled and "2019" not in labelled
    older = door._load_script(SimpleNamespace(labels={}), "/tmp/door/c.json")
    assert "test -S /tmp/door/admin.sock" in older and "127.0.0.1:2019" in older
