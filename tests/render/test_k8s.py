"""`export k8s` (issue 38): every catalogue stack and one stack per platform as manifests, each
object valid against the official OpenAPI schemas of Kubernetes 1.37, 1.36 and 1.35 (the PyPI
package kubernetes-validate, offline, strict: no field the API does not know); the container's
argv is the compose render's, as `docker compose config` resolves it and as Kubernetes' own $(VAR)
expansion hands it to the process; no secret value in any exported file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kit.k8s import CANARY, OVERRIDE, kube_expand, switch_render, validate
from kit.scratch import MINIMAL_STACK, SHIPPED_STACKS, Scratch

from b70deploy.actions.export import ExportK8s, source_for
from b70deploy.config.node import Node, load_node
from b70deploy.config.schema import Stack
from b70deploy.errors import UserError
from b70deploy.render import k8s, production_stack
from b70deploy.render.files import COMPOSE_FILE, Rendered, render
from b70deploy.render.gpu import access_for
from b70deploy.render.standby import DEV_MODE
from b70deploy.render.vllm_args import parse_serve_args
from b70deploy.state.fsio import write_tree


def export_of(node: Node, stack: Stack, opts: k8s.Options | None = None) -> tuple[k8s.Export, Rendered]:
    rendered = switch_render(node, stack)
    src = source_for(node, rendered.files, stack.name, stack.image, stack.env, stack.gpus,
                     secret_keys=rendered.secret_keys)
    return k8s.render(src, opts or k8s.Options()), rendered


def test_kube_expand_follows_kubernetes_cases() -> None:
    env = {"VAR_A": "A", "VAR_B": "B"}
    cases = {"$$(VAR_B)_$(VAR_A)": "$(VAR_B)_A", "f000-$$VAR_A": "f000-$VAR_A", "$VAR_A": "$VAR_A",
             "$$$$$$$(VAR_A)": "$$$A", "$(VAR_DNE)": "$(VAR_DNE)", "foo$(VAR_Awhoops!": "foo$(VAR_Awhoops!",
             "$(VAR_A)foobarzab$": "Afoobarzab$", "${VAR_A}": "${VAR_A}"}
    for given, want in cases.items():
        assert kube_expand(given, env) == want
    for text in ("$(HOME)", "a$$b", "$", "x$(", CANARY):
        assert kube_expand(k8s.k8s_escape(text), {"HOME": "/root"}) == text


@pytest.fixture
def node(scratch: Scratch) -> Node:
    """The shipped catalogue on a node with a secrets file: HF_TOKEN (the canary), and a secret over
    a key of a stack's own env."""
    scratch.copy_shipped()
    secrets = scratch.root / "secrets.env"
    secrets.write_text(f"HF_TOKEN='{CANARY}'\nSTACK_KEY={OVERRIDE}\n")
    secrets.chmod(0o600)
    scratch.write_config({"secrets_env_file": str(secrets), "hf_cache": str(scratch.root / "hf")})
    return load_node(str(scratch.config))


def _deployment(export: k8s.Export) -> dict[str, Any]:
    return next(o for o in export.objects if o["kind"] == "Deployment")


