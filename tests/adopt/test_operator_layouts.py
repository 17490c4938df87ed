"""Real operators' public compose files (tests/fixtures/operators/, each with its SOURCE.md naming
repository, path and commit), brought up by hand on the engine and taken through the whole
sequence (issue 33, item 7): init, adopt, import of a saved variant, rollback to it by name,
switch to the stack `stack from-compose` makes of the operator's own file, rollback by number to
the adopted revision. Every step is checked from outside: docker inspect of the vllm service and
every companion, a completion, the router answering for the served name, the companions' data.
At the end every field of every service equals what the hand-made run had.

The operator's files are used byte for byte. What this engine cannot give (no registry: images;
no NVIDIA runtime or AMD devices; one engine shared by many tests: host ports, container names,
an external network's name) is changed the way an operator changes a project without editing
it: a `docker-compose.override.yml` the test writes beside it (so every layout is also a
project of two compose files; naptha-node, which its operator runs from two files of their own with
`-f`, of three). Stand-in images carry the real images' ENTRYPOINT and CMD."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import simkit
import yaml
from filelock import FileLock
from kit.scratch import make_gpu_nodes
from kit.simnode import docker
from simkit import unavailable

from b70deploy.sim import door_image
from b70deploy.sim.image import REPO as SIM_REPO

pytestmark = pytest.mark.docker

FIXTURES = Path(__file__).parent.parent / "fixtures" / "operators"
# A dense model's config.json as the hub cache holds it (the sim reads its sizes; vLLM reads it there).
HUB_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
              "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
              "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
FAST = ["ENV B70SIM_BOOT_SECONDS=1", "ENV B70SIM_DECODE_TPS=500"]


STANDIN_INPUTS = "b70test.standin-inputs"


def _inputs(base_id: str, changes: list[str], files: dict[str, Path | bytes]) -> str:
    """A digest of everything a stand-in is made of: the base image, the changes, the files' bytes."""
    h = hashlib.sha256(f"{base_id}\0{changes}\0".encode())
    for dest, what in sorted(files.items()):
        h.update(f"{dest}\0".encode())
        if isinstance(what, bytes):
            h.update(what)
            continue
        for path in sorted(what.rglob("*")) if what.is_dir() else [what]:
            if path.is_file() and path.suffix != ".so" and "__pycache__" not in path.parts:
                h.update(f"{path.relative_to(what) if what.is_dir() else ''}\0".encode() + path.read_bytes())
    return h.hexdigest()[:24]


