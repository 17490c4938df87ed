"""The parser and the diagnosis against the bytes a real vLLM 0.21.0 (CPU build) printed.

tests/fixtures/vllm-0.21.0-cpu/ is unedited container output (its README says how it was
made). Every expected value below is read off those files, prefixes and all.
"""

from __future__ import annotations

from pathlib import Path

from b70deploy.vllmlog.bootlog import BootFacts, parse_boot_facts
from b70deploy.vllmlog.diagnosis import diagnose, exception_line_index, is_fatal

REAL = Path(__file__).parents[1] / "fixtures" / "vllm-0.21.0-cpu"


def real_lines(name: str) -> list[str]:
    return (REAL / name).read_text(encoding="utf-8").splitlines()


def _facts(name: str) -> BootFacts:
    return parse_boot_facts(real_lines(name))


def test_good_boot_facts_are_what_vllm_printed() -> None:
    f = _facts("boot.log")
    assert f.vllm_version == "0.21.0"                     # banner `version 0.21.0`, then `(v0.21.0)`
    assert f.kv_cache_tokens == 1_048_576                 # `GPU KV cache size: 1,048,576 tokens`
    assert (f.max_concurrency, f.max_concurrency_len) == (2048.0, 512)
    assert f.init_engine_seconds == 1.0                   # `... warmup model) took 1.00 s`
    assert f.available_kv_gib == 1.0                      # `Explicitly set (1.0/15.59) GiB for KV cache`
    assert f.async_scheduling_disabled is True            # the engine core's `... is disabled.` is the last word
    assert f.api_server_started                           # `(APIServer pid=1) INFO:     Application startup complete.`
    # What a CPU boot does not print stays unknown, never guessed: --enforce-eager compiles nothing,
    # so neither `torch.compile took` nor `Initial profiling/warmup run took` is there.
    assert f.attention_backend is None and f.kv_cache_dtype is None and f.moe_method is None
    assert f.model_weights_gib is None and f.compile_seconds is None and f.flash_attn_version is None
    assert f.warmup_seconds is None and f.moe_backend is None
    assert f.warnings == []


def test_die_after_ready_boot_facts() -> None:
    f = _facts("die-after-ready.log")
    assert f.vllm_version == "0.21.0"
    assert f.kv_cache_tokens == 4_194_304
    assert (f.max_concurrency, f.max_concurrency_len) == (8192.0, 512)
    assert f.init_engine_seconds == 0.93
    assert f.async_scheduling_disabled is True and f.api_server_started


def test_crash_before_the_engine_still_has_the_banner_version() -> None:
    f = _facts("crash-missing-model.log")
    assert f.vllm_version == "0.21.0"  # only the banner: the engine never started
    assert f.kv_cache_tokens is None and f.init_engine_seconds is None and f.api_server_started is None


def test_argparse_crash_states_nothing() -> None:
    f = _facts("crash-bad-flag.log")
    assert f == BootFacts()  # argparse exits before the banner


# ---------------------------------------------------------------- diagnosis


def test_good_boot_has_no_diagnosis() -> None:
    lines = real_lines("boot.log")
    assert diagnose(lines) is None  # the 400's VLLMValidationError traceback is a request error, not fatal
    assert not any(is_fatal(ln) for ln in lines)


def test_die_after_ready_names_the_worker_cause() -> None:
    lines = real_lines("die-after-ready.log")
    d = diagnose(lines)
    assert d is not None and d.id == "cpu-attention-unsupported"
    assert d.line.endswith("RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0")
    assert d.line.startswith("(Worker pid=39) ERROR")
    assert lines[d.line_number - 1] == d.line and d.data["head_dim"] == 16
    assert d.data["root_cause"] == "Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0"


def test_die_after_ready_engine_lines_alone_still_name_the_cause() -> None:
    # Only the engine's and API server's lines (the worker's traceback cut off): the engine's
    # `Worker failed with error '...'` carries the cause.
    lines = [ln for ln in real_lines("die-after-ready.log") if not ln.startswith("(Worker ")]
    d = diagnose(lines)
    assert d is not None and d.id == "cpu-attention-unsupported"
    assert d.line.endswith("RuntimeError: Worker failed with error 'Unsupported CPU attention configuration: "
                           "head_dim=16 isa=2 kv_cache_idx=0', please check the stack trace above for the root cause")


