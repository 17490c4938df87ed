"""No secret in clear, anywhere (issue 34), on the real engine: a hand-made project whose
companion holds three secrets (one inline in the compose file, one from `.env`, one from its
own env file) and a private key the operator keeps 0600 and binds into it (naptha-node's
`.pem`, tests/fixtures/layouts) and a Traefik basic-auth label interpolated from `.env`, and whose
vllm service holds two (its env_file) and a basic-auth label written inline, taken by one node through init,
adopt, import, stack from-compose, diff, render, show, switch, status, history, logs, diagnose,
audit, a watch notification and a rollback, with `--json` of each. The canary appears in no
output, no notification and no file of a mode other than 0600 under the deploy dir, the state
dir and the node config's folder; the containers still get every value (docker inspect, the
companion answering); and each secret has the one fingerprint render/masking.mask gives its
unquoted value in every output."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import simkit
import yaml
from kit import ports
from kit.hooks import Hooks, receiver
from kit.simnode import completion, docker, service_box
from simkit import CLI, cli_env

from b70deploy.render.masking import mask
from b70deploy.sim.box import write_models
from b70deploy.sim.vllm_tree import MARLIN_REL, VARIANTS

pytestmark = pytest.mark.docker

CANARY = f"b70canary{uuid.uuid4().hex}"
API_LABEL = "traefik.http.middlewares.api.basicauth.users"  # a Traefik basic-auth middleware's users
SECRETS = {  # key -> the value the container must get
    "WEBUI_ADMIN_PASSWORD": f"{CANARY}-inline",                 # companion: inline, a secret by its name
    "DATABASE_URL": f"postgres://app:{CANARY}-dotenv@db/app",   # companion: from .env's DB_PASSWORD
    "WEBUI_SIGNING": f"{CANARY}-envfile",                       # companion: from its 0600 env file
    "HF_TOKEN": f"{CANARY}-hf",                                 # vllm: its env_file, a secret by name
    "SERVICE_URL": f"https://user:{CANARY}-url@example.invalid",  # vllm: its env_file, by the file
    "WEBUI_USERS": f"admin:{CANARY}-label",                    # companion's label, from .env: by the file's mode
    API_LABEL: f"api:{CANARY}-apilabel",   # vllm's label, inline: by its key (no other value inside it)
}
LABELS = {"vllm": {API_LABEL: SECRETS[API_LABEL]},
          "open-webui": {"traefik.http.middlewares.ui.basicauth.users": SECRETS["WEBUI_USERS"]}}
MODEL = "qwen3-30b-a3b-w4a16"
# The operator's fix of the Marlin check on XPU (the field report's fix 4), mounted over the image's file.
MARLIN_TARGET = next(f"{v.site_packages}/vllm/{MARLIN_REL}" for v in VARIANTS if v.name == "bash-c")
KEY_FILE = "keys/node.pem"  # bound into the companion; a secret by its mode only
KEY = f"-----BEGIN PRIVATE KEY-----\n{CANARY}-pem\n-----END PRIVATE KEY-----\n"
FINGERPRINT = re.compile(r"\b(" + "|".join(map(re.escape, SECRETS)) + r")\b\W{1,6}(\*{4}\(sha256:[0-9a-f]{8}\))")


def compose_file(extra_flag: str = "") -> str:
    """The operator's file: the webui password written inline, the rest from env files."""
    vllm = {"image": "${VLLM_IMAGE}", "profiles": ["gpu"], "env_file": "vllm023.env",
            "command": ["vllm", "serve", "/models/Qwen/Qwen3-30B-A3B-W4A16", "--served-model-name", MODEL,
                        "--host", "0.0.0.0", "--port", "8000", "--max-model-len", "32768",
                        *([extra_flag] if extra_flag else [])],
            "ports": ["127.0.0.1:${VLLM_PORT}:8000"], "labels": LABELS["vllm"],
            "volumes": ["${MODELS_DIR}:/models:ro", f"./vllm-patches/marlin_utils.py:{MARLIN_TARGET}:ro"]}
    webui = {"image": "${VLLM_IMAGE}", "profiles": ["gpu"], "command": ["sim-webui", "--port", "8080"],
             "env_file": "webui.env", "ports": ["127.0.0.1:${WEBUI_PORT}:8080"],
             "volumes": [f"./{KEY_FILE}:/run/keys/node.pem:ro"],
             "labels": {"traefik.http.middlewares.ui.basicauth.users": "${WEBUI_USERS}"},
             "environment": {"WEBUI_ADMIN_PASSWORD": SECRETS["WEBUI_ADMIN_PASSWORD"],
                             "DATABASE_URL": "postgres://app:${DB_PASSWORD}@db/app"}}
    return yaml.safe_dump({"services": {"vllm": vllm, "open-webui": webui}}, sort_keys=False)


