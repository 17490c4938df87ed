"""vLLM started every way operators start it, brought up by hand on the real engine, then taken
through init, stack from-compose, adopt, a switch to the stack from-compose wrote, and a rollback to
the adopted bytes (issue 33, items 1-3).

The stand-in images carry the real image's ENTRYPOINT (vllm-project/vllm docker/Dockerfile, the
vllm-openai stage): `python3 -m vllm.entrypoints.openai.api_server` at 0000977eaf873be6a295cf73017976d49ca2fb9d,
`vllm serve` at dead20baf70df70580ecb093f82b0b7b8676e4f5. The layouts:

- entrypoint: the image's ENTRYPOINT starts vLLM, the service writes flags only: no
  --served-model-name, no --max-model-len, no prefix-caching flag, a container port of its own (4997)
  that its healthcheck names, a second published port, and a hub id whose cache HF_HOME names, bound
  read-write.
- opea: opea-project/GenAIExamples' Gaudi vllm-service (tests/fixtures/compose/opea-gaudi): a bash -c
  prelude, then python3 -m vllm.entrypoints.openai.api_server on container port 80, under an image
  with no ENTRYPOINT (its Dockerfile.hpu ends in CMD ["/bin/bash"]).
- script: an inline script in entrypoint: [/bin/bash, -c] + command:, several lines (set -e, an export,
  a symlink) and then `exec vllm serve`, the hub cache named by HF_HUB_CACHE.
- hubname: `vllm serve` under ENTRYPOINT [vllm, serve], the hub folder named `models`, not `hub`
  (HF_HUB_CACHE=/cache/models: huggingface_hub reads it whatever its name); then a stack whose env
  names no cache, which render points at that folder with HF_HUB_CACHE.

Each step is checked from outside: `docker inspect` of the container's argv, mounts and their modes,
published ports and healthcheck, and a completion asked for the name vLLM serves."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import simkit
import yaml
from kit.simnode import completion, docker, service_box

from b70deploy.render.vllm_args import parse_serve_args, split_launcher, split_prelude
from b70deploy.sim.box import MODELS

pytestmark = pytest.mark.docker

FIXTURES = Path(__file__).parent.parent / "fixtures" / "compose"
API_SERVER = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
HUB_ID = "Qwen/Qwen3-0.6B"
SIM_ENV = {"B70SIM_BOOT_SECONDS": "0.5", "B70SIM_DECODE_TPS": "500"}
# A small model's config: with no --max-model-len vLLM takes max_position_embeddings, which must fit the KV pool.
# Unquantized (the sim's quantized MoE needs the report's marlin fix on XPU).
SMALL = {**{k: v for k, v in MODELS["Qwen/Qwen3-30B-A3B-W4A16"].items() if k != "quantization_config"},
         "max_position_embeddings": 8192}


@dataclass
class Layout:
    name: str
    root: Path
    folder: Path
    project: str
    service: str
    port: int                 # the published port of vLLM's container port
    model: str                # the name vLLM serves under (the model argument: no --served-model-name)
    config: Path

    def cli(self, *args: str, code: int | None = 0) -> subprocess.CompletedProcess[str]:
        r = simkit.run_cli(self.config, *args, timeout=240)
        if code is not None:
            assert r.returncode == code, (args, r.stdout, r.stderr)
        return r

    def box(self) -> dict[str, Any]:
        return service_box(self.project, self.service)


def _hub_cache(hf_home: Path, folder: str = "hub") -> None:
    """A hub cache holding the hub id's snapshot (huggingface_hub's layout: refs/main names it)."""
    repo = hf_home / folder / f"models--{HUB_ID.replace('/', '--')}"
    (repo / "snapshots" / "0123abc").mkdir(parents=True)
    (repo / "snapshots" / "0123abc" / "config.json").write_text(json.dumps(SMALL))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")


def _image(base: str, tag: str, entrypoint: list[str], cmd: list[str] | None = None) -> None:
    """`base` (the sim image) with the real image's ENTRYPOINT and CMD (a build: `docker commit
    --change "ENTRYPOINT []"` keeps the old one)."""
    dockerfile = f"FROM {base}\nENTRYPOINT {json.dumps(entrypoint)}\nCMD {json.dumps(cmd or [])}\n"
    built = subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=dockerfile, capture_output=True,
                           text=True, timeout=120, check=False)
    assert built.returncode == 0, built.stderr


def _files(name: str, root: Path, tag: str, port: int, extra_port: int) -> tuple[str, dict[str, Any], str]:
    """(the vllm service's name, the compose document, the name vLLM serves under) of layout `name`."""
    if name == "entrypoint":
        _hub_cache(root / "hf")
        return "vllm", {"services": {"vllm": {
            "image": tag, "command": ["--model", HUB_ID, "--port", "4997", "--tensor-parallel-size", "1"],
            "environment": {"HF_HOME": "/hf", **SIM_ENV},
            "volumes": [f"{root / 'hf'}:/hf"],                       # read-write: the hub client writes there
            "ports": [f"127.0.0.1:{port}:4997", f"127.0.0.1:{extra_port}:9400"],
            "healthcheck": {"test": ["CMD", "wget", "-qO-", "http://127.0.0.1:4997/health"], "interval": "2s"},
            "ipc": "host"}}}, HUB_ID
    if name == "opea":
        doc = yaml.safe_load((FIXTURES / "opea-gaudi" / "docker-compose.yml").read_text())
        svc = doc["services"]["vllm-service"]
        svc["image"] = tag
        svc["container_name"] = f"{root.name}-vllm-gaudi-server"  # the engine is shared: a unique name
        del svc["runtime"]                                         # no Gaudi runtime on this engine
        svc["ports"] = [f"127.0.0.1:{port}:80"]
        svc["environment"].update(SIM_ENV)
        (root / "data" / "Qwen").mkdir(parents=True)
        (root / "data" / "Qwen" / "Qwen3-0.6B").mkdir()
        (root / "data" / "Qwen" / "Qwen3-0.6B" / "config.json").write_text(json.dumps(SMALL))
        svc["volumes"] = [f"{root / 'data'}:/data"]
        return "vllm-service", doc, "/data/Qwen/Qwen3-0.6B"
    if name == "hubname":
        _hub_cache(root / "cache", "models")
        return "vllm", {"services": {"vllm": {
            "image": tag, "command": [HUB_ID, "--max-model-len", "4096"],
            "environment": {"HF_HUB_CACHE": "/cache/models", **SIM_ENV},
            "volumes": [f"{root / 'cache'}:/cache"], "ports": [f"127.0.0.1:{port}:8000"]}}}, HUB_ID
    _hub_cache(root / "cache")
    script = ("set -e\nexport VLLM_LOGGING_LEVEL=INFO\nln -sf /cache/hub /tmp/hub\n"
              f"exec vllm serve {HUB_ID} --max-model-len 4096 --enforce-eager\n")
    return "vllm", {"services": {"vllm": {
        "image": tag, "entrypoint": ["/bin/bash", "-c"], "command": [script],
        "environment": {"HF_HUB_CACHE": "/cache/hub", **SIM_ENV},
        "volumes": [f"{root / 'cache'}:/cache"], "ports": [f"127.0.0.1:{port}:8000"]}}}, HUB_ID


@pytest.fixture(params=["entrypoint", "opea", "script", "hubname"])
def layout(request: pytest.FixtureRequest, tmp_path: Path, sim_images: dict[str, str],
           free_port: Callable[[], int]) -> Iterator[Layout]:
    name = str(request.param)
    project = simkit.unique("start")
    root = tmp_path / project
    folder = root / "app"
    folder.mkdir(parents=True)
    tag = f"{project}/vllm-openai:stand-in"
    if name in ("script", "hubname"):
        docker("tag", sim_images["serve"], tag)                    # ENTRYPOINT ["vllm", "serve"]
    elif name == "opea":
        # opea-project/GenAIComps comps/llms/text-generation/vllm/docker/Dockerfile.hpu at
        # 0e0c1e4f5ac048fb5ff1e7b5f019e15361e4c3b0: no ENTRYPOINT, CMD ["/bin/bash"].
        _image(sim_images["serve"], tag, [], ["/bin/bash"])
    else:
        _image(sim_images["serve"], tag, API_SERVER)               # ENTRYPOINT python3 -m ...api_server
    port, extra = free_port(), free_port()
    service, doc, model = _files(name, root, tag, port, extra)
    (folder / "docker-compose.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (folder / ".env").write_text("LLM_MODEL_ID=/data/Qwen/Qwen3-0.6B\nHUGGINGFACEHUB_API_TOKEN=hf_cs_canary\n")
    stacks = root / "stacks"
    stacks.mkdir()
    lay = Layout(name=name, root=root, folder=folder, project=project, service=service, port=port, model=model,
                 config=root / "node.yaml")
    try:
        up = subprocess.run(["docker", "compose", "-p", project, "up", "-d"], cwd=folder, capture_output=True,
                            text=True, timeout=180, check=False)
        assert up.returncode == 0, up.stderr
        try:
            simkit.wait_status(f"http://127.0.0.1:{port}/health", 200, timeout=60)
        except AssertionError:
            logs = subprocess.run(["docker", "compose", "-p", project, "logs", "--tail", "20"], cwd=folder,
                                  capture_output=True, text=True, timeout=60, check=False)
            raise AssertionError(f"the hand-made {name} layout never became healthy: {logs.stdout[-3000:]}") from None
        yield lay
    finally:
        simkit.remove_by_project(project)
        simkit.remove_by_project(f"{project}-dark")
        simkit.remove_keep_tags(project)
        docker("rmi", "-f", tag, check=False)


def _argv(box: dict[str, Any]) -> list[str]:
    return [str(box["Path"]), *map(str, box["Args"])]


def _serve(argv: list[str]) -> tuple[str | None, dict[str, Any], list[str], dict[str, str]]:
    """(prelude, flag values, extra flags, host/port) of a container's argv, however it starts vLLM."""
    prelude, rest = split_prelude(argv) if argv[0].endswith("bash") else (None, argv)
    rest = split_launcher(rest)[1]
    parsed = parse_serve_args(rest[2:] if rest[:2] == ["vllm", "serve"] else rest)
    return prelude, {"model": parsed.model, **parsed.values}, parsed.extra, parsed.fixed


def _mounts(box: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    return {m["Destination"]: (m["Source"], bool(m["RW"])) for m in box["Mounts"]}


def _published(box: dict[str, Any]) -> dict[str, list[str]]:
    bound = box["HostConfig"]["PortBindings"] or {}
    return {k: sorted(b["HostPort"] for b in v) for k, v in bound.items()}


def test_every_way_to_start_vllm_is_read_and_served_the_same_way(layout: Layout) -> None:
    before = layout.box()
    assert completion(layout.port, layout.model)["model"] == layout.model  # vLLM serves under the model argument

    # ---- init: finds vLLM however it is started; the hub cache and the port are the service's own
    out = simkit.run_cli(None, "init", "--config", str(layout.config), "--project", layout.project,
                         "--state-dir", str(layout.root / "state"), timeout=120)
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(layout.config.read_text())
    assert cfg["ports"]["prod"] == layout.port and cfg.get("service", "vllm") == layout.service
    if layout.name == "entrypoint":
        assert cfg["hf_cache"] == str(layout.root / "hf")
    elif layout.name == "script":
        assert cfg["hf_cache"] == str(layout.root / "cache")
    elif layout.name == "hubname":  # the bind as written, the hub folder below it by its own name
        assert (cfg["hf_cache"], cfg["hf_cache_target"], cfg["hf_hub_folder"]) == (
            str(layout.root / "cache"), "/cache", "models")
    else:  # its weights bind as written: read-write
        assert cfg["models_dir"] == str(layout.root / "data") and cfg["models_target"] == "/data"
        assert cfg["models_read_only"] is False
    assert "runs no" not in out.stdout + out.stderr and "hf_canary" not in out.stdout + out.stderr
    cfg.update({"stacks_dir": str(layout.root / "stacks"), "device_dir": None, "load_threshold": 1000,
                "timeouts": {"health": 60, "rollback": 60, "poll_interval": 0.2},
                "stack_overlay": {"settle_seconds": 0.5}})  # test environment: short waits, no GPU here
    layout.config.write_text(yaml.safe_dump(cfg))

    # ---- stack from-compose: nothing refused, nothing added
    made = layout.cli("stack", "from-compose", str(layout.folder / "docker-compose.yml"), "--name", "mine",
                      "--service", layout.service, "--json")
    doc = json.loads(made.stdout)["stack_doc"]
    assert "served_model_names" not in doc and ("max_model_len" in doc) == (layout.name in ("script", "hubname"))
    assert doc["prefix_caching"] == "default"  # no flag: vLLM's own default, as the command had it

    # ---- adopt, then switch to the stack: the same program, flags, mounts, ports and healthcheck
    layout.cli("adopt", "--as", "hand")
    r = layout.cli("switch", "mine", "--yes")
    after = layout.box()
    assert after["Id"] != before["Id"]
    prelude, values, extra, fixed = _serve(_argv(before))
    prelude2, values2, extra2, fixed2 = _serve(_argv(after))
    assert (prelude2, values2, sorted(extra2)) == (prelude, values, sorted(extra)), r.stdout
    assert fixed2.get("--port", "8000") == fixed.get("--port", "8000")   # the operator's container port
    assert fixed2.get("--host") == fixed.get("--host")                  # the operator's --host, or none as they had
    assert _published(after) == _published(before)                       # every published port, as it was
    assert (after["Config"].get("Healthcheck") or {}).get("Test") == (before["Config"].get("Healthcheck") or {}).get(
        "Test")
    mounts, mounts2 = _mounts(before), _mounts(after)
    for target, (source, rw) in mounts.items():  # the weights bind too: OPEA's ./data:/data stays read-write
        assert mounts2[target] == (source, rw), target
    assert completion(layout.port, layout.model)["model"] == layout.model

    # ---- rollback to the adopted bytes: the hand-made container again, argv for argv
    layout.cli("rollback", "hand", "--yes")
    back = layout.box()
    assert _argv(back) == _argv(before) and _mounts(back) == mounts and _published(back) == _published(before)
    assert re.sub(r"\s", "", str(back["Config"].get("Healthcheck"))) == re.sub(
        r"\s", "", str(before["Config"].get("Healthcheck")))
    assert completion(layout.port, layout.model)["model"] == layout.model

    # ---- import: the file as a rollback target, its command mapped for lint (no "does not map" warning)
    imported = json.loads(layout.cli("import", str(layout.folder / "docker-compose.yml"), "--as", "saved",
                                     "--json").stdout)
    assert imported["created"] and not any("does not map" in w for w in imported["warnings"]), imported["warnings"]

    if layout.name != "hubname":
        return
    # ---- a stack whose env names no cache: render points HF_HUB_CACHE at the node's hub folder
    bare = {k: v for k, v in doc.items() if k != "env"}
    (layout.root / "stacks" / "bare.yaml").write_text(yaml.safe_dump({**bare, "name": "bare", "env": SIM_ENV}))
    layout.cli("switch", "bare", "--yes")
    box = layout.box()
    env = dict(e.split("=", 1) for e in box["Config"]["Env"])
    assert env["HF_HUB_CACHE"] == "/cache/models" and "HF_HOME" not in env
    assert _mounts(box)["/cache"] == (str(layout.root / "cache"), True)
    assert completion(layout.port, layout.model)["model"] == layout.model
