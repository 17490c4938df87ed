"""Hot standby on the real engine with the sim and the door (issue 24): the live stack sleeps in its slot
while the new one boots beside it; a failed switch wakes it, checks it and points the door back; a
rollback to it wakes it instead of booting.

The sim reports vLLM 0.32.0 on XPU here (an image of this node's with that version in its `vllm`
package), where Platform.is_sleep_mode_available() is true (vllm/platforms/interface.py:231-236 in
0.32.0), so the render runs it with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1.

Asked from outside: the door's port answers (a completion, /v1/models' max_model_len, which differs
between alpha and beta), the engine says which container runs, since when, and with which labels,
and each slot's own port says whether it sleeps.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
import requests
import yaml
from kit.clients import Clients
from kit.ports import free_span
from kit.simnode import SimNode, docker
from simkit import CLI, cli_env

from b70deploy.config.node import load_node
from b70deploy.docker.node import DockerNode
from b70deploy.errors import OperationError
from b70deploy.render.door import DOOR_SERVICE
from b70deploy.sim.door_image import build as build_door
from b70deploy.sim.image import TAGS as SIM_TAGS

pytestmark = pytest.mark.docker


def sim_032(node: SimNode) -> str:
    """The sim image with vLLM 0.32.0 in its `vllm` package (what the tool reads the version from), and
    that release's XPU carve-out of Marlin, upstream since 0.23 (patches/marlin-xpu-carveout.yaml), so the
    stacks render without the patch and still boot: the sim's `standby` variant (b70deploy/sim/vllm_tree.py),
    built once for the session, under a tag of this node's (the node fixture removes it)."""
    tag = f"{node.project}/vllm:v032"
    docker("tag", SIM_TAGS["standby"], tag)
    node.tags["v032"] = tag
    return tag


@pytest.fixture
def standby_node(node: SimNode, sim_images: dict[str, str], free_port: Callable[[], int]) -> Iterator[SimNode]:
    door = f"{node.project}/door:caddy"
    docker("tag", build_door().tag, door)
    node.tags["door"] = door
    cfg = yaml.safe_load(node.config.read_text())
    cfg["image_map"]["intel/vllm:latest"] = sim_032(node)
    cfg["door"] = {"enabled": True, "image": door, "hold_seconds": 60, "retry_after": 7, "probe_port": free_port()}
    cfg["standby"] = "sleep"
    cfg["companions"] = []
    node.config.write_text(yaml.safe_dump(cfg))
    try:
        yield node
    finally:
        for box in ours(node):  # the slots are compose projects of their own: P-r<N>
            docker("rm", "-f", box["Id"], check=False)
        for net in docker("network", "ls", "-q", "--filter", f"name={node.project}-r").stdout.split():
            docker("network", "rm", net, check=False)
        docker("rmi", door, check=False)


def ours(node: SimNode) -> list[dict[str, Any]]:
    """`docker inspect` of the node's vllm containers, its slots' included."""
    rows = docker("ps", "-a", "--filter", "label=b70deploy.role=vllm", "--format",
                  '{{.ID}} {{.Label "com.docker.compose.project"}}').stdout.splitlines()
    mine = [i for i, _, project in (r.partition(" ") for r in rows)
            if project == node.project or project.startswith(f"{node.project}-r")]  # never another test's
    return [json.loads(docker("inspect", i).stdout)[0] for i in mine]


def port_of(box: dict[str, Any]) -> int:
    return int(box["NetworkSettings"]["Ports"]["8000/tcp"][0]["HostPort"])


def sleeping(box: dict[str, Any]) -> bool:
    said = requests.get(f"http://127.0.0.1:{port_of(box)}/is_sleeping", timeout=5)
    if said.status_code == 404:  # no development endpoints: a vLLM rendered without sleep mode never sleeps
        return False
    got: bool = said.json()["is_sleeping"]
    return got


