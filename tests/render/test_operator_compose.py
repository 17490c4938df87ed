"""The compose files operators really write (issue 28, item 8; tests/fixtures/compose/): each is
carried by `stack from-compose` (or refused in one line naming the key), and the stack renders
back to the same vLLM command, bind mounts and passthrough keys, as the real `docker compose
config` reads both files. GPU access is read back as the node's platform and device paths
(render/gpu.py) and rendered again the platform's way: the same device request, the same device
nodes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.scratch import Scratch
from simkit import run_cli

from b70deploy.config.node import Node, load_node
from b70deploy.config.schema import Stack
from b70deploy.render.devices import DeviceAccess
from b70deploy.render.files import COMPOSE_FILE, render
from b70deploy.render.from_compose import GPU_KEYS
from b70deploy.render.gpu import GpuAccess, access_of
from b70deploy.render.vllm_args import parse_command, shell_of, split_launcher, split_prelude
from b70deploy.state.fsio import write_tree

pytestmark = pytest.mark.docker

Config = Callable[[Path], dict[str, Any]]
FIXTURES = Path(__file__).parent.parent / "fixtures" / "compose"
MODEL = "Qwen/Qwen3-0.6B"
CARRIED = ["nvidia-hub", "python-m", "python-m-command", "bash-lc", "rocm", "vllm-server"]


def operator_folder(root: Path, name: str) -> Path:
    """A copy of the fixture with what it binds made: the weights folder, and a hub cache that
    holds the model in the hub's layout (refs/main naming its one snapshot)."""
    folder = root / name
    shutil.copytree(FIXTURES / name, folder)
    (folder / "models" / MODEL).mkdir(parents=True)
    (folder / "models" / MODEL / "config.json").write_text("{}")
    for cache in (folder / "hf", root / "hf-cache"):
        repo = cache / "hub" / f"models--{MODEL.replace('/', '--')}"
        (repo / "snapshots" / "0123abc").mkdir(parents=True, exist_ok=True)
        (repo / "snapshots" / "0123abc" / "config.json").write_text("{}")
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text("0123abc")
    (folder / ".env").write_text(f"HF_CACHE={root / 'hf-cache'}\nHF_TOKEN=hf_canary_0d1e\n")
    return folder


def program(svc: dict[str, Any]) -> list[str]:
    """What the container runs, as far as the compose file says: its entrypoint when that starts vLLM
    (a launcher, a shell), then the command."""
    entry = [str(a) for a in svc.get("entrypoint") or []]
    command = [str(a) for a in svc.get("command") or []]
    reads = split_launcher(entry)[0] is not None or shell_of(entry) is not None
    return [*entry, *command] if reads else command


def same_command(ours: list[str], theirs: list[str]) -> None:
    """The same server started the same way with the same settings: launcher, shell and prelude as
    written; model, stack values and other flags alike (the render spells out prefix caching, host
    and port, which the hand-made file left to vLLM's defaults)."""
    assert shell_of(ours) == shell_of(theirs)
    pre_ours, serve_ours = split_prelude(ours)
    pre_theirs, serve_theirs = split_prelude(theirs)
    assert pre_ours == pre_theirs
    assert split_launcher(serve_ours)[0] == split_launcher(serve_theirs)[0]
    a, b = parse_command(ours), parse_command(theirs)
    assert a.model == b.model
    assert a.values == b.values  # nothing added: prefix caching stays vLLM's default
    assert a.extra == b.extra


def binds(svc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(str(v["source"]).rstrip("/"), str(v["target"])) for v in svc.get("volumes") or []
            if v.get("type") == "bind"}


def platform_access(node: Node, stack: Stack) -> GpuAccess:
    """The node's GPU access as the fixture's host would show it: the device paths the node config
    names (this machine has none of them; access_for would read /dev)."""
    cfg = node.config
    dri = DeviceAccess(device_dir=Path(cfg.device_dir) if cfg.device_dir else None)
    rocm = cfg.platform == "rocm"
    return access_of(cfg.platform, stack.gpus if stack.gpus is not None else cfg.gpus, dri,
                     kfd=Path(cfg.kfd_device) if rocm else None, kfd_gid=("video", 44) if rocm else None,
                     cdi=cfg.nvidia_cdi)


