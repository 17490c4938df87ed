"""One bad stack (or bad gathered fact) per lint finding: each is detected, with its fix.

Pure: the context is gathered without Docker; image facts, when a rule needs them, are
given as data (the real-engine tests gather them from the sim images).
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from b70deploy.config.node import Node
from b70deploy.config.node_cache import Settings
from b70deploy.config.schema import Door, HostMount, ModelSpec, Speculative, Standby, ToolCalling
from b70deploy.docker.image_inspect import ImageFacts
from b70deploy.docker.produce import port_owner, produce, subnet_owner
from b70deploy.lint import LintContext, lint_stack
from b70deploy.lint.gather import build_context, context
from b70deploy.lint.rules import RULES
from b70deploy.render.door import subnet
from b70deploy.render.files import COMPOSE_FILE, DOTENV_FILE

BASH_C = ImageFacts(ref="b70sim/vllm:bash-c", id="sha256:" + "1" * 64,
                    entrypoint=["/bin/bash", "-c", 'source x && exec "$@"', "--"], cmd=None,
                    entrypoint_style="bash-c", groups={"root": 0, "video": 44},
                    vllm_package_dir="/opt/venv/lib/python3.12/site-packages/vllm",
                    vllm_version="0.21.1.dev17+g0a4756bb5", packages=[], modules={"arctic_inference": False})


def _ctx(node: Node, name: str, image: ImageFacts | None = None, **update: Any) -> LintContext:
    stack = node.catalogue().load(name)
    if update:
        stack = stack.model_copy(update=update)
    ctx = context(node, stack, docker=False)
    ctx.image = image
    return ctx


def _edit_file(ctx: LintContext, name: str, fn: Callable[[str], str]) -> LintContext:
    files = dict(ctx.rendered.files)
    files[name] = fn(files[name].decode()).encode()
    ctx.rendered = dataclasses.replace(ctx.rendered, files=files)
    return ctx


def _node(node: Node, **cfg: Any) -> Node:
    config = node.config.model_copy(update=cfg)
    return dataclasses.replace(node, settings=Settings.of(config), load_config=lambda: config)


def case_bare_flags(node: Node) -> LintContext:
    return _ctx(node, "w4a16-131k", BASH_C, entrypoint_style="vllm-serve")


def case_model_arg(node: Node) -> LintContext:
    ctx = _ctx(node, "w4a16-131k")
    return _edit_file(ctx, DOTENV_FILE, lambda t: "\n".join(ln for ln in t.splitlines()
                                                            if not ln.startswith("VLLM_MODEL=")))


def case_group_names(node: Node) -> LintContext:
    ctx = _ctx(node, "w4a16-131k", BASH_C)
    return _edit_file(ctx, COMPOSE_FILE,
                      lambda t: t.replace("    ipc: host", '    group_add: ["render"]\n    ipc: host'))


def case_marlin(node: Node) -> LintContext:
    return _ctx(node, "w4a16", patches=[])


def case_eagle(node: Node) -> LintContext:
    stack = node.catalogue().load("eagle3")
    assert stack.speculative is not None
    spec = stack.speculative.model_copy(update={"draft_max_position_embeddings": None})
    return _ctx(node, "eagle3", speculative=spec)


def case_suffix(node: Node) -> LintContext:
    return _ctx(node, "tq-256k", dataclasses.replace(BASH_C, entrypoint_style="vllm-serve"))


def case_ngram(node: Node) -> LintContext:
    return _ctx(_node(node, peak_concurrency=12), "ngram")


def case_kv(node: Node) -> LintContext:
    return _ctx(_node(node, kv_memory_gib=6.0), "w4a16")


def case_production_aliases(node: Node) -> LintContext:
    # qwen35 as it first shipped: the hybrid behind the 30B's production names.
    return _ctx(node, "qwen35", served_model_names=["qwen3.5-35b-a3b", "qwen3-30b-a3b-w4a16", "qwen3-30b-tq-256k"])


def case_hybrid_prefix(node: Node) -> LintContext:
    return _ctx(node, "qwen35", prefix_caching=True)


def case_hybrid_eager(node: Node) -> LintContext:
    return _ctx(node, "qwen35", enforce_eager=False)


def case_gptq(node: Node) -> LintContext:
    return _ctx(node, "tq-256k", dtype="bfloat16")


def case_tool(node: Node) -> LintContext:
    return _ctx(node, "w4a16", tool_calling=ToolCalling(), extra_args=["--enable-auto-tool-choice"])


def case_model_missing(node: Node) -> LintContext:
    return _ctx(node, "w4a16", model=ModelSpec(path="Qwen/not-downloaded", quantization="compressed-tensors"))


def case_models_dir_missing(node: Node) -> LintContext:
    """The node's models folder is not on this host: an error before anything stops."""
    return _ctx(dataclasses.replace(node, models_dir=node.models_dir / "not-here"), "w4a16")


