"""The parser and the diagnosis against the bytes a real vLLM 0.32.0 (CPU build) printed.

tests/fixtures/vllm-0.32.0-cpu/ is unedited container output (its README says how each file
was made). Every expected value below is read off those files.
"""

from __future__ import annotations

from pathlib import Path

from b70deploy.vllmlog.bootlog import parse_boot_facts
from b70deploy.vllmlog.diagnosis import diagnose

REAL = Path(__file__).parents[1] / "fixtures" / "vllm-0.32.0-cpu"


def real_lines(name: str) -> list[str]:
    return (REAL / name).read_text(encoding="utf-8").splitlines()


def test_a_multi_line_worker_exception_is_quoted_whole() -> None:
    """Inductor's CppCompileError carries the g++ command and the linker's output: the engine's
    `Worker failed with error '...'` spans 8 lines up to `', please check the stack trace above ...`."""
    lines = real_lines("crash-compile-linker.log")
    d = diagnose(lines)
    assert d is not None and d.id == "worker-failed"
    assert d.line.endswith("RuntimeError: Worker failed with error 'CppCompileError: C++ compile error")
    cause = d.data["root_cause"]
    assert cause.startswith("CppCompileError: C++ compile error\n\nCommand:\ng++ ")
    assert cause.endswith("Output:\n/usr/bin/ld: cannot find /lib/x86_64-linux-gnu/libmvec.so.1: No such file or "
                          "directory\ncollect2: error: ld returned 1 exit status")
    assert d.quote.endswith("', please check the stack trace above for the root cause")
    assert "collect2: error: ld returned 1 exit status" in d.fix  # the fix quotes it whole, on one line
    assert "\n" not in d.fix
    # The worker died with it: the later `Worker proc VllmWorker-0 died unexpectedly` is not the cause.
    assert any("died unexpectedly" in ln for ln in lines[d.line_number:])
    f = parse_boot_facts(lines)
    assert f.vllm_version == "0.32.0" and f.kv_cache_tokens is None and f.compile_seconds is None
    assert f.async_scheduling_disabled is None  # 0.32 never states it



def test_sleep_mode_validation_error_quotes_the_value_error_whole() -> None:
    """`--enable-sleep-mode` on the CPU build: vllm/config/model.py:657 raises it inside ModelConfig;
    0.32 prints the traceback without the process prefix, the cause indented under it."""
    lines = real_lines("crash-sleep-mode.log")
    d = diagnose(lines)
    assert d is not None and d.id == "config-invalid"
    assert d.line == "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"
    assert d.data["value_errors"] == ["Sleep mode is not supported on current platform."]
    assert "Value error, Sleep mode is not supported on current platform." in d.fix
    assert "remove --enable-sleep-mode" in d.fix
    assert d.quote.splitlines()[1].startswith("  Value error, Sleep mode is not supported on current platform.")
    f = parse_boot_facts(lines)
    assert f.vllm_version == "0.32.0" and f.kv_cache_tokens is None and f.api_server_started is None


def test_good_boot_facts_are_what_vllm_printed() -> None:
    f = parse_boot_facts(real_lines("boot.log"))
    assert f.vllm_version == "0.32.0"                     # banner `version 0.32.0`, then `(v0.32.0)`
    # `CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 512 tokens per request: 2048.00x`: one line
    assert f.kv_cache_tokens == 1_048_576
    assert (f.max_concurrency, f.max_concurrency_len) == (2048.0, 512)
    assert f.init_engine_seconds == 26.94                 # `[core.py:402] init engine (...) took 26.94 s`
    assert f.available_kv_gib == 1.0                      # `Explicitly set (1.0/18.96) GiB for KV cache on node 0.`
    assert f.api_server_started                           # `INFO:     Application startup complete.`, no prefix
    # 0.32 never states async scheduling, and --enforce-eager compiles nothing: absent, never a default.
    assert f.async_scheduling_disabled is None
    assert f.compile_seconds is None and f.warmup_seconds is None
    assert f.attention_backend is None and f.kv_cache_dtype is None and f.moe_method is None
    assert f.moe_backend is None and f.model_weights_gib is None and f.warnings == []
    assert diagnose(real_lines("boot.log")) is None