def served(node: SimNode) -> tuple[str, int, dict[str, Any]]:
    """Through the door: a completion that says Paris and /v1/models' max_model_len; from the engine: the
    one running, awake container of ours on the door's network, and its stack label."""
    url = f"http://127.0.0.1:{node.prod}"
    card = requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]
    done = requests.post(f"{url}/v1/completions", timeout=30,
                         json={"model": card["id"], "prompt": "The capital of France is", "max_tokens": 4}).json()
    assert "Paris" in done["choices"][0]["text"], done
    on_door = [b for b in ours(node) if b["State"]["Running"]
               and f"{node.project}_default" in b["NetworkSettings"]["Networks"] and not sleeping(b)]
    assert len(on_door) == 1, [b["Name"] for b in on_door]
    return on_door[0]["Config"]["Labels"]["b70deploy.stack"], int(card["max_model_len"]), on_door[0]


def _beta_serving(node: SimNode) -> dict[str, Any]:
    """`switch alpha`, then `switch beta`: beta serves (slot 2), alpha sleeps (slot 1); beta's container."""
    node.cli("switch", "alpha", "--yes", check=True)
    node.cli("switch", "beta", "--yes", check=True)
    return served(node)[2]


def _killed_switch(node: SimNode, stack: str, fault: str) -> None:
    """`switch STACK` SIGKILLed by the runner's own fault hook (B70DEPLOY_FAULT, e.g. before:activate)."""
    killed = node.cli("switch", stack, "--yes", env={"B70DEPLOY_FAULT": fault})
    assert killed.returncode == -9, killed.stdout + killed.stderr


def test_standby_failed_switch_wakes_the_sleeping_stack_and_the_door_points_back(standby_node: SimNode) -> None:
    node = standby_node
    node.cli("switch", "alpha", "--yes", check=True)
    stack, length, alpha = served(node)
    assert (stack, length) == ("alpha", 131072)
    assert "--enable-sleep-mode" in alpha["Config"]["Cmd"][-1] or "--enable-sleep-mode" in alpha["Config"]["Cmd"]
    r = node.cli("switch", "garbage", "--yes")  # healthy, then its smoke tests fail
    assert r.returncode == 1, r.stdout + r.stderr
    assert "node back on revision 1 (alpha)" in r.stdout, r.stdout + r.stderr
    stack, length, now = served(node)
    # the same container, never restarted: woken, not booted
    assert (stack, length, now["Id"], now["State"]["StartedAt"]) == ("alpha", 131072, alpha["Id"],
                                                                       alpha["State"]["StartedAt"])
    log = docker("logs", now["Id"]).stdout + docker("logs", now["Id"]).stderr
    assert "seconds to fall asleep" in log and "seconds to wake up" in log, log[-2000:]
    assert [b["Config"]["Labels"]["b70deploy.stack"] for b in ours(node)] == ["alpha"]  # the failed slot is gone
    assert node.json("history")[-1]["outcome"] == "failed"


def test_standby_rollback_wakes_the_previous_stack_instead_of_booting(standby_node: SimNode) -> None:
    node = standby_node
    node.cli("switch", "alpha", "--yes", check=True)
    _, _, alpha = served(node)
    node.cli("switch", "beta", "--yes", check=True)
    stack, length, beta = served(node)
    assert (stack, length) == ("beta", 262144)
    asleep = [b for b in ours(node) if b["Id"] == alpha["Id"]]
    assert asleep and sleeping(asleep[0])  # alpha sleeps beside beta
    # status and history say so (issue 24 item 5), and neither prune nor gc takes it
    st = node.json("status")
    assert st["container"]["stack"] == "beta" and not st["differs"], st
    assert [(s["slot"], s["stack"], s["asleep"]) for s in st["standbys"]] == [(1, "alpha", True)], st["standbys"]
    assert "standby: revision 1 (alpha) asleep" in node.cli("status", check=True).stdout
    assert [(h["number"], h["asleep"]) for h in node.json("history")] == [(1, True), (2, False)]
    node.cli("prune", "--keep", "1", "--yes", check=True)
    assert [h["number"] for h in node.json("history")] == [1, 2]
    assert "revision 1" not in node.cli("gc", "--dry-run").stdout
    done = node.cli("rollback", "--yes", check=True)
    assert "woke revision 1's slot" in done.stdout + done.stderr, done.stdout + done.stderr
    stack, length, now = served(node)
    assert (stack, length, now["Id"], now["State"]["StartedAt"]) == ("alpha", 131072, alpha["Id"],
                                                                       alpha["State"]["StartedAt"])
    beta_now = [b for b in ours(node) if b["Id"] == beta["Id"]]
    assert beta_now and sleeping(beta_now[0])  # and beta is the standby now
    assert node.json("status")["current"]["number"] == 3