def _standin(base: str, tag: str, changes: list[str], files: dict[str, Path | bytes] | None = None) -> str:
    """`base`'s files (and `files`: path in the image -> a host file or folder, or bytes) as a new
    image with `base`'s environment and labels and only the ENTRYPOINT and CMD `changes` give (an
    imported image inherits none: `docker commit` cannot unset an ENTRYPOINT). Cached as the sim
    images are: built once for all workers and sessions, again only when its inputs change."""
    base_info = json.loads(docker("image", "inspect", base).stdout)[0]
    digest = _inputs(base_info["Id"], changes, files or {})
    with FileLock(os.path.join(tempfile.gettempdir(), "b70test-standins.lock"), timeout=600):
        have = docker("image", "inspect", tag, check=False)
        current = json.loads(have.stdout)[0] if have.returncode == 0 else None
        if current is not None and (current["Config"].get("Labels") or {}).get(STANDIN_INPUTS) == digest:
            return tag
        conf = base_info["Config"]
        keep = [f"ENV {e}" for e in conf.get("Env") or []]
        keep += [f"LABEL {k}={v}" for k, v in (conf.get("Labels") or {}).items()]
        box = docker("create", base, "true").stdout.strip()
        try:
            with tempfile.TemporaryDirectory() as stage:
                for dest, what in (files or {}).items():
                    at = Path(stage) / dest.lstrip("/")
                    at.parent.mkdir(parents=True, exist_ok=True)
                    if isinstance(what, bytes):
                        at.write_bytes(what)
                        at.chmod(0o755)
                    elif what.is_dir():
                        shutil.copytree(what, at, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
                    else:
                        shutil.copyfile(what, at)
                if files:
                    docker("cp", f"{stage}/.", f"{box}:/")
            argv = ["docker", "import"]
            for c in [*keep, "WORKDIR /", *changes, f"LABEL {STANDIN_INPUTS}={digest}"]:
                argv += ["--change", c]
            export = subprocess.Popen(["docker", "export", box], stdout=subprocess.PIPE)
            done = subprocess.run([*argv, "-", tag], stdin=export.stdout, capture_output=True, timeout=300,
                                  check=False)
            export.wait(timeout=300)
            assert done.returncode == 0, done.stderr
        finally:
            docker("rm", "-f", box, check=False)
        if current is not None:  # the replaced build, unless something still uses or tags it
            docker("image", "rm", current["Id"], check=False)
    return tag


@pytest.fixture(scope="module")
def standins(sim_images: dict[str, str]) -> dict[str, str]:
    """Images standing in for the operators' (each with the real image's ENTRYPOINT and CMD), tagged
    beside the sim images (B70SIM_REPO) and kept as they are."""
    repo = SIM_REPO
    door = door_image.build(tag=f"{repo}:ops-caddy-base").tag
    return {
        # vllm/vllm-openai of the layout's time: ENTRYPOINT python3 -m vllm.entrypoints.openai.api_server
        # (the operator's README shows `python3 -m vllm.ent…` as the container's command).
        "vllm-openai": _standin(sim_images["serve"], f"{repo}:ops-vllm-openai", [
            'ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]', *FAST]),
        # rocm/vllm: no ENTRYPOINT, a shell as CMD; the compose command starts the server.
        "rocm-vllm": _standin(sim_images["serve"], f"{repo}:ops-rocm-vllm", ['CMD ["/bin/bash"]', *FAST]),
        # open-webui keeps webui.db in /app/backend/data and listens on 8080.
        # OPEA's llm-vllm-hpu (GenAIComps Dockerfile.hpu): no ENTRYPOINT, CMD ["/bin/bash"].
        "no-entrypoint": _standin(sim_images["serve"], f"{repo}:ops-llm-vllm-hpu", ['CMD ["/bin/bash"]', *FAST]),
        # A vLLM image whose ENTRYPOINT is `vllm serve` (the compose file of that layout sets it too).
        "vllm-serve": _standin(sim_images["serve"], f"{repo}:ops-vllm-xpu", ['ENTRYPOINT ["vllm", "serve"]', *FAST]),
        "open-webui": _standin(sim_images["serve"], f"{repo}:ops-open-webui", [
            'CMD ["sim-webui", "--port", "8080", "--data", "/app/backend/data"]']),
        # caddy:2: CMD caddy run --config /etc/caddy/Caddyfile --adapter caddyfile.
        "caddy": _standin(door, f"{repo}:ops-caddy", [
            'CMD ["caddy", "run", "--config", "/etc/caddy/Caddyfile", "--adapter", "caddyfile"]']),
        # ghcr.io/berriai/litellm: WORKDIR /app, ENTRYPOINT ["docker/prod_entrypoint.sh"], CMD ["--port", "4000"];
        # the stand-in routes by the operator's own config (litellm_standin.py, with PyYAML).
        "litellm": _standin(sim_images["serve"], f"{repo}:ops-litellm", [
            "WORKDIR /app", 'ENTRYPOINT ["docker/prod_entrypoint.sh"]', 'CMD ["--port", "4000"]'], files={
            "/app/docker/prod_entrypoint.sh":
                b'#!/bin/sh\nPYTHONPATH=/opt/litellm exec python3 /opt/litellm/litellm_standin.py "$@"\n',
            "/opt/litellm/litellm_standin.py": Path(__file__).parent / "litellm_standin.py",
            "/opt/litellm/yaml": Path(yaml.__file__).parent}),
        # pgvector/pgvector:pg17 (postgres's image): ENTRYPOINT docker-entrypoint.sh, CMD postgres, PGDATA in
        # /var/lib/postgresql/data. The stand-in keeps a data file made once with a random id there (as
        # initdb makes the cluster's system identifier once) and answers pg_isready on 5432.
        "pgvector": _standin(sim_images["serve"], f"{repo}:ops-pgvector", [
            "ENV PGDATA=/var/lib/postgresql/data", 'ENTRYPOINT ["docker-entrypoint.sh"]', 'CMD ["postgres"]'],
            files={"/usr/local/bin/docker-entrypoint.sh": b'#!/bin/sh\nexec sim-webui --port 5432 --data "$PGDATA"\n',
                   "/usr/local/bin/pg_isready": b"#!/bin/sh\nexec wget -q -O /dev/null http://127.0.0.1:5432/health\n"}),
    }


@dataclass
class Layout:
    name: str                                  # the fixture folder
    served: str                                # the model its .env serves (the served name: no alias given)
    variant: str                               # the saved variant's model
    override: Callable[[Layout, Path], dict[str, Any]]   # the test environment's override file
    env: Callable[[Layout, Path], str]         # the .env the operator keeps beside it
    hub: Callable[[Path], Path]                # where the hub cache is on the host
    router: str | None = None                  # the companion in front of vllm that answers /v1
    webui: str | None = None                   # the companion whose data must survive
    up: tuple[str, ...] = ()                   # how the operator starts it: `docker compose [up] ... up -d ...`
    service: str = "vllm"                      # the vLLM service's name in the file
    source: Path | None = None                 # the fixture folder when not under FIXTURES (another issue's)
    variant_env: Callable[[Layout, str], str] | None = None   # the saved variant's .env (default: the model swapped)
    file: str = "docker-compose.yml"           # the operator's (first) compose file
    variant_file: bool = False                 # the saved variant's compose file has the other model too
    key: str | None = None                     # the service's --api-key: every /v1 request sends it
    files: tuple[str, ...] = ()                # the operator's own compose files in -f order (default: `file`)
    vllm_file: str | None = None               # the one holding the vLLM service (default: `file`)
    variant_edit: Callable[[str], str] | None = None   # the saved variant's file, from the operator's
    router_key: str | None = None              # the key the router asks of every /v1 request
    data: str = "/app/backend/data/webui.db"   # the `webui` companion's data file
    ports: dict[str, int] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)