def gpu_of(svc: dict[str, Any]) -> tuple[Any, set[str]]:
    """A service's GPU access as Compose read it: its device requests and its device nodes."""
    requests = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices")
    return requests, {str(d["source"]) for d in svc.get("devices") or []}


def from_compose(scratch: Scratch, folder: Path, name: str) -> dict[str, Any]:
    result = run_cli(scratch.config, "stack", "from-compose", str(folder / "docker-compose.yml"), "--name", name,
                     "--json", in_process=True)
    assert result.returncode == 0, result.stderr
    assert "hf_canary" not in result.stdout + result.stderr + (scratch.stacks / f"{name}.yaml").read_text()
    out: dict[str, Any] = json.loads(result.stdout)
    return out


@pytest.mark.parametrize("name", CARRIED)
def test_from_compose_carries_it_and_render_gives_it_back(scratch: Scratch, compose: Config, name: str) -> None:
    folder = operator_folder(scratch.root, name)
    out = from_compose(scratch, folder, name)
    node_facts = {k: v for k, v in out["node"].items() if k not in ("project", "gids")}
    scratch.write_config(node_facts)
    node = load_node(str(scratch.config))
    stack = node.catalogue().load(name)
    rendered = render(stack, node, platform_access(node, stack))
    write_tree(scratch.root / "r", rendered.files)
    theirs_doc = compose(folder)
    ours_doc = compose(scratch.root / "r")
    service = out["service"]
    assert node.service == service  # the node config names the service; render uses the name
    theirs, ours = theirs_doc["services"][service], ours_doc["services"][service]
    assert ours["image"] == theirs["image"]
    same_command(program(ours), program(theirs))
    assert binds(ours) == binds(theirs)
    assert gpu_of(ours) == gpu_of(theirs)  # the platform's way, from the node's platform and devices
    for key in set(stack.compose) - GPU_KEYS:  # the passthrough: each key as Compose read it
        assert ours[key] == theirs[key], key
    for net, conf in (theirs_doc.get("networks") or {}).items():
        if net in (theirs.get("networks") or {}) and conf.get("ipam"):
            assert ours_doc["networks"][net]["ipam"] == conf["ipam"]
    if not theirs.get("ports"):  # expose-only: published for b70deploy's probes on loopback only
        assert [p["host_ip"] for p in ours["ports"]] == ["127.0.0.1"] and ours["expose"] == theirs["expose"]
    lint = run_cli(scratch.config, "lint", name, "--no-docker", "--json", in_process=True)
    found = [f["id"] for s in json.loads(lint.stdout)["stacks"].values() for f in s["findings"]]
    assert not {"model-arg-unresolved", "command-bare-flags", "hub-model-missing", "model-missing"} & set(found)