def _hub(node: Node, hf_cache: str | None) -> LintContext:
    """w4a16 named by a hub id, on a node whose hf_cache is `hf_cache`."""
    hub_node = dataclasses.replace(node, load_config=lambda: node.config.model_copy(update={"hf_cache": hf_cache}))
    return _ctx(hub_node, "w4a16", model=ModelSpec(path="Qwen/Qwen3-0.6B", hub=True, quantization="compressed-tensors"))


def case_hub_cache_unset(node: Node) -> LintContext:
    return _hub(node, None)


def case_hub_model_missing(node: Node) -> LintContext:
    """A hub cache that holds another model only (the hub's layout: hub/models--ORG--NAME/snapshots)."""
    cache = node.state_dir / "hf"
    (cache / "hub" / "models--Qwen--Other" / "snapshots" / "abc").mkdir(parents=True, exist_ok=True)
    (cache / "hub" / "models--Qwen--Other" / "snapshots" / "abc" / "config.json").write_text("{}")
    return _hub(node, str(cache))


def case_expose_remote(node: Node) -> LintContext:
    """An expose-only stack on a node reached at another address than loopback."""
    remote = dataclasses.replace(node, settings=dataclasses.replace(node.settings, address="192.0.2.7"))
    return _ctx(remote, "w4a16", compose={"expose": ["8000"]})


def case_api_key_unset(node: Node) -> LintContext:
    """A stack from a command with --api-key on a node whose secrets_env_file lacks VLLM_API_KEY."""
    return _ctx(node, "w4a16", api_key=True)


def case_mount_missing(node: Node) -> LintContext:
    return _ctx(node, "w4a16", mounts=[HostMount(source="/no/such/venv", target="/opt/venv")])


def case_draft_missing(node: Node) -> LintContext:
    return _ctx(node, "eagle3", speculative=Speculative(method="eagle3", model="Qwen/no-draft-here"))


def case_patch_unknown(node: Node) -> LintContext:
    return _ctx(node, "w4a16", patches=["marlin-xpu-carveout", "no-such-patch"])


def case_patch_drift(node: Node) -> LintContext:
    ctx = _ctx(node, "w4a16")
    ctx.patch_errors["marlin-xpu-carveout"] = ("patch-does-not-apply", "patch marlin-xpu-carveout: no longer applies")
    return ctx


def case_port(node: Node) -> LintContext:
    class NoContainers:
        class containers:  # mimics docker.DockerClient.containers
            @staticmethod
            def list(ignore_removed: bool = False) -> list[Any]:
                return []

    ctx = _ctx(node, "w4a16")
    with socket.socket() as s:
        s.bind((node.config.bind_address, node.config.ports.prod))
        s.listen()
        ctx.port_owner = port_owner(node, NoContainers())
    return ctx


def case_door_subnet(node: Node) -> LintContext:
    class OneNetwork:
        class networks:  # mimics docker.DockerClient.networks: an operator's network on the door's addresses
            @staticmethod
            def list() -> list[Any]:
                net = subnet(Door(enabled=True), node.project)
                return [SimpleNamespace(name="lan", attrs={"IPAM": {"Config": [{"Subnet": str(net.supernet(4))}]}})]

    door = _node(node, door=Door(enabled=True))
    ctx = _ctx(door, "w4a16")
    ctx.subnet_owner = subnet_owner(ctx.rendered, door.project, OneNetwork())
    return ctx


def case_image_missing(node: Node) -> LintContext:
    ctx = _ctx(node, "w4a16")
    ctx.image_error = "image b70sim/vllm:nope is not on this node"
    return ctx


