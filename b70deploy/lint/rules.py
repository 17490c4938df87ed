"""The lint rules: each reads a LintContext and yields Findings. Pure: no Docker, no network;
the facts that need Docker (image, compose config, port owner) are gathered beforehand."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from ..config import hub
from ..errors import UserError
from ..render import draft as draft_mod
from ..render import standby as standby_rules
from ..render.files import COMPOSE_FILE, DOTENV_FILE, expose_only
from ..render.gpu import gpu_count
from ..render.patches import find_patch, release
from ..render.vllm_args import (
    API_KEY_ENV,
    FLAG_BY_NAME,
    Flag,
    flag_name,
    parse_serve_args,
    split_launcher,
    split_prelude,
)
from ..state import caches
from . import kv
from .findings import Finding, LintContext, Severity

Rule = Callable[[LintContext], Iterator[Finding]]
RULES: list[tuple[tuple[str, ...], Rule]] = []  # (the finding ids the rule may emit, the rule)
ALL_PLATFORMS: tuple[str, ...] = ("cuda", "rocm", "xpu", "cpu")
GPU_PLATFORMS: tuple[str, ...] = ("cuda", "rocm", "xpu")
# Finding id -> the node platforms its rule applies to (render/gpu.py); lint runs a rule only
# on a node of one of them.
PLATFORMS: dict[str, tuple[str, ...]] = {}

# The post's ngram sweep at 8K context (aggregate tok/s vs no draft); it loses past C=4.
NGRAM_SWEEP = "+24% C=1, +14% C=2, +12% C=3, +2% C=4, -45% C=12"
NGRAM_CROSSOVER = 4
MARLIN_PATCH = "marlin-xpu-carveout"
MARLIN_FILE = "/model_executor/layers/quantization/utils/marlin_utils.py"
SPEC_DRAFT_METHODS = ("eagle", "eagle3", "mtp")


def rule(*ids: str, platforms: tuple[str, ...] = ALL_PLATFORMS) -> Callable[[Rule], Rule]:
    """Register a rule under every finding id it emits (the README's lint table lists exactly
    these) and the platforms it applies to."""
    def add(fn: Rule) -> Rule:
        RULES.append((ids, fn))
        PLATFORMS.update(dict.fromkeys(ids, platforms))
        return fn
    return add


def applies(ids: tuple[str, ...], platform: str) -> bool:
    return any(platform in PLATFORMS[i] for i in ids)


def _f(ctx: LintContext, rule_id: str, severity: Severity, message: str, fix: str) -> Finding:
    return Finding(id=rule_id, severity=severity, message=message, fix=fix, stack=ctx.stack.name)


# Our own rendered compose file, not the operator's input (that goes through validation's strict
# loader): libyaml's safe loader, when PyYAML has it, reads it ten times faster.
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _compose(ctx: LintContext) -> dict[str, Any]:
    """The rendered compose file as data (rules only read it)."""
    text = ctx.rendered.files.get(COMPOSE_FILE)
    return {} if text is None else _parsed_compose(text)


@functools.lru_cache(maxsize=4)  # three rules read the same stack's file in a row
def _parsed_compose(text: bytes) -> dict[str, Any]:
    try:
        doc = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _vllm_service(ctx: LintContext, doc: dict[str, Any]) -> dict[str, Any]:
    svc = (doc.get("services") or {}).get(ctx.node.service)
    return svc if isinstance(svc, dict) else {}


def _style(ctx: LintContext) -> str:
    return ctx.image.entrypoint_style if ctx.image and ctx.image.entrypoint_style != "other" \
        else ctx.stack.entrypoint_style


def _raw_command(ctx: LintContext) -> list[str]:
    cmd = _vllm_service(ctx, ctx.compose_config or _compose(ctx)).get("command") or ctx.rendered.command
    return [str(a) for a in cmd] if isinstance(cmd, list) else str(cmd).split()


def _command(ctx: LintContext) -> list[str]:
    """The command as `vllm serve ...`: a `bash -c "PRELUDE && vllm serve ..."` script read as its serve part."""
    raw = _raw_command(ctx)
    if (ctx.stack.prelude or ctx.stack.shell) and len(raw) == 1:  # a vllm-serve image's script: under its shell
        raw = [*(ctx.stack.shell or ["bash", "-c"]), raw[0]]
    try:  # a python -m vllm.entrypoints.openai.api_server launcher reads the same flags
        return split_launcher(split_prelude(raw)[1])[1]
    except ValueError:
        return raw


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _model_config(ctx: LintContext) -> dict[str, Any] | None:
    if ctx.stack.model.hub:
        cache = ctx.node.config.hf_cache
        snap = hub.snapshot(Path(cache), ctx.stack.model.path, ctx.node.config.hf_hub_folder) if cache else None
        return None if snap is None else _read_json(snap / "config.json")
    return None if ctx.models_dir is None else _read_json(ctx.models_dir / ctx.stack.model.path / "config.json")


def _length(ctx: LintContext, cfg: dict[str, Any] | None = None) -> int | None:
    """The context length vLLM serves: the stack's max_model_len, else the model's own
    (config.json's max_position_embeddings, the key vLLM's _get_and_verify_max_len reads first
    for these models); None when neither is known."""
    if ctx.stack.max_model_len is not None:
        return ctx.stack.max_model_len
    conf = cfg if cfg is not None else _model_config(ctx)
    value = (conf or {}).get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


# ---------------------------------------------------------------- command and compose


@rule("command-bare-flags")
def command_shape(ctx: LintContext) -> Iterator[Finding]:
    cmd = _command(ctx)
    style = _style(ctx)
    src = f"image {ctx.image.ref}" if ctx.image else "the stack's entrypoint_style"
    if cmd != _raw_command(ctx) or ctx.stack.prelude:
        return  # a bash -c script names `vllm serve` itself, under either entrypoint
    if style == "bash-c" and cmd[:2] != ["vllm", "serve"]:
        yield _f(ctx, "command-bare-flags", "error",
                 f"{src} runs the command through bash -c '... exec \"$@\"' --, but the command starts with "
                 f"{' '.join(cmd[:2]) or '(nothing)'!r}: it fails with `exec: --: invalid option`",
                 "set entrypoint_style: bash-c so the command starts with `vllm serve`")
    elif style == "vllm-serve" and cmd[:1] == ["vllm"]:
        yield _f(ctx, "command-bare-flags", "error",
                 f"{src} has ENTRYPOINT [vllm, serve], but the command starts with `vllm` too "
                 "(it would run `vllm serve vllm serve ...`)",
                 "set entrypoint_style: vllm-serve so the command is the model and flags only")


_INTERP = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


@rule("model-arg-unresolved")
def model_argument(ctx: LintContext) -> Iterator[Finding]:
    fix = "write the interpolated values into the .env beside docker-compose.yml (env_file: does not feed ${VAR})"
    if ctx.compose_config is not None:
        cmd = _command(ctx)
        idx = 2 if cmd[:2] == ["vllm", "serve"] else 0
        model = parse_serve_args(cmd[idx:]).model or ""  # positional, or --model (a launcher's)
        root = ctx.node.config.models_target
        hub_id = ctx.stack.model.hub and model == ctx.stack.model.path  # vLLM resolves it in the hub cache
        if not hub_id and (not model or "$" in model or model.startswith("-") or not model.startswith(f"{root}/")):
            yield _f(ctx, "model-arg-unresolved", "error",
                     f"after `docker compose config` the model argument is {model!r}, not a path under "
                     f"{root} (the node's models_target)", fix)
        return
    # No Compose to ask: every ${VAR} in the compose file must be defined in the .env beside it.
    text = ctx.rendered.files.get(COMPOSE_FILE, b"").decode()
    defined = {ln.split("=", 1)[0].strip() for ln in ctx.rendered.files.get(DOTENV_FILE, b"").decode().splitlines()
               if "=" in ln and not ln.lstrip().startswith("#")}
    missing = sorted({v for v in _INTERP.findall(text) if v not in defined})
    if missing:
        yield _f(ctx, "model-arg-unresolved", "error",
                 f"docker-compose.yml interpolates {', '.join(missing)} but the .env beside it does not define "
                 "it: Compose would pass an empty value", fix)


@rule("compose-config")
def compose_config(ctx: LintContext) -> Iterator[Finding]:
    if ctx.compose_error:
        yield _f(ctx, "compose-config", "error", f"`docker compose config` failed: {ctx.compose_error}",
                 "correct the stack or node config value it names")


@rule("group-names", platforms=("rocm", "xpu"))
def group_names(ctx: LintContext) -> Iterator[Finding]:
    groups = [str(g) for g in _vllm_service(ctx, ctx.compose_config or _compose(ctx)).get("group_add") or []]
    for g in groups:
        if g.isdigit():
            continue
        if ctx.image is not None and g not in ctx.image.groups:
            yield _f(ctx, "group-names", "error",
                     f"group_add names {g!r}, which image {ctx.image.ref} has no entry for in /etc/group: the "
                     f"daemon fails with `Unable to find group {g}`",
                     "use the numeric gid that owns the host's /dev/dri nodes (node config gids:)")
        else:
            yield _f(ctx, "group-names", "error" if ctx.image is None else "warning",
                     f"group_add names {g!r}: Docker resolves names in the image's /etc/group, not the host's",
                     "use the numeric gid that owns the host's /dev/dri nodes (node config gids:)")


@rule("tool-parser-missing")
def tool_parser(ctx: LintContext) -> Iterator[Finding]:
    cmd = _command(ctx)
    if "--enable-auto-tool-choice" in cmd and not any(a.startswith("--tool-call-parser") for a in cmd):
        yield _f(ctx, "tool-parser-missing", "error",
                 "--enable-auto-tool-choice without --tool-call-parser: vLLM refuses to start",
                 "set tool_calling.parser: hermes (and drop the flag from extra_args)")


@rule("flag-twice")
def flag_twice(ctx: LintContext) -> Iterator[Finding]:
    """A flag a stack key renders, given again (in extra_args): vLLM's argparse keeps the last
    one, so what runs is not what the key, the boot expectations and the other rules read."""
    seen: dict[Flag, str] = {}
    for token in _command(ctx):
        name, _ = flag_name(token)
        f = FLAG_BY_NAME.get(name) if token.startswith("--") else None
        if f is None:
            continue
        if f in seen:
            where = f"the stack's {f.key}" if f.key else "the stack"
            yield _f(ctx, "flag-twice", "error",
                     f"the command has {seen[f]} and then {name} again: vLLM takes the last one, so {where} "
                     "is not what runs", f"set it with the stack key ({f.key or f.flag}) and drop {name} from "
                     "extra_args")
        seen[f] = name


@rule("production-aliases")
def production_aliases(ctx: LintContext) -> Iterator[Finding]:
    prod = ctx.node.config.production
    taken = [a for a in ctx.stack.aliases if a in prod.aliases]
    family = ctx.stack.model_family
    if not taken or family == prod.model_family:
        return
    own = ctx.stack.model_family or ctx.stack.model.path.rsplit("/", 1)[-1].lower()
    who = f"model_family {family}" if family else "no model_family"
    yield _f(ctx, "production-aliases", "warning",
             f"the stack ({who}) serves the production alias{'es' if len(taken) > 1 else ''} {', '.join(taken)} "
             f"of {prod.model_family}: clients asking for it would silently get another model",
             f"serve its own alias (served_model_names: [{own}]), or set model_family: {prod.model_family} "
             "if this is that model")


# ---------------------------------------------------------------- model, quantization, architecture


@rule("models-dir-missing", "model-missing", "draft-missing")
def model_files(ctx: LintContext) -> Iterator[Finding]:
    drafted = bool(ctx.stack.speculative and ctx.stack.speculative.model)
    if ctx.models_dir_missing is not None and (drafted or not ctx.stack.model.hub):  # a hub model binds no models_dir
        yield _f(ctx, "models-dir-missing", "error",
                 f"models_dir {ctx.models_dir_missing} does not exist on this host: the engine refuses the weights "
                 "bind (create_host_path: false), after the old stack has stopped",
                 "set models_dir (and models_target) in the node config to the host folder of the weights, or "
                 "mount that folder")
    if ctx.models_dir is None:
        return
    checks = [] if ctx.stack.model.hub else [("model", ctx.stack.model.path)]  # a hub id: hub_cache's
    if ctx.stack.speculative and ctx.stack.speculative.model:
        checks.append(("draft", ctx.stack.speculative.model))
    for what, rel in checks:
        path = ctx.models_dir / rel
        if not (path / "config.json").is_file():
            state = "has no config.json" if path.is_dir() else "does not exist"
            key = "model.path" if what == "model" else "speculative.model"
            yield _f(ctx, "model-missing" if what == "model" else "draft-missing", "error",
                     f"{what} folder {path} {state}",
                     f"download the weights there, or correct {key} (relative to models_dir {ctx.models_dir})")


@rule("hub-cache-unset", "hub-model-missing")
def hub_cache(ctx: LintContext) -> Iterator[Finding]:
    """A hub id is loaded from the node's hf_cache; there is no network to download it here."""
    if not ctx.stack.model.hub:
        return
    cache = ctx.node.config.hf_cache
    repo = ctx.stack.model.path
    if cache is None and ctx.node.config.hf_cache_volume:
        return  # a named volume: what it holds is the engine's (as the hand-made deployment had it)
    if cache is None:
        yield _f(ctx, "hub-cache-unset", "warning",
                 f"the model is the hub id {repo} and the node has no hf_cache: vLLM downloads it into the container "
                 "at every boot (or fails without a network)",
                 "set hf_cache in the node config to the host folder that is HF_HOME (it holds hub/models--ORG--NAME)")
        return
    if not ctx.node.on_this_host and not Path(cache).is_dir():
        return  # the node's files are not visible from here
    folder = ctx.node.config.hf_hub_folder
    if hub.snapshot(Path(cache), repo, folder) is None:
        yield _f(ctx, "hub-model-missing", "error",
                 f"hf_cache {cache} holds no snapshot of {repo} with a config.json "
                 f"({hub.repo_folder(Path(cache), repo, folder)}/snapshots): vLLM would try to download it",
                 f"download it there first (HF_HOME={cache} huggingface-cli download {repo}), or correct model.path")