def _container(export: k8s.Export) -> dict[str, Any]:
    container: dict[str, Any] = _deployment(export)["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize("name", SHIPPED_STACKS)
def test_every_catalogue_stack_is_valid_kubernetes(node: Node, name: str) -> None:
    stack = node.catalogue().load(name)
    export, rendered = export_of(node, stack, k8s.Options(namespace="llm"))
    validate(export.objects)
    kinds = [o["kind"] for o in export.objects]
    assert kinds == ["ConfigMap"] * len(stack.patches) + ["Service", "Deployment"]
    assert {o["metadata"]["namespace"] for o in export.objects} == {"llm"}
    container = _container(export)
    # the argv as Compose hands it over: ${VLLM_MODEL} from .env, nothing else changed
    model = rendered.interpolation["VLLM_MODEL"]
    assert export.args == [model if a == "${VLLM_MODEL}" else a for a in rendered.command]
    assert [kube_expand(a, {}) for a in container["args"]] == export.args
    assert container["resources"]["limits"] == {"gpu.intel.com/xe": 1}
    assert _deployment(export)["spec"]["strategy"] == {"type": "Recreate"}
    assert container["envFrom"] == [{"secretRef": {"name": export.secret_name}}]
    assert export.secret_keys == ("HF_TOKEN", "STACK_KEY")
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= \
        node.config.timeouts.health
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    service = next(o for o in export.objects if o["kind"] == "Service")
    assert service["spec"]["ports"] == [{"name": "http", "port": node.config.ports.prod, "targetPort": "http",
                                         "protocol": "TCP"}]
    for cm in export.objects[:len(stack.patches)]:  # each patched file, its bytes, over the image's file
        rel = cm["metadata"]["annotations"]["b70deploy/file"]
        [(key, text)] = cm["data"].items()
        assert text.encode() == rendered.files[rel]
        mount = next(m for m in container["volumeMounts"] if m.get("subPath") == key)
        assert mount["mountPath"] == cm["metadata"]["annotations"]["b70deploy/target"] and mount["readOnly"]
    shm = next(v for v in _deployment(export)["spec"]["template"]["spec"]["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    text = export.yaml()
    assert CANARY.encode() not in text and OVERRIDE.encode() not in text
    assert list(yaml.safe_load_all(text)) == export.objects and export_of(node, stack)[0].yaml() == \
        k8s.render(source_for(node, rendered.files, stack.name, stack.image, stack.env, stack.gpus)).yaml()


PLATFORMS: dict[str, dict[str, Any]] = {
    "cuda": {"platform": "cuda", "gpus": 2},
    "rocm": {"platform": "rocm", "gpus": ["1"]},
    "xpu": {"platform": "xpu"},
    "cpu": {"platform": "cpu"},
}


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_one_stack_per_platform(scratch: Scratch, platform: str) -> None:
    scratch.write_stack("s", {**MINIMAL_STACK, "name": "s", "env": {"VLLM_LOGGING_LEVEL": "DEBUG", "STACK_KEY": "a"}})
    secrets = scratch.root / "secrets.env"
    secrets.write_text(f"STACK_KEY={OVERRIDE}\n")
    secrets.chmod(0o600)
    scratch.write_config({**PLATFORMS[platform], "secrets_env_file": str(secrets)})
    node = load_node(str(scratch.config))
    stack = node.catalogue().load("s")
    opts = k8s.Options(intel_driver="i915") if platform == "xpu" else k8s.Options()
    export, _ = export_of(node, stack, opts)
    validate(export.objects)
    container = _container(export)
    limits = container.get("resources", {}).get("limits")
    assert limits == {"cuda": {"nvidia.com/gpu": 2}, "rocm": {"amd.com/gpu": 1}, "xpu": {"gpu.intel.com/i915": 1},
                      "cpu": None}[platform]
    strategy = _deployment(export)["spec"]["strategy"]
    assert strategy == ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
                        if platform == "cpu" else {"type": "Recreate"})
    security = container.get("securityContext", {})
    assert security.get("capabilities") == {"cpu": {"add": ["SYS_NICE"]}, "rocm": {"add": ["SYS_PTRACE"]}}.get(platform)
    assert (security.get("seccompProfile") == {"type": "Unconfined"}) == (platform in ("cpu", "rocm"))
    env = {e["name"]: e["value"] for e in container["env"]}
    # the stack's env as values; its key the node's secret overrides (as in vllm.env) only by reference
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG" and "STACK_KEY" not in env
    # rocm's selection [1] is a host id: the plugin's container sees its one device as 0
    assert "CUDA_VISIBLE_DEVICES" not in env and "ZE_AFFINITY_MASK" not in env
    assert export.secret_keys == ("STACK_KEY",) and OVERRIDE.encode() not in export.yaml()


def test_hub_model_and_claims(scratch: Scratch) -> None:
    scratch.write_stack("hub", {**MINIMAL_STACK, "name": "hub", "model": {"path": "Qwen/Qwen3-0.6B", "hub": True}})
    scratch.write_config({"hf_cache": str(scratch.root / "hf")})
    node = load_node(str(scratch.config))
    export, _ = export_of(node, node.catalogue().load("hub"), k8s.Options(hf_cache_claim="hf-cache"))
    validate(export.objects)
    pod = _deployment(export)["spec"]["template"]["spec"]
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}} in pod["volumes"]
    assert {"name": "hf-cache", "mountPath": "/root/.cache/huggingface"} in pod["containers"][0]["volumeMounts"]
    assert {"name": "HF_HOME", "value": "/root/.cache/huggingface"} in pod["containers"][0]["env"]
    assert export.args[2] == "Qwen/Qwen3-0.6B"
    scratch.write_stack("w", {**MINIMAL_STACK, "name": "w"})
    export, _ = export_of(node, node.catalogue().load("w"), k8s.Options(models_claim="weights"))
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in \
        _deployment(export)["spec"]["template"]["spec"]["volumes"]