def _evdcush_override(lay: Layout, folder: Path) -> dict[str, Any]:
    s = lay.extra
    return {"services": {
        # No NVIDIA runtime here; vllm is only exposed to Caddy: published on loopback for the tool's probes.
        "vllm": {"image": s["vllm-openai"], "deploy": "!reset", "ports": [f"127.0.0.1:{lay.ports['vllm']}:8000"]},
        "open-webui": {"image": s["open-webui"]},
        "caddy": {"image": s["caddy"], "ports": f"!override 127.0.0.1:{lay.ports['router']}:2080"}}}


def _shelldandy_override(lay: Layout, folder: Path) -> dict[str, Any]:
    s = lay.extra
    return {"services": {"vllm": {
        "image": s["rocm-vllm"], "container_name": f"{folder.name}-vllm",
        "ports": f"!override 127.0.0.1:{lay.ports['vllm']}:8000",
        "devices": f"!override {s['kfd']}:/dev/kfd {s['dri']}:/dev/dri"}},
        "networks": {"backend": {"name": s["network"]}}}


def _b70_override(lay: Layout, folder: Path) -> dict[str, Any]:
    s, uniq = lay.extra, folder.name
    return {"services": {
        "vllm": {"image": s["vllm-xpu"], "container_name": f"{uniq}-vllm",
                 "ports": f"!override 127.0.0.1:{lay.ports['vllm']}:8000",
                 "devices": f"!override {s['dri']}:/dev/dri",
                 "volumes": f"!override ${{MODELS_DIR}}:/llm/models:ro {s['dri']}/by-path:/dev/dri/by-path:ro "
                            "vllm-cache-runtime:/root/.cache"},
        "open-webui": {"image": s["open-webui"], "container_name": f"{uniq}-webui",
                       "ports": f"!override 127.0.0.1:{lay.ports['router']}:8080"}},
        "networks": {"llm-net": {"name": s["network"]}},
        "volumes": {v: {"name": f"{uniq}_{v}"}
                    for v in ("vllm-cache-runtime", "vllm-cache-runtime-2", "open-webui-data", "prometheus-data",
                              "grafana-data")}}