@rule("api-key-unset")
def api_key(ctx: LintContext) -> Iterator[Finding]:
    """A stack whose vLLM asks for a key (api_key: true, the operator's --api-key) gets it as VLLM_API_KEY
    from the node's secrets_env_file: without it vLLM serves /v1 to anyone (build_app adds the check only
    for a non-empty key: vllm/entrypoints/openai/api_server.py at 0001948b)."""
    if ctx.stack.api_key and API_KEY_ENV not in ctx.rendered.secret_keys:
        yield _f(ctx, "api-key-unset", "error",
                 f"stack {ctx.stack.name} serves with an API key (api_key: true) and the node's secrets_env_file "
                 f"has no {API_KEY_ENV}: vLLM would answer /v1 without one",
                 f"put {API_KEY_ENV}=<the key> in the node's secrets_env_file (0600)")


@rule("expose-probe-unreachable")
def expose_probe(ctx: LintContext) -> Iterator[Finding]:
    """An expose-only stack is published on loopback only (render/files.expose_only): the probes
    must run on the node itself."""
    if expose_only(ctx.stack) and not ctx.node.on_this_host:
        yield _f(ctx, "expose-probe-unreachable", "error",
                 f"the stack's port is only exposed (compose: expose), so it is published on 127.0.0.1 of the "
                 f"node, which b70deploy's /health and smoke probes at {ctx.node.address} cannot reach",
                 "drop expose from compose: (the port is then published on the node's bind_address), or run "
                 "b70deploy on the node itself")


