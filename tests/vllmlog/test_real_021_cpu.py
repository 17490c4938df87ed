"""The parser and the diagnosis against the bytes a real vLLM 0.21.0 (CPU build) printed.

tests/fixtures/vllm-0.21.0-cpu/ is unedited container output (its README says how it was
made). Every expected value below is read off those files, prefixes and all.
"""

from __future__ import annotations

from pathlib import Path

from b70deploy.vllmlog.bootlog import BootFacts, parse_boot_facts

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
    assert f.async_scheduling_disabled                    # the engine core's `... is disabled.` is the last word
    assert f.api_server_started                           # `(APIServer pid=1) INFO:     Application startup complete.`
    # What a CPU boot does not print stays unknown, never guessed.
    assert f.attention_backend is None and f.kv_cache_dtype is None and f.moe_method is None
    assert f.model_weights_gib is None and f.compile_seconds is None and f.flash_attn_version is None
    assert f.warnings == []


def test_die_after_ready_boot_facts() -> None:
    f = _facts("die-after-ready.log")
    assert f.vllm_version == "0.21.0"
    assert f.kv_cache_tokens == 4_194_304
    assert (f.max_concurrency, f.max_concurrency_len) == (8192.0, 512)
    assert f.init_engine_seconds == 0.93
    assert f.async_scheduling_disabled and f.api_server_started


def test_crash_before_the_engine_still_has_the_banner_version() -> None:
    f = _facts("crash-missing-model.log")
    assert f.vllm_version == "0.21.0"  # only the banner: the engine never started
    assert f.kv_cache_tokens is None and f.init_engine_seconds is None and not f.api_server_started


def test_argparse_crash_states_nothing() -> None:
    f = _facts("crash-bad-flag.log")
    assert f == BootFacts()  # argparse exits before the banner