def _louislepage_override(lay: Layout, folder: Path) -> dict[str, Any]:
    s, uniq = lay.extra, folder.name
    return {"services": {
        "vllm-api": {"image": s["vllm-openai"], "container_name": f"{uniq}-vllm-api", "deploy": "!reset",
                     "ports": f"!override 127.0.0.1:{lay.ports['vllm']}:8000"},
        "open-webui": {"image": s["open-webui"], "container_name": f"{uniq}-open-webui",
                       "ports": f"!override 127.0.0.1:{lay.ports['router']}:8080"}},
        "volumes": {"huggingface-cache": {"driver": "local", "driver_opts": {
            "type": "none", "o": "bind", "device": str(folder.parent / "hf-volume")}}}}


def _naptha_override(lay: Layout, folder: Path) -> dict[str, Any]:
    s, uniq, vllm = lay.extra, folder.name, "Qwen2.5-7B-Instruct"
    return {"services": {
        # No NVIDIA runtime here; vllm publishes no port: published on loopback for the tool's probes.
        vllm: {"image": s["vllm-serve"], "deploy": "!reset", "ports": [f"127.0.0.1:{lay.ports['vllm']}:8000"]},
        "litellm": {"image": s["litellm"], "container_name": f"{uniq}-litellm",
                    "ports": f"!override 127.0.0.1:{lay.ports['router']}:4000"},
        # Its health check runs first one `interval` (30 s) after a start (Engine 20.10 has no
        # start_interval), and litellm, which waits for it, starts again on every switch.
        "pgvector": {"image": s["pgvector"], "container_name": f"{uniq}-node-pgvector",
                     "ports": f"!override 127.0.0.1:{lay.ports['db']}:5432", "healthcheck": {"interval": "1s"}}},
        "networks": {"naptha-network": {"name": s["network"]}}}


def _opea_override(lay: Layout, folder: Path) -> dict[str, Any]:
    return {"services": {"vllm-service": {
        "image": lay.extra["no-entrypoint"], "container_name": f"{folder.name}-vllm-gaudi-server",
        "runtime": "!reset", "ports": f"!override 127.0.0.1:{lay.ports['vllm']}:80"}}}