@rule("mount-missing")
def host_mounts(ctx: LintContext) -> Iterator[Finding]:
    if ctx.models_dir is None:  # the node's files are not visible from here (a remote node)
        return
    for i, m in enumerate(ctx.stack.mounts):
        if not Path(m.source).exists():
            yield _f(ctx, "mount-missing", "error",
                     f"mounts[{i}].source {m.source} does not exist: Compose would create an empty folder there "
                     f"and {m.target} would be empty in the container",
                     "create it first, or correct mounts[].source")


@rule("cache-env-overridden")
def cache_env(ctx: LintContext) -> Iterator[Finding]:
    """Warm boots set these under `environment:`, which Compose puts over `env_file:` (the
    stack's env): a stack's own value would be ignored without a word."""
    if "CACHE_DIR" not in ctx.rendered.interpolation:
        return
    ours = caches.container_env(ctx.node.config.platform)
    clash = sorted(k for k, v in ctx.stack.env.items() if k in ours and v != ours[k])
    if clash:
        yield _f(ctx, "cache-env-overridden", "warning",
                 f"env sets {', '.join(clash)}, but warm boots point it into the image's cache mount "
                 f"({caches.CONTAINER_ROOT}) and Compose's environment: wins over env_file:",
                 f"remove {', '.join(clash)} from the stack's env (to move the caches, set the node config's "
                 "cache_dir)")


