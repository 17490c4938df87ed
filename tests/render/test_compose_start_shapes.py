"""Every way operators start vLLM, read the one way (render/from_compose, vllm_args; issue 33 items
1-3): pure, no engine. tests/adopt/test_compose_start.py brings the same shapes up on the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from b70deploy.config.schema import Stack
from b70deploy.docker.discover import _runs_vllm
from b70deploy.errors import UserError
from b70deploy.render.from_compose import serve_arguments, stack_from_compose
from b70deploy.render.vllm_args import container_command, split_prelude

API_SERVER = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
CLI_MAIN = ["python3", "-m", "vllm.entrypoints.cli.main", "serve"]


@dataclass
class Image:
    """What from_compose reads of an image (docker/image_inspect.ImageFacts)."""

    ref: str
    entrypoint: list[str] | None
    entrypoint_style: str
    cmd: list[str] | None = None
    id: str = "sha256:" + "1" * 64
    groups: dict[str, int] = field(default_factory=dict)


# vllm-project/vllm docker/Dockerfile, the vllm-openai stage, at 0000977e and at dead20ba.
OLD_OPENAI = Image("vllm/vllm-openai:v0.9.0", API_SERVER, "other")
NEW_OPENAI = Image("vllm/vllm-openai:v0.11.0", ["vllm", "serve"], "vllm-serve")


def bind(source: str, target: str, read_only: bool = False) -> dict[str, Any]:
    return {"type": "bind", "source": source, "target": target, "read_only": read_only}


def test_vllm_serve_with_the_model_and_flags_in_the_entrypoint_and_no_command() -> None:
    """naptha-node's node/compose-files/vllm-models/*.yml (c45e4ce3): `entrypoint: [vllm, serve, MODEL, ...]`."""
    svc = {"image": NEW_OPENAI.ref, "volumes": [bind("/srv/hf", "/root/.cache/huggingface")],
           "entrypoint": ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--enable-prefix-caching",
                          "--enable-chunked-prefill", "--max-model-len", "32768", "--tool-call-parser", "hermes"]}
    for image in (NEW_OPENAI, None):
        out = stack_from_compose(svc, image=image)
        assert out.doc["model"] == {"path": "Qwen/Qwen2.5-7B-Instruct", "hub": True}
        assert out.doc["entrypoint_style"] == "vllm-serve" and out.doc["max_model_len"] == 32768
        assert out.doc["extra_args"] == ["--enable-chunked-prefill"] and not out.notes
    assert serve_arguments(svc, NEW_OPENAI) is not None


def test_flags_under_the_images_python_m_entrypoint_need_no_name_nor_length() -> None:
    """The old vllm-openai image: ENTRYPOINT python3 -m ...api_server, the service writes flags only."""
    svc = {"image": OLD_OPENAI.ref, "command": ["--model", "Qwen/Qwen3-0.6B", "--port", "4997"],
           "volumes": [bind("/srv/hf", "/root/.cache/huggingface")],
           "ports": [{"target": 4997, "published": "18000", "host_ip": "127.0.0.1"},
                     {"target": 9400, "published": "19400"}],
           "healthcheck": {"test": ["CMD", "curl", "-f", "http://localhost:4997/health"]}}
    out = stack_from_compose(svc, image=OLD_OPENAI)
    doc = out.doc
    assert doc["launcher"] == API_SERVER and doc["model"] == {"path": "Qwen/Qwen3-0.6B", "hub": True}
    assert "served_model_names" not in doc and "max_model_len" not in doc   # vLLM requires neither
    assert doc["prefix_caching"] == "default" and doc["container_port"] == 4997
    assert doc["extra_ports"] == ["19400:9400"] and doc["compose"]["healthcheck"] == svc["healthcheck"]
    assert out.node["ports"] == {"prod": 18000} and out.node["hf_cache"] == "/srv/hf"
    stack = Stack.model_validate({"name": "s", **doc})
    assert stack.aliases == [] and stack.prefix_caching       # vLLM's default is on
    argv = container_command(stack, model="Qwen/Qwen3-0.6B")
    assert argv == ["--model", "Qwen/Qwen3-0.6B", "--port", "4997"]  # nothing added: no --host it never had