LAYOUTS = {
    "evdcush-vllm-openwebui": Layout(
        "evdcush-vllm-openwebui", served="google/gemma-3-4b-it", variant="google/gemma-3-1b-it",
        override=_evdcush_override, env=lambda lay, folder: (FIXTURES / lay.name / "env-example").read_text(),
        hub=lambda folder: folder / "hf-cache" / "hub", router="caddy", webui="open-webui"),
    "shelldandy-homelab-vllm": Layout(
        "shelldandy-homelab-vllm", served="microsoft/DialoGPT-medium", variant="microsoft/DialoGPT-large",
        override=_shelldandy_override,
        env=lambda lay, folder: (FIXTURES / lay.name / "env-example").read_text().replace(
            "CONFIG_PATH=/opt/vllm", f"CONFIG_PATH={folder.parent / 'opt-vllm'}"),
        hub=lambda folder: folder.parent / "opt-vllm" / "huggingface" / "hub"),
    "bklinkradt-arc-b70-qwen-vllm": Layout(
        "bklinkradt-arc-b70-qwen-vllm", served="Qwen3.8-27B", variant="Qwen3.8-27B",
        override=_b70_override,
        # The operator's .env is not published: the models folder and the device gids of this host.
        env=lambda lay, folder: f"MODELS_DIR={lay.extra['models']}\nVIDEO_GID=4444\nRENDER_GID=4343\n",
        hub=lambda folder: folder.parent / "hf-none", webui="open-webui",
        up=("--profile", "managed", "up", "-d", "vllm", "open-webui"),
        # The saved variant: the same file with another models folder (another build of the weights).
        variant_env=lambda lay, env: env.replace(lay.extra["models"], lay.extra["models"] + "-v2")),
    "louislepage-vllm-openwebui": Layout(
        "louislepage-vllm-openwebui", served="unsloth/DeepSeek-R1-Distill-Llama-70B-bnb-4bit",
        variant="unsloth/DeepSeek-R1-Distill-Llama-8B-bnb-4bit", file="compose.yml", service="vllm-api",
        override=_louislepage_override, key="sk-louislepage-canary-41d2", variant_file=True,
        env=lambda lay, folder: f"VLLM_API_KEY={lay.key}\nHUGGING_FACE_HUB_TOKEN=hf_louislepage_canary\n",
        hub=lambda folder: folder.parent / "hf-volume" / "hub", webui="open-webui"),
    "napthaai-naptha-node-vllm": Layout(
        "napthaai-naptha-node-vllm", served="Qwen/Qwen2.5-7B-Instruct", variant="Qwen/Qwen2.5-7B-Instruct",
        service="Qwen2.5-7B-Instruct", override=_naptha_override,
        files=("docker-compose.yml", "node/compose-files/vllm-models/Qwen2.5-7B-Instruct.yml"),
        vllm_file="node/compose-files/vllm-models/Qwen2.5-7B-Instruct.yml",
        # The saved variant: the same model file with a shorter context (--max-model-len 32768 -> 16384).
        variant_edit=lambda text: text.replace('"--max-model-len", "32768"', '"--max-model-len", "16384"'),
        env=lambda lay, folder: _naptha_env(folder), hub=lambda folder: folder.parent / "hf-home" / "hub",
        router="litellm", router_key="sk-abc123", webui="pgvector", data="/var/lib/postgresql/data/webui.db",
        up=("up", "-d", "pgvector", "litellm", "Qwen2.5-7B-Instruct")),
    "opea-gaudi": Layout(
        "opea-gaudi", served="/data/Qwen/Qwen3-0.6B", variant="/data/Qwen/Qwen3-0.6B-v2",
        source=FIXTURES.parent / "compose" / "opea-gaudi", service="vllm-service", override=_opea_override,
        env=lambda lay, folder: "LLM_MODEL_ID=/data/Qwen/Qwen3-0.6B\nHUGGINGFACEHUB_API_TOKEN=hf_ops_canary\n",
        hub=lambda folder: folder / "data" / "hub-none"),
}


def _naptha_env(folder: Path) -> str:
    """The operator's .env as launch.sh keeps it for vLLM: .env.example's values with LLM_BACKEND=vllm, one
    model, HF_HOME and the token set (launch.sh asks for them), and the GPU id generate_litellm_config.py
    assigns (launch.sh passes it in the environment of `docker compose`; here it is in the .env)."""
    example = (FIXTURES / "napthaai-naptha-node-vllm" / "env-example").read_text()
    env = example.replace("LLM_BACKEND=ollama", "LLM_BACKEND=vllm").replace(
        "VLLM_MODELS=NousResearch/Hermes-3-Llama-3.1-8B", "VLLM_MODELS=Qwen/Qwen2.5-7B-Instruct").replace(
        "LAUNCH_DOCKER=false", "LAUNCH_DOCKER=true").replace("HUGGINGFACE_TOKEN=\n",
                                                             "HUGGINGFACE_TOKEN=hf_naptha_canary\n")
    env = env.replace("HF_HOME=/home/<youruser>/.cache/huggingface", f"HF_HOME={folder.parent / 'hf-home'}")
    return env + "GPU_ID_qwen2_5_7b_instruct=0\n"


def _override_text(doc: dict[str, Any]) -> str:
    """YAML with Compose's `!reset` and `!override` tags (a value of "!reset" or "!override A B")."""
    text = yaml.safe_dump(doc, sort_keys=False, width=10000)
    text = text.replace("'!reset'", "!reset {}")
    for line in [ln for ln in text.splitlines() if "'!override " in ln]:
        key, value = line.split(": '!override ", 1)
        items = ", ".join(json.dumps(v) for v in value.rstrip("'").split())
        text = text.replace(line, f"{key}: !override [{items}]")
    return text


