"""Boot facts from log fixtures written after the post's and vLLM's own lines."""

from __future__ import annotations

from pathlib import Path

from b70deploy.config.schema import Expect
from b70deploy.vllmlog.bootlog import BootFacts, check_expectations, parse_boot_facts

FIX = Path(__file__).parent / "fixtures"


def _facts(name: str) -> BootFacts:
    return parse_boot_facts((FIX / name).read_text().splitlines())


def test_post_boot_log_facts() -> None:
    f = _facts("boot_ok_131k.log")
    assert f.vllm_version == "0.21.1.dev17+g0a4756bb5"
    assert f.kv_cache_dtype == "fp8"
    assert f.attention_backend == "FLASH_ATTN" and f.attention_fallback is None
    assert f.flash_attn_version == 2
    assert f.moe_method == "CompressedTensorsWNA16MoEMethod"
    assert f.kv_cache_tokens == 270_592
    assert (f.max_concurrency, f.max_concurrency_len) == (2.06, 131_072)
    assert f.available_kv_gib == 12.39 and f.model_weights_gib == 15.72
    assert f.compile_seconds == 82.14 and f.init_engine_seconds == 24.09
    assert f.api_server_started
    assert f.to_dict()["kv_cache_tokens"] == 270_592


def test_expectations_hold_for_the_post_log() -> None:
    expect = Expect(attention_backend="FLASH_ATTN", flash_attn_version=2, kv_cache_dtype="fp8",
                    moe_method="CompressedTensorsWNA16MoEMethod", min_kv_tokens=270_000)
    assert check_expectations(_facts("boot_ok_131k.log"), expect) == []


def test_newer_joined_kv_line_and_silent_fallback() -> None:
    f = _facts("boot_fallback_033.log")
    assert f.kv_cache_tokens == 135_296 and f.max_concurrency == 0.52 and f.max_concurrency_len == 262_144
    assert f.attention_backend == "TRITON_ATTN" and "Falling back" in (f.attention_fallback or "")
    msgs = check_expectations(f, Expect(attention_backend="FLASH_ATTN", kv_cache_dtype="fp8",
                                        moe_method="CompressedTensorsWNA16MoEMethod", min_kv_tokens=270_000,
                                        flash_attn_version=2))
    text = "\n".join(msgs)
    assert "attention backend is TRITON_ATTN, expected FLASH_ATTN: silent fallback" in text
    assert "Marlin" in text and "270,000" in text and "135,296" in text
    assert "fp8" in text and "FlashAttention not stated" in text
    assert len(msgs) == 5


def test_absent_facts_are_none() -> None:
    f = parse_boot_facts(["hello", "world"])
    assert f.kv_cache_tokens is None and f.attention_backend is None and f.vllm_version is None
    assert check_expectations(f, Expect()) == []


def test_cuda_style_backend_line() -> None:
    f = parse_boot_facts(["INFO [cuda.py:1] Using AttentionBackendEnum.FLASH_ATTN backend.",
                          "INFO Initializing a V1 LLM engine (v0.20.2) with config: ..."])
    assert f.attention_backend == "FLASH_ATTN" and f.vllm_version == "0.20.2"


def test_marlin_moe_hint_names_the_patch_only_for_compressed_tensors() -> None:
    from b70deploy.config.schema import Expect
    from b70deploy.vllmlog.bootlog import BootFacts, check_expectations

    want = Expect(moe_method="CompressedTensorsWNA16MoEMethod")
    ct = check_expectations(BootFacts(moe_method="CompressedTensorsWNA16MarlinMoEMethod"), want)
    assert any("marlin-xpu-carveout" in p for p in ct)
    gptq = check_expectations(BootFacts(moe_method="GPTQMarlinMoEMethod"), Expect(moe_method="GPTQMoEMethod"))
    assert gptq and not any("marlin-xpu-carveout" in p for p in gptq) and "Marlin path" in gptq[0]