def test_the_images_cmd_is_the_command_when_the_service_writes_none() -> None:
    image = Image("vllm/vllm-openai:v0.11.0", ["vllm", "serve"], "vllm-serve", cmd=["Qwen/Qwen3-0.6B"])
    svc = {"image": image.ref, "volumes": [bind("/srv/hf", "/root/.cache/huggingface")]}
    assert stack_from_compose(svc, image=image).doc["model"]["path"] == "Qwen/Qwen3-0.6B"
    # Its own entrypoint drops the image's CMD (Docker's rule): then there is nothing to read.
    with pytest.raises(UserError, match="no command"):
        stack_from_compose({**svc, "entrypoint": ["vllm", "serve"]}, image=image)


def test_python_m_cli_main_serve_is_the_launcher_it_was() -> None:
    svc = {"image": NEW_OPENAI.ref, "entrypoint": CLI_MAIN, "command": ["Qwen/Qwen3-0.6B", "--max-model-len", "4096"]}
    doc = stack_from_compose(svc, image=NEW_OPENAI).doc
    assert doc["launcher"] == CLI_MAIN and doc["max_model_len"] == 4096
    stack = Stack.model_validate({"name": "s", **doc})
    # the cli's serve takes the model positionally, as `vllm serve` does
    assert container_command(stack, model="Qwen/Qwen3-0.6B")[:1] == ["Qwen/Qwen3-0.6B"]


OPEA = ("export VLLM_CPU_KVCACHE_SPACE=40 && python3 -m vllm.entrypoints.openai.api_server --enforce-eager "
        "--model /data/Qwen/Qwen3-0.6B --tensor-parallel-size 1 --host 0.0.0.0 --port 80 --block-size 128")


def test_opea_prelude_then_python_m_on_port_80() -> None:
    """opea-project/GenAIExamples ChatQnA/docker_compose/intel/hpu/gaudi/compose_vllm.yaml at 3fb60608."""
    svc = {"image": "opea/llm-vllm-hpu:latest", "command": ["/bin/bash", "-c", OPEA],
           "volumes": [bind("/srv/data", "/data")], "ports": [{"target": 80, "published": "8007"}]}
    out = stack_from_compose(svc)
    doc = out.doc
    assert doc["prelude"] == "export VLLM_CPU_KVCACHE_SPACE=40" and doc["launcher"] == API_SERVER
    assert doc["container_port"] == 80 and out.node["ports"] == {"prod": 8007}
    stack = Stack.model_validate({"name": "s", **doc})
    [shell, flag, script] = container_command(stack, model="/data/Qwen/Qwen3-0.6B")
    assert [shell, flag] == ["/bin/bash", "-c"]
    assert script.startswith("export VLLM_CPU_KVCACHE_SPACE=40 && exec python3 -m vllm.entrypoints.openai.api_server "
                             "--model /data/Qwen/Qwen3-0.6B ")
    assert "--port 80" in script and doc["host"] == "0.0.0.0" and "--host 0.0.0.0" in script  # the operator's, kept