def test_standby_a_stack_that_does_not_fit_beside_the_sleeper_is_refused_and_forced_wakes_it(
        standby_node: SimNode) -> None:
    """The sim's GPU ledger (B70SIM_GPU_LEDGER, in the image's warm-boot cache folder, which every container
    of that image mounts) on a 32 GiB device: alpha holds 0.9 of it awake and 1 GiB asleep (the sim's
    B70SIM_ASLEEP_GIB). A stack at 0.98 wants 31.36 GiB where 31 are free beside the sleeper: lint
    standby-memory refuses it before anything stops; with the rule ignored, vLLM's start-up check
    (request_memory, vllm/v1/worker/utils.py:403-421 in 0.21.0, as the sim models it) fails its boot
    and the sleeping alpha is woken."""
    node = standby_node
    cfg = yaml.safe_load(node.config.read_text())
    cfg["standby"] = {"mode": "sleep", "keep_gib": 1.0}
    cfg["gpu_memory_gib"] = 32
    cfg["stack_overlay"]["env"].update({"B70SIM_GPU_LEDGER": "/var/cache/b70deploy/gpu-ledger.json",
                                        "B70SIM_GPU_MEMORY_GIB": "32", "B70SIM_ASLEEP_GIB": "1"})
    node.config.write_text(yaml.safe_dump(cfg))
    stacks = node.root / "stacks"
    (stacks / "fat.yaml").write_text(yaml.safe_dump({"extends": "alpha", "gpu_memory_utilization": 0.98}))
    (stacks / "fat-forced.yaml").write_text(yaml.safe_dump(
        {"extends": "fat", "lint": {"ignore": {"standby-memory": "forced: vLLM's own check decides"}}}))
    node.cli("switch", "alpha", "--yes", check=True)
    _, _, alpha = served(node)
    refused = node.cli("switch", "fat", "--yes")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = [ln for ln in refused.stderr.splitlines() if "standby-memory" in ln]
    assert len(said) == 1 and "31 GiB is free" in said[0], refused.stderr
    stack, _, now = served(node)  # nothing stopped, nothing slept
    assert (stack, now["Id"]) == ("alpha", alpha["Id"])
    forced = node.cli("switch", "fat-forced", "--yes")
    assert forced.returncode == 1, forced.stdout + forced.stderr
    assert "node back on revision 1 (alpha)" in forced.stdout, forced.stdout + forced.stderr
    failed = node.json("history")[-1]
    assert failed["stack"] == "fat-forced" and failed["outcome"] == "failed"
    log = node.cli("logs", str(failed["number"]), check=True).stdout
    assert "Free memory on device" in log and "is less than desired GPU memory utilization (0.98" in log, log[-2000:]
    stack, _, now = served(node)
    assert (stack, now["Id"], now["State"]["StartedAt"]) == ("alpha", alpha["Id"], alpha["State"]["StartedAt"])


def test_standby_drain_and_restore_stop_and_start_the_slot_that_serves(standby_node: SimNode) -> None:
    node = standby_node
    node.cli("switch", "alpha", "--yes", check=True)
    _, _, alpha = served(node)
    node.cli("drain", check=True)
    box = [b for b in ours(node) if b["Id"] == alpha["Id"]]
    assert box and not box[0]["State"]["Running"]  # the slot itself stopped, not a container beside it
    node.cli("restore", check=True)
    stack, _, now = served(node)
    assert (stack, now["Id"]) == ("alpha", alpha["Id"]) and len(ours(node)) == 1  # no second vllm made