def _hub_model(cache: Path, model: str) -> None:
    repo = cache / f"models--{model.replace('/', '--')}"
    (repo / "snapshots" / "0123abc").mkdir(parents=True, exist_ok=True)
    (repo / "snapshots" / "0123abc" / "config.json").write_text(json.dumps(HUB_CONFIG))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text("0123abc")


def inspected(box: dict[str, Any]) -> dict[str, Any]:
    """Every field of a container that its compose service decides, as docker inspect reports it."""
    cfg, host = box["Config"], box["HostConfig"]
    labels = {k: v for k, v in (cfg.get("Labels") or {}).items()
              if not k.startswith(("com.docker.compose.", "b70deploy."))}
    return {
        "image": box["Image"], "entrypoint": cfg.get("Entrypoint"), "cmd": cfg.get("Cmd"), "args": box["Args"],
        "env": sorted(cfg.get("Env") or []), "labels": labels, "name": box["Name"],
        "mounts": sorted((m.get("Type"), m.get("Name") or m.get("Source"), m["Destination"], m["RW"])
                         for m in box["Mounts"]),
        "networks": sorted(box["NetworkSettings"]["Networks"]),
        "aliases": sorted(a for n in box["NetworkSettings"]["Networks"].values() for a in n.get("Aliases") or []
                          if a != box["Config"]["Hostname"] and not a.startswith(box["Id"][:12])),
        "ports": host.get("PortBindings"), "devices": host.get("Devices"), "groups": host.get("GroupAdd"),
        "security_opt": host.get("SecurityOpt"), "cap_add": host.get("CapAdd"), "ipc": host.get("IpcMode"),
        "shm": host.get("ShmSize"), "ulimits": host.get("Ulimits"), "restart": host.get("RestartPolicy"),
        "exposed": sorted(cfg.get("ExposedPorts") or {}), "healthcheck": cfg.get("Healthcheck"),
    }


def _boxes(project: str) -> dict[str, dict[str, Any]]:
    ids = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={project}").stdout.split()
    boxes = json.loads(docker("inspect", *ids).stdout) if ids else []
    return {b["Config"]["Labels"]["com.docker.compose.service"]: b for b in boxes}


def _answers(port: int, model: str, key: str | None = None) -> dict[str, Any]:
    """A completion asked at `port` (with the service's key, when it has one); a companion the switch
    has just started again (the router) is given a few seconds to listen: restore starts it and returns."""
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    deadline = time.monotonic() + 30
    while True:
        try:
            r = requests.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60, headers=auth,
                              json={"model": model, "prompt": "The capital of France is", "max_tokens": 4})
            break
        except requests.ConnectionError:
            assert time.monotonic() < deadline, f"nothing answers on port {port}"
            time.sleep(0.2)
    if key:  # vLLM refuses /v1 without it (vllm/entrypoints/openai/server_utils.py:32-77, 387dcddc); LiteLLM too
        assert requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).status_code == 401
    served = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=10, headers=auth).text \
        if r.status_code != 200 else ""
    assert r.status_code == 200, (r.text, served)
    got: dict[str, Any] = r.json()
    return got