def test_host_is_rendered_only_where_the_operator_or_stack_has_it() -> None:
    """vLLM without --host binds every IPv4 interface (vLLM 0.24.0 api_server.py:540, `args.host or ""`),
    as --host 0.0.0.0 does: a stack that never said renders none; a loopback host, which the published
    port cannot reach, is left out with a note."""
    base = {"image": "vllm/vllm-openai:v0.24.0", "entrypoint": ["vllm", "serve"],
            "volumes": [bind("/srv/models", "/models")]}
    for host, kept in (("0.0.0.0", "0.0.0.0"), ("::", "::"), (None, None), ("127.0.0.1", None)):
        flags = [] if host is None else ["--host", host]
        out = stack_from_compose({**base, "command": ["/models/m", *flags]})
        assert out.doc.get("host") == kept, host
        assert any("--host 127.0.0.1 is left out" in n for n in out.notes) == (host == "127.0.0.1")
        argv = container_command(Stack.model_validate({"name": "s", **out.doc}), model="/models/m")
        assert (argv[argv.index("--host") + 1] if "--host" in argv else None) == kept
    with pytest.raises(ValueError, match=r"host .a b. is not an address"):
        Stack.model_validate({"name": "s", **out.doc, "host": "a b"})


SCRIPT = "set -e\nexport A=1\nln -sf /cache/hub /tmp/hub\nexec vllm serve Qwen/Qwen3-0.6B \\\n  --max-model-len 4096\n"


def test_an_inline_script_in_entrypoint_and_command_keeps_its_lines() -> None:
    svc = {"image": NEW_OPENAI.ref, "entrypoint": ["/bin/bash", "-c"], "command": [SCRIPT],
           "environment": {"HF_HUB_CACHE": "/cache/hub"}, "volumes": [bind("/srv/cache", "/cache")]}
    out = stack_from_compose(svc, image=NEW_OPENAI)
    doc = out.doc
    assert doc["prelude"] == "set -e\nexport A=1\nln -sf /cache/hub /tmp/hub\n" and doc["shell"] == ["/bin/bash", "-c"]
    assert doc["env"] == {"HF_HUB_CACHE": "/cache/hub"}        # the operator's variable, as written
    assert out.node == {"hf_cache": "/srv/cache", "hf_cache_target": "/cache"}
    stack = Stack.model_validate({"name": "s", **doc})
    [script] = container_command(stack, model="Qwen/Qwen3-0.6B")   # the entrypoint is the shell again
    assert script.startswith("set -e\nexport A=1\nln -sf /cache/hub /tmp/hub\nexec vllm serve Qwen/Qwen3-0.6B ")
    assert serve_arguments({**svc, "command": [script]}, NEW_OPENAI) is not None


@pytest.mark.parametrize(("volumes", "node"), [
    ([bind("/srv/cache", "/cache")],
     {"hf_cache": "/srv/cache", "hf_cache_target": "/cache", "hf_hub_folder": "models"}),
    ([bind("/srv/models", "/cache/models")],
     {"hf_cache": "/srv/models", "hf_cache_target": "/cache/models", "hf_hub_folder": "."}),
])
def test_a_hub_folder_not_named_hub_is_taken_as_bound(volumes: list[dict[str, Any]], node: dict[str, Any]) -> None:
    """huggingface_hub reads HF_HUB_CACHE as the hub folder whatever its name (constants.py; config/hub.py):
    the bind that holds it is hf_cache as written, the hub folder's path below it hf_hub_folder."""
    svc = {"image": NEW_OPENAI.ref, "command": ["Qwen/Qwen3-0.6B"], "environment": {"HF_HUB_CACHE": "/cache/models"},
           "volumes": volumes}
    out = stack_from_compose(svc, image=NEW_OPENAI)
    assert out.doc["model"] == {"path": "Qwen/Qwen3-0.6B", "hub": True} and out.node == node
    assert out.doc["env"] == {"HF_HUB_CACHE": "/cache/models"}  # the operator's variable, as written


@pytest.mark.parametrize(("script", "says"), [
    ("vllm serve m --max-model-len 8\necho done", "goes on after the server"),
    ("cd /x; vllm serve $MODEL", "expansion"),
])
def test_a_script_that_is_not_served_the_same_way_is_one_line(script: str, says: str) -> None:
    with pytest.raises(UserError) as e:
        stack_from_compose({"image": "i:1", "entrypoint": ["bash", "-c"], "command": [script]})
    assert says in e.value.what and "\n" not in str(e.value)