@rule("marlin-carveout-missing", platforms=("xpu",))  # CUDA has Marlin
def marlin(ctx: LintContext) -> Iterator[Finding]:
    m = ctx.stack.model
    # The shipped patch, or the operator's own corrected marlin_utils.py: a patch made from it
    # (`patch from-file`, any name) or the file mounted as a hand-made compose file had it.
    targets = [*(p.target for p in ctx.patched), *(h.target for h in ctx.stack.mounts)]
    own = any(t.endswith(MARLIN_FILE) for t in targets)
    if m.quantization != "compressed-tensors" or m.architecture == "dense" \
            or MARLIN_PATCH in ctx.stack.patches or own:
        return
    version = ctx.image.vllm_version if ctx.image else None
    with contextlib.suppress(UserError):  # no shipped patch file: the rule still names the fix
        if find_patch(ctx.node.patches_dir, MARLIN_PATCH).upstream_note(version) is not None:
            return  # this vLLM routes W4A16 MoE on XPU off Marlin itself (see the patch file)
    which = f"vLLM {version}" if version else "vLLM before the upstream fix (the image's version is not known here)"
    if m.architecture is None:  # not stated: the crash is MoE's only, so say what is not known
        yield _f(ctx, "marlin-carveout-missing", "warning",
                 f"model.architecture is not set: if the model is MoE, {which} routes its compressed-tensors "
                 "(W4A16) layers on XPU to the CUDA-only Marlin kernel and EngineCore crashes",
                 f"set model.architecture (dense, moe or hybrid-moe); for an MoE model add patches: [{MARLIN_PATCH}]")
        return
    yield _f(ctx, "marlin-carveout-missing", "error",
             f"compressed-tensors (W4A16) MoE on XPU is routed to the CUDA-only Marlin kernel by {which}: "
             "EngineCore crashes with `no attribute 'gptq_marlin_repack'` after loading weights",
             f"add patches: [{MARLIN_PATCH}] to the stack")


