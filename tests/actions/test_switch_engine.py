"""switch and rollback on the real engine with the sim image (issue 4's must-shows)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from kit.simnode import SimNode, docker
from simkit import CLI, cli_env

from b70deploy.sim.image import TAGS as SIM_TAGS

pytestmark = pytest.mark.docker


def tree_digest(*roots: Path) -> str:
    h = hashlib.sha256()
    for root in roots:
        if not root.exists():
            continue
        for p in sorted(root.rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(root)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def assert_revisions_intact(node: SimNode) -> None:
    """No revision lost or altered: every file matches the hash recorded when it was made."""
    for d in sorted((node.state / "revisions").glob("[0-9]*")):
        meta = json.loads((d / "meta.json").read_text())
        for name, digest in meta["files"].items():
            assert hashlib.sha256((d / "files" / name).read_bytes()).hexdigest() == digest, (d, name)


def test_switch_a_to_b_records_revisions_and_dry_run_changes_nothing(node: SimNode) -> None:
    r = node.cli("switch", "alpha", "--yes", check=True)
    assert "node on revision 1 (alpha)" in r.stdout
    before = tree_digest(node.state, node.deploy)
    dry = node.cli("switch", "beta", "--dry-run", check=True)
    assert "dry run, nothing changed" in dry.stdout and "activate" in dry.stdout
    assert "-      - \"131072\"" in dry.stdout and "+      - \"262144\"" in dry.stdout
    assert tree_digest(node.state, node.deploy) == before
    r = node.cli("switch", "beta", "--yes", "-m", "longer context", check=True)
    assert "node on revision 2 (beta)" in r.stdout
    hist = node.json("history")
    assert [(h["number"], h["stack"], h["outcome"]) for h in hist] == [(1, "alpha", "superseded"),
                                                                        (2, "beta", "deployed")]
    assert hist[1]["parent"] == 1 and hist[1]["message"] == "longer context"
    rev = node.state / "revisions" / "000002" / "files"
    for name in ("docker-compose.yml", ".env", "vllm.env", "patches/marlin-xpu-carveout/marlin_utils.py"):
        assert (node.deploy / name).read_bytes() == (rev / name).read_bytes()
    assert (node.deploy / "vllm.env").stat().st_mode & 0o777 == 0o600
    st = node.json("status")
    assert st["current"]["number"] == 2 and st["health"] == 200
    assert st["facts"]["kv_cache_tokens"] == 270592 and st["facts"]["attention_backend"] == "FLASH_ATTN"
    models = requests.get(f"http://127.0.0.1:{node.prod}/v1/models", timeout=5).json()
    assert {m["id"] for m in models["data"]} == {"qwen3-30b-a3b-w4a16", "alias-b"}
    webui = docker("ps", "--filter", f"label=com.docker.compose.project={node.project}",
                   "--filter", "label=com.docker.compose.service=webui", "--format", "{{.State}}").stdout.strip()
    assert webui == "running"
    audit = node.json("audit")
    assert [a["command"] for a in audit] == ["switch alpha", "switch beta"]
    assert_revisions_intact(node)


def test_the_new_container_is_created_while_the_old_one_still_serves(node: SimNode) -> None:
    """The clients' outage starts after the engine has created the new container: in the
    engine's own event stream beta's vllm is created before alpha's gets its stop signal, and
    started only after alpha's died."""
    node.cli("switch", "alpha", "--yes", check=True)
    t0 = time.time()
    node.cli("switch", "beta", "--yes", check=True)
    out = docker("events", "--since", f"{t0:.3f}", "--until", f"{time.time():.3f}",
                 "--filter", f"label=com.docker.compose.project={node.project}",
                 "--filter", "label=com.docker.compose.service=vllm",
                 "--format", '{{.TimeNano}} {{.Action}} {{index .Actor.Attributes "b70deploy.stack"}}').stdout
    seen = [(int(t), action, stack) for t, action, stack in (line.split() for line in out.splitlines())]

    def first(action: str, stack: str) -> int:
        return min(t for t, a, s in seen if a == action and s == stack)

    assert first("create", "beta") < first("kill", "alpha") < first("die", "alpha") < first("start", "beta"), seen
    assert _serves(node) == "beta"