def test_standby_dry_run_says_what_will_sleep_and_what_will_stop(standby_node: SimNode) -> None:
    """Issue 39, point 5: a live stack started without --enable-sleep-mode (here one whose stack says
    `standby: off`, as an adopted hand-made stack runs) cannot sleep: `switch --dry-run` says the drain
    stops it, and the switch does (asked of the engine); once the live stack runs in a standby slot, the
    dry run says that slot falls asleep."""
    node = standby_node
    (node.root / "stacks" / "plain.yaml").write_text(yaml.safe_dump({"extends": "alpha", "standby": "off"}))
    node.cli("switch", "plain", "--yes", check=True)
    [plain] = [b for b in ours(node) if b["State"]["Running"]]
    assert plain["Config"]["Labels"]["b70deploy.stack"] == "plain"
    assert "--enable-sleep-mode" not in " ".join(plain["Config"]["Cmd"])  # no /is_sleeping: it cannot sleep
    said = node.cli("switch", "beta", "--dry-run", check=True).stdout
    assert ("standby: revision 1 (plain) runs outside the standby slots and without --enable-sleep-mode: the "
            "drain STOPS it, it does not sleep") in said, said
    node.cli("switch", "beta", "--yes", check=True)
    stack, _, _ = served(node)
    old = (json.loads(docker("inspect", plain["Id"], check=False).stdout or "[]") or [{}])[0]
    assert stack == "beta" and not old.get("State", {}).get("Running"), old.get("State")  # stopped, or gone
    said = node.cli("switch", "alpha", "--dry-run", check=True).stdout
    assert "standby: revision 2's slot falls asleep (level 1) while alpha boots beside it" in said, said


def test_standby_a_run_killed_in_activate_is_recovered_to_the_slot_status_names(standby_node: SimNode) -> None:
    """Issue 35's kill: SIGKILL at activate of a switch whose boot is held (B70SIM_HOLD_UNTIL), so the killed
    run's slot runs on the door's network, never healthy. The rollback `status` advises removes that slot (no
    run recorded it as a revision), wakes beta's, and from outside the slot that serves through the door is
    the revision `status` names: its labels and argv, a completion; at most one slot asleep; the next switch
    succeeds."""
    node = standby_node
    beta = _beta_serving(node)
    _killed_switch(node, "held", "during:activate")
    booting = [b for b in ours(node) if b["Config"]["Labels"]["com.docker.compose.project"] == f"{node.project}-r3"]
    assert booting and booting[0]["State"]["Running"]  # the killed run's slot, held in its boot
    assert f"{node.project}_default" in booting[0]["NetworkSettings"]["Networks"]
    st = node.json("status")
    assert st["interrupted"]["step"] == "activate" and "b70deploy rollback" in st["fix"], st
    done = node.cli("rollback", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "removed slot 3" in done.stdout + done.stderr, done.stdout + done.stderr
    stack, length, now = served(node)  # a completion through the door, and the one awake container on its network
    st = node.json("status")
    assert (stack, length) == ("beta", 262144) and now["Id"] == beta["Id"]  # woken, not booted
    assert st["current"]["stack"] == "beta" and st["differs"] == [], st
    assert st["serving_slot"] == {"slot": 2, "revision": st["current"]["number"]}, st
    assert now["Config"]["Labels"]["com.docker.compose.project"] == f"{node.project}-r2"
    argv = " ".join(now["Config"]["Cmd"])
    assert "262144" in argv and "--enable-sleep-mode" in argv, argv  # beta's own command line
    slots = ours(node)
    assert f"{node.project}-r3" not in [b["Config"]["Labels"]["com.docker.compose.project"] for b in slots]
    assert sum(1 for b in slots if b["State"]["Running"] and sleeping(b)) <= 1
    node.cli("switch", "alpha", "--yes", check=True)
    stack, _, _ = served(node)
    assert stack == "alpha" and sum(1 for b in ours(node) if b["State"]["Running"] and sleeping(b)) <= 1


def test_standby_slots_publish_on_ports_from_the_configured_range(standby_node: SimNode) -> None:
    """Issue 35: `ports.standby: [FIRST, LAST]` keeps every slot's loopback port in that range."""
    node = standby_node
    span = free_span(3)
    cfg = yaml.safe_load(node.config.read_text())
    cfg["ports"]["standby"] = [span[0], span[-1]]
    node.config.write_text(yaml.safe_dump(cfg))
    node.cli("switch", "alpha", "--yes", check=True)
    node.cli("switch", "beta", "--yes", check=True)
    assert served(node)[0] == "beta"
    ports = sorted(port_of(b) for b in ours(node))
    assert len(ports) == 2 and all(span[0] <= p <= span[-1] for p in ports), (ports, span)


def test_standby_a_run_killed_before_activate_is_rolled_back_by_waking_the_sleeper_never_stopping_it(
        standby_node: SimNode) -> None:
    """chaos_standby.py found it: killed between drain and activate, beta's slot sleeps still joined to the door's
    network, so the probes reach it; the rollback took it for a stack outside the slots and stopped it, then
    woke nothing and booted beta cold in the project's own container. Now it is woken: the same container,
    never restarted, serves beta through the door."""
    node = standby_node
    beta = _beta_serving(node)
    _killed_switch(node, "alpha", "before:activate")
    done = node.cli("rollback", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    stack, _, now = served(node)
    assert (stack, now["Id"], now["State"]["StartedAt"]) == ("beta", beta["Id"], beta["State"]["StartedAt"])
    assert not docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={node.project}",
                      "--filter", "label=com.docker.compose.service=vllm").stdout.split()  # no own container
    st = node.json("status")
    assert st["differs"] == [] and st["serving_slot"] == {"slot": 2, "revision": st["current"]["number"]}, st


def test_standby_a_recovery_whose_woken_standby_fails_boots_the_previous_revision_in_its_slot(
        standby_node: SimNode) -> None:
    """Issue 35, deliver 4: killed before activate, `later`'s slot sleeps (the killed run put it to sleep); the
    rollback puts nothing to sleep, wakes it, and the woken engine answers word-salad (B70SIM_FAIL=garbage,
    FAIL_AFTER seconds after it was first ready). The previous revision comes back booted cold in its slot,
    P-r2, recorded as serving there, never in the project's own container: from outside, a completion through
    the door, the one awake container on the door's network (a new one, its labels and argv), and status."""
    node = standby_node
    after = 15.0
    (node.root / "stacks" / "later.yaml").write_text(yaml.safe_dump(
        {"extends": "beta", "env": {"B70SIM_FAIL": "garbage", "B70SIM_FAIL_AFTER": f"{after:g}"}}))
    node.cli("switch", "alpha", "--yes", check=True)
    node.cli("switch", "later", "--yes", check=True)
    _, _, later = served(node)
    _killed_switch(node, "alpha", "before:activate")
    ready = later["State"]["StartedAt"]
    time.sleep(max(0.0, after + 1.0 - (time.time() - started_epoch(ready))))  # the wake now answers garbage
    done = node.cli("rollback", "--yes")
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "woke revision 2's slot" in said, said
    assert "revision 2 booted again in its slot 2" in said, said
    stack, length, now = served(node)
    assert (stack, length) == ("later", 262144) and now["Id"] != later["Id"], now["Id"]
    assert now["Config"]["Labels"]["com.docker.compose.project"] == f"{node.project}-r2"
    assert "262144" in " ".join(now["Config"]["Cmd"])
    assert not docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={node.project}",
                      "--filter", "label=com.docker.compose.service=vllm").stdout.split()  # no own container
    st = node.json("status")
    assert st["current"]["number"] == 2 and st["differs"] == [], st
    assert st["serving_slot"] == {"slot": 2, "revision": 2}, st
    assert sum(1 for b in ours(node) if b["State"]["Running"] and sleeping(b)) <= 1
    node.cli("switch", "alpha", "--yes", check=True)
    assert served(node)[0] == "alpha"


