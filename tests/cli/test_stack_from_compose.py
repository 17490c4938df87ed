"""`b70deploy stack from-compose` through the CLI, with the real `docker compose config`.

The round trip: each shipped stack rendered by the render code, from-compose'd into a new
stack, rendered again: Compose reads the same vllm service from both (command, environment,
image, mounts, ports), except for the label naming the stack.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit.scratch import SHIPPED_STACKS, Scratch
from simkit import run_cli

from b70deploy.config.node import load_node
from b70deploy.config.secrets_file import load_secrets
from b70deploy.render import devices
from b70deploy.render.files import COMPOSE_FILE, render
from b70deploy.render.vllm_args import parse_serve_args
from b70deploy.state.fsio import write_tree

Config = Callable[[Path], dict[str, Any]]
CANARY = "hf_canary_7f3a9"
# Values that need care on the way back: a literal `$`, quotes, spaces.
ENV = {"ZE_AFFINITY_MASK": "0", "PRICE": "$5 a 'token'", "B70SIM_BOOT_SECONDS": "1"}


def _service(compose: Config, folder: Path) -> dict[str, Any]:
    svc: dict[str, Any] = compose(folder)["services"]["vllm"]
    svc["labels"].pop("b70deploy.stack")
    return svc


@pytest.mark.parametrize("name", SHIPPED_STACKS)
def test_round_trip_gives_the_same_service(scratch: Scratch, compose: Config, name: str) -> None:
    scratch.copy_shipped()
    scratch.write_config({"secrets_env_file": str(scratch.root / "secrets.env")})
    (scratch.root / "secrets.env").write_text(f"HF_TOKEN={CANARY}\n")
    node = load_node(str(scratch.config))
    secrets, _ = load_secrets(node.secrets_env_file)
    stack = node.catalogue().load(name)
    stack = stack.model_copy(update={"env": {**stack.env, **ENV}})
    first = render(stack, node, devices.scan(None), secrets=secrets)
    write_tree(scratch.root / "a", first.files)

    result = run_cli(scratch.config, "stack", "from-compose", str(scratch.root / "a" / COMPOSE_FILE),
                     "--name", f"{name}-rt", "--json", in_process=True)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["withheld_env"] == ["HF_TOKEN"] and out["file"] == str(scratch.stacks / f"{name}-rt.yaml")
    written = (scratch.stacks / f"{name}-rt.yaml").read_text()
    assert CANARY not in written + result.stdout + result.stderr

    back = node.catalogue().load(f"{name}-rt")
    second = render(back, node, devices.scan(None), secrets=secrets)
    write_tree(scratch.root / "b", second.files)
    assert second.command == first.command
    assert _service(compose, scratch.root / "b") == _service(compose, scratch.root / "a")


def _hand_made(folder: Path, command: str, *, env_line: str = "VLLM023_MODEL=/models/Qwen/Qwen3-30B-A3B-W4A16") -> Path:
    """The report's layout: bash -c entrypoint, `vllm serve --model ${VLLM023_MODEL}`, a .env, an env_file
    with a secret, a bind-mounted corrected marlin_utils.py, open-webui beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vllm-patches").mkdir(exist_ok=True)
    (folder / "vllm-patches" / "marlin_utils.py").write_text("# corrected\n")
    (folder / ".env").write_text(env_line + "\n")
    (folder / "vllm023.env").write_text(f"HF_TOKEN={CANARY}\nZE_AFFINITY_MASK=0\n")
    doc = {"services": {
        "vllm": {"image": "intel/vllm:latest", "profiles": ["gpu"],
                 "entrypoint": ["/bin/bash", "-c", 'source /opt/intel/oneapi/setvars.sh --force && exec "$$@"', "--"],
                 "command": command, "env_file": ["vllm023.env"], "ports": ["0.0.0.0:8000:8000"],
                 "volumes": ["/srv/models:/models:ro",
                             "./vllm-patches/marlin_utils.py:/usr/local/lib/python3.12/dist-packages/vllm/"
                             "model_executor/layers/quantization/utils/marlin_utils.py:ro"],
                 "devices": ["/dev/dri:/dev/dri"], "group_add": ["992"], "ipc": "host", "shm_size": "16g"},
        "open-webui": {"image": "ghcr.io/open-webui/open-webui:main", "profiles": ["gpu"]}}}
    path = folder / "docker-compose.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


REPORT_COMMAND = ('vllm serve --model "${VLLM023_MODEL}" --served-model-name qwen3-30b-a3b-w4a16 qwen3-30b-tq-256k '
                  "--max_model_len 262144 --dtype float16 --kv-cache-dtype fp8 --enable-auto-tool-choice "
                  "--tool-call-parser hermes --speculative-config "
                  "'{\"method\":\"ngram\",\"num_speculative_tokens\":5,\"prompt_lookup_max\":4,\"prompt_lookup_min\":2}'"
                  " --gpu-memory-utilization 0.95 --block-size 64")