def test_each_kind_comes_back_as_what_the_stack_says(scratch: Scratch) -> None:
    docs = {n: from_compose(scratch, operator_folder(scratch.root, n), n) for n in CARRIED}
    hub = docs["nvidia-hub"]
    assert hub["stack_doc"]["model"] == {"path": MODEL, "hub": True}
    assert hub["node"]["hf_cache"] == str(scratch.root / "hf-cache")
    assert hub["withheld_env"] == ["HUGGING_FACE_HUB_TOKEN"]          # a token: withheld
    assert hub["stack_doc"]["max_num_batched_tokens"] == 8192           # a count of tokens: a stack key
    assert "--enable-prompt-tokens-details" in hub["stack_doc"]["extra_args"]  # a flag about tokens: kept
    # The GPU reservation is the platform's (render/gpu.py writes it again); runtime goes through as written.
    assert hub["node"]["platform"] == "cuda" and "gpus" not in hub["stack_doc"]  # count: all
    assert hub["stack_doc"]["compose"] == {"runtime": "nvidia"}
    launcher = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert docs["python-m"]["stack_doc"]["launcher"] == launcher
    assert docs["python-m"]["stack_doc"]["entrypoint_style"] == "vllm-serve"  # the launcher is the entrypoint
    assert docs["python-m-command"]["stack_doc"]["launcher"] == launcher
    assert docs["python-m-command"]["stack_doc"]["env"] == {"MAX_NUM_BATCHED_TOKENS": "8192"}
    assert docs["bash-lc"]["stack_doc"]["shell"] == ["bash", "-lc"]
    assert docs["bash-lc"]["stack_doc"]["prelude"] == "source /opt/intel/oneapi/setvars.sh --force"
    rocm = docs["rocm"]
    assert rocm["node"]["device_dir"] == "/dev/dri"
    assert rocm["node"]["platform"] == "rocm" and rocm["node"]["kfd_device"] == "/dev/kfd"  # the platform's
    assert "devices" not in rocm["stack_doc"].get("compose", {})  # render writes kfd and dri again
    assert rocm["stack_doc"]["compose"]["security_opt"] == ["seccomp=unconfined"]
    server = docs["vllm-server"]
    assert server["service"] == "vllm-server"
    assert "bind_address" not in server["node"]  # the stack's expose: keeps its port on loopback
    carried = server["stack_doc"]["compose"]
    assert set(carried) == {"cap_drop", "expose", "healthcheck", "mem_limit", "networks", "pids_limit", "ulimits"}
    assert server["node"]["networks"] == {"backend": {"ipam": {"config": [{"subnet": "172.31.77.0/24"}]}}}
    assert any("container_name is not carried over" in n for n in server["notes"])


def test_an_entrypoint_script_is_refused_in_one_line_nothing_written(scratch: Scratch) -> None:
    folder = operator_folder(scratch.root, "entrypoint-script")
    result = run_cli(scratch.config, "stack", "from-compose", str(folder / "docker-compose.yml"), "--name", "s",
                     in_process=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "services.vllm.entrypoint: the entrypoint /bin/bash /scripts/start.sh" in result.stderr
    assert "fix: " in result.stderr and not list(scratch.stacks.iterdir())


def test_a_named_volume_that_is_hf_home_becomes_the_nodes_hf_cache_volume(scratch: Scratch) -> None:
    folder = scratch.root / "named"
    folder.mkdir()
    (folder / "docker-compose.yml").write_text(yaml.safe_dump({
        "services": {"vllm": {"image": "vllm/vllm-openai:v0.10.1", "volumes": ["hf:/root/.cache/huggingface"],
                              "command": [MODEL, "--served-model-name", "q", "--max-model-len", "4096"]}},
        "volumes": {"hf": {}}}))
    result = run_cli(scratch.config, "stack", "from-compose", str(folder / "docker-compose.yml"), "--name", "s",
                     in_process=True)
    assert result.returncode == 0, result.stderr
    assert "hf_cache_volume: named_hf" in result.stderr   # the node config value: the volume's engine name
    assert yaml.safe_load((scratch.stacks / "s.yaml").read_text())["model"] == {"path": MODEL, "hub": True}


def test_render_to_compose_file_has_the_stack_keys_again(scratch: Scratch) -> None:
    """The rendered file of a carried stack, converted once more, gives the same stack document."""
    folder = operator_folder(scratch.root, "vllm-server")
    first = from_compose(scratch, folder, "one")
    scratch.write_config({k: v for k, v in first["node"].items() if k != "project"})
    node = load_node(str(scratch.config))
    rendered = render(node.catalogue().load("one"), node, DeviceAccess(device_dir=None))
    write_tree(scratch.root / "r", rendered.files)
    second = from_compose(scratch, scratch.root / "r", "two")
    assert second["stack_doc"] == first["stack_doc"]
    assert {k: second["node"][k] for k in ("hf_cache", "networks")} == \
        {k: first["node"][k] for k in ("hf_cache", "networks")}
    assert (scratch.root / "r" / COMPOSE_FILE).read_text().count("b70deploy.stack: \"one\"") == 1
