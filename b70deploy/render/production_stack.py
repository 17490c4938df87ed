"""A Kubernetes export (render/k8s.py) as values for vLLM production-stack's Helm chart (pure).

The chart (vllm-project/production-stack helm/, vllm-stack 0.1.12; what it does with each value is
in tests/fixtures/production-stack/SOURCE.md) writes the container's command itself: `vllm serve
<modelURL> --host 0.0.0.0 --port <containerPort>`, a prefix-caching toggle, then
`vllmConfig.extraArgs`. So the export's flags go into extraArgs, minus the host, port and toggle the
chart writes: the same flags reach vLLM, not in the same order (argparse reads them the same;
tests/render/test_k8s.py reads both with render/vllm_args.py). What the chart cannot run as the
compose render does is refused in one line: an image whose entrypoint is not `vllm serve` (the
chart's command replaces it: intel/vllm's sources oneAPI's setvars.sh first), a stack's own
launcher or shell, patched files, and a CPU stack (the chart then requires CPU and memory
requests a stack does not state).
"""

from __future__ import annotations

from typing import Any

from ..errors import UserError
from .k8s import Export, Source, k8s_escape

CHART = "vLLM production-stack's chart"
TOGGLES = ("--enable-prefix-caching", "--no-enable-prefix-caching")
FIX = "export the plain manifests (without --helm-values)"


def image_parts(ref: str) -> tuple[str, str]:
    """(repository, tag) for the chart's `repository:tag`; a digest pin is kept whole
    (repository `name@sha256`, tag the hex: the chart joins them with `:`)."""
    if "@" in ref:
        name, digest = ref.split("@", 1)
        algo, _, hexd = digest.partition(":")
        return f"{name}@{algo}", hexd
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    return (ref[:colon], ref[colon + 1:]) if colon > slash else (ref, "latest")


def _without(flags: list[str], pair: tuple[str, str]) -> list[str]:
    for i in range(len(flags) - 1):
        if (flags[i], flags[i + 1]) == pair:
            return flags[:i] + flags[i + 2:]
    return flags


def values(src: Source, export: Export) -> dict[str, Any]:
    """The chart's values for one model: servingEngineSpec with one modelSpec."""
    where = f"stack {src.stack}"
    if export.command is not None:
        raise UserError(f"{CHART} runs `vllm serve` as the container's command; this stack runs "
                        f"{export.command[0]} (its launcher or shell)", where=where, fix=FIX)
    if export.args[:2] == ["vllm", "serve"]:
        raise UserError(f"{CHART} replaces the image's entrypoint with `vllm serve`, and this stack's image "
                        "has its own (entrypoint_style bash-c)", where=where,
                        fix=f"use an image whose entrypoint is vllm serve, or {FIX}")
    if any(o["kind"] == "ConfigMap" for o in export.objects):
        raise UserError(f"{CHART} has no ConfigMap of its own for a patched file", where=where, fix=FIX)
    if src.platform == "cpu":
        raise UserError(f"{CHART} requires CPU and memory requests, which a stack does not state", where=where,
                        fix=FIX)
    deployment = next(o for o in export.objects if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    port = int(container["ports"][0]["containerPort"])
    args = list(export.args)
    if args[:1] == ["--model"]:  # the launcher's form, also read by `vllm serve`
        args = args[1:]
    if not args or args[0].startswith("-"):
        raise UserError(f"{CHART} passes the model first; this command starts with {args[:1] or 'nothing'}",
                        where=where, fix=FIX)
    model, flags = args[0], args[1:]
    flags = _without(_without(flags, ("--host", "0.0.0.0")), ("--port", str(port)))
    toggle = next((i for i, f in enumerate(flags) if f in TOGGLES), None)  # a render always writes one
    if toggle is None:
        raise UserError(f"{CHART} always writes a prefix-caching flag, and this command has none (vLLM's own "
                        "default would change)", where=where, fix="set the stack's prefix_caching, or " + FIX)
    prefix = flags.pop(toggle) == TOGGLES[0]
    repository, tag = image_parts(src.image)
    spec: dict[str, Any] = {
        "name": src.name, "repository": repository, "tag": tag, "modelURL": k8s_escape(model), "replicaCount": 1,
        "vllmConfig": {"enablePrefixCaching": prefix, "extraArgs": [k8s_escape(f) for f in flags]},
        "resources": container["resources"],
    }
    if container.get("env"):
        spec["env"] = container["env"]
    if export.secret_name:
        spec["envFromSecret"] = {"name": export.secret_name}
    spec["extraVolumes"] = pod["volumes"]
    spec["extraVolumeMounts"] = container["volumeMounts"]
    spec["podAnnotations"] = deployment["spec"]["template"]["metadata"]["annotations"]
    probe = {"httpGet": {"path": "/health", "port": port}}
    engine: dict[str, Any] = {
        "containerPort": port,
        "strategy": deployment["spec"]["strategy"],
        "startupProbe": {**probe, **{k: container["startupProbe"][k] for k in ("periodSeconds", "failureThreshold")}},
        "readinessProbe": {**probe, **{k: container["readinessProbe"][k] for k in ("periodSeconds",
                                                                                   "failureThreshold")}},
    }
    if container.get("securityContext"):
        engine["containerSecurityContext"] = container["securityContext"]
    if pod.get("securityContext"):
        engine["securityContext"] = pod["securityContext"]
    engine["modelSpec"] = [spec]
    return {"servingEngineSpec": engine}