def case_flag_twice(node: Node) -> LintContext:
    return _ctx(node, "w4a16", extra_args=["--max_model_len=4096"])


def case_compose(node: Node) -> LintContext:
    ctx = _ctx(node, "w4a16")
    ctx.compose_error = "services.vllm.ports: invalid port"
    return ctx


def case_cache_env(node: Node) -> LintContext:
    stack = node.catalogue().load("w4a16").model_copy(update={"env": {"VLLM_CACHE_ROOT": "/root/.cache/vllm"}})
    return build_context(produce(node, stack, docker=False, pin_image=BASH_C.id))  # a pinned id: caches are mounted


def case_flag_removed(node: Node) -> LintContext:
    return _ctx(node, "w4a16", dataclasses.replace(BASH_C, vllm_version="0.32.0"),
                extra_args=["--calculate-kv-scales"])


def case_turboquant(node: Node) -> LintContext:
    return _ctx(node, "tq-256k", max_num_seqs=4)


def case_gpu_access(node: Node) -> LintContext:
    ctx = _ctx(_node(node, platform="cuda"), "w4a16")
    ctx.gpu_missing = ["the engine at local engine has no nvidia runtime (docker info Runtimes: runc)"]
    return ctx


def case_parallel(node: Node) -> LintContext:
    return _ctx(node, "w4a16", gpus=2)


def case_cpu_kvcache(node: Node) -> LintContext:
    return _ctx(_node(node, platform="cpu"), "w4a16")


def case_standby_cannot_sleep(node: Node) -> LintContext:
    # vLLM 0.21 on XPU: Platform.is_sleep_mode_available() is False there (render/standby.py)
    door_node = _node(node, door=Door(enabled=True))
    return _ctx(door_node, "w4a16-131k", BASH_C, standby=Standby(mode="sleep"))


def case_standby_memory(node: Node) -> LintContext:
    door_node = _node(node, door=Door(enabled=True), standby=Standby(mode="sleep", keep_gib=4.0), gpu_memory_gib=32.0)
    return _ctx(door_node, "w4a16-131k", gpu_memory_utilization=0.9)


def case_standby_host_ram(node: Node) -> LintContext:
    door_node = _node(node, door=Door(enabled=True), standby=Standby(mode="sleep", level=1))
    ctx = _ctx(door_node, "w4a16-131k")
    ctx.host_available, ctx.weights_bytes = 8 * 2**30, 16 * 2**30  # the host's facts, given as data
    return ctx


CASES: list[tuple[str, str, Callable[[Node], LintContext], str]] = [
    ("flag-removed", "error", case_flag_removed, "drop --calculate-kv-scales"),
    ("turboquant-max-num-seqs", "error", case_turboquant, "set max_num_seqs: 1"),
    ("cache-env-overridden", "warning", case_cache_env, "remove VLLM_CACHE_ROOT"),
    ("command-bare-flags", "error", case_bare_flags, "entrypoint_style: bash-c"),
    ("model-arg-unresolved", "error", case_model_arg, ".env"),
    ("group-names", "error", case_group_names, "numeric gid"),
    ("marlin-carveout-missing", "error", case_marlin, "patches: [marlin-xpu-carveout]"),
    ("eagle-draft-length", "error", case_eagle, "draft_max_position_embeddings: 262144"),
    ("suffix-no-arctic", "error", case_suffix, "arctic-inference"),
    ("ngram-concurrency", "warning", case_ngram, "drop speculative"),
    ("kv-budget", "warning", case_kv, "lower max_model_len to about 131072"),
    ("production-aliases", "warning", case_production_aliases, "served_model_names: [qwen3.5-35b-a3b]"),
    ("hybrid-prefix-caching", "error", case_hybrid_prefix, "prefix_caching: false"),
    ("hybrid-not-eager", "error", case_hybrid_eager, "enforce_eager: true"),
    ("gptq-bfloat16", "error", case_gptq, "dtype: float16"),
    ("tool-parser-missing", "error", case_tool, "tool_calling.parser: hermes"),
    ("flag-twice", "error", case_flag_twice, "(max_model_len)"),
    ("models-dir-missing", "error", case_models_dir_missing, "models_dir (and models_target)"),
    ("model-missing", "error", case_model_missing, "model.path"),
    ("draft-missing", "error", case_draft_missing, "speculative.model"),
    ("mount-missing", "error", case_mount_missing, "mounts[].source"),
    ("hub-cache-unset", "warning", case_hub_cache_unset, "set hf_cache"),
    ("expose-probe-unreachable", "error", case_expose_remote, "drop expose from compose:"),
    ("api-key-unset", "error", case_api_key_unset, "VLLM_API_KEY=<the key>"),
    ("hub-model-missing", "error", case_hub_model_missing, "huggingface-cli download Qwen/Qwen3-0.6B"),
    ("patch-unknown", "error", case_patch_unknown, "patches/no-such-patch.yaml"),
    ("patch-does-not-apply", "error", case_patch_drift, "rewrite the edit"),
    ("port-in-use", "error", case_port, "ports.prod"),
    ("door-subnet-in-use", "error", case_door_subnet, "door.subnet"),
    ("image-missing", "error", case_image_missing, "docker pull"),
    ("compose-config", "error", case_compose, "correct"),
    ("gpu-access-missing", "error", case_gpu_access, "platform:"),
    ("parallel-gpu-count", "error", case_parallel, "TP x PP = 2"),
    ("cpu-kvcache-space", "warning", case_cpu_kvcache, "VLLM_CPU_KVCACHE_SPACE"),
    ("standby-cannot-sleep", "warning", case_standby_cannot_sleep, "set standby: off"),
    ("standby-memory", "error", case_standby_memory, "set gpu_memory_utilization: 0.87 or less"),
    ("standby-host-ram", "error", case_standby_host_ram, "set standby: off"),
]