def test_unknown_worker_error_is_surfaced_over_engine_dead() -> None:
    lines = [ln.replace("Unsupported CPU attention configuration", "Something new broke")
             for ln in real_lines("die-after-ready.log")]
    d = diagnose(lines)
    assert d is not None and d.id == "worker-failed"
    assert d.data["root_cause"] == "Something new broke: head_dim=16 isa=2 kv_cache_idx=0"
    assert "Something new broke: head_dim=16" in d.fix
    assert d.line.endswith("', please check the stack trace above for the root cause")


def test_engine_dead_alone_is_generic() -> None:
    lines = [ln for ln in real_lines("die-after-ready.log") if ln.startswith("(APIServer ")]
    d = diagnose(lines)
    assert d is not None and d.id == "engine-dead"
    assert d.line.endswith("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
                           "See stack trace (above) for the root cause.")


def test_missing_model_quotes_the_final_oserror() -> None:
    lines = real_lines("crash-missing-model.log")
    d = diagnose(lines)
    assert d is not None and d.id == "model-not-found"
    assert d.line.startswith("(APIServer pid=1) OSError: Can't load the configuration of '/models/no-such-model'.")
    assert d.line_number == len(lines)  # the last line: what the process died with


def test_bad_flag_quotes_argparse() -> None:
    lines = real_lines("crash-bad-flag.log")
    d = diagnose(lines)
    assert d is not None and d.id == "bad-cli-argument"
    assert d.line == "api_server.py: error: unrecognized arguments: --no-such-flag"


def test_a_hit_on_a_code_line_quotes_its_exception() -> None:
    lines = ["(APIServer pid=1) Traceback (most recent call last):",
             '(APIServer pid=1)   File "/x/hub.py", line 1, in f',
             "(APIServer pid=1)     raise HFValidationError(",
             "(APIServer pid=1) huggingface_hub.errors.HFValidationError: Repo id must be in the form 'x'"]
    d = diagnose(lines)
    assert d is not None and d.id == "model-not-found" and d.line_number == 4


def test_exception_line_index_rules() -> None:
    lines = ["ERROR 11-30 05:19:16 [core.py:1] Traceback (most recent call last):",
             'ERROR 11-30 05:19:16 [core.py:1]   File "a.py", line 3, in g',
             "ERROR 11-30 05:19:16 [core.py:1]     boom()",
             "ERROR 11-30 05:19:16 [core.py:1] KeyError: 'a'",
             "ERROR 11-30 05:19:16 [core.py:1] ",
             "ERROR 11-30 05:19:16 [core.py:1] The above exception was the direct cause of the following exception:",
             "ERROR 11-30 05:19:16 [core.py:1] Traceback (most recent call last):",
             'ERROR 11-30 05:19:16 [core.py:1]   File "b.py", line 9, in h',
             "ERROR 11-30 05:19:16 [core.py:1] ValueError: the real one",
             "INFO 11-30 05:19:17 [x.py:2] later"]
    assert exception_line_index(lines, 2) == 8 and exception_line_index(lines, 0) == 8
    assert exception_line_index(lines, 3) == 8
    assert exception_line_index(lines, 9) == 9  # a plain log line quotes itself


def test_sleep_mode_validation_error_quotes_the_value_error_whole() -> None:
    """`--enable-sleep-mode` on the CPU build: pydantic's ValidationError for ModelConfig, the cause on
    the indented line under it (vllm/config/model.py:508 raises it)."""
    lines = real_lines("crash-sleep-mode.log")
    d = diagnose(lines)
    assert d is not None and d.id == "config-invalid"
    assert d.line.endswith("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig")
    assert d.data["value_errors"] == ["Sleep mode is not supported on current platform."]
    assert "Value error, Sleep mode is not supported on current platform." in d.fix
    assert "remove --enable-sleep-mode" in d.fix and d.data["flag"] == "--enable-sleep-mode"
    assert d.quote.splitlines()[1].startswith("  Value error, Sleep mode is not supported on current platform. [type=")
    f = parse_boot_facts(lines)
    assert f.vllm_version == "0.21.0" and f.kv_cache_tokens is None and f.api_server_started is None