@dataclass
class Node:
    root: Path
    folder: Path       # the hand-made project's folder: the deploy dir
    saved: Path        # a saved copy beside it, for import
    config: Path
    state: Path
    project: str
    port: int
    webui_port: int
    hooks: Hooks
    ran: list[tuple[str, str]] = field(default_factory=list)   # (command, stdout + stderr)

    def cli(self, *args: str, code: int | None = 0, config: bool = True) -> str:
        r = simkit.run_cli(self.config if config else None, *args, timeout=300)
        out = r.stdout + r.stderr
        self.ran.append((" ".join(args), out))
        if code is not None:
            assert r.returncode == code, (args, out)
        return r.stdout

    def both(self, *args: str) -> Any:
        """The command plain and with --json; the JSON's document."""
        self.cli(*args)
        return json.loads(self.cli(*args, "--json"))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, sim_images: dict[str, str]) -> Iterator[Node]:
    root = tmp_path_factory.mktemp("secrets")
    project = simkit.unique("sec")
    folder, saved = root / project, root / "saved"
    folder.mkdir()
    tag = f"{project}/vllm:bash-c"
    docker("tag", sim_images["bash-c"], tag)
    models = write_models(root / "models")
    port, webui = ports.free_port(), ports.free_port()
    files = {
        "docker-compose.yml": compose_file(),
        ".env": f"VLLM_IMAGE={tag}\nVLLM_PORT={port}\nMODELS_DIR={models}\nWEBUI_PORT={webui}\n"
                f"DB_PASSWORD={CANARY}-dotenv\nWEBUI_USERS={SECRETS['WEBUI_USERS']}\n",
        "vllm023.env": f"HF_TOKEN={SECRETS['HF_TOKEN']}\nSERVICE_URL={SECRETS['SERVICE_URL']}\n"
                       "B70SIM_BOOT_SECONDS=1\nB70SIM_DECODE_TPS=500\n",
        "webui.env": f"WEBUI_SIGNING={SECRETS['WEBUI_SIGNING']}\n",
        KEY_FILE: KEY,
    }
    marlin = simkit.image_file(tag, MARLIN_TARGET).decode()
    files["vllm-patches/marlin_utils.py"] = marlin.replace(
        "if current_platform.is_rocm():", "if current_platform.is_rocm() or current_platform.is_xpu():")
    assert files["vllm-patches/marlin_utils.py"] != marlin
    for name, text in files.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(text)
        os.chmod(folder / name, 0o600 if name.endswith((".env", ".pem")) else 0o644)  # as an operator leaves them
    shutil.copytree(folder, saved)  # import's source: the same layout with another flag
    (saved / "docker-compose.yml").write_text(compose_file("--enable-prefix-caching"))
    with receiver() as hooks:
        n = Node(root=root, folder=folder, saved=saved, config=root / "etc" / "node.yaml", state=root / "state",
                 project=project, port=port, webui_port=webui, hooks=hooks)
        n.config.parent.mkdir()
        with simkit.running_by_hand(folder, f"http://127.0.0.1:{port}/health", project, tag):
            yield n


def inspected_env(project: str, service: str) -> dict[str, str]:
    box = service_box(project, service)
    return dict(e.split("=", 1) for e in box["Config"]["Env"])


def assert_containers_get_the_values(n: Node) -> None:
    """From outside: each container's environment as the engine holds it, and both answer."""
    webui, vllm = inspected_env(n.project, "open-webui"), inspected_env(n.project, "vllm")
    for key in ("WEBUI_ADMIN_PASSWORD", "DATABASE_URL", "WEBUI_SIGNING"):
        assert webui.get(key) == SECRETS[key], key
    for key in ("HF_TOKEN", "SERVICE_URL"):
        assert vllm.get(key) == SECRETS[key], key
    box = service_box(n.project, "open-webui")["Id"]
    assert docker("exec", box, "cat", "/run/keys/node.pem").stdout == KEY
    assert stat.S_IMODE((n.folder / KEY_FILE).stat().st_mode) == 0o600
    simkit.wait_status(f"http://127.0.0.1:{n.webui_port}/health", 200, timeout=30)  # it was just started
    assert requests.get(f"http://127.0.0.1:{n.webui_port}/health", timeout=10).json() == {"status": True}
    assert completion(n.port, MODEL)["model"] == MODEL