@pytest.mark.parametrize(("rule_id", "severity", "make", "fix"), CASES, ids=[c[0] for c in CASES])
def test_each_finding(node: Node, rule_id: str, severity: str, make: Callable[[Node], LintContext],
                      fix: str) -> None:
    findings = lint_stack(make(node))
    hits = [f for f in findings if f.id == rule_id]
    assert hits, f"{rule_id} not found in {[f.id for f in findings]}"
    assert hits[0].severity == severity and fix in hits[0].fix and hits[0].message
    for f in findings:  # one line, one fix: a message never carries a fix of its own
        assert "\n" not in f.one_line() and f.one_line().count("fix: ") == 1, f.one_line()
    # The bad value is the only problem: nothing else is reported as an error.
    others = [f for f in findings if f.severity == "error" and f.id != rule_id]
    assert not others, others


def test_every_rule_has_a_case() -> None:
    ids = {c[0] for c in CASES}
    # Each finding id a rule declares has a case that makes it fire, and no case fires an undeclared id.
    assert {rid for rids, _ in RULES for rid in rids} == ids


def test_catalogue_is_clean_without_docker(node: Node) -> None:
    for name in node.catalogue().names():
        ctx = context(node, node.catalogue().load(name), docker=False)
        assert lint_stack(ctx) == [], name


def test_group_name_present_in_image_is_a_warning(node: Node) -> None:
    ctx = _edit_file(_ctx(node, "w4a16-131k", BASH_C), COMPOSE_FILE,
                     lambda t: t.replace("    ipc: host", '    group_add: ["video"]\n    ipc: host'))
    [f] = [f for f in lint_stack(ctx) if f.id == "group-names"]
    assert f.severity == "warning"


def test_stack_with_fixed_draft_is_clean(node: Node) -> None:
    assert not [f for f in lint_stack(_ctx(node, "eagle3")) if f.id == "eagle-draft-length"]


def test_bash_c_stack_on_serve_image(node: Node) -> None:
    ctx = _ctx(node, "w4a16-131k", dataclasses.replace(BASH_C, entrypoint_style="vllm-serve"))
    [f] = [f for f in lint_stack(ctx) if f.id == "command-bare-flags"]
    assert "vllm serve vllm serve" in f.message and "entrypoint_style: vllm-serve" in f.fix



def test_a_stack_that_does_not_load_is_one_finding_with_its_fix_once(node: Node) -> None:
    from b70deploy.lint.gather import lint_stacks

    [finding], skipped = lint_stacks(node, ["no-such-stack"], docker=False)["no-such-stack"]
    assert finding.id == "stack-invalid" and finding.severity == "error" and not skipped
    assert finding.fix.startswith("use one of: ") and "fix:" not in finding.message
    assert finding.one_line().count("; fix: ") == 1