def _webui_db(name: str, path: str = "/app/backend/data/webui.db") -> str:
    """The first line of the companion's data file (its random id), once its process has made it."""
    deadline = time.monotonic() + 30
    while True:
        out = docker("exec", name, "cat", path, check=False)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.splitlines()[0]
        assert time.monotonic() < deadline, out.stderr
        time.sleep(0.2)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_an_operators_layout_goes_through_every_step_and_comes_back_equal(
        name: str, tmp_path: Path, standins: dict[str, str], free_port: Callable[[], int]) -> None:
    lay = LAYOUTS[name]
    project = simkit.unique("ops")
    folder = tmp_path / project
    shutil.copytree(lay.source or FIXTURES / name, folder, ignore=shutil.ignore_patterns("SOURCE.md", "env-example"))
    lay.ports = {"vllm": free_port(), "router": free_port(), "db": free_port()}
    lay.extra = dict(standins)
    network = None
    if name.startswith("bklinkradt"):
        try:
            dri, _kfd = make_gpu_nodes(tmp_path / "dev", 4343, 4444)
        except PermissionError as e:
            unavailable(str(e))
        network = f"{project}-llm-net"
        docker("network", "create", network)
        models = tmp_path / "models"
        for folder_name in ("models", "models-v2"):
            (tmp_path / folder_name / "Qwen3.8-27B-INT4").mkdir(parents=True)
            (tmp_path / folder_name / "Qwen3.8-27B-INT4" / "config.json").write_text(json.dumps(HUB_CONFIG))
        lay.extra |= {"dri": str(dri), "network": network, "models": str(models), "vllm-xpu": standins["vllm-serve"]}
        (folder / "monitoring" / "grafana" / "dashboards").mkdir()  # its dashboard JSON is not in the fixture
    if name.startswith("napthaai"):  # launch.sh creates the external network before `docker compose up`
        network = f"{project}-naptha-network"
        docker("network", "create", network)
        lay.extra |= {"network": network}
        for made in ("db/alembic/versions", "fs", "hub/modules"):   # node-app's binds: the node makes them (.gitignore)
            (folder / "node" / "storage" / made).mkdir(parents=True)
    if name == "opea-gaudi":  # the weights in ./data, as its LLM_MODEL_ID names them
        for model in (lay.served, lay.variant):
            (folder / model.removeprefix("/")).mkdir(parents=True)
            (folder / model.removeprefix("/") / "config.json").write_text(json.dumps(HUB_CONFIG))
    if name.startswith("shelldandy"):
        try:
            dri, kfd = make_gpu_nodes(tmp_path / "dev", 4343, 4444)
        except PermissionError as e:
            unavailable(str(e))
        network = f"{project}-backend"
        docker("network", "create", network)
        lay.extra |= {"dri": str(dri), "kfd": str(kfd), "network": network}
    override = _override_text(lay.override(lay, folder)).encode()
    (folder / "docker-compose.override.yml").write_bytes(override)
    env = lay.env(lay, folder)
    (folder / ".env").write_text(env)
    (folder / ".env.small").write_text(lay.variant_env(lay, env) if lay.variant_env else env.replace(lay.served,
                                                                                                   lay.variant))
    files = [*(lay.files or (lay.file,)), "docker-compose.override.yml"]   # -f order: the operator's, then the test's
    with_files = [a for f in files for a in ("-f", f)] if lay.files else []   # as the operator runs it
    vllm_file = lay.vllm_file or lay.file
    small = (folder / vllm_file).read_text()   # the saved variant
    (folder / f"{vllm_file}.small").write_text(lay.variant_edit(small) if lay.variant_edit else small.replace(
        lay.served, lay.variant) if lay.variant_file else small)
    for model in (lay.served, lay.variant):
        _hub_model(lay.hub(folder), model)
    config, state = tmp_path / "node.yaml", tmp_path / "state"

    def cli(*args: str, with_config: bool = True) -> subprocess.CompletedProcess[str]:
        r = simkit.run_cli(config if with_config else None, *args, timeout=300)
        assert r.returncode == 0, (args, r.stdout, r.stderr)   # 0 refusals
        assert not lay.key or lay.key not in r.stdout + r.stderr, args   # a secret: never printed
        return r

    try:
        up = subprocess.run(["docker", "compose", "-p", project, *with_files, *(lay.up or ("up", "-d"))], cwd=folder,
                            capture_output=True, text=True, timeout=180, check=False)
        assert up.returncode == 0, up.stderr
        try:
            simkit.wait_status(f"http://127.0.0.1:{lay.ports['vllm']}/health", 200, timeout=90)
        except AssertionError as e:  # what the hand-made vLLM said
            logs = subprocess.run(["docker", "compose", "-p", project, *with_files, "logs", "--tail", "15",
                                  lay.service], cwd=folder, capture_output=True, text=True, timeout=60, check=False)
            raise AssertionError(f"{e}\n{logs.stdout}{logs.stderr}") from None
        hand = {svc: inspected(b) for svc, b in _boxes(project).items()}
        data = _webui_db(_boxes(project)[lay.webui]["Name"].lstrip("/"), lay.data) if lay.webui else None

        # ---- init, adopt: the project as Compose ran it (two files), nothing restarted
        cli("init", "--config", str(config), "--project", project, "--state-dir", str(state), with_config=False)
        cfg = yaml.safe_load(config.read_text())
        assert cfg["compose_files"] == files
        # Test environment only: the test's own stacks folder, short waits, a load threshold a shared box meets.
        (tmp_path / "stacks").mkdir()
        with config.open("a") as fh:
            fh.write(yaml.safe_dump({"stacks_dir": str(tmp_path / "stacks"), "stack_overlay": {"settle_seconds": 0.5},
                                     "load_threshold": 1000,
                                     "timeouts": {"health": 90, "rollback": 90, "poll_interval": 0.2}}))
        assert json.loads(cli("adopt", "--as", "hand", "--json").stdout)["revision"] == 1
        assert {svc: inspected(b) for svc, b in _boxes(project).items()} == hand
        status = json.loads(cli("status", "--json").stdout)   # the deploy dir read as the project's files
        assert status["current"]["number"] == 1 and status["differs"] == [], status

        cli("stack", "from-compose", str(folder / files[0]), *[a for f in files[1:] for a in ("-f", str(folder / f))],
            "--env", str(folder / ".env"), "--name", "made")

        # ---- import the saved variant (its own .env) and roll back to it by name
        cli("import", *[a for f in files for a in ("-f", str(folder / (f"{f}.small" if f == vllm_file else f)))],
            "--env", str(folder / ".env.small"), "--as", "small")
        cli("rollback", "small", "--yes")
        assert inspected(_boxes(project)[lay.service]) != hand[lay.service]   # the variant runs (model or folder)
        assert _answers(lay.ports["vllm"], lay.variant, lay.key)["model"] == lay.variant
        if lay.router:
            assert _answers(lay.ports["router"], lay.variant, lay.router_key)["model"] == lay.variant

        # ---- switch to the stack the operator's own file makes (rendered by the tool; made before the
        # rollback above put the variant's .env into the folder)
        cli("switch", "made", "--yes")
        boxes = _boxes(project)
        assert boxes[lay.service]["Config"]["Labels"]["b70deploy.stack"] == "made"
        assert _answers(lay.ports["vllm"], lay.served, lay.key)["model"] == lay.served
        if lay.router:
            assert _answers(lay.ports["router"], lay.served, lay.router_key)["model"] == lay.served
        for svc, was in hand.items():
            now = inspected(boxes[svc])
            assert now["networks"] == was["networks"], svc
            if svc != lay.service:
                assert now["env"] == was["env"] and now["image"] == was["image"], svc
        if lay.webui:
            assert _webui_db(boxes[lay.webui]["Name"].lstrip("/"), lay.data) == data

        # ---- rollback 1: the hand-made project again, every field as it was
        cli("rollback", "1", "--yes")
        assert {svc: inspected(b) for svc, b in _boxes(project).items()} == hand
        assert json.loads(cli("status", "--json").stdout)["differs"] == []
        assert {n: (folder / n).read_bytes() for n in files} == \
            {**{n: ((lay.source or FIXTURES / name) / n).read_bytes() for n in files[:-1]},
             "docker-compose.override.yml": override}
        assert _answers(lay.ports["vllm"], lay.served, lay.key)["model"] == lay.served
        if lay.router:
            assert _answers(lay.ports["router"], lay.served, lay.router_key)["model"] == lay.served
        if lay.webui:
            assert _webui_db(_boxes(project)[lay.webui]["Name"].lstrip("/"), lay.data) == data
    finally:
        subprocess.run(["docker", "compose", "-p", project, *with_files, "down", "-v", "--remove-orphans",
                        "--timeout", "5"], cwd=folder, capture_output=True, timeout=120, check=False)
        simkit.remove_by_project(project)
        volumes = docker("volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={project}").stdout.split()
        if volumes:   # when the files `down -v` reads were not in the folder (a step failed mid-way)
            docker("volume", "rm", "-f", *volumes, check=False)
        simkit.remove_keep_tags(project)
        if network:
            docker("network", "rm", network, check=False)