DOLLARS = ["--chat-template-content-format", "$(HOME)$$x", "--override-generation-config", '{"a":"$b"}']


@pytest.mark.parametrize("shape", ["plain", "prelude", "vllm-serve"])
def test_args_equal_the_compose_command(scratch: Scratch, compose: Any, shape: str) -> None:
    """The Deployment's command and args, as Kubernetes expands them, are the vllm service's
    entrypoint and command as `docker compose config` resolves the rendered files."""
    doc: dict[str, Any] = {**MINIMAL_STACK, "name": "d", "extra_args": DOLLARS, "env": {"QUOTED": "it's $(HOME) $5"}}
    if shape == "prelude":
        doc["prelude"] = "export X=$HOME; echo $(date) $$"
    if shape == "vllm-serve":
        doc |= {"entrypoint_style": "vllm-serve", "launcher": ["python3", "-m", "vllm.entrypoints.openai.api_server"]}
    scratch.write_stack("d", doc)
    scratch.write_config({"platform": "cpu"})
    node = load_node(str(scratch.config))
    export, rendered = export_of(node, node.catalogue().load("d"))
    write_tree(scratch.root / "r", rendered.files)
    svc = compose(scratch.root / "r")["services"]["vllm"]
    # `config` writes a file Compose can load again: each `$` of a resolved value escaped as `$$`
    command = [a.replace("$$", "$") for a in svc["command"]]
    entrypoint = [a.replace("$$", "$") for a in svc.get("entrypoint") or []]
    container = _container(export)
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    assert [kube_expand(a, env) for a in container["args"]] == command == export.args
    assert [kube_expand(a, env) for a in container.get("command", [])] == entrypoint
    assert any("$(HOME)$$x" in a for a in command)  # the stack's dollars, as written
    # vllm.env's value (double-quoted for Compose's parser) reaches the container as the stack wrote it
    assert kube_expand(env["QUOTED"], env) == svc["environment"]["QUOTED"].replace("$$", "$") == "it's $(HOME) $5"


def test_dev_mode_is_never_exported(node: Node, scratch: Scratch) -> None:
    """A stack with standby: sleep exports without sleep mode (the Service exposes the one API
    port, where vLLM's development endpoints would answer); a render that has them is refused."""
    scratch.write_config({"door": {"enabled": True}, "standby": "sleep", "platform": "cuda"})
    node = load_node(str(scratch.config))
    done = ExportK8s(node, stack="qwen35", docker=False).plan()
    assert not any(k in done.yaml for k in (b"VLLM_SERVER_DEV_MODE", b"--enable-sleep-mode"))
    assert any("standby" in n for n in done.notes)
    stack = node.catalogue().load("qwen35")
    rendered = render(stack, node, access_for(node, stack), vllm_version="0.21.0")  # as a switch renders it
    assert DEV_MODE.keys() <= set(yaml.safe_load(rendered.files[COMPOSE_FILE])["services"]["vllm"]["environment"])
    with pytest.raises(UserError, match="development endpoints"):
        k8s.render(source_for(node, rendered.files, stack.name, stack.image, stack.env, stack.gpus))


def test_names_and_sizes() -> None:
    assert k8s.dns_label("b70-w4a16_131k.v2") == "b70-w4a16-131k-v2"
    assert k8s.dns_label("9lives") == "x-9lives"
    long = k8s.dns_label("p-" + "a" * 80)
    assert len(long) == 63 and re.fullmatch(r"[a-z][-a-z0-9]*[a-z0-9]", long)
    assert [k8s.quantity(s) for s in ("16g", "512m", "64k", "1000")] == ["16Gi", "512Mi", "64Ki", "1000"]
    values = {"A": "1", "E": ""}
    assert k8s.interpolate("$$A ${A} $A ${E:-d} ${E-d} ${U:-u} ${A:+p}", values, where="f") == "$A 1 1 d  u p"
    with pytest.raises(UserError, match="U is unset: say"):
        k8s.interpolate("${U:?say}", values, where="f")


def test_bad_options_are_one_line(node: Node) -> None:
    for opts, flag in ((k8s.Options(namespace="Bad_NS"), "--namespace"),
                       (k8s.Options(models_claim="no/slash"), "--models-claim")):
        with pytest.raises(UserError, match=flag):
            ExportK8s(node, stack="qwen35", options=opts, docker=False).plan()