def test_production_aliases_belong_to_the_production_family(node: Node) -> None:
    [f] = [f for f in lint_stack(case_production_aliases(node)) if f.id == "production-aliases"]
    assert "qwen3-30b-a3b-w4a16, qwen3-30b-tq-256k of qwen3-30b-a3b" in f.message and "silently" in f.message
    # No family declared: it may not take them either; its own alias is suggested.
    [f] = [f for f in lint_stack(_ctx(node, "qwen36", model_family=None,
                                      served_model_names=["qwen3-30b-tq-256k"])) if f.id == "production-aliases"]
    assert "no model_family" in f.message and "production alias qwen3-30b-tq-256k" in f.message
    assert "served_model_names: [qwen3.6-35b-a3b-ct-int4]" in f.fix
    # The shipped hybrids serve their own alias; every 30B stack may serve the production ones.
    for name in ("qwen35", "qwen36", "w4a16", "eagle3", "tq-256k"):
        assert not [f for f in lint_stack(_ctx(node, name)) if f.id == "production-aliases"], name
    # The node decides which family owns which names.
    other = _node(node, production=node.config.production.model_copy(update={"model_family": "qwen3.5-35b-a3b"}))
    assert [f.id for f in lint_stack(_ctx(other, "w4a16")) if f.id == "production-aliases"] == ["production-aliases"]
    assert not [f for f in lint_stack(_ctx(other, "qwen35")) if f.id == "production-aliases"]


def test_an_own_corrected_marlin_utils_counts_as_the_carveout(node: Node) -> None:
    """A patch made by `patch from-file` (any name) or the corrected file mounted as the hand-made
    compose file had it (`stack from-compose` keeps it as a mount) fixes what the rule is about."""
    from b70deploy.render.patches import PatchedFile

    target = "/opt/venv/lib/python3.12/site-packages/vllm/model_executor/layers/quantization/utils/marlin_utils.py"
    mounted = _ctx(node, "w4a16", patches=[], mounts=[HostMount(source="/srv/p/marlin_utils.py", target=target)])
    patched = _ctx(node, "w4a16", patches=["marlin-mine"])
    patched.patched = [PatchedFile(patch="marlin-mine", target=target, data=b"", original_sha256="0", sha256="1",
                                   image_id="sha256:1")]
    elsewhere = _ctx(node, "w4a16", patches=[], mounts=[HostMount(source="/srv/p/x.py", target="/opt/x.py")])
    ids = [[f.id for f in lint_stack(c)] for c in (mounted, patched, elsewhere)]
    assert "marlin-carveout-missing" not in ids[0] + ids[1] and "marlin-carveout-missing" in ids[2]


def test_a_stack_that_never_set_architecture_is_not_linted_as_moe(node: Node) -> None:
    """Issue 39: the schema's default (moe) fed lint and `show` for a stack without the key. Unset, the
    MoE-only Marlin crash is a warning that asks for the key; hybrid's rules do not fire; dense is quiet."""
    def model(architecture: str | None) -> ModelSpec:
        stack = node.catalogue().load("w4a16")
        return stack.model.model_copy(update={"architecture": architecture})

    unset, dense, moe = (lint_stack(_ctx(node, "w4a16", patches=[], model=model(a))) for a in (None, "dense", "moe"))
    assert [(f.severity, f.fix) for f in unset if f.id == "marlin-carveout-missing"] == [
        ("warning", "set model.architecture (dense, moe or hybrid-moe); for an MoE model add patches: "
                    "[marlin-xpu-carveout]")]
    assert not [f for f in dense if f.id == "marlin-carveout-missing"]
    assert [f.severity for f in moe if f.id == "marlin-carveout-missing"] == ["error"]
    loose = ModelSpec.model_validate({"path": "Qwen/Qwen3-8B", "quantization": "compressed-tensors"})
    assert loose.architecture is None
    hybrid_rules = {"hybrid-prefix-caching", "hybrid-not-eager"}
    unset_eager = lint_stack(_ctx(node, "w4a16", model=model(None), prefix_caching=True, enforce_eager=False))
    assert not hybrid_rules & {f.id for f in unset_eager}
