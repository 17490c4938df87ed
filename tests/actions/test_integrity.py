"""Nothing lost, nothing wrong deployed (issue 22), on the real engine through the real CLI: a
flipped byte in a stored revision, a state dir on a small filesystem of the test's own that
fills up, truncated records. Each looks from outside: the vllm container (its id, stack label
and argv), a completion from the port, the deploy dir's bytes, the files under the state dir."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

import pytest
from kit.simnode import SimNode, docker
from kit.smallfs import fill, small_fs
from simkit import cli_env

from b70deploy.render.filenames import COMPOSE_FILE


def vllm_box(node: SimNode) -> dict[str, object]:
    """The one vllm container as the engine sees it: id, stack label, argv."""
    ids = node.containers("vllm")
    assert len(ids) == 1, ids
    attrs = json.loads(docker("inspect", ids[0]).stdout)[0]
    return {"id": attrs["Id"], "stack": attrs["Config"]["Labels"].get("b70deploy.stack"),
            "argv": [*(attrs["Config"].get("Entrypoint") or []), *(attrs["Config"].get("Cmd") or [])]}


def rev_dir(node: SimNode, number: int) -> Path:
    return node.state / "revisions" / f"{number:06d}"


def recorded(node: SimNode, number: int) -> dict[str, str]:
    return dict(json.loads((rev_dir(node, number) / "meta.json").read_text())["files"])


def deploy_dir_is(node: SimNode, number: int, want: dict[str, str] | None = None) -> None:
    """The deploy dir holds byte for byte what revision `number` recorded (by its meta.json's
    hashes, or `want`: read before the test damaged it)."""
    want = want or recorded(node, number)
    got = {p.relative_to(node.deploy).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in node.deploy.rglob("*") if p.is_file()}
    assert got == want, f"deploy dir is not revision {number}"


def current(node: SimNode) -> int:
    return int((node.state / "revisions" / "current").read_text())


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr and "serves nothing" not in r.stdout + r.stderr, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "; fix: " in errors[0], r.stderr
    return errors[0]


def flip_byte(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert data.count(old) >= 1, f"{old!r} not in {path}"
    path.write_bytes(data.replace(old, new, 1))


def journal_size(node: SimNode) -> int:
    return (node.state / "journal.jsonl").stat().st_size


def steps_since(node: SimNode, offset: int) -> list[str]:
    """The steps started since the journal was `offset` bytes long."""
    with (node.state / "journal.jsonl").open("rb") as fh:
        fh.seek(offset)
        lines = [json.loads(x) for x in fh.read().splitlines()]
    return [e.get("step", "") for e in lines if e["event"] == "step-start"]


# ---------------------------------------------------------------- a flipped byte


def test_a_flipped_byte_is_refused_before_the_drain_by_number_and_by_name(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    node.cli("switch", "beta", "--yes", check=True)
    before = vllm_box(node)
    assert before["stack"] == "beta" and "262144" in before["argv"]
    flip_byte(rev_dir(node, 1) / "files" / COMPOSE_FILE, b"131072", b"131073")  # alpha's max_model_len
    for spec in ("1", "alpha"):
        offset = journal_size(node)
        r = node.cli("rollback", spec, "--yes")
        line = one_line_error(r)
        assert r.returncode == 2 and "revision 1" in line and f"files/{COMPOSE_FILE}" in line, line
        assert "roll back to another revision" in line and "b70deploy fsck" in line
        assert "drain" not in steps_since(node, offset)
        assert vllm_box(node) == before  # the same container, never stopped or recreated
        assert node.answers() == "beta"
        deploy_dir_is(node, 2)
    assert node.cli("fsck").returncode == 1
    found = json.loads(node.cli("fsck", "--json").stdout)["findings"]
    assert [f["revision"] for f in found] == [1] and f"files/{COMPOSE_FILE}" in found[0]["what"]


def test_the_automatic_undo_never_writes_a_damaged_copy(node: SimNode) -> None:
    """The current revision's stored copy is damaged. With the deploy dir intact the undo writes
    the deploy dir's bytes (they have the recorded hashes) and status points at the repair;
    with the deploy dir changed too, the switch is refused before the drain."""
    node.cli("switch", "alpha", "--yes", check=True)
    stored = rev_dir(node, 1) / "files" / COMPOSE_FILE
    flip_byte(stored, b"131072", b"131073")
    st = node.json("status")
    assert st["differs"] and "rollback" not in st["fix"] and "fsck --repair" in st["fix"], st
    r = node.cli("switch", "crash", "--yes")  # fails to boot: the undo brings revision 1 back
    assert r.returncode == 1 and "node back on revision 1 (alpha)" in r.stdout, r.stdout + r.stderr
    box = vllm_box(node)
    assert box["stack"] == "alpha" and "131072" in box["argv"] and "131073" not in box["argv"]
    assert node.answers() == "alpha"
    deploy_dir_is(node, 1)
    assert node.cli("fsck", "--repair").returncode == 0
    assert b"131072" in stored.read_bytes() and node.json("status")["differs"] == []
    # Now damage the stored copy and hand-edit the deploy dir: nothing holds the undo's bytes.
    flip_byte(stored, b"131072", b"131073")
    flip_byte(node.deploy / COMPOSE_FILE, b"131072", b"131074")
    before, offset = vllm_box(node), journal_size(node)
    r = node.cli("switch", "beta", "--yes")
    line = one_line_error(r)
    assert r.returncode == 2 and "revision 1" in line and f"files/{COMPOSE_FILE}" in line, line
    assert "drain" not in steps_since(node, offset)
    assert vllm_box(node) == before and node.answers() == "alpha"
    st = node.json("status")
    assert "rollback 1" not in (st["fix"] or ""), st  # never advises deploying the damage


# ---------------------------------------------------------------- a full disk


def test_a_state_dir_that_fills_up_serves_what_the_records_name(node: SimNode) -> None:
    """The state dir on a tmpfs of 2 MiB. Filled to a level before the switch: refused before
    the drain, naming the full state dir. Filled while the new stack boots: undone, every record
    written from the reserve, the output says the state dir is full."""
    with small_fs(node.state, 2048):
        node.cli("switch", "alpha", "--yes", check=True)
        alpha = vllm_box(node)
        for leave_kib in (0, 32, 160):
            filler = fill(node.state, leave_kib * 1024)
            try:
                r = node.cli("switch", "beta", "--yes")
            finally:
                filler.unlink()
            line = one_line_error(r)
            assert r.returncode == 1 and f"the state dir {node.state} is full" in line, line
            assert vllm_box(node) == alpha and node.answers() == "alpha"
            assert current(node) == 1
            deploy_dir_is(node, 1)
        # Filled during the switch: once the new stack is booting.
        proc = subprocess.Popen([*node_cli(), "switch", "beta", "--yes"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=cli_env(node.config, node.extra_env))
        filler = None
        try:
            filler = fill_at_step(node, "wait-healthy", proc)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert filler is not None, "the switch ended before it booted beta"
        assert proc.returncode == 1 and "Traceback" not in err, out + err
        assert f"the state dir {node.state} is full" in err and "node back on revision 1 (alpha)" in out, out + err
        assert vllm_box(node)["stack"] == "alpha" and node.answers() == "alpha"
        assert current(node) == 1
        deploy_dir_is(node, 1)
        outcomes = [json.loads((d / "status.json").read_text())["outcome"]
                    for d in sorted((node.state / "revisions").glob("0*"))]
        assert outcomes[0] == "deployed" and "pending" not in outcomes, outcomes
        filler.unlink()
        node.cli("switch", "beta", "--yes", check=True)  # room again: the switch goes through
        assert node.answers() == "beta" and current(node) == len(outcomes) + 1


def node_cli() -> list[str]:
    from simkit import CLI

    return list(CLI)


def fill_at_step(node: SimNode, step: str, proc: subprocess.Popen[str]) -> Path | None:
    """Fill the state dir to the last byte as soon as the journal shows `step` starting."""
    journal = node.state / "journal.jsonl"
    seen = journal.stat().st_size
    deadline = time.monotonic() + 90
    while proc.poll() is None and time.monotonic() < deadline:
        with journal.open("rb") as fh:
            fh.seek(seen)
            events = [json.loads(line) for line in fh.read().splitlines() if line.endswith(b"}")]
        if any(e["event"] == "step-start" and e.get("step") == step for e in events):
            return fill(node.state)
        time.sleep(0.05)
    return None


# ---------------------------------------------------------------- truncated records


@pytest.mark.parametrize("record", ["meta.json", "status.json"])
@pytest.mark.parametrize("which", ["current", "older"])
def test_a_truncated_record_is_a_one_line_error_and_the_node_keeps_serving(
        node: SimNode, record: str, which: str) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    node.cli("switch", "beta", "--yes", check=True)
    before, beta = vllm_box(node), recorded(node, 2)
    number = 2 if which == "current" else 1
    path = rev_dir(node, number) / record
    path.write_bytes(path.read_bytes()[:40])  # a torn write: the head of the JSON
    for args in (("rollback", "1", "--yes"), ("rollback", "--yes"), ("rollback", "alpha", "--yes")):
        r = node.cli(*args)
        line = one_line_error(r)
        assert r.returncode == 2 and str(path) in line, (args, line)
        assert vllm_box(node) == before and node.answers() == "beta"
        deploy_dir_is(node, 2, beta)
    st = node.cli("status")
    assert st.returncode == 0 and "Traceback" not in st.stderr, st.stderr
    assert f"DAMAGED: {path}" in st.stdout, st.stdout
    if which == "current":
        assert "revision 2: its records cannot be read" in st.stdout and "no revision deployed" not in st.stdout
    hist = node.cli("history")
    assert hist.returncode == 0 and f"revision {number}: DAMAGED: {path}" in hist.stderr, hist.stdout + hist.stderr
    assert node.cli("fsck").returncode == 1
    repaired = node.cli("fsck", "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    if which == "current" and record == "meta.json":  # set aside: the live files kept as a new revision
        assert "the deploy dir kept as revision 3, now current" in repaired.stdout, repaired.stdout
        assert current(node) == 3 and node.json("status")["differs"] == [] and node.answers() == "beta"
        deploy_dir_is(node, 3, beta)
    assert node.cli("fsck").returncode == 0
    node.cli("switch", "alpha", "--yes", check=True)
    assert node.answers() == "alpha"
