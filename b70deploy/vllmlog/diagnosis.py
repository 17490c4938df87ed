"""Fatal boot-log signatures, each with the fix, and stall detection while a stack boots.

Pure: lines in, a Diagnosis out. The catalogue covers every fatal line the post and the
vLLM facts list. Specific signatures rank before generic ones ("Engine core initialization
failed" is printed after, and "EngineCore failed to start" before, the real cause), and
within a rank the earliest line wins.

The line a diagnosis quotes is the exception the process died with: a signature that hits a
traceback's code line (`    raise HFValidationError(`) quotes that traceback's
`ExceptionType: message` line instead, and a chained traceback ("During handling of the above
exception, another exception occurred:") is followed to its last exception (vLLM 0.21's
missing model: `OSError: Can't load the configuration of ...`). Process prefixes
(`(APIServer pid=1) `) and vLLM's `ERROR 11-30 05:19:16 [file.py:N] ` are looked through.
A worker's death reaches the engine as `Worker failed with error '<cause>'`; the cause is the
diagnosis's `root_cause`, whole even when it runs over several lines (0.32's CppCompileError
carries the compiler's command and output up to `', please check the stack trace above ...`).
The diagnosis's `quote` is the exception whole: those continuation lines, or pydantic's indented
lines under a `ValidationError: N validation error(s) for XConfig` (the `Value error, ...` that
names the cause).

A catalogue fix reads without the stack; when the stack the log came from is known (the
switch, `diagnose REV`, `diagnose --stack`), `for_stack` checks the fix against it: the
Marlin carve-out is offered only to a compressed-tensors MoE stack that lacks it, the draft
is offered as KV relief only when there is one, a setting the stack already has is never
advised again, and a flag that is not in extra_args is traced to the stack setting instead.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config.schema import Stack

SPECIFIC = 0
CAUSE = 1      # names the root cause's text, but not a known one (a worker's error message)
GENERIC = 2
ROUND_TO = 1024
MARLIN_PATCH = "marlin-xpu-carveout"  # the shipped patch for compressed-tensors MoE on XPU


@dataclass(frozen=True)
class Diagnosis:
    id: str
    title: str
    line: str                # the log line that matched (or a summary for a stall)
    fix: str
    line_number: int | None = None  # 1-based, None for a stall
    data: dict[str, Any] = field(default_factory=dict)  # machine-readable parts of the fix
    quote: str = ""          # the exception whole, prefixes off, one line per line it spans

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def one_line(self) -> str:
        return f"{self.title} [{self.id}]; fix: {self.fix}"


FixFn = Callable[[re.Match[str], Sequence[str]], tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class Signature:
    id: str
    title: str
    pattern: re.Pattern[str]
    fix: str | FixFn
    rank: int = SPECIFIC
    platforms: tuple[str, ...] = ()  # the node platforms whose logs carry it (empty: every one)

    def make(self, m: re.Match[str], line: str, number: int, lines: Sequence[str], quote: str = "") -> Diagnosis:
        if callable(self.fix):
            text, data = self.fix(m, lines)
        else:
            text, data = self.fix, {}
        return Diagnosis(id=self.id, title=self.title, line=line.strip(), fix=text, line_number=number, data=data,
                         quote=quote or log_body(line).strip())


def suggest_max_model_len(estimate: int) -> tuple[int, str]:
    """A --max-model-len that fits: the estimate rounded down to a multiple of 1024, and why."""
    if estimate >= ROUND_TO:
        rounded = estimate // ROUND_TO * ROUND_TO
        how = "the estimate rounded down to a multiple of 1024" if rounded != estimate else \
            "the estimate, already a multiple of 1024"
        return rounded, how
    return estimate, "the estimate itself (below 1024)"


def _kv_relief(stack: Stack | None) -> str:
    """Ways to free memory for KV: raise gpu_memory_utilization, an fp8 KV cache unless the stack
    has one, and the draft only when the stack has one (unknown stack: "if any")."""
    ways = ["raise gpu_memory_utilization"]
    if stack is None or not stack.kv_cache_dtype.startswith("fp8"):
        ways.append("use an fp8 KV cache (kv_cache_dtype: fp8)")
    if stack is None:
        ways.append("drop the draft model, if any")
    elif stack.speculative is not None and stack.speculative.model is not None:
        ways.append(f"drop the draft model ({stack.speculative.model})")
    return ", ".join(ways[:-1]) + " or " + ways[-1] if len(ways) > 1 else ways[0]


def _kv_too_small_text(data: dict[str, Any], stack: Stack | None) -> str:
    if "suggested_max_model_len" not in data:
        return f"lower max_model_len, or free memory for KV: {_kv_relief(stack)}"
    suggested, estimate = data["suggested_max_model_len"], data["estimated_max_model_len"]
    _, how = suggest_max_model_len(estimate)
    return (f"set max_model_len: {suggested} ({how}; vLLM estimated {estimate}), or free memory for KV: "
            f"{_kv_relief(stack)}")


def _kv_too_small_fix(m: re.Match[str], lines: Sequence[str]) -> tuple[str, dict[str, Any]]:
    text = " ".join(lines)
    est = re.search(r"estimated maximum model length is (\d+)", text)
    want = re.search(r"max seq len \((\d+)\)", text)
    need = re.search(r"\(([\d.]+) GiB KV cache is needed", text)
    have = re.search(r"available KV cache memory \(([\d.]+) GiB\)", text)
    data: dict[str, Any] = {}
    if want:
        data["max_model_len"] = int(want.group(1))
    if need and have:
        data["kv_needed_gib"], data["kv_available_gib"] = float(need.group(1)), float(have.group(1))
    if est is not None:
        estimate = int(est.group(1))
        data.update(estimated_max_model_len=estimate, suggested_max_model_len=suggest_max_model_len(estimate)[0])
    return _kv_too_small_text(data, None), data


def _cpu_attention_fix(m: re.Match[str], lines: Sequence[str]) -> tuple[str, dict[str, Any]]:
    head = re.search(r"head_dim=(\d+)", m.string)
    data: dict[str, Any] = {"head_dim": int(head.group(1))} if head else {}
    which = f" (head_dim={head.group(1)})" if head else ""
    return (f"vLLM's CPU attention kernels have no kernel for this model's head size{which}; the engine "
            "dies on the first request after /health said 200. Serve the model on a GPU node, or use a model "
            "whose head_dim the CPU backend supports", data)


# vllm/v1/executor/multiproc_executor.py (get_response): f"Worker failed with error '{e}', please check
# the stack trace above for the root cause"; matched on the exception's whole text, so a cause that
# spans lines is kept whole.
_WORKER_FAILED = re.compile(r"Worker failed with error '(.*?)\n?'?(?:, please check the stack trace above for the "
                            r"root cause)?\Z", re.DOTALL)
_WORKER_OPEN = re.compile(r"Worker failed with error '")
_WORKER_CLOSE = re.compile(r"'(?:, please check the stack trace above for the root cause)?$")


def one_line(text: str) -> str:
    """A multi-line quote on one line: its non-empty lines joined by ' / '."""
    return " / ".join(ln.strip() for ln in text.splitlines() if ln.strip())


def _worker_fix(m: re.Match[str], lines: Sequence[str]) -> tuple[str, dict[str, Any]]:
    cause = m.group(1)
    return (f"a worker died with: {one_line(cause)}; the worker's traceback above says where. Fix that cause, or "
            "roll back if it repeats", {"root_cause": cause})


# pydantic's report under `ValidationError: 1 validation error for ModelConfig`: a `Value error, <the
# ValueError vLLM raised> [type=value_error, input_value=..., input_type=...]` line per error.
_VALUE_ERROR = re.compile(r"^\s*(?:Value error|Assertion failed), (.*?)(?: \[type=[\w.]+.*)?$", re.MULTILINE)
_CONFIG_INVALID = re.compile(r"ValidationError: (\d+) validation errors? for (\w+)")
# vllm/config/model.py (0.21 :508, 0.32 :657): raise ValueError("Sleep mode is not supported on current
# platform.") when current_platform.is_sleep_mode_available() is False.
_SLEEP_MODE = "Sleep mode is not supported on current platform."
# vllm/config/model.py (_get_and_verify_max_len): f"User-specified max_model_len ({max_model_len}) is greater
# than the derived max_model_len ({max_len_key}={derived_max_model_len} or model_max_length=...".
_LONG_LEN = re.compile(r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len "
                       r"\((\w+)=([\d.]+)")


def _config_fix(m: re.Match[str], lines: Sequence[str]) -> tuple[str, dict[str, Any]]:
    errors = [e.strip() for e in _VALUE_ERROR.findall(m.string)]
    config = m.group(2)
    data: dict[str, Any] = {"config": config, "value_errors": errors}
    said = "; ".join(f"Value error, {e}" for e in errors) or "(no value error quoted)"
    if _SLEEP_MODE in errors:
        return (f"vLLM's {config} refused the configuration: {said}: remove --enable-sleep-mode (extra_args): this "
                "platform has no sleep mode", {**data, "flag": "--enable-sleep-mode"})
    long = next((x for x in map(_LONG_LEN.search, errors) if x is not None), None)
    if long is not None:
        derived = int(float(long.group(3)))
        return (f"vLLM's {config} refused the configuration: {said}: set max_model_len: {derived} or less "
                f"(the model's {long.group(2)})", {**data, "max_model_len": int(long.group(1)),
                                                   "derived_max_model_len": derived})
    return (f"vLLM's {config} refused the configuration: {said}: correct the setting it names (the stack key or "
            "extra_args flag that renders it)", data)


def _group_fix(m: re.Match[str], lines: Sequence[str]) -> tuple[str, dict[str, Any]]:
    name = m.group(1)
    return (f"the image's /etc/group has no {name!r}: use the numeric gid that owns /dev/dri "
            f"(b70deploy renders numeric group_add; set gids: {{{name}: <gid>}} in the node config)",
            {"group": name})


# The two Battlemage crash signatures the field report checked every boot for (it saw neither).
# vllm-project/vllm#27408, "vLLM crashes with SIGABRT on Intel Arc B-series (Battlemage) GPUs during
# model inspection": the compute runtime aborts in drm_neo.cpp inside the registry's inspection
# subprocess (registry._run_in_subprocess re-raises it as "Error raised in subprocess:" + its stderr).
BMG_SIGABRT_ISSUE = "vLLM #27408 (SIGABRT on Intel Arc B-series GPUs during model inspection)"
# vllm-project/vllm#41663, "XPU TP=2 on dual Intel Arc Pro B70 (Battlemage): GP fault + xe BCS engine
# reset": a `VLLM::Worker` general protection fault, then xe BCS engine resets, with TP=2 (kernel
# log lines: arch/x86/kernel/traps.c "%s[%d] general protection fault ip:.. sp:.. error:..", and
# drivers/gpu/drm/xe/xe_guc_submit.c "Engine reset: engine_class=%s, logical_mask: 0x%x, guc_id=%d").
BMG_GP_FAULT_ISSUE = "vLLM #41663 (TP=2 on dual Arc Pro B70: GP fault + xe BCS engine reset)"
_BMG_DRIVER_FIX = ("update the host's xe driver (kernel) and GuC firmware and the image's compute runtime "
                   "(libze-intel-gpu, intel-opencl-icd), then retry; roll back meanwhile")


def _worker_died_fix(m: re.Match[str], lines: Sequence[str]) -> tuple[str, dict[str, Any]]:
    return (f"the worker {m.group(1)} died without a Python error, a native crash: check the host's kernel "
            "log (`dmesg`, `journalctl -k`) for `general protection fault` and `Engine reset: engine_class=bcs` "
            f"({BMG_GP_FAULT_ISSUE}); roll back if it repeats", {"worker": m.group(1)})


CATALOGUE: tuple[Signature, ...] = (
    Signature("bare-flags-bash-c", "the bash -c entrypoint exec'd a bare flag",
              # bash's $0 is the trailing "--": a bare model path fails as "--: line 1: /models/...".
              re.compile(r"exec: -[-\w]*: invalid option|"
                         r"^--: line \d+: \S+: (?:No such file or directory|command not found|Permission denied)"),
              "the image's entrypoint is bash -c '... exec \"$@\"' --: the command must start with `vllm serve` "
              "(set entrypoint_style: bash-c in the stack)"),
    Signature("group-name-missing", "group_add names a group the image does not have",
              re.compile(r"Unable to find group ([\w.-]+)"), _group_fix),
    Signature("marlin-on-xpu", "quantized weights were routed to the CUDA-only Marlin kernel",
              re.compile(r"has no attribute '(?:gptq_marlin_repack|\w*marlin\w*)'"),
              f"for a compressed-tensors (W4A16) MoE stack, add patches: [{MARLIN_PATCH}] "
              "(check_moe_marlin_supports_layer must exclude XPU); for any other stack, make model.quantization "
              "and model.architecture say what the model's config.json says, then `b70deploy lint` names the fix",
              platforms=("xpu",)),
    Signature("arctic-inference-missing", "suffix decoding needs the arctic-inference package",
              re.compile(r"Arctic Inference is required for suffix decoding"),
              "use an image with arctic-inference installed (a derived image: pip install arctic-inference), "
              "or change speculative.method"),
    Signature("kv-too-small", "the KV cache cannot hold one max_model_len request",
              re.compile(r"To serve at least one request with the models?'s? max seq len|"
                         r"estimated maximum model length is \d+"), _kv_too_small_fix),
    Signature("kv-no-memory", "no memory left for the KV cache",
              re.compile(r"No available memory for the cache blocks"),
              "the weights leave no room for KV: raise gpu_memory_utilization, drop the draft model if any, or use "
              "a smaller quantization"),
    Signature("mamba-state-copy", "hybrid model with prefix caching: the mamba state copy crashed",
              re.compile(r"get_mamba_state_copy_func|object of type 'NoneType' has no len\(\)"),
              "set prefix_caching: false for hybrid (Gated-DeltaNet) models"),
    Signature("gptq-bfloat16", "GPTQ rejects bfloat16",
              re.compile(r"bfloat16 is not supported for quantization method gptq|"
                         r"gptq\b.*does not support .*bfloat16", re.IGNORECASE),
              "set dtype: float16 (GPTQ runs in float16 only)"),
    Signature("gpu-out-of-memory", "the GPU ran out of memory",
              re.compile(r"(?:XPU|CUDA|GPU) out of memory|OutOfMemoryError|OUT_OF_DEVICE_MEMORY", re.IGNORECASE),
              "lower gpu_memory_utilization, max_num_seqs or max_num_batched_tokens, or stop other GPU users"),
    Signature("level-zero-error", "a Level-Zero / Unified Runtime error from the GPU driver",
              re.compile(r"\b(?:UR_RESULT_ERROR_\w+|ZE_RESULT_ERROR_\w+|PI_ERROR_\w+)|"
                         r"level.?zero\b.*\berror|\bUR error\b", re.IGNORECASE),
              "a driver or device fault, not the stack: check dmesg and the GPU (xpu-smi), then retry; "
              "roll back if it repeats", platforms=("xpu",)),
    Signature("bmg-inspect-sigabrt", f"the GPU runtime aborted (SIGABRT): {BMG_SIGABRT_ISSUE}",
              re.compile(r"models\.registry'\]' died with <Signals\.SIGABRT: 6>|"
                         r"Abort was called at \d+ line in file|[/\w.-]*drm_neo\.cpp\b"),
              f"a Battlemage driver/runtime fault, not the stack ({BMG_SIGABRT_ISSUE}): {_BMG_DRIVER_FIX}",
              platforms=("xpu",)),
    Signature("bmg-tp2-gp-fault", f"a worker hit a general protection fault: {BMG_GP_FAULT_ISSUE}",
              re.compile(r"VLLM::Worker\S*\[\d+\] general protection fault|"
                         r"Engine reset: engine_class=bcs\b"),
              f"serve on one GPU (tensor parallel size 1): TP=2 on dual B70 reproduces {BMG_GP_FAULT_ISSUE}; "
              f"or {_BMG_DRIVER_FIX}", platforms=("xpu",)),
    Signature("cpu-attention-unsupported", "the CPU attention backend does not support this model",
              # vLLM's CPU build, a head_dim its kernels lack: boots, answers /health, dies on the first request.
              re.compile(r"Unsupported CPU attention configuration"), _cpu_attention_fix),
    Signature("model-not-found", "the model folder is missing or not a model",
              re.compile(r"does not appear to have a file named config\.json|Can't load the configuration of|"
                         r"Invalid repository ID or local directory|HFValidationError|"
                         r"No such file or directory: '/models/"),
              "check model.path (and speculative.model) below the node's models_dir; `b70deploy lint` checks it"),
    Signature("config-invalid", "vLLM's config validation refused a setting (the value error is quoted)",
              _CONFIG_INVALID, _config_fix),
    Signature("bad-cli-argument", "vllm serve rejected an argument",
              re.compile(r"error: (?:unrecognized arguments|argument --[\w-]+)"),
              "remove or correct the flag (extra_args in the stack); `vllm serve --help` in the image lists them"),
    Signature("tool-parser-missing", "auto tool choice without a tool-call parser",
              re.compile(r"--enable-auto-tool-choice.*requires.*--tool-call-parser|"
                         r"tool[_ -]call[_ -]parser.*(?:required|must be set)", re.IGNORECASE),
              "set tool_calling.parser: hermes (or auto_tool_choice: false)"),
    Signature("worker-failed", "a worker process raised an error (the cause is quoted)",
              _WORKER_FAILED, _worker_fix, rank=CAUSE),
    # vllm/v1/executor/multiproc_executor.py: logger.error("Worker proc %s died unexpectedly, shutting
    # down executor.", proc_name): the worker vanished (a signal), so no Python traceback names a cause.
    Signature("worker-died", "a worker process died without an error (a native crash)",
              re.compile(r"Worker proc (\S+) died unexpectedly"), _worker_died_fix, rank=CAUSE),
    Signature("engine-init-failed", "the engine core failed to start (cause above it in the log)",
              re.compile(r"Engine core initialization failed|EngineCore failed to start"),
              "read the first error above this line; run `b70deploy diagnose --log FILE` on the full log",
              rank=GENERIC),
    Signature("engine-dead", "the engine died after start",
              re.compile(r"EngineDeadError|Engine core .*(?:died|dead)|EngineCore encountered a fatal error|"
                         r"engine (?:is )?dead", re.IGNORECASE),
              "the engine process exited (see the error before it); if it repeats, roll back",
              rank=GENERIC),
)

_ANY = re.compile("|".join(f"(?:{s.pattern.pattern})" for s in CATALOGUE), re.IGNORECASE)


def is_fatal(line: str) -> bool:
    """Cheap per-line check for a streaming log: does this line carry a known fatal signature?"""
    return _ANY.search(line) is not None


def diagnose(lines: Sequence[str], stack: Stack | None = None, platform: str | None = None) -> Diagnosis | None:
    """The most specific fatal signature in `lines` (earliest line within a rank), or None.
    It quotes the exception the process died with (see the module docstring); given the
    stack the log came from, the fix is checked against it (`for_stack`); given the node's
    platform, only its signatures count (an XPU runtime's crash is no NVIDIA node's)."""
    best: tuple[int, int] | None = None
    found: tuple[Signature, re.Match[str], int] | None = None
    for i, line in enumerate(lines):
        if not is_fatal(line):
            continue
        for sig in CATALOGUE:
            if platform is not None and sig.platforms and platform not in sig.platforms:
                continue
            m = sig.pattern.search(line)
            if m is None:
                continue
            key = (sig.rank, i)
            if best is None or key < best:
                best, found = key, (sig, m, i)
            break
    if found is None:
        return None
    sig, m, i = found
    q = exception_line_index(lines, i)
    quote = exception_text(lines, q)
    d = sig.make(sig.pattern.search(quote) or m, lines[q], q + 1, lines, quote)
    if "root_cause" not in d.data:
        cause = next((w.group(1) for k, ln in enumerate(lines) if _WORKER_OPEN.search(ln)
                      if (w := _WORKER_FAILED.search(exception_text(lines, k))) is not None), None)
        if cause is not None:
            d = dataclasses.replace(d, data={**d.data, "root_cause": cause})
    return for_stack(d, stack)


# `(EngineCore pid=27) ` and/or `ERROR 11-30 05:19:16 [core.py:1142] `; the space after `]` only,
# so a traceback's indentation stays.
_LOG_PREFIX = re.compile(r"^(?:\([\w.-]+ pid=\d+\) )?"
                         r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
                         r"\[[\w./-]+:\d+\] ?)?")
# `RuntimeError: ...`, `vllm.v1.engine.exceptions.EngineDeadError: ...`, `torch.OutOfMemoryError: ...`
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning): \S")
_CHAINED = re.compile(r"^(?:During handling of the above exception, another exception occurred|"
                      r"The above exception was the direct cause of the following exception):")
_SCAN = 500  # lines a traceback may run on


def log_body(line: str) -> str:
    """The line without the process and vLLM logger prefixes (indentation kept)."""
    return _LOG_PREFIX.sub("", line.rstrip("\n"), count=1)


def _next_exception(lines: Sequence[str], start: int) -> int | None:
    return next((k for k in range(start, min(len(lines), start + _SCAN)) if _EXCEPTION.match(log_body(lines[k]))),
                None)


def exception_line_index(lines: Sequence[str], i: int) -> int:
    """The index of the line to quote for a hit at `i`: the `ExceptionType: message` line of the
    traceback `i` is in (a hit on a code line or a `Traceback` header moves to it), followed
    through chained tracebacks to the last exception; a plain log line quotes itself."""
    body = log_body(lines[i])
    j = i
    if not _EXCEPTION.match(body):
        if not (body[:1].isspace() or body.startswith("Traceback (most recent call last)")):
            return i
        first = _next_exception(lines, i + 1)
        if first is None:
            return i
        j = first
    while True:
        k = j + 1
        while k < len(lines) and not log_body(lines[k]).strip():
            k += 1
        if k >= len(lines) or not _CHAINED.match(log_body(lines[k])):
            return j
        nxt = _next_exception(lines, k + 1)
        if nxt is None:
            return j
        j = nxt


def exception_text(lines: Sequence[str], j: int) -> str:
    """The exception at `j` whole, prefixes off: the lines after it with the same prefix that
    continue it (inside a `Worker failed with error '...'` quote that is still open, or
    pydantic's indented lines), joined by newlines."""
    first = lines[j].rstrip("\n")
    body = log_body(first)
    prefix = first[:len(first) - len(body)]
    parts = [body.strip()]
    open_quote = _WORKER_OPEN.search(body) is not None and not _WORKER_CLOSE.search(body)
    for k in range(j + 1, min(len(lines), j + _SCAN)):
        line = lines[k].rstrip("\n")
        b = log_body(line)
        if line[:len(line) - len(b)] != prefix:
            break
        if open_quote:
            parts.append(b)
            if _WORKER_CLOSE.search(b):
                break
        elif b[:1].isspace() and b.strip():
            parts.append(b)
        else:
            break
    return "\n".join(parts)


# ---------------------------------------------------------------- the stack it explains

StackFix = Callable[[Diagnosis, "Stack"], "tuple[str, dict[str, Any]] | None"]


def _marlin_for(d: Diagnosis, stack: Stack) -> tuple[str, dict[str, Any]] | None:
    m = stack.model
    q, arch = m.quantization, m.architecture
    data: dict[str, Any] = {"quantization": q, "architecture": arch}
    if q == "compressed-tensors" and arch != "dense":
        if MARLIN_PATCH not in stack.patches:
            return (f"add patches: [{MARLIN_PATCH}] to the stack (check_moe_marlin_supports_layer must exclude "
                    "XPU)", {**data, "patch": MARLIN_PATCH})
        return (f"the stack already lists {MARLIN_PATCH}, yet vLLM took the Marlin path: the patched "
                "marlin_utils.py is not the one this image imports; `b70deploy lint "
                f"{stack.name}` checks the edit against the image (rewrite it for this vLLM, or pin the image "
                "it was written for)", data)
    if q in ("gptq", "awq"):
        return (f"vLLM chose {q}'s Marlin kernel, which XPU lacks; the {MARLIN_PATCH} patch covers "
                f"compressed-tensors MoE only, not {q}: ask for the plain kernel with extra_args: "
                f"[--quantization, {q}]", data)
    if q == "compressed-tensors":  # dense
        return (f"a dense compressed-tensors model reached the Marlin kernel, which XPU lacks; the {MARLIN_PATCH} "
                "patch covers MoE layers only: use an image whose vLLM has an XPU kernel for this "
                "quantization, or other weights", data)
    return (f"the stack says model.quantization: {q} ({arch or 'architecture not set'}), yet only quantized "
            "weights reach Marlin: the "
            f"config.json under model.path ({m.path}) states a quantization the stack does not; make "
            "model.quantization and model.architecture match it, then `b70deploy lint "
            f"{stack.name}` says whether a patch is needed", data)


def _bash_c_for(d: Diagnosis, stack: Stack) -> tuple[str, dict[str, Any]] | None:
    if stack.entrypoint_style != "bash-c":
        return None
    return ("the stack already sets entrypoint_style: bash-c (its command starts with `vllm serve`): the image's "
            "entrypoint is not the bash -c wrapper it expects, or extra_args holds a stray value; check "
            f"`docker inspect {stack.image}` and `b70deploy render {stack.name}`", {})


def _arctic_for(d: Diagnosis, stack: Stack) -> tuple[str, dict[str, Any]] | None:
    if stack.speculative is not None and stack.speculative.method == "suffix":
        return None
    return ("use an image with arctic-inference installed (a derived image: pip install arctic-inference), or "
            "remove the suffix --speculative-config from extra_args (the stack's speculative.method is "
            f"{stack.speculative.method if stack.speculative else 'not set'})", {})


def _kv_too_small_for(d: Diagnosis, stack: Stack) -> tuple[str, dict[str, Any]] | None:
    return _kv_too_small_text(d.data, stack), {}


def _kv_no_memory_for(d: Diagnosis, stack: Stack) -> tuple[str, dict[str, Any]] | None:
    return f"the weights leave no room for KV: {_kv_relief(stack)}, or use a smaller quantization", {}


def _mamba_for(d: Diagnosis, stack: Stack) -> tuple[str, dict[str, Any]] | None:
    if not stack.prefix_caching:
        return ("the stack already sets prefix_caching: false, so the mamba state copy failed some other way: "
                "check extra_args for --enable-prefix-caching, else roll back and report the log", {})
    if stack.model.architecture != "hybrid-moe":
        said = f"says model.architecture: {stack.model.architecture}" if stack.model.architecture \
            else "does not set model.architecture"
        return (f"the model has mamba (Gated-DeltaNet) layers, but the stack {said}: set model.architecture: "
                "hybrid-moe and prefix_caching: false", {})
    return None


def _gptq_bf16_for(d: Diagnosis, stack: Stack) -> tuple[str, dict[str, Any]] | None:
    if stack.dtype != "float16":
        return None
    return ("the stack already sets dtype: float16: a --dtype in extra_args overrides it; remove that", {})


def _model_missing_for(d: Diagnosis, stack: Stack) -> tuple[str, dict[str, Any]] | None:
    paths = f"model.path ({stack.model.path})"
    if stack.speculative is not None and stack.speculative.model is not None:
        paths += f" and speculative.model ({stack.speculative.model})"
    return f"check {paths} below the node's models_dir; `b70deploy lint {stack.name}` checks it", {}


def _flag_for(d: Diagnosis, stack: Stack) -> tuple[str, dict[str, Any]] | None:
    flags = re.findall(r"--[\w-]+", d.line)
    flag = flags[-1] if flags else None
    if flag is not None and any(a == flag or a.startswith(flag + "=") for a in stack.extra_args):
        return f"remove or correct {flag} in the stack's extra_args; `vllm serve --help` in the image lists them", \
            {"flag": flag}
    which = flag or "the flag"
    return (f"{which} is not in extra_args: a stack setting renders it and this image's vLLM does not take it "
            f"(`b70deploy render {stack.name}` shows the command): drop that setting or use an image whose vLLM "
            "knows the flag", {"flag": flag} if flag else {})


def _tool_parser_for(d: Diagnosis, stack: Stack) -> tuple[str, dict[str, Any]] | None:
    if not any(a.startswith("--enable-auto-tool-choice") for a in stack.extra_args):
        return None
    return ("extra_args passes --enable-auto-tool-choice without a parser: remove it and set tool_calling: "
            "{parser: hermes, auto_tool_choice: true}", {})


def _compile_stall_for(d: Diagnosis, stack: Stack) -> tuple[str, dict[str, Any]] | None:
    if not stack.enforce_eager:
        return None
    return ("the stack already sets enforce_eager: true, so the model's graph is not being compiled: raise the "
            "node's timeouts.stall if this step is slow, else check the container (docker top, GPU activity) "
            "and roll back", {})


def _tensor_parallel(stack: Stack) -> int:
    """The tensor parallel size extra_args asks for (1 when it does not)."""
    args = stack.extra_args
    for i, a in enumerate(args):
        for flag in ("--tensor-parallel-size", "-tp"):
            if a == flag and i + 1 < len(args) and args[i + 1].isdigit():
                return int(args[i + 1])
            if a.startswith(flag + "=") and a.split("=", 1)[1].isdigit():
                return int(a.split("=", 1)[1])
    return 1


def _gp_fault_for(d: Diagnosis, stack: Stack) -> tuple[str, dict[str, Any]] | None:
    tp = _tensor_parallel(stack)
    if tp > 1:
        return (f"remove --tensor-parallel-size {tp} from extra_args and serve on one GPU: TP={tp} on dual B70 "
                f"reproduces {BMG_GP_FAULT_ISSUE}; or {_BMG_DRIVER_FIX}", {"tensor_parallel_size": tp})
    return (f"the stack already serves on one GPU (no --tensor-parallel-size), so this is not the TP=2 path of "
            f"{BMG_GP_FAULT_ISSUE}: {_BMG_DRIVER_FIX}", {"tensor_parallel_size": 1})


def _worker_died_for(d: Diagnosis, stack: Stack) -> tuple[str, dict[str, Any]] | None:
    tp = _tensor_parallel(stack)
    if tp < 2:
        return None
    return (f"{d.fix}; with --tensor-parallel-size {tp} on dual Battlemage this is most likely "
            f"{BMG_GP_FAULT_ISSUE}: serve on one GPU", {"tensor_parallel_size": tp})


_FOR_STACK: dict[str, StackFix] = {
    "marlin-on-xpu": _marlin_for, "bare-flags-bash-c": _bash_c_for, "arctic-inference-missing": _arctic_for,
    "kv-too-small": _kv_too_small_for, "kv-no-memory": _kv_no_memory_for, "mamba-state-copy": _mamba_for,
    "gptq-bfloat16": _gptq_bf16_for, "model-not-found": _model_missing_for, "bad-cli-argument": _flag_for,
    "tool-parser-missing": _tool_parser_for, "compile-stall": _compile_stall_for,
    "bmg-tp2-gp-fault": _gp_fault_for, "worker-died": _worker_died_for,
}


def for_stack(d: Diagnosis | None, stack: Stack | None) -> Diagnosis | None:
    """`d` with its fix checked against the stack whose log it read (None: unknown, `d` as is).
    Signatures whose fix holds for any stack (a driver fault, a worker's quoted cause) keep it."""
    if d is None or stack is None:
        return d
    check = _FOR_STACK.get(d.id)
    fix, data = (check(d, stack) if check is not None else None) or (d.fix, {})
    return dataclasses.replace(d, fix=fix, data={**d.data, **data, "stack": stack.name})


# ---------------------------------------------------------------- stalls

COMPILE_STALL = "compile-stall"
LOG_STALL = "log-stall"
_COMPILE_START = re.compile(r"torch\.compile|Dynamo bytecode transform|Compiling a graph|compile range|"
                            r"Capturing (?:CUDA |XPU )?graphs?|graph capturing", re.IGNORECASE)
_COMPILE_END = re.compile(r"torch\.compile (?:took|takes)|Compilation finished|Graph capturing finished|"
                          r"init engine .* took|KV cache size:", re.IGNORECASE)


class StallWatch:
    """Notices when the log goes quiet: during torch.compile after `compile_seconds`, at any
    other point of the boot after `quiet_seconds` (None: never). Feed it lines with the time
    they arrived; ask `check(now)` between polls. Times are monotonic seconds."""

    def __init__(self, compile_seconds: float, *, quiet_seconds: float | None = None, start: float = 0.0) -> None:
        self.compile_seconds = compile_seconds
        self.quiet_seconds = quiet_seconds
        self.last_time = start
        self.last_line = ""
        self.compiling = False

    def feed(self, line: str, now: float) -> None:
        self.last_time = now
        self.last_line = line.strip()
        if _COMPILE_END.search(line):
            self.compiling = False
        elif _COMPILE_START.search(line):
            self.compiling = True

    def feed_all(self, lines: Iterable[str], now: float) -> None:
        for line in lines:
            self.feed(line, now)

    def check(self, now: float) -> Diagnosis | None:
        quiet = now - self.last_time
        last = self.last_line or "(no log line yet)"
        if self.compiling and quiet >= self.compile_seconds:
            return Diagnosis(
                id=COMPILE_STALL, title=f"torch.compile made no progress for {quiet:.0f} s",
                line=last,
                fix="set enforce_eager: true (torch.compile hangs on some layers, e.g. the post's Gated-DeltaNet "
                    "hybrids), or raise the node's timeouts.stall if this model compiles slowly",
                data={"quiet_seconds": round(quiet, 1)})
        if self.quiet_seconds is not None and quiet >= self.quiet_seconds:
            return Diagnosis(
                id=LOG_STALL, title=f"no new log line for {quiet:.0f} s during boot",
                line=last,
                fix="check the container (docker top / GPU activity); raise the node's timeouts.stall if the "
                    "model loads slowly from disk",
                data={"quiet_seconds": round(quiet, 1)})
        return None