def assert_containers_get_the_labels(n: Node) -> None:
    """The operator's labels as the engine holds them: the hand-made files' and every render's."""
    for service, labels in LABELS.items():
        got = service_box(n.project, service)["Config"]["Labels"]
        assert {k: got.get(k) for k in labels} == labels, service


def start_watch(n: Node) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen([*CLI, "watch", "--json", "--interval", "0.5"], env=cli_env(n.config),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        lines.extend(line.rstrip("\n") for line in proc.stdout)
    threading.Thread(target=read, daemon=True).start()
    return proc, lines


def test_no_secret_in_clear_through_every_command(node: Node) -> None:
    n = node
    assert_containers_get_the_labels(n)
    # ---- init: the companion's secrets found, marked, masked in what it prints; the config 0600
    printed = n.cli("init", "--print", "--project", n.project, "--state-dir", str(n.state), config=False)
    assert "Secret values are masked here" in printed
    got = json.loads(n.cli("init", "--config", str(n.config), "--project", n.project, "--state-dir",
                           str(n.state), "--json", config=False))
    [companion] = yaml.safe_load(n.config.read_text())["companions"]
    # Neither name says so (DB_PASSWORD's does): WEBUI_USERS is its label's, from the 0600 .env.
    assert companion["secrets"] == ["WEBUI_SIGNING", "WEBUI_USERS"]
    assert companion["environment"]["DATABASE_URL"] == "postgres://app:${DB_PASSWORD}@db/app"
    assert companion["variables"] == {"DB_PASSWORD": f"{CANARY}-dotenv", "WEBUI_USERS": SECRETS["WEBUI_USERS"]}
    # A label's, from .env; and the one vllm's label wrote inline, which a switch renders from the 0600 .env.
    inline = "B70_LABEL_VLLM_TRAEFIK_HTTP_MIDDLEWARES_API_BASICAUTH_USERS"
    assert yaml.safe_load(n.config.read_text())["secret_variables"] == [inline, "WEBUI_USERS"]
    assert stat.S_IMODE(n.config.stat().st_mode) == 0o600
    assert any("the companions hold secrets" in note for note in got["notes"]), got["notes"]
    with n.config.open("a") as fh:  # test environment only: short waits, the receiver of notifications
        fh.write(yaml.safe_dump({
            "image_map": {"intel/vllm:latest": f"{n.project}/vllm:bash-c"}, "load_threshold": 1000,
            "stack_overlay": {"settle_seconds": 0.5}, "timeouts": {"health": 60, "rollback": 60, "poll_interval": 0.2},
            "notify": {"webhooks": [n.hooks.url("ok")]}}))

    # ---- adopt and import: the operator's bytes kept, the stored copy 0600, said once
    adopted = json.loads(n.cli("adopt", "--as", "hand", "--json"))
    clear = [x for x in adopted["notes"] if "holds a secret in clear" in x]
    assert len(clear) == 1 and "WEBUI_ADMIN_PASSWORD" in clear[0] and "env_file:" in clear[0], adopted["notes"]
    assert API_LABEL in clear[0] and "a label's value into the project's .env" in clear[0]
    assert "already adopted" in n.cli("adopt", "--as", "hand")
    imported = json.loads(n.cli("import", str(n.saved / "docker-compose.yml"), "--as", "saved", "--json"))
    assert imported["revision"] == 2 and sum("holds a secret in clear" in w for w in imported["warnings"]) == 1
    for number in (1, 2):
        stored = n.state / "revisions" / f"{number:06d}" / "files" / "docker-compose.yml"
        assert not stored.is_file() or stat.S_IMODE(stored.stat().st_mode) == 0o600
    stored = sorted(n.state.glob("revisions/*/files/docker-compose.yml"))
    assert len(stored) == 2 and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in stored), stored
    keys = sorted(n.state.glob(f"revisions/*/files/{KEY_FILE}"))  # the key kept as the operator keeps it
    assert len(keys) == 2 and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in keys), keys

    # ---- a stack from the hand-made file: its secrets left out of the stack file (0644, printed)
    out = n.root / "out"
    n.cli("stack", "from-compose", str(n.folder / "docker-compose.yml"), "--name", "fromc", "-o",
          str(out / "fromc.yaml"), "--json")
    assert CANARY not in (out / "fromc.yaml").read_text()

    # ---- what a switch would write, then the switch
    n.both("diff", "eagle3")
    rendered = n.both("render", "eagle3")
    assert "open-webui.secrets.env" in rendered["files"]
    n.both("show", "eagle3")
    n.cli("switch", "eagle3", "--dry-run")
    n.cli("switch", "eagle3", "--yes")
    compose = (n.folder / "docker-compose.yml").read_text()
    assert "env_file:\n      - \"open-webui.secrets.env\"" in compose and CANARY not in compose
    assert 'DATABASE_URL: "postgres://app:${DB_PASSWORD}@db/app"' in compose  # the reference, as written
    assert stat.S_IMODE((n.folder / ".env").stat().st_mode) == 0o600  # its value: in the .env, for Compose
    secret_file = n.folder / "open-webui.secrets.env"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert_containers_get_the_values(n)
    assert_containers_get_the_labels(n)  # issue 33: the operator's labels survive the render, the inline one via .env

    # ---- every read-only command, plain and --json
    for args in (("status",), ("history",), ("audit",), ("diff", "1", "3"), ("diff", "2", "3")):
        n.both(*args)
    n.cli("logs", "3")
    n.both("diagnose", "3")

    # ---- a watch notification: a container started by hand from a copy, under a label holding a secret
    proc, lines = start_watch(n)
    try:
        hand = n.root / "by-hand"
        shutil.copytree(n.folder, hand)
        text = (hand / "docker-compose.yml").read_text()
        (hand / "docker-compose.yml").write_text(
            text.replace('b70deploy.stack: "eagle3"', f'b70deploy.stack: "{SECRETS["WEBUI_ADMIN_PASSWORD"]}"'))
        up = subprocess.run(["docker", "compose", "--project-directory", str(hand), "-p", n.project, "--profile",
                             "gpu", "up", "-d", "--force-recreate", "vllm"], capture_output=True, text=True,
                            timeout=120, check=False)
        assert up.returncode == 0, up.stderr
        drift = n.hooks.wait_for("watch.drift", timeout=60)
        assert mask(SECRETS["WEBUI_ADMIN_PASSWORD"]) in drift["outcome"], drift
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        time.sleep(0.2)
        shutil.rmtree(n.root / "by-hand", ignore_errors=True)
    n.ran.append(("watch --json", "\n".join(lines)))

    # ---- rollback to the adopted revision: the operator's bytes back, the compose file 0600
    assert json.loads(n.cli("rollback", "hand", "--yes", "--json"))
    assert (n.folder / "docker-compose.yml").read_text() == compose_file()
    assert stat.S_IMODE((n.folder / "docker-compose.yml").stat().st_mode) == 0o600
    assert not secret_file.exists()
    assert_containers_get_the_values(n)
    assert_containers_get_the_labels(n)
    n.both("status")
    n.both("history")
    n.cli("logs", "4")

    # ---- the canary: in no output, no notification, no file but 0600 ones
    bodies = json.dumps(n.hooks.bodies)
    assert n.hooks.events() and CANARY not in bodies
    for what, out in n.ran:
        assert CANARY not in out, f"`b70deploy {what}` printed the canary"
    for top in (n.folder, n.state, n.config.parent):
        for path in sorted(p for p in top.rglob("*") if p.is_file()):
            if CANARY.encode() in path.read_bytes():
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, f"{path} holds the canary, mode not 0600"

    # ---- one fingerprint per value: mask() of the unquoted value, in every output and notification
    seen: dict[str, set[str]] = {}
    for _what, out in [*n.ran, ("notifications", bodies)]:
        for key, fingerprint in FINGERPRINT.findall(out):
            seen.setdefault(key, set()).add(fingerprint)
    assert seen.get("HF_TOKEN") and seen.get("WEBUI_ADMIN_PASSWORD"), seen
    for key, fingerprints in seen.items():
        assert fingerprints == {mask(SECRETS[key])}, (key, fingerprints)