def _crash_times(node: SimNode, since: float) -> list[float]:
    """When containers of the project died by themselves (not stopped by a drain: 0/137/143)."""
    out = docker("events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}", "--filter",
                 f"label=com.docker.compose.project={node.project}", "--filter", "event=die",
                 "--format", "{{.TimeNano}} {{.Actor.Attributes.exitCode}}").stdout.splitlines()
    return [int(t) / 1e9 for t, code in (line.split() for line in out) if code not in ("0", "137", "143")]


def test_crash_at_boot_rolls_back_with_diagnosis_within_two_seconds(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    t0 = time.time()
    r = node.cli("switch", "crash", "--yes")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "marlin-on-xpu" in r.stderr and "gptq_marlin_repack" in r.stderr
    assert "node back on revision 1 (alpha), healthy" in r.stdout
    journal = [json.loads(line) for line in (node.state / "journal.jsonl").read_text().splitlines()]
    failed = [e for e in journal if e["event"] == "step-failed" and e["step"] == "wait-healthy"][-1]
    dies = [t for t in _crash_times(node, t0) if t < failed["ts"] + 5]
    assert dies, "the crashed container's exit was not seen"
    lag = failed["ts"] - dies[0]
    assert lag < 2.0, f"diagnosis {lag:.2f} s after the container exited"
    hist = node.json("history")
    assert hist[-1]["outcome"] == "failed" and node.json("status")["current"]["number"] == 1
    log = node.cli("logs", str(hist[-1]["number"]), check=True).stdout
    assert "gptq_marlin_repack" in log
    again = node.cli("diagnose", str(hist[-1]["number"]))  # the kept log, diagnosed later
    assert again.returncode == 1 and "marlin-on-xpu" in again.stdout
    assert requests.get(f"http://127.0.0.1:{node.prod}/health", timeout=5).status_code == 200


@pytest.mark.parametrize("stack,why", [("garbage", "expected 'Paris'"), ("fallback", "FLASH_ATTN")])
def test_healthy_but_wrong_fails_the_check_and_rolls_back(node: SimNode, stack: str, why: str) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    r = node.cli("switch", stack, "--yes")
    assert r.returncode == 1
    assert "failed at check" in r.stderr and why in r.stderr, r.stderr
    assert "node back on revision 1 (alpha)" in r.stdout
    assert node.json("status")["current"]["stack"] == "alpha"
    # why it failed is kept with the revision: in history, and in diagnose when no log line says it
    failed = next(h for h in node.json("history") if h["number"] == 2)
    assert failed["outcome"] == "failed" and why in failed["failure"], failed
    shown = node.cli("history", check=True).stdout
    assert "why it failed" in shown and why.split()[0] in shown, shown
    if stack == "garbage":  # the smoke test: a clean log
        said = node.cli("diagnose", "2").stdout
        assert "no fatal signature" in said and "revision 2 failed: check: " in said and why in said, said


def test_rollback_by_stack_restores_exact_bytes_pinned_to_the_image_that_ran(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    ran = node.running_image()
    node.cli("switch", "beta", "--yes", check=True)
    # The tag moves to another image: a rollback must still run the image that ran alpha.
    docker("tag", SIM_TAGS["bash-c-drift"], node.tags["bash-c"])
    assert docker("image", "inspect", "-f", "{{.Id}}", node.tags["bash-c"]).stdout.strip() != ran
    r = node.cli("rollback", "alpha", "--yes", check=True)
    assert "node on revision 3 (alpha)" in r.stdout
    one = node.state / "revisions" / "000001" / "files"
    three = node.state / "revisions" / "000003" / "files"
    for f in one.rglob("*"):
        if f.is_file():
            rel = f.relative_to(one)
            assert (three / rel).read_bytes() == f.read_bytes()
            assert (node.deploy / rel).read_bytes() == f.read_bytes()
    assert node.running_image() == ran
    hist = node.json("history")
    assert hist[-1]["kind"] == "rollback" and hist[-1]["restored_from"] == 1 and hist[-1]["parent"] == 2
    # No argument: back to the previous revision (beta).
    r = node.cli("rollback", "--yes", check=True)
    assert "node on revision 4 (beta)" in r.stdout


def test_rollback_to_a_gone_image_is_a_clear_error(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    node.cli("switch", "beta", "--yes", check=True)
    meta = json.loads((node.state / "revisions" / "000001" / "meta.json").read_text())
    meta["image_id"] = "sha256:" + "0" * 64
    (node.state / "revisions" / "000001" / "meta.json").write_text(json.dumps(meta))
    r = node.cli("rollback", "1", "--yes")
    assert r.returncode == 2 and "is gone" in r.stderr and "0000000000" in r.stderr


def test_concurrent_switch_is_refused_naming_the_holder(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    release = node.root / "models" / ".release"  # the `held` stack's boot waits for it
    held = subprocess.Popen([*CLI, "switch", "held", "--yes"], env=cli_env(node.config, node.extra_env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        holder = node.state / "lock.json"
        deadline = time.time() + 120  # a bound on a broken run, not a timing: the step lasts until released
        while time.time() < deadline and held.poll() is None:
            if holder.is_file() and json.loads(holder.read_text() or "{}").get("step") == "wait-healthy":
                break
            time.sleep(0.1)
        assert held.poll() is None, "the held switch ended before its boot was released"
        r = node.cli("switch", "beta", "--yes")
        # Refused at once, naming the holder and its step: a switch that waited for the lock
        # would have run after it (exit 0, a revision of beta).
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"pid {held.pid}" in r.stderr and "switch held" in r.stderr
        assert "step wait-healthy," in r.stderr, r.stderr
    finally:
        release.touch()
        out, err = held.communicate(timeout=120)
    assert held.returncode == 0, out + err
    # The refused switch left nothing behind: no revision, no run, the holder's result stands.
    assert [(h["stack"], h["outcome"]) for h in node.json("history")] == [("alpha", "superseded"),
                                                                          ("held", "deployed")]
    assert "switch beta" not in (node.state / "journal.jsonl").read_text()
    assert node.json("audit")[-1]["command"] == "switch held"


def test_dark_mode_never_touches_production(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    before = tree_digest(node.state / "revisions", node.deploy)
    node.cli("drain", check=True)
    r = node.cli("up", "beta", "--dark", check=True)
    assert f"127.0.0.1:{node.dark}" in r.stdout
    assert requests.get(f"http://127.0.0.1:{node.dark}/health", timeout=5).status_code == 200
    assert tree_digest(node.state / "revisions", node.deploy) == before
    node.cli("down", "--dark", check=True)
    r = node.cli("restore", check=True)
    assert "node restored" in r.stdout
    assert requests.get(f"http://127.0.0.1:{node.prod}/health", timeout=5).status_code == 200
    assert node.json("status")["current"]["number"] == 1


STEPS = ["preflight", "record", "snapshot", "drain", "verify", "activate", "wait-healthy", "check", "commit",
         "companions"]


# The kill matrix in three runs of consecutive kills (each on a node of its own, so pytest-xdist
# runs them side by side): every step is killed once, the verb still alternates by step index.
KILL_RUNS = [(0, 4), (4, 7), (7, len(STEPS))]


@pytest.mark.parametrize("first,stop", KILL_RUNS, ids=[f"{STEPS[a]}..{STEPS[b - 1]}" for a, b in KILL_RUNS])
def test_sigkill_at_every_step_boundary_then_resume_or_rollback(node: SimNode, first: int, stop: int) -> None:
    """The process is killed (SIGKILL) after each step in turn; `status` names the step, and
    `resume` (even turns) or `rollback` (odd turns) brings a healthy stack back, with no
    revision lost or altered."""
    node.cli("switch", "alpha", "--yes", check=True)
    target = "beta"
    for i, step in enumerate(STEPS[first:stop], first):
        known = {p.name for p in (node.state / "revisions").glob("[0-9]*")}
        killed = node.cli("switch", target, "--yes", env={"B70DEPLOY_FAULT": f"after:{step}"})
        assert killed.returncode == -9, (step, killed.stdout, killed.stderr)
        st = node.json("status")
        assert st["interrupted"]["step"] == step, (step, st)
        assert st["lock"]["alive"] is False
        if i == first:  # a kill at any step leaves the same stale lock (status says so above at every step)
            blocked = node.cli("switch", target, "--yes")
            assert blocked.returncode == 1 and "stale lock" in blocked.stderr
        verb = "resume" if i % 2 == 0 else "rollback"
        fixed = node.cli(verb, *(["--yes"] if verb == "rollback" else []))
        assert fixed.returncode == 0, (step, verb, fixed.stdout, fixed.stderr)
        st = node.json("status")
        assert "interrupted" not in st and st["lock"] is None and st["health"] == 200, (step, verb, st)
        # From outside: the container serves the stack the records name, from the current
        # revision's exact files, and nothing else of the project is left over.
        assert _serves(node) == st["current"]["stack"] and st["differs"] == [], (step, verb, st)
        assert_deploy_dir_is_revision(node, st["current"]["number"])
        assert sorted(_project_containers(node)) == sorted([f"{node.project}-vllm-1", f"{node.project}-webui-1"])
        assert known <= {p.name for p in (node.state / "revisions").glob("[0-9]*")}, "a revision was lost"
        assert_revisions_intact(node)
        target = "alpha" if st["current"]["stack"] == "beta" else "beta"


def _project_containers(node: SimNode) -> list[str]:
    return docker("ps", "-a", "--filter", f"label=com.docker.compose.project={node.project}",
                  "--format", "{{.Names}}").stdout.split()


def _serves(node: SimNode) -> str:
    ids = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={node.project}",
                 "--filter", "label=com.docker.compose.service=vllm").stdout.split()
    assert len(ids) == 1, ids
    return docker("inspect", "-f", '{{index .Config.Labels "b70deploy.stack"}}', ids[0]).stdout.strip()


@pytest.mark.parametrize("sig,code", [("INT", 130), ("TERM", 143)])
def test_an_interrupt_inside_activate_undoes_it_and_leaves_no_renamed_container(node: SimNode, sig: str,
                                                                                code: int) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    r = node.cli("switch", "beta", "--yes", env={"B70DEPLOY_FAULT": f"during:activate:{sig}"})
    assert r.returncode == code, r.stdout + r.stderr
    # From outside: alpha answers, its exact files are in the deploy dir, no stray containers.
    assert _serves(node) == "alpha"
    status = node.json("status")
    assert status["current"]["stack"] == "alpha" and status["differs"] == [] and status["fix"] is None
    assert_deploy_dir_is_revision(node, status["current"]["number"])
    assert sorted(_project_containers(node)) == sorted([f"{node.project}-vllm-1", f"{node.project}-webui-1"])
    assert node.json("history")[-1]["outcome"] == "interrupted"  # not failed: it was stopped


def assert_deploy_dir_is_revision(node: SimNode, number: int) -> None:
    files = node.state / "revisions" / f"{number:06d}" / "files"
    want = {f.relative_to(files).as_posix(): f.read_bytes() for f in files.rglob("*") if f.is_file()}
    have = {n: (node.deploy / n).read_bytes() for n in want if (node.deploy / n).is_file()}
    assert have == want, f"deploy dir differs from revision {number}"


def test_status_names_a_hand_edit_and_its_one_fix_works(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    env = node.deploy / ".env"
    env.write_text(env.read_text().replace("VLLM_PORT=", "VLLM_PORT_EDITED_BY_HAND=\nVLLM_PORT="))
    status = node.json("status")
    assert any("deploy dir differs from revision 1: .env" in d for d in status["differs"]), status
    assert status["fix"].startswith("b70deploy rollback 1")
    node.cli("rollback", "1", "--yes", check=True)
    after = node.json("status")
    assert after["differs"] == [] and after["current"]["stack"] == "alpha" and _serves(node) == "alpha"


def test_an_engine_that_dies_on_its_first_request_is_rolled_back_by_the_switch(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    (node.root / "stacks" / "dies.yaml").write_text("extends: alpha\nenv: {B70SIM_FAIL: die-after-ready}\n")
    r = node.cli("switch", "dies", "--yes")
    assert r.returncode == 1, r.stdout + r.stderr
    # The smoke tests run as soon as /health answers: their first request kills the engine, before the door
    # is released, and the log's diagnosis comes with the failure.
    assert "failed at check:" in r.stderr and "HTTP 500" in r.stderr, r.stderr  # the request it died on
    assert "[cpu-attention-unsupported]" in r.stderr and "node back on revision 1 (alpha)" in r.stdout
    assert _serves(node) == "alpha" and node.json("status")["differs"] == []


@pytest.mark.parametrize("step", ["drain", "activate", "wait-healthy", "companions"])
def test_sigkill_inside_a_step_then_rollback_serves_what_status_names(node: SimNode, step: str) -> None:
    """Killed after the step's effects but before it was journaled as done: the hardest point."""
    node.cli("switch", "alpha", "--yes", check=True)
    killed = node.cli("switch", "beta", "--yes", env={"B70DEPLOY_FAULT": f"during:{step}"})
    assert killed.returncode == -9, (step, killed.stdout, killed.stderr)
    st = node.json("status")
    assert st["interrupted"]["step"] == step and st["fix"].startswith("b70deploy resume"), st
    node.cli("rollback", "--yes", check=True)
    st = node.json("status")
    assert st["current"]["stack"] == "alpha" and _serves(node) == "alpha" and st["differs"] == [], st
    assert_deploy_dir_is_revision(node, st["current"]["number"])
    assert sorted(_project_containers(node)) == sorted([f"{node.project}-vllm-1", f"{node.project}-webui-1"])
    assert_revisions_intact(node)


def test_the_compose_file_is_written_on_the_walk_cli_actions_deploy_state(node: SimNode,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26's walk, asked of a real switch: the packages of the call stack at the moment the
    compose file is written, outermost first, each once, the bytes handed to state/fsio.py;
    docker/ (which produced the files earlier, then returned) is not among them."""
    import inspect

    from simkit import run_cli

    from b70deploy.deploy import deploydir

    seen: list[list[str]] = []
    real = deploydir.write_atomic

    def spy(path: Path, data: bytes, **kw: Any) -> None:
        if path.name == "docker-compose.yml":
            names = [str(f.frame.f_globals.get("__name__", "")) for f in reversed(inspect.stack())]
            rooms = [n.split(".")[1] for n in names if n.startswith("b70deploy.")]
            seen.append([r for i, r in enumerate(rooms) if i == 0 or rooms[i - 1] != r])
        real(path, data, **kw)

    monkeypatch.setattr(deploydir, "write_atomic", spy)
    r = run_cli(node.config, "switch", "alpha", "--yes", env=node.extra_env, in_process=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert node.answers() == "alpha"
    assert seen == [["cli", "actions", "deploy"]] and real.__module__ == "b70deploy.state.fsio"


@pytest.mark.parametrize("signal_name", ["TERM", "INT"])
def test_a_signal_after_the_commit_ends_with_the_commits_outcome_and_exit_0(node: SimNode, signal_name: str) -> None:
    """Issue 35: SIGTERM (or Ctrl-C) that lands once the run committed: the node serves the new revision, so
    the command says so and exits 0, and the audit line says ok, naming the signal."""
    node.cli("switch", "alpha", "--yes", check=True)
    r = node.cli("switch", "beta", "--yes", env={"B70DEPLOY_FAULT": f"after:commit:{signal_name}"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "node on revision 2 (beta)" in r.stdout and "terminated" not in r.stderr, r.stdout + r.stderr
    assert f"SIG{signal_name} came after the commit" in r.stdout + r.stderr
    last = node.json("audit")[-1]
    assert (last["command"], last["outcome"], last["signals_after_commit"]) == ("switch beta", "ok",
                                                                                [f"SIG{signal_name}"]), last
    st = node.json("status")
    assert st["current"]["stack"] == "beta" and st["differs"] == [] and _serves(node) == "beta", st