@rule("hybrid-prefix-caching", "hybrid-not-eager")
def hybrid(ctx: LintContext) -> Iterator[Finding]:
    if ctx.stack.model.architecture != "hybrid-moe":
        return
    if ctx.stack.prefix_caching:
        yield _f(ctx, "hybrid-prefix-caching", "error",
                 "hybrid (Gated-DeltaNet) model with prefix caching: the mamba state copy crashes "
                 "(get_mamba_state_copy_func() returns None)", "set prefix_caching: false")
    if not ctx.stack.enforce_eager:
        yield _f(ctx, "hybrid-not-eager", "error",
                 "hybrid (Gated-DeltaNet) model without --enforce-eager: torch.compile hangs on the GDN layers "
                 "(20+ minutes, never serving)", "set enforce_eager: true")


@rule("gptq-bfloat16", platforms=("xpu",))  # the report's XPU GPTQ path (patches/gptq-xpu.yaml)
def gptq_dtype(ctx: LintContext) -> Iterator[Finding]:
    if ctx.stack.model.quantization != "gptq":
        return
    if ctx.stack.dtype == "bfloat16":
        yield _f(ctx, "gptq-bfloat16", "error", "GPTQ with dtype bfloat16: GPTQ rejects bfloat16",
                 "set dtype: float16")
    elif ctx.stack.dtype == "auto":
        cfg = _model_config(ctx) or {}
        if str(cfg.get("torch_dtype", "")) == "bfloat16":
            yield _f(ctx, "gptq-bfloat16", "warning",
                     "GPTQ with dtype auto and a bfloat16 checkpoint: GPTQ runs in float16 only",
                     "set dtype: float16")


@rule("eagle-draft-length")
def eagle_length(ctx: LintContext) -> Iterator[Finding]:
    spec = ctx.stack.speculative
    if spec is None or spec.method not in SPEC_DRAFT_METHODS or not spec.model or ctx.models_dir is None:
        return
    cfg = _read_json(ctx.models_dir / spec.model / "config.json")
    if cfg is None:
        return  # draft-missing reports it
    limit = draft_mod.length_limit(cfg)
    served = "the draft"
    if spec.draft_max_position_embeddings is not None:
        cfg = {**cfg, draft_mod.FIELD: spec.draft_max_position_embeddings}
        limit = draft_mod.length_limit(cfg)
        served = f"the draft copy (max_position_embeddings {spec.draft_max_position_embeddings})"
    want = _length(ctx)
    if limit is None or want is None or limit[1] >= want:
        return
    key, value = limit
    fix = (f"set speculative.draft_max_position_embeddings: {want} (b70deploy serves a copy "
           "with that one field raised), or `b70deploy draft fix`")
    if key != draft_mod.FIELD:
        fix = f"raise {key} in a copy of the draft to {want}"
    yield _f(ctx, "eagle-draft-length", "error",
             f"{served} caps {key} at {value:,}, below max_model_len {want:,}: past position "
             f"{value:,} vLLM skips drafting and acceptance falls to zero", fix)


@rule("suffix-no-arctic")
def suffix(ctx: LintContext) -> Iterator[Finding]:
    spec = ctx.stack.speculative
    if spec is None or spec.method != "suffix" or ctx.image is None:
        return
    if not ctx.image.has_package("arctic-inference"):
        yield _f(ctx, "suffix-no-arctic", "error",
                 f"suffix decoding needs arctic-inference, which image {ctx.image.ref} does not have: config "
                 "validation fails with `Arctic Inference is required for suffix decoding`",
                 "use an image with arctic-inference installed (a derived image), or another speculative.method")