def test_a_separator_before_the_server_is_kept() -> None:
    assert split_prelude(["sh", "-c", "ulimit -n 65536; vllm serve m"]) == ("ulimit -n 65536;", ["vllm", "serve", "m"])


@pytest.mark.parametrize(("env", "target", "cache", "cache_target"), [
    ({}, "/root/.cache/huggingface", "/h", None),
    ({"HF_HOME": "/hf"}, "/hf", "/h", "/hf"),
    ({"HF_HUB_CACHE": "/c/hub"}, "/c", "/h", "/c"),
    ({"HUGGINGFACE_HUB_CACHE": "/c/hub"}, "/c", "/h", "/c"),     # the hub client's legacy name
    ({"HF_HOME": "/data/hf"}, "/data", "/h/hf", "/data/hf"),     # a bind above HF_HOME
])
def test_the_hub_cache_is_found_where_the_environment_puts_it(env: dict[str, str], target: str, cache: str,
                                                              cache_target: str | None) -> None:
    svc = {"image": "vllm/vllm-openai:v0.11.0", "command": ["Qwen/Qwen3-0.6B"], "environment": env,
           "volumes": [bind("/h", target)]}
    out = stack_from_compose(svc, image=NEW_OPENAI)
    assert out.doc["model"] == {"path": "Qwen/Qwen3-0.6B", "hub": True} and "models_dir" not in out.node
    assert out.node.get("hf_cache") == cache and out.node.get("hf_cache_target") == cache_target


def test_a_name_the_hub_client_never_reads_is_said() -> None:
    svc = {"image": "i:1", "command": ["vllm", "serve", "Qwen/Qwen3-0.6B"],
           "environment": {"HUGGING_FACE_HUB_CACHE": "/c/hub"}, "volumes": [bind("/h", "/root/.cache/huggingface")]}
    out = stack_from_compose(svc)
    assert out.node["hf_cache"] == "/h" and any("HUGGINGFACE_HUB_CACHE" in n for n in out.notes)


def test_a_hub_cache_in_a_named_volume_is_refused_naming_the_key() -> None:
    svc = {"image": "i:1", "command": ["vllm", "serve", "Qwen/Qwen3-0.6B"], "environment": {"HF_HUB_CACHE": "/c"},
           "volumes": [{"type": "volume", "source": "hf", "target": "/c"}]}
    with pytest.raises(UserError) as e:
        stack_from_compose(svc, where="f.yml: services.vllm")
    assert str(e.value).startswith("f.yml: services.vllm.volumes: ") and "bind a host folder" in str(e.value)


def test_a_read_write_bind_stays_read_write() -> None:
    svc = {"image": "i:1", "command": ["vllm", "serve", "/models/m"],
           "volumes": [bind("/srv/models", "/models", True), bind("/srv/cache", "/root/.cache/vllm")]}
    doc = stack_from_compose(svc).doc
    assert doc["mounts"] == [{"source": "/srv/cache", "target": "/root/.cache/vllm", "read_only": False}]


def test_a_port_that_is_no_number_is_refused() -> None:
    with pytest.raises(UserError, match="--port 'http'"):
        stack_from_compose({"image": "i:1", "command": ["vllm", "serve", "Qwen/Qwen3-0.6B", "--port", "http"]})


@pytest.mark.parametrize(("command", "runs"), [
    ("python3 -m vllm.entrypoints.openai.api_server --model x", True),
    ("/usr/bin/python3 -m vllm.entrypoints.cli.main serve x", True),
    ('/bin/bash -c "export A=1 && exec vllm serve m"', True),
    ("vllm serve --model x", True),
    ("/bin/bash /scripts/start.sh", False),
    ("caddy run", False),
])
def test_init_sees_vllm_however_the_container_starts_it(command: str, runs: bool) -> None:
    assert _runs_vllm(command) is runs