def test_patched_stack_without_docker_is_refused(node: Node, tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"patch marlin-xpu-carveout.*--revision"):
        ExportK8s(node, stack="w4a16", out=tmp_path / "k", docker=False).run()
    assert not (tmp_path / "k").exists()


CHART_SCHEMA = json.loads((Path(__file__).parents[1] / "fixtures/production-stack/values.schema.json").read_text())


def chart_command(spec: dict[str, Any]) -> list[str]:
    """The container command the chart writes from one modelSpec (helm/templates/deployment-vllm-multi.yaml,
    tests/fixtures/production-stack/SOURCE.md), for the keys the export sets."""
    conf = spec["vllmConfig"]
    toggle = "--enable-prefix-caching" if conf["enablePrefixCaching"] else "--no-enable-prefix-caching"
    return ["vllm", "serve", spec["modelURL"], "--host", "0.0.0.0", "--port", "8000", toggle, *conf["extraArgs"]]


def test_production_stack_values(scratch: Scratch) -> None:
    """An NVIDIA stack on the official image as the chart's values: valid against the chart's own
    schema, and the chart's command gives vLLM the same model and flags as the compose render."""
    scratch.write_stack("o", {**MINIMAL_STACK, "name": "o", "image": "vllm/vllm-openai:v0.11.0",
                              "entrypoint_style": "vllm-serve", "prefix_caching": False, "gpus": 2,
                              "model": {"path": "Qwen/Qwen3-0.6B", "hub": True}, "env": {"VLLM_LOGGING_LEVEL": "INFO"},
                              "extra_args": ["--tensor-parallel-size", "2", "--chat-template-content-format", "$(X)"]})
    secrets = scratch.root / "secrets.env"
    secrets.write_text(f"HF_TOKEN='{CANARY}'\n")
    secrets.chmod(0o600)
    scratch.write_config({"platform": "cuda", "hf_cache": str(scratch.root / "hf"), "secrets_env_file": str(secrets)})
    node = load_node(str(scratch.config))
    done = ExportK8s(node, stack="o", docker=False, helm_values=True).plan()
    assert done.values is not None
    jsonschema.Draft202012Validator(CHART_SCHEMA).validate(done.values)
    [spec] = done.values["servingEngineSpec"]["modelSpec"]
    assert (spec["repository"], spec["tag"]) == ("vllm/vllm-openai", "v0.11.0")
    assert spec["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    assert spec["envFromSecret"] == {"name": "b70-o-secrets"} and CANARY.encode() not in done.yaml
    argv = [kube_expand(a, {}) for a in chart_command(spec)]
    ours, chart = parse_serve_args(done.export.args), parse_serve_args(argv[2:])
    assert (ours.model, ours.values, ours.extra) == (chart.model, chart.values, chart.extra)
    # The chart writes --host 0.0.0.0; a stack without host: renders none, which vLLM binds the same
    # (vLLM 0.24.0 api_server.py:540, `args.host or ""`).
    assert ours.fixed == {k: v for k, v in chart.fixed.items() if k != "--host"} and chart.fixed["--host"] == "0.0.0.0"
    assert ours.values["prefix_caching"] is False and "$(X)" in chart.extra
    engine = done.values["servingEngineSpec"]
    assert engine["startupProbe"]["failureThreshold"] * engine["startupProbe"]["periodSeconds"] >= 720
    assert engine["strategy"] == {"type": "Recreate"}
    assert yaml.safe_load(done.yaml) == done.values
    assert [production_stack.image_parts(r) for r in ("reg:5000/a/b", "a/b@sha256:" + "f" * 64)] == \
        [("reg:5000/a/b", "latest"), ("a/b@sha256", "f" * 64)]


@pytest.mark.parametrize(("stack", "config", "want"), [
    ("qwen35", {}, "entrypoint_style bash-c"),
    ("tq-256k", {}, "patched file"),
    ("cpu", {"platform": "cpu"}, "CPU and memory requests"),
])
def test_production_stack_refusals(node: Node, scratch: Scratch, stack: str, config: dict[str, Any],
                                   want: str) -> None:
    scratch.write_stack("cpu", {**MINIMAL_STACK, "name": "cpu", "entrypoint_style": "vllm-serve"})
    scratch.write_config(config)
    node = load_node(str(scratch.config))
    s = node.catalogue().load(stack)
    export, rendered = export_of(node, s)
    src = source_for(node, rendered.files, s.name, s.image, s.env, s.gpus)
    with pytest.raises(UserError, match=want):
        production_stack.values(src, export)