@rule("ngram-concurrency")
def ngram(ctx: LintContext) -> Iterator[Finding]:
    spec = ctx.stack.speculative
    peak = ctx.node.config.peak_concurrency
    if spec is None or spec.method != "ngram" or peak is None or peak <= NGRAM_CROSSOVER:
        return
    yield _f(ctx, "ngram-concurrency", "warning",
             f"ngram at the node's peak concurrency {peak}: the post measured ngram vs no draft at 8K context "
             f"{NGRAM_SWEEP} (async scheduling off, 2048 scheduled tokens cap)",
             "drop speculative at this concurrency, or use a draft model (eagle3) for novel output")


@rule("kv-budget")
def kv_budget(ctx: LintContext) -> Iterator[Finding]:
    """Can the KV pool hold one max_model_len request (vLLM refuses to start if not)? Measured
    memory first (a previous boot of the same model, draft and image), else the node's estimate."""
    cfg = _model_config(ctx)
    if cfg is None:
        return
    spec = ctx.stack.speculative
    draft_cfg = None
    if spec and spec.model and spec.method in SPEC_DRAFT_METHODS and ctx.models_dir is not None:
        draft_cfg = _read_json(ctx.models_dir / spec.model / "config.json")
    sizes = kv.per_token_with_draft(cfg, draft_cfg, ctx.stack.kv_cache_dtype, ctx.stack.dtype)
    if sizes is None:
        return
    per_token, draft_share = sizes
    want = _length(ctx, cfg)
    if want is None:
        return
    bpt = f"{per_token:,} bytes per token" + (f", {draft_share:,} of them the draft's own KV layers"
                                              if draft_share else "")
    m = ctx.measured_kv
    fix_len = "lower max_model_len to {fit}"
    if m is not None and m.kv_cache_tokens is not None and m.kv_cache_dtype == ctx.stack.kv_cache_dtype:
        if m.kv_cache_tokens < want:
            fit = m.kv_cache_tokens // kv.XPU_BLOCK_SIZE * kv.XPU_BLOCK_SIZE
            yield _f(ctx, "kv-budget", "warning",
                     f"revision {m.revision} (same model, draft and image) measured a KV pool of "
                     f"{m.kv_cache_tokens:,} tokens: one {want:,}-token request does not fit, vLLM refuses to start",
                     fix_len.format(fit=f"{fit:,} or less") + ", or free memory (gpu_memory_utilization, no draft)")
        return
    if m is not None and m.available_kv_gib is not None:
        budget = m.available_kv_gib * kv.GIB
        source = f"the {m.available_kv_gib:.2f} GiB revision {m.revision} measured for this model, draft and image"
        verdict = "vLLM refuses to start"
    else:
        gib = ctx.node.config.kv_memory_gib
        if gib is None:
            return
        budget = gib * kv.GIB
        parts = [f"{gib} GiB declared by the node"]
        if spec and spec.model and ctx.models_dir is not None:
            weights = sum(p.stat().st_size for p in (ctx.models_dir / spec.model).glob("*")
                          if p.suffix in (".safetensors", ".bin", ".pt") and p.is_file())
            budget -= weights
            parts.append(f"less {weights / kv.GIB:.2f} GiB of draft weights")
        if ctx.stack.enforce_eager:
            budget += kv.EAGER_CREDIT_GIB * kv.GIB
            parts.append(f"plus {kv.EAGER_CREDIT_GIB} GiB for --enforce-eager")
        source = f"an estimated {budget / kv.GIB:.2f} GiB ({', '.join(parts)})"
        verdict = "vLLM's own check decides"
    blocks = -(-want // kv.XPU_BLOCK_SIZE)  # vLLM sizes a request in whole blocks
    if blocks * kv.XPU_BLOCK_SIZE * per_token <= budget:
        return
    fit = kv.fit_tokens(budget, per_token)
    yield _f(ctx, "kv-budget", "warning",
             f"one {want:,}-token request needs {kv.gib_needed(want, per_token):.2f} GiB of KV cache ({bpt}), "
             f"more than {source}: about {fit:,} tokens fit; {verdict}",
             fix_len.format(fit=f"about {fit // 1024 * 1024}") + ", use kv_cache_dtype: fp8, set enforce_eager: true, "
             "or free memory (gpu_memory_utilization, no draft)")


# Flags `vllm serve` took in 0.21.0 and no longer takes in 0.32.0: the two parsers the real lane
# builds (make_arg_parser of vllm.entrypoints.openai.cli_args in 0.21.0, of
# vllm.entrypoints.launchers.cli_args in 0.32.0), compared flag by flag. Which release between
# them dropped each is not known here, so only an image of 0.32.0 or later is told.
REMOVED_FLAGS = {"--calculate-kv-scales": "0.32.0", "--no-calculate-kv-scales": "0.32.0",
                 "--max-long-partial-prefills": "0.32.0", "--max-num-partial-prefills": "0.32.0",
                 "--override-attention-dtype": "0.32.0"}


@rule("flag-removed")
def removed_flag(ctx: LintContext) -> Iterator[Finding]:
    version = ctx.image.vllm_version if ctx.image else None
    have = release(version) if version else None
    if have is None:
        return
    for token in _command(ctx):
        name, _ = flag_name(token)
        gone = REMOVED_FLAGS.get(name) if token.startswith("--") else None
        if gone is not None and have >= (release(gone) or have):
            yield _f(ctx, "flag-removed", "error",
                     f"{name} is not a flag of vLLM {version} (0.21.0 took it, {gone} does not): "
                     "vllm serve exits 2 with `unrecognized arguments`",
                     f"drop {name} from extra_args, or pin an image of the vLLM the stack was written for")


# The TurboQuant fork's --max-num-seqs footgun (the report's "six integration fixes" post, fix 6):
# the fork reserves max_num_seqs x max_model_len of its KV up front; 4 x 262,144 left the first 8K
# prefill out of memory. Only the fork's presets size it that way: its CacheDType value is
# turboquant_k3v4_nc (stacks/tq-256k.yaml); the report writes it k3v4_nc.
TURBOQUANT_KV = ("turboquant_k3v4_nc", "k3v4_nc")


@rule("turboquant-max-num-seqs")
def turboquant_sizing(ctx: LintContext) -> Iterator[Finding]:
    s = ctx.stack
    if s.kv_cache_dtype not in TURBOQUANT_KV:
        return
    seqs = s.max_num_seqs
    pool = s.expect.min_kv_tokens
    length = _length(ctx)
    if seqs is None or pool is None or length is None or seqs * length <= pool:
        return
    fit = max(pool // length, 1)
    yield _f(ctx, "turboquant-max-num-seqs", "error",
             f"the TurboQuant fork ({s.kv_cache_dtype}) reserves max_num_seqs x max_model_len = {seqs} x "
             f"{length:,} = {seqs * length:,} tokens, more than its {pool:,}-token pool: the "
             "first prefill runs out of memory (the report's fix 6: 4 x 262,144, the first 8K prefill OOM)",
             f"set max_num_seqs: {fit} (or lower max_model_len so max_num_seqs x max_model_len <= {pool:,})")


# ---------------------------------------------------------------- gathered facts


@rule("patch-unknown", "patch-does-not-apply")
def patch_problems(ctx: LintContext) -> Iterator[Finding]:
    for name, (rule_id, message) in sorted(ctx.patch_errors.items()):
        fix = f"add patches/{name}.yaml or remove the name from the stack" if rule_id == "patch-unknown" else \
            "rewrite the edit for this image's file, pin the image the patch was written for, or drop the patch"
        yield _f(ctx, rule_id, "error", message, fix)


@rule("image-missing")
def image_problems(ctx: LintContext) -> Iterator[Finding]:
    if ctx.image_error:
        yield _f(ctx, "image-missing", "error", ctx.image_error, f"docker pull {ctx.stack.image} (or docker load it)")


@rule("port-in-use")
def port(ctx: LintContext) -> Iterator[Finding]:
    if ctx.port_owner:
        p = ctx.node.config.ports.prod
        yield _f(ctx, "port-in-use", "error", f"port {p} is already in use by {ctx.port_owner}",
                 f"stop what holds port {p}, or change ports.prod in the node config")


@rule("door-subnet-in-use")
def door_subnet(ctx: LintContext) -> Iterator[Finding]:
    if ctx.subnet_owner:
        yield _f(ctx, "door-subnet-in-use", "error", f"the front door's network to vllm: {ctx.subnet_owner}",
                 "set door.subnet in the node config to a free /29 (e.g. 198.19.7.0/29)")


@rule("gpu-access-missing", platforms=GPU_PLATFORMS)
def gpu_access(ctx: LintContext) -> Iterator[Finding]:
    """The engine or host lacks what the platform's GPU access needs (docker/platform.py): the
    switch stops here, before the old stack does."""
    for missing in ctx.gpu_missing:
        yield _f(ctx, "gpu-access-missing", "error", missing,
                 "set the node config's platform: and gpus: to what this node has (`b70deploy init` "
                 "discovers it), or install the platform's container runtime")


def _parallel(args: list[str], *flags: str) -> int:
    """The size one of `flags` asks for in an argv (1 when none does)."""
    for i, a in enumerate(args):
        for flag in flags:
            if a == flag and i + 1 < len(args) and args[i + 1].isdigit():
                return int(args[i + 1])
            if a.startswith(flag + "=") and a.split("=", 1)[1].isdigit():
                return int(a.split("=", 1)[1])
    return 1


@rule("parallel-gpu-count", platforms=GPU_PLATFORMS)
def parallel_gpus(ctx: LintContext) -> Iterator[Finding]:
    """vLLM places one worker per GPU: tensor x pipeline parallel size workers need exactly that
    many GPUs of the selection (fewer: it cannot start; more: some sit idle)."""
    gpus = ctx.stack.gpus if ctx.stack.gpus is not None else ctx.node.config.gpus
    want = gpu_count(gpus)
    if want is None:
        return
    args = _command(ctx)
    tp = _parallel(args, "--tensor-parallel-size", "-tp")
    pp = _parallel(args, "--pipeline-parallel-size", "-pp")
    if tp * pp != want:
        yield _f(ctx, "parallel-gpu-count", "error",
                 f"tensor_parallel_size {tp} x pipeline_parallel_size {pp} = {tp * pp} worker(s), but gpus selects "
                 f"{want} GPU(s)",
                 f"select {tp * pp} GPU(s) with gpus:, or set --tensor-parallel-size so that TP x PP = {want}")


@rule("cpu-kvcache-space", platforms=("cpu",))
def cpu_kvcache(ctx: LintContext) -> Iterator[Finding]:
    if "VLLM_CPU_KVCACHE_SPACE" not in ctx.stack.env:
        yield _f(ctx, "cpu-kvcache-space", "warning",
                 "VLLM_CPU_KVCACHE_SPACE is not set: vLLM's CPU docs size the KV cache with it (GiB of RAM)",
                 "set env: {VLLM_CPU_KVCACHE_SPACE: \"8\"} (GiB) to what the node can spare")


# ---------------------------------------------------------------- hot standby (render/standby.py)

# vllm/config/cache.py:66 (0.21.0): gpu_memory_utilization's default, when the stack sets none.
VLLM_UTILIZATION = 0.92


@rule("standby-cannot-sleep")
def standby_cannot_sleep(ctx: LintContext) -> Iterator[Finding]:
    """A stack that asks to sleep where its image's vLLM has no sleep mode on this platform: rendered
    without the flag (vLLM would exit at start-up), and its switch stops the live stack first."""
    version = ctx.image.vllm_version if ctx.image is not None else None
    note = standby_rules.cannot_sleep_note(ctx.stack, ctx.node, version)
    if note is None:
        return
    yield _f(ctx, "standby-cannot-sleep", "warning", note,
             "set standby: off for this stack, or run it where vLLM can sleep (CUDA, ROCm, or XPU with vLLM 0.23+)")


@rule("standby-memory", platforms=GPU_PLATFORMS)
def standby_memory(ctx: LintContext) -> Iterator[Finding]:
    """Beside a sleeping stack, this one must pass vLLM's start-up check: free memory at least
    ceil(total * gpu_memory_utilization) (vllm/v1/worker/utils.py:403-421, 0.21.0, request_memory).
    Checked where the numbers are known: the node's gpu_memory_gib and standby.keep_gib (what the
    sleeping stack keeps on the GPU)."""
    node = ctx.node.config
    total, keep = node.gpu_memory_gib, node.standby.keep_gib
    if not node.standby.sleeps or total is None or keep is None:
        return
    util = ctx.stack.gpu_memory_utilization or VLLM_UTILIZATION
    free = total - keep
    wanted = math.ceil(total * util * 2**30) / 2**30
    if free >= wanted:
        return
    most = math.floor(free / total * 100) / 100
    yield _f(ctx, "standby-memory", "error",
             f"beside a sleeping stack ({keep:g} GiB kept of {total:g}) {free:g} GiB is free, below this stack's "
             f"gpu_memory_utilization {util:g} ({wanted:.2f} GiB): vLLM's start-up check refuses it (Free memory on "
             "device ... is less than desired GPU memory utilization)",
             f"set gpu_memory_utilization: {most:g} or less, or standby: off")


@rule("standby-host-ram")
def standby_host_ram(ctx: LintContext) -> Iterator[Finding]:
    """Level 1 moves the weights to host RAM while the stack sleeps (offload_tags=("weights",),
    vllm/v1/worker/gpu_worker.py:173, 0.21.0): they must fit in what the host has available."""
    host, weights = ctx.host_available, ctx.weights_bytes
    if host is None or weights is None or weights <= host:
        return
    gib = 2**30
    yield _f(ctx, "standby-host-ram", "error",
             f"standby level 1 keeps the sleeping stack's weights in host RAM: {weights / gib:.1f} GiB of weights, "
             f"{host / gib:.1f} GiB available on this host",
             "set standby: off for this stack (level 2 drops the weights, which a wake then lacks), or free host RAM")