def started_epoch(stamp: str) -> float:
    """Docker's StartedAt (RFC 3339, nanoseconds) as epoch seconds."""
    return datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp()


def _stream_long(node: SimNode, tokens: int) -> threading.Thread:
    """A streamed completion of `tokens` tokens through the door (the node's sim decodes 500 a second: the
    overlay in tests/actions/conftest.py), read whole in a thread: a switch's hold waits for it."""
    url = f"http://127.0.0.1:{node.prod}"
    model = requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]

    def read() -> None:
        with requests.post(f"{url}/v1/completions", stream=True, timeout=120, json={
                "model": model, "prompt": "The capital of France is", "max_tokens": tokens, "stream": True,
                "ignore_eos": True}) as got:
            for _ in got.iter_lines():
                pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def _slot_box(node: SimNode, slot: int) -> dict[str, Any] | None:
    return next((b for b in ours(node) if b["Config"]["Labels"]["com.docker.compose.project"]
                 == f"{node.project}-r{slot}"), None)


def test_standby_a_new_slot_joins_the_door_created_answers_for_nothing_and_a_kill_then_leaves_the_live_one(
        standby_node: SimNode) -> None:
    """Issue 35: the new slot joins the door's network when it is created, before the door holds, so that
    activate is only its start. Killed while the door holds for a stream in flight (the new slot created and
    joined, not started): the engine's DNS names only the live slot for the service (asked on that network,
    from inside the live slot), the stream ends whole on beta; the `rollback` status advises removes the
    killed run's slot, and beta serves through the door in the slot status names: its own container, kept (a
    cold boot of the bytes it serves would hold the clients for the whole boot)."""
    node = standby_node
    beta = _beta_serving(node)
    reader = _stream_long(node, 15000)  # 30 s
    time.sleep(0.5)
    switch = subprocess.Popen([*CLI, "switch", "alpha", "--yes"], env=cli_env(node.config, node.extra_env),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        made = None
        while time.monotonic() < deadline and switch.poll() is None:
            made = _slot_box(node, 3)
            closed = requests.get(f"http://127.0.0.1:{node.prod}/health", timeout=5).status_code == 503
            if made is not None and f"{node.project}_default" in made["NetworkSettings"]["Networks"] and closed:
                break
            time.sleep(0.1)
        assert made is not None and made["State"]["Status"] == "created", made and made["State"]
        assert f"{node.project}_default" in made["NetworkSettings"]["Networks"]
        aliases = made["NetworkSettings"]["Networks"][f"{node.project}_default"]["Aliases"] or []
        assert "vllm" in aliases, aliases
        # Asked where the door asks: inside the door's container, which is on that network alone (a slot is on
        # its own project's network too, where `vllm` names itself).
        door = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={node.project}", "--filter",
                      f"label=com.docker.compose.service={DOOR_SERVICE}").stdout.split()[0]
        said = docker("exec", door, "busybox", "nslookup", "vllm").stdout
        named = re.findall(r"Address:\s*([0-9.]+)\s*$", said.partition("Name:")[2], re.M)
        live_ip = json.loads(docker("inspect", beta["Id"]).stdout)[0]["NetworkSettings"]["Networks"][
            f"{node.project}_default"]["IPAddress"]
        assert named == [live_ip], (said, live_ip)
        card = json.loads(docker("exec", door, "wget", "-qO-", "http://vllm:8000/v1/models").stdout)["data"][0]
        assert card["max_model_len"] == 262144, card  # beta's, dialled as the door dials it
        assert switch.poll() is None, switch.communicate()  # still waiting for the stream: the door holds
        switch.kill()
    finally:
        if switch.poll() is None:
            switch.kill()
        switch.communicate()
    reader.join(timeout=60)
    st = node.json("status")
    assert st["interrupted"]["step"] == "drain" and "b70deploy rollback" in st["fix"], st
    assert st["serving_slot"] == {"slot": 2, "revision": st["current"]["number"]}, st
    assert [s["status"] for s in st["standbys"] if s["slot"] == 3] == ["created"], st["standbys"]
    done = node.cli("rollback", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "removed slot 3" in done.stdout + done.stderr, done.stdout + done.stderr
    stack, length, now = served(node)  # a completion through the door, and the one awake container on its network
    assert (stack, length) == ("beta", 262144), done.stdout
    assert _slot_box(node, 3) is None
    st = node.json("status")
    assert st["current"]["stack"] == "beta" and st["differs"] == [], st
    serving = int(now["Config"]["Labels"]["com.docker.compose.project"].rpartition("-r")[2])
    assert st["serving_slot"] == {"slot": serving, "revision": st["current"]["number"]}, st
    assert "262144" in " ".join(now["Config"]["Cmd"])  # beta's own command line
    # beta's own container, kept as it ran (no cold boot of the bytes it serves while the door held the clients)
    assert now["Id"] == beta["Id"] and now["State"]["StartedAt"] == beta["State"]["StartedAt"], done.stdout
    assert "kept, not booted" in done.stdout + done.stderr, done.stdout + done.stderr
    assert sum(1 for b in ours(node) if b["State"]["Running"] and sleeping(b)) <= 1
    node.cli("switch", "alpha", "--yes", check=True)
    assert served(node)[0] == "alpha"


def test_standby_a_run_killed_before_activate_resumes_to_its_joined_slot(standby_node: SimNode) -> None:
    """Issue 35: killed between the drain (beta asleep, off the door's network; alpha's slot created and joined
    to it) and activate, `resume` starts alpha's slot, which then alone answers for the service: from outside,
    a completion through the door, the one awake container on its network (alpha's labels and argv, in P-r3),
    beta's still asleep, and status names alpha serving in slot 3."""
    node = standby_node
    beta = _beta_serving(node)
    _killed_switch(node, "alpha", "before:activate")
    made, slept = _slot_box(node, 3), _slot_box(node, 2)
    assert made is not None and made["State"]["Status"] == "created"
    assert f"{node.project}_default" in made["NetworkSettings"]["Networks"]  # joined before it starts
    assert slept is not None and sleeping(slept)
    assert f"{node.project}_default" not in slept["NetworkSettings"]["Networks"]  # left while it fell asleep
    done = node.cli("resume")
    assert done.returncode == 0, done.stdout + done.stderr
    stack, length, now = served(node)
    assert (stack, length) == ("alpha", 131072)
    assert now["Config"]["Labels"]["com.docker.compose.project"] == f"{node.project}-r3"
    assert "131072" in " ".join(now["Config"]["Cmd"])
    assert sleeping(json.loads(docker("inspect", beta["Id"]).stdout)[0])  # the same beta, asleep
    st = node.json("status")
    assert st["current"]["stack"] == "alpha" and st["differs"] == [], st
    assert st["serving_slot"] == {"slot": 3, "revision": st["current"]["number"]}, st


def test_standby_a_sleep_that_fails_leaves_the_slot_off_the_door_and_the_wake_joins_it_back(
        standby_node: SimNode) -> None:
    """Issue 35: the live slot leaves the door's network while it falls asleep. When the sleep fails (here the
    0.32.0 server refuses level 3 with 422, as vLLM validates it), the node knows it left: the undo's wake
    joins it back, and the door reaches it again (a completion through the door, the slot on its network)."""
    node = standby_node
    beta = _beta_serving(node)
    io = DockerNode.production(load_node(str(node.config)))
    assert io.slots()[2] == "live"
    with pytest.raises(OperationError, match="422"):
        io.doze(2, 3)
    off = json.loads(docker("inspect", beta["Id"]).stdout)[0]
    assert f"{node.project}_default" not in off["NetworkSettings"]["Networks"] and not sleeping(off)
    io.wake(2)
    stack, _, now = served(node)  # through the door, and the one awake container on its network
    assert (stack, now["Id"], now["State"]["StartedAt"]) == ("beta", beta["Id"], beta["State"]["StartedAt"])


def _network_mode(node: SimNode) -> str:
    [box] = node.containers(DOOR_SERVICE)
    return docker("inspect", "-f", "{{.HostConfig.NetworkMode}}", box).stdout.strip()


def test_standby_the_door_moves_onto_the_hosts_network_and_back_holding_and_sending_nothing_elsewhere(
        standby_node: SimNode) -> None:
    """In front of a stack that sleeps the door is in the project network; in front of one that does not,
    on the host's (render/door.py). A switch between the two recreates it before it holds, so the clients
    meet only refused connections while the port changes hands, never an answer from another host: vllm's
    fixed address routes off the host until its network exists (docker/node.py `_door_network`)."""
    node = standby_node
    node.cli("switch", "alpha", "--yes", check=True, timeout=180)
    assert _network_mode(node) != "host"
    cfg = yaml.safe_load(node.config.read_text())
    cfg["standby"] = "off"
    node.config.write_text(yaml.safe_dump(cfg))
    onto = Clients(node.prod)
    onto.during(lambda: node.cli("switch", "beta", "--yes", check=True, timeout=180))
    assert _network_mode(node) == "host" and served(node)[0] == "beta"
    assert onto.ok > 0 and not [why for why in onto.failed if why.startswith("HTTP")], onto.failed
    on = Clients(node.prod)
    on.during(lambda: node.cli("switch", "alpha", "--yes", check=True, timeout=180))
    assert on.failed == [] and on.ok > 0 and served(node)[0] == "alpha"
    cfg["standby"] = "sleep"
    node.config.write_text(yaml.safe_dump(cfg))
    back = Clients(node.prod)
    back.during(lambda: node.cli("switch", "beta", "--yes", check=True, timeout=180))
    assert _network_mode(node) != "host" and served(node)[0] == "beta"
    assert back.ok > 0 and not [why for why in back.failed if why.startswith("HTTP")], back.failed