def test_report_layout_becomes_a_stack_that_renders_its_command(scratch: Scratch, compose: Config) -> None:
    path = _hand_made(scratch.root / "b70-vllm", REPORT_COMMAND)
    result = run_cli(scratch.config, "stack", "from-compose", str(path), "--name", "hand", in_process=True)
    assert result.returncode == 0, result.stderr
    assert "entrypoint" in result.stdout and CANARY not in result.stdout + result.stderr
    for piece in ("HF_TOKEN", "patch from-file", "models_dir: /srv/models", "project: b70-vllm", "gid992"):
        assert piece in result.stderr, piece
    node = load_node(str(scratch.config))
    stack = node.catalogue().load("hand")
    assert stack.speculative is not None and stack.speculative.method == "ngram"
    # ZE_AFFINITY_MASK is Level Zero's GPU mask: it comes back as the stack's GPU selection (issue 28)
    assert stack.extra_args == ["--block-size", "64"] and stack.env == {} and stack.gpus == ["0"]
    rendered = render(stack, node, devices.scan(None))
    write_tree(scratch.root / "r", rendered.files)
    got = compose(scratch.root / "r")["services"]["vllm"]["command"]
    want = compose(path.parent)["services"]["vllm"]["command"]
    assert got[:2] == want[:2] == ["vllm", "serve"]
    # The same effective command: same model, same values, same other flags; the stack spells out
    # what the hand-made one left to defaults (prefix caching, host, port).
    ours, theirs = parse_serve_args(got[2:]), parse_serve_args(want[2:])
    assert ours.model == theirs.model == "/models/Qwen/Qwen3-30B-A3B-W4A16"
    assert ours.values == theirs.values  # nothing added
    assert ours.extra == theirs.extra == ["--block-size", "64"]


def test_env_option_interpolates_from_that_file(scratch: Scratch) -> None:
    path = _hand_made(scratch.root / "h", REPORT_COMMAND, env_line="VLLM023_MODEL=/models/wrong")
    other = scratch.root / "other.env"
    other.write_text("VLLM023_MODEL=/models/Qwen/Other\n")
    result = run_cli(scratch.config, "stack", "from-compose", str(path), "--env", str(other), "--name", "o",
                     "--json", in_process=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["stack_doc"]["model"] == {"path": "Qwen/Other"}


@pytest.mark.parametrize(("args", "says"), [
    (("--name", "Bad/Name"), "--name: stack name 'Bad/Name' is not allowed"),
    (("--name", "exists"), "already exists"),
    (("--name", "x", "-o", "elsewhere.yaml"), "is not named x.yaml"),
    (("--name", "x", "--env", "/nonexistent.env"), "--env /nonexistent.env is not a file"),
    (("--name", "x", "--service", "nope"), "no service 'nope'"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(scratch: Scratch, args: tuple[str, ...], says: str) -> None:
    path = _hand_made(scratch.root / "h", REPORT_COMMAND)
    scratch.write_stack("exists", "# the operator's own\n")
    before = {p: p.read_bytes() for p in scratch.stacks.iterdir()}
    result = run_cli(scratch.config, "stack", "from-compose", str(path), *args, in_process=True)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and result.stderr.count("\n") == 1 and "fix:" in result.stderr
    assert {p: p.read_bytes() for p in scratch.stacks.iterdir()} == before
    assert not (scratch.root / "elsewhere.yaml").exists()


def test_compose_refusing_the_file_is_bad_input(scratch: Scratch) -> None:
    path = _hand_made(scratch.root / "h", 'vllm serve "${UNSET_MODEL:?set UNSET_MODEL in .env}"')
    result = run_cli(scratch.config, "stack", "from-compose", str(path), "--name", "x", in_process=True)
    assert result.returncode == 2 and "docker compose refuses it" in result.stderr
    assert "UNSET_MODEL" in result.stderr and not (scratch.stacks / "x.yaml").exists()


def test_lint_still_checks_the_flags_kept_in_extra_args(scratch: Scratch) -> None:
    """Auto tool choice without a parser is no valid tool_calling: the flag stays verbatim, and
    lint reads it from the rendered command; a stack key's flag repeated there is caught too."""
    path = _hand_made(scratch.root / "h", 'vllm serve "${VLLM023_MODEL}" --served-model-name m '
                                          "--max-model-len 4096 --enable-auto-tool-choice")
    made = run_cli(scratch.config, "stack", "from-compose", str(path), "--name", "tools", "--json", in_process=True)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["stack_doc"]["extra_args"] == ["--enable-auto-tool-choice"]
    scratch.write_stack("twice", {"extends": "tools", "extra_args": ["--max-model-len", "8192"]})
    result = run_cli(scratch.config, "lint", "tools", "twice", "--no-docker", "--json", in_process=True)
    assert result.returncode == 2, result.stderr
    found = {n: [f["id"] for f in s["findings"]] for n, s in json.loads(result.stdout)["stacks"].items()}
    assert "tool-parser-missing" in found["tools"] and "flag-twice" in found["twice"], found


@pytest.mark.docker
@pytest.mark.parametrize(("variant", "command", "style"), [
    ("bash-c", "/models/Qwen/M --served-model-name m --max-model-len 4096", "bash-c"),
    ("serve", "vllm serve /models/Qwen/M --served-model-name m --max-model-len 4096", "vllm-serve"),
])
def test_entrypoint_style_is_read_from_the_image_on_the_engine(scratch: Scratch, sim_images: dict[str, str],
                                                               variant: str, command: str, style: str) -> None:
    """The image on the engine decides, over the command's shape (each is the wrong shape here)."""
    folder = scratch.root / "h"
    folder.mkdir()
    (folder / "docker-compose.yml").write_text(yaml.safe_dump({"services": {"vllm": {
        "image": sim_images[variant], "command": command, "volumes": ["/srv/models:/models:ro"]}}}))
    result = run_cli(scratch.config, "stack", "from-compose", str(folder / "docker-compose.yml"), "--name", "s",
                     "--json", in_process=True)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["stack_doc"]["entrypoint_style"] == style
    assert out["sources"]["entrypoint_style"].startswith(f"image {sim_images[variant]} (")
    assert any("vllm serve" in n for n in out["notes"])
