"""Day one on a hand-run node, on the real engine: the report's /apps/b70-vllm as it stood on
2026-07-05 (ngram in production, the TurboQuant and pre-ngram copies beside it), brought up
with plain `docker compose --profile gpu up -d` under the folder's own project name. Then,
with no node config written by hand: init, adopt, import both copies, `rollback tq-256k`,
`switch eagle3`, `rollback ngram`. After each move the node itself is asked what it serves
(a completion, /v1/models, the container's image and argv, the deploy dir's bytes), and a
canary secret in vllm023.env must appear in no output, log or state file but the 0600 env
copies."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import simkit
import yaml
from kit.simnode import completion, docker, service_box

from b70deploy.sim.box import write_models
from b70deploy.sim.vllm_tree import GPTQ_REL, MARLIN_REL, VARIANTS

pytestmark = pytest.mark.docker

CANARY = f"b70canary{uuid.uuid4().hex}"
SITE = {v.name: v.site_packages for v in VARIANTS}
MARLIN_TARGET = f"{SITE['bash-c']}/vllm/{MARLIN_REL}"
GPTQ_TARGET = f"{SITE['serve']}/vllm/{GPTQ_REL}"
NGRAM = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}'
COMMON = ["--host", "0.0.0.0", "--port", "8000", "--dtype", "float16", "--max-model-len", "262144",
          "--enable-prefix-caching", "--tool-call-parser", "hermes", "--enable-auto-tool-choice"]


def compose_file(*, image: str, command: list[str], patch: tuple[str, str], entrypoint: bool) -> str:
    """A compose file as the operator wrote it by hand (models and ports from .env)."""
    vllm: dict[str, Any] = {"image": "${VLLM_IMAGE}", "profiles": ["gpu"], "command": command,
                            "env_file": "vllm023.env", "ports": ["127.0.0.1:${VLLM_PORT}:8000"],
                            "volumes": ["${MODELS_DIR}:/models:ro", f"./{patch[0]}:{patch[1]}:ro"],
                            "shm_size": "16g"}
    if entrypoint:  # intel/vllm's own, written out as the report quotes it
        vllm["entrypoint"] = ["/bin/bash", "-c", 'source /opt/intel/oneapi/setvars.sh --force && exec "$@"', "--"]
    webui = {"image": "${WEBUI_IMAGE}", "profiles": ["gpu"], "command": ["sim-webui", "--port", "8080"],
             "ports": ["127.0.0.1:${WEBUI_PORT}:8080"]}
    return f"# {image} by hand\n" + yaml.safe_dump({"services": {"vllm": vllm, "open-webui": webui}}, sort_keys=False)


@dataclass
class HandNode:
    root: Path
    folder: Path
    project: str
    port: int
    tags: dict[str, str]
    config: Path
    originals: dict[str, bytes]

    def cli(self, *args: str, code: int | None = 0, config: bool = True) -> subprocess.CompletedProcess[str]:
        r = simkit.run_cli(self.config if config else None, *args, timeout=300)
        RAN.append((" ".join(args), r))
        if code is not None:
            assert r.returncode == code, (args, r.stdout, r.stderr)
        return r

    def json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def completion(self, model: str) -> dict[str, Any]:
        return completion(self.port, model)

    def vllm_container(self) -> dict[str, Any]:
        return service_box(self.project)


RAN: list[tuple[str, subprocess.CompletedProcess[str]]] = []


@pytest.fixture
def hand_node(tmp_path: Path, sim_images: dict[str, str], free_port: Callable[[], int]) -> Iterator[HandNode]:
    project = simkit.unique("adopt")
    folder = tmp_path / project   # Compose names the project after its folder, as b70-vllm on the node
    folder.mkdir()
    tags = {v: f"{project}/vllm:{v}" for v in ("bash-c", "serve")}
    for variant, tag in tags.items():
        docker("tag", sim_images[variant], tag)
    models = write_models(tmp_path / "models")
    port, webui = free_port(), free_port()
    env = {"VLLM_PORT": str(port), "MODELS_DIR": str(models), "WEBUI_IMAGE": tags["bash-c"],
           "WEBUI_PORT": str(webui)}

    def dotenv(image: str, model: str) -> str:
        return "".join(f"{k}={v}\n" for k, v in {"VLLM_IMAGE": image, "VLLM023_MODEL": model, **env}.items())

    marlin = simkit.image_file(tags["bash-c"], MARLIN_TARGET).decode()
    gptq = simkit.image_file(tags["serve"], GPTQ_TARGET).decode()
    w4a16 = ["vllm", "serve", "/models/${VLLM023_MODEL}", "--served-model-name", "qwen3-30b-a3b-w4a16",
             "qwen3-30b-tq-256k", *COMMON, "--kv-cache-dtype", "fp8"]
    marlin_mount = ("vllm-patches/marlin_utils.py", MARLIN_TARGET)
    files = {
        # The operator's own fix 4 (the report's corrected marlin_utils.py) and the old gptq.py fix.
        "vllm-patches/marlin_utils.py": marlin.replace("if current_platform.is_rocm():",
                                                       "if current_platform.is_rocm() or current_platform.is_xpu():"),
        "vllm-patches/gptq.py": gptq.replace("if current_platform.is_cuda_alike():",
                                             "if current_platform.is_cuda_alike() or current_platform.is_xpu():"),
        "docker-compose.yml": compose_file(image="ngram", command=[*w4a16, "--speculative-config", NGRAM],
                                           patch=marlin_mount, entrypoint=True),
        ".env": dotenv(tags["bash-c"], "Qwen/Qwen3-30B-A3B-W4A16"),
        "vllm023.env": f"HF_TOKEN={CANARY}\nB70SIM_BOOT_SECONDS=1\nB70SIM_DECODE_TPS=500\n",
        "docker-compose.yml.pre-ngram": compose_file(image="w4a16", command=w4a16, patch=marlin_mount,
                                                     entrypoint=True),
        "docker-compose.yml.tq-rollback": compose_file(
            image="tq", patch=("vllm-patches/gptq.py", GPTQ_TARGET), entrypoint=False,
            command=["/models/${VLLM023_MODEL}", "--served-model-name", "qwen3-30b-tq-256k", "qwen3-30b-a3b-w4a16",
                     *COMMON, "--kv-cache-dtype", "k3v4_nc", "--speculative-config", '{"method":"suffix"}']),
        ".env.tq-rollback": dotenv(tags["serve"], "Qwen/Qwen3-30B-A3B-GPTQ-Int4"),
    }
    assert files["vllm-patches/marlin_utils.py"] != marlin and files["vllm-patches/gptq.py"] != gptq
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
        if name.endswith(".env") or ".env." in name:
            os.chmod(folder / name, 0o600)
    node = HandNode(root=tmp_path, folder=folder, project=project, port=port, tags=tags,
                    config=tmp_path / "node.yaml", originals={n: t.encode() for n, t in files.items()})
    try:
        simkit.up_by_hand(folder, node.url("/health"))
        yield node
    finally:
        simkit.remove_by_project(project)
        simkit.remove_keep_tags(project)
        docker("rmi", *tags.values(), check=False)


def history(node: HandNode) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = node.json("history")
    return rows


def test_day_one_init_adopt_import_then_rollback_by_name(hand_node: HandNode, sim_images: dict[str, str]) -> None:
    node, folder = hand_node, hand_node.folder
    RAN.clear()

    # ---- init: every node fact from the engine and the host
    out = node.cli("init", "--config", str(node.config), "--project", node.project,
                   "--state-dir", str(node.root / "state"), config=False)
    assert "wrote" in out.stdout and "com.docker.compose.project" in out.stdout, out.stdout
    cfg = yaml.safe_load(node.config.read_text())
    assert cfg["project"] == node.project and cfg["deploy_dir"] == str(folder)
    assert cfg["ports"]["prod"] == node.port and cfg["bind_address"] == "127.0.0.1"
    assert cfg["models_dir"] == str(node.root / "models")
    assert cfg["secrets_env_file"] == str(folder / "vllm023.env")
    assert [c["name"] for c in cfg["companions"]] == ["open-webui"]
    assert cfg["companions"][0]["command"] == ["sim-webui", "--port", "8080"]
    written = node.config.read_bytes()
    again = node.cli("init", "--config", str(node.config), "--project", node.project, code=2, config=False)
    assert "never overwrites" in again.stderr and node.config.read_bytes() == written
    # Test environment only, never a node fact: the catalogue's image references name this
    # test's sim tags, short settle and poll times, and a load threshold a shared CI box meets.
    with node.config.open("a") as fh:
        fh.write(yaml.safe_dump({
            "image_map": {"intel/vllm:latest": node.tags["bash-c"], "vllm-xpu:0.19.0-tr5": node.tags["serve"]},
            "stack_overlay": {"settle_seconds": 0.5}, "load_threshold": 1000,
            "timeouts": {"health": 60, "rollback": 60, "poll_interval": 0.2}}))

    # ---- adopt: the live ngram deployment is revision 1, with its env_file and patch
    got = node.json("adopt", "--as", "ngram")
    assert got["revision"] == 1 and got["created"] and got["outcome"] == "deployed"
    assert set(got["files"]) == {"docker-compose.yml", ".env", "vllm023.env", "vllm-patches/marlin_utils.py"}
    [patch] = got["patches"]
    assert patch["target"] == MARLIN_TARGET and patch["package_target"] == MARLIN_REL
    assert "+    if current_platform.is_rocm() or current_platform.is_xpu():" in patch["diff"]
    assert "already adopted: revision 1" in node.cli("adopt", "--as", "ngram").stdout
    status = node.json("status")
    assert status["current"]["number"] == 1 and status["differs"] == [] and status["health"] == 200
    assert [h["number"] for h in history(node)] == [1]

    # ---- import the saved copies
    tq = node.json("import", str(folder / "docker-compose.yml.tq-rollback"), "--as", "tq-256k")
    assert tq["revision"] == 2 and tq["env_file"] == str(folder / ".env.tq-rollback")
    assert [p["target"] for p in tq["patches"]] == [GPTQ_TARGET]
    pre = node.cli("import", str(folder / "docker-compose.yml.pre-ngram"), "--as", "w4a16", "-m", "before ngram")
    assert "as revision 3 (w4a16, unproven)" in pre.stdout, pre.stdout
    rows = history(node)
    assert [(r["kind"], r["stack"], r["outcome"]) for r in rows] == [
        ("adopt", "ngram", "deployed"), ("import", "tq-256k", "unproven"), ("import", "w4a16", "unproven")]
    assert "unproven" in node.cli("history").stdout

    # ---- rollback tq-256k: an import that never ran under the tool, through the full gate
    node.cli("rollback", "tq-256k", "--yes")
    answer = node.completion("qwen3-30b-tq-256k")
    assert answer["model"] == "qwen3-30b-tq-256k" and "Paris" in answer["choices"][0]["text"]
    roots = {m["root"] for m in requests.get(node.url("/v1/models"), timeout=10).json()["data"]}
    assert roots == {"/models/Qwen/Qwen3-30B-A3B-GPTQ-Int4"}
    box = node.vllm_container()
    assert box["Image"] == docker("image", "inspect", "-f", "{{.Id}}", node.tags["serve"]).stdout.strip()
    assert "k3v4_nc" in box["Args"] and any(m["Destination"] == GPTQ_TARGET for m in box["Mounts"])
    rows = history(node)
    assert (rows[-1]["kind"], rows[-1]["restored_from"], rows[-1]["outcome"]) == ("rollback", 2, "deployed")
    assert rows[1]["outcome"] == "unproven"   # the import stays what it was; the rollback proved it

    # ---- switch eagle3: a stack the tool renders, with the node config init wrote
    node.cli("switch", "eagle3", "--yes")
    box = node.vllm_container()
    assert box["Config"]["Labels"].get("b70deploy.stack") == "eagle3"
    assert node.completion("qwen3-30b-a3b-w4a16")["model"] == "qwen3-30b-a3b-w4a16"
    assert any('"method":"eagle3"' in a for a in box["Args"])

    # ---- rollback ngram: the adopted revision, the hand-made bytes, back in the deploy dir
    node.cli("rollback", "ngram", "--yes")
    box = node.vllm_container()
    assert NGRAM in box["Args"] and "b70deploy.stack" not in (box["Config"]["Labels"] or {})
    assert node.completion("qwen3-30b-a3b-w4a16")["model"] == "qwen3-30b-a3b-w4a16"
    for name in ("docker-compose.yml", ".env", "vllm023.env", "vllm-patches/marlin_utils.py"):
        assert (folder / name).read_bytes() == node.originals[name], name
    assert not (folder / "vllm.env").exists() and not [p for p in folder.glob("patches/**/*") if p.is_file()]
    rows = history(node)
    assert (rows[-1]["kind"], rows[-1]["stack"], rows[-1]["restored_from"]) == ("rollback", "ngram", 1)
    assert node.json("status")["current"]["number"] == rows[-1]["number"]

    # ---- drift from day one: intel/vllm:latest moves to an image whose marlin_utils.py was
    # reworded; a rollback to the pre-ngram copy (which mounts the corrected file) is refused
    # before anything stops, naming the file and the line that no longer matches.
    serving = node.json("status")["current"]["number"]
    docker("tag", sim_images["bash-c-drift"], node.tags["bash-c"])
    refused = node.cli("rollback", "w4a16", "--yes", code=2)
    assert "vllm-patches/marlin_utils.py" in refused.stderr and "no longer applies" in refused.stderr, refused.stderr
    assert node.json("status")["current"]["number"] == serving
    assert NGRAM in node.vllm_container()["Args"]

    # ---- the canary: in no output, log or state file but the 0600 env copies
    for args in (("status",), ("history",), ("audit",), ("audit", "--json"), ("diff", "1", "2"),
                 ("init", "--print", "--project", node.project)):
        node.cli(*args, code=None)
    for what, r in RAN:
        assert CANARY not in r.stdout and CANARY not in r.stderr, f"`b70deploy {what}` printed the canary"
    state = node.root / "state"
    for name in ("journal.jsonl", "audit.log"):
        assert CANARY not in (state / name).read_text(), name
    holders = [p for p in sorted(state.rglob("*")) if p.is_file() and CANARY.encode() in p.read_bytes()]
    assert holders, "the revisions keep the env files"
    for path in holders:
        assert path.name.endswith(".env") and path.relative_to(state).parts[2] == "files", path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_a_rollback_to_the_adopted_revision_keeps_the_door_in_front(hand_node: HandNode,
                                                                     free_port: Callable[[], int]) -> None:
    """The door is the node's (issue 37): on a node adopted by hand and then given `door: {}`, a
    switch puts the door in front; `rollback ngram` to the adopted revision, made without the door,
    is refused before anything stops, and a client loop through the door sees no connection error
    (it took the door away and left 3.8 s of refused connections before)."""
    from b70deploy.sim.door_image import build as build_door

    node = hand_node
    node.cli("init", "--config", str(node.config), "--project", node.project,
             "--state-dir", str(node.root / "state"), config=False)
    door_tag = f"{node.project}/door:caddy"
    docker("tag", build_door().tag, door_tag)
    node.tags["door"] = door_tag  # removed with the fixture's tags
    # init's dark port is the first above prod no service publishes: never handed out as the probe port.
    taken = set(yaml.safe_load(node.config.read_text())["ports"].values())
    probe = next(p for p in iter(free_port, None) if p not in taken)
    with node.config.open("a") as fh:
        fh.write(yaml.safe_dump({
            "image_map": {"intel/vllm:latest": node.tags["bash-c"], "vllm-xpu:0.19.0-tr5": node.tags["serve"]},
            "stack_overlay": {"settle_seconds": 0.5}, "load_threshold": 1000,
            "timeouts": {"health": 60, "rollback": 60, "poll_interval": 0.2},
            "door": {"image": door_tag, "probe_port": probe}}))  # a door key: the door is on
    assert node.json("adopt", "--as", "ngram")["revision"] == 1
    node.cli("switch", "eagle3", "--yes")
    assert service_box(node.project)["Config"]["Labels"]["b70deploy.stack"] == "eagle3"

    failed: list[str] = []
    answered = 0
    stop = threading.Event()

    def loop() -> None:
        nonlocal answered
        while not stop.is_set():
            try:
                r = requests.post(node.url("/v1/completions"), timeout=60,
                                  json={"model": "qwen3-30b-a3b-w4a16", "prompt": "The capital of France is",
                                        "max_tokens": 4}, headers={"Connection": "close"})
                if r.status_code == 200:
                    answered += 1
                else:
                    failed.append(f"HTTP {r.status_code}")
            except requests.RequestException as e:
                failed.append(type(e).__name__)

    clients = [threading.Thread(target=loop, daemon=True) for _ in range(3)]
    for t in clients:
        t.start()
    def wait_answered(n: int) -> None:  # until the clients had n answers in all (they saw the node)
        deadline = time.monotonic() + 30
        while answered < n:
            assert time.monotonic() < deadline, (answered, failed[:5])
            time.sleep(0.05)

    try:
        wait_answered(10)  # the clients run through the door before the rollback
        said = node.cli("rollback", "ngram", "--yes", code=2)
        wait_answered(answered + 10)  # and after it was refused
    finally:
        stop.set()
        for t in clients:
            t.join(timeout=70)
    out = said.stdout + said.stderr
    assert "made without the front door" in out and "nothing was stopped" in out and "fix:" in out, out
    assert failed == [] and answered > 0, (answered, failed[:5])
    assert service_box(node.project)["Config"]["Labels"]["b70deploy.stack"] == "eagle3"
