"""The fatal-signature catalogue against log lines taken from the facts file and the post."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kit.scratch import MINIMAL_STACK, Scratch
from simkit import run_cli

from b70deploy.config.schema import Stack
from b70deploy.vllmlog.diagnosis import (
    CATALOGUE,
    COMPILE_STALL,
    LOG_STALL,
    StallWatch,
    diagnose,
    for_stack,
    is_fatal,
    suggest_max_model_len,
)

FIX = Path(__file__).parent / "fixtures"
CASES = [tuple(ln.split("\t", 1)) for ln in (FIX / "fatal_lines.txt").read_text().splitlines() if ln.strip()]


def test_every_signature_has_a_fixture_line() -> None:
    assert {c[0] for c in CASES} == {s.id for s in CATALOGUE}


@pytest.mark.parametrize(("sig", "line"), CASES, ids=[c[0] for c in CASES])
def test_signature_detected(sig: str, line: str) -> None:
    assert is_fatal(line)
    d = diagnose(["INFO starting", line, "INFO after"])
    assert d is not None and d.id == sig and d.line_number == 2 and d.fix


def test_bare_model_path_under_bash_c() -> None:
    d = diagnose(["--: line 1: /models/Qwen/Qwen3-30B-A3B-W4A16: No such file or directory"])
    assert d is not None and d.id == "bare-flags-bash-c"


def test_healthy_log_has_no_diagnosis() -> None:
    lines = (FIX / "boot_ok_131k.log").read_text().splitlines()
    assert diagnose(lines) is None
    assert not any(is_fatal(ln) for ln in lines)
    assert not is_fatal("WARNING [gptq.py:1] 4-bit gptq_gemm kernel is buggy, switch to gptq_marlin")


def test_kv_too_small_suggests_max_model_len() -> None:
    d = diagnose((FIX / "kv_too_small.log").read_text().splitlines())
    assert d is not None and d.id == "kv-too-small"  # the root cause outranks the engine lines around it
    assert d.data["estimated_max_model_len"] == 251_200
    assert d.data["suggested_max_model_len"] == 250_880
    assert d.data["max_model_len"] == 262_144
    assert d.data["kv_needed_gib"] == 12.25 and d.data["kv_available_gib"] == 11.74
    assert "max_model_len: 250880" in d.fix and "multiple of 1024" in d.fix


def test_rounding() -> None:
    assert suggest_max_model_len(251_200) == (250_880, "the estimate rounded down to a multiple of 1024")
    assert suggest_max_model_len(4096)[0] == 4096
    assert suggest_max_model_len(700)[0] == 700


def test_generic_only_when_nothing_specific() -> None:
    d = diagnose(["ERROR EngineCore failed to start.", "RuntimeError: something odd"])
    assert d is not None and d.id == "engine-init-failed"


def test_compile_stall() -> None:
    w = StallWatch(60, start=0)
    w.feed("INFO [backends.py:1] Dynamo bytecode transform time: 9.1 s", 5)
    assert w.check(30) is None
    d = w.check(70)
    assert d is not None and d.id == COMPILE_STALL and "enforce_eager" in d.fix
    w.feed("INFO torch.compile takes 82.14 s in total", 71)
    assert w.check(500) is None  # compile finished; no quiet limit set


def test_quiet_boot_stall() -> None:
    w = StallWatch(60, quiet_seconds=300, start=0)
    w.feed("INFO loading weights", 1)
    assert w.check(200) is None
    d = w.check(302)
    assert d is not None and d.id == LOG_STALL


# ---------------------------------------------------------------- the stack a diagnosis explains

MARLIN = "(EngineCore_DP0 pid=312) AttributeError: '_OpNamespace' '_C' object has no attribute 'gptq_marlin_repack'"


def _stack(**over: Any) -> Stack:
    doc: dict[str, Any] = {"name": "s", "image": "intel/vllm:latest", "served_model_names": ["m"],
                           "max_model_len": 4096, "model": {"path": "Qwen/Qwen3-8B"}}
    for key, value in over.items():
        doc[key] = {**doc[key], **value} if isinstance(value, dict) and isinstance(doc.get(key), dict) else value
    return Stack.model_validate(doc)


DENSE = _stack(model={"architecture": "dense", "quantization": "none"})
W4A16_MOE = _stack(name="w4a16", model={"path": "Qwen/Qwen3-30B-A3B-W4A16", "quantization": "compressed-tensors",
                                        "architecture": "moe"})


def test_marlin_fix_offers_the_carveout_to_a_w4a16_moe_stack_only() -> None:
    moe = diagnose([MARLIN], W4A16_MOE)
    assert moe is not None and moe.id == "marlin-on-xpu"
    assert "add patches: [marlin-xpu-carveout]" in moe.fix and moe.data["patch"] == "marlin-xpu-carveout"
    dense = diagnose([MARLIN], DENSE)
    assert dense is not None and dense.id == "marlin-on-xpu" and dense.data["stack"] == "s"
    assert "marlin-xpu-carveout" not in dense.fix and "patch" not in dense.data
    assert "model.quantization: none" in dense.fix and "Qwen/Qwen3-8B" in dense.fix  # what the line means here
    assert "W4A16" not in dense.title


@pytest.mark.parametrize("stack", [
    _stack(model={"quantization": "gptq", "architecture": "hybrid-moe"}),
    _stack(model={"quantization": "compressed-tensors", "architecture": "dense"}),
    _stack(model={"quantization": "fp8", "architecture": "moe"}),
], ids=["gptq", "ct-dense", "fp8"])
def test_marlin_fix_never_prescribes_the_moe_patch_elsewhere(stack: Stack) -> None:
    d = diagnose([MARLIN], stack)
    assert d is not None and "add patches" not in d.fix and "patch" not in d.data
    assert f"{stack.model.quantization}" in d.fix  # names what this stack's line means


def test_marlin_with_the_patch_already_listed_points_at_the_image() -> None:
    patched = _stack(model={"quantization": "compressed-tensors"}, patches=["marlin-xpu-carveout"])
    d = diagnose([MARLIN], patched)
    assert d is not None and "already lists marlin-xpu-carveout" in d.fix and "lint s" in d.fix


def test_unknown_stack_keeps_the_conditional_fix() -> None:
    d = diagnose([MARLIN])
    assert d is not None and "compressed-tensors (W4A16) MoE stack" in d.fix and "stack" not in d.data


def test_kv_relief_offers_only_what_the_stack_can_give() -> None:
    lines = (FIX / "kv_too_small.log").read_text().splitlines()
    plain = diagnose(lines, DENSE)
    assert plain is not None and "max_model_len: 250880" in plain.fix
    assert "draft" not in plain.fix and "kv_cache_dtype: fp8" in plain.fix
    eagle = _stack(kv_cache_dtype="fp8", speculative={"method": "eagle3", "model": "draft/eagle3"})
    drafted = diagnose(lines, eagle)
    assert drafted is not None and "drop the draft model (draft/eagle3)" in drafted.fix and "fp8" not in drafted.fix
    nomem = diagnose(["ValueError: No available memory for the cache blocks."], DENSE)
    assert nomem is not None and "draft" not in nomem.fix


def test_fixes_never_advise_a_setting_the_stack_has() -> None:
    def fix(line: str, stack: Stack) -> str:
        d = diagnose([line], stack)
        assert d is not None
        return d.fix

    bash_c = fix("/bin/bash: line 1: exec: --: invalid option", _stack(entrypoint_style="bash-c"))
    assert "set entrypoint_style: bash-c" not in bash_c and "already sets entrypoint_style" in bash_c
    assert "set entrypoint_style: bash-c" in fix("/bin/bash: line 1: exec: --: invalid option",
                                                 _stack(entrypoint_style="vllm-serve"))
    mamba = "TypeError: object of type 'NoneType' has no len()"
    assert "already sets prefix_caching: false" in fix(mamba, _stack(prefix_caching=False))
    assert "architecture: hybrid-moe" in fix(mamba, DENSE)
    gptq = "ValueError: torch.bfloat16 is not supported for quantization method gptq."
    assert "already sets dtype: float16" in fix(gptq, _stack(dtype="float16"))
    arctic = "ImportError: Arctic Inference is required for suffix decoding."
    assert "change speculative.method" not in fix(arctic, DENSE) and "extra_args" in fix(arctic, DENSE)
    missing = "OSError: /models/Qwen/missing does not appear to have a file named config.json."
    assert "model.path (Qwen/Qwen3-8B)" in fix(missing, DENSE) and "speculative.model" not in fix(missing, DENSE)
    flag = "vllm serve: error: unrecognized arguments: --bogus-flag"
    assert "--bogus-flag in the stack's extra_args" in fix(flag, _stack(extra_args=["--bogus-flag"]))
    assert "not in extra_args" in fix(flag, DENSE)
    w = StallWatch(60, start=0)
    w.feed("INFO [backends.py:1] Dynamo bytecode transform time: 9.1 s", 5)
    stall = for_stack(w.check(70), _stack(enforce_eager=True))
    assert stall is not None and "set enforce_eager" not in stall.fix and "already sets enforce_eager" in stall.fix


def test_every_fix_is_one_line_with_or_without_a_stack() -> None:
    for sig, line in CASES:
        for stack in (None, DENSE, W4A16_MOE):
            d = diagnose([line], stack)
            assert d is not None and "\n" not in d.fix and "fix:" not in d.fix, (sig, d.fix)
            assert d.one_line().count("fix:") == 1


def test_diagnose_cli_checks_the_fix_against_the_named_stack(scratch: Scratch) -> None:
    log = scratch.root / "boot.log"
    log.write_text(f"INFO loading weights\n{MARLIN}\nRuntimeError: Engine core initialization failed.\n")
    scratch.write_stack("dense", {**MINIMAL_STACK, "model": {"path": "Qwen/Qwen3-8B", "architecture": "dense"}})
    scratch.write_stack("w4a16", {**MINIMAL_STACK, "model": {"path": "Qwen/Qwen3-30B-A3B-W4A16",
                                                             "quantization": "compressed-tensors"}})
    out = {}
    for name in ("dense", "w4a16"):
        r = run_cli(scratch.config, "diagnose", "--log", str(log), "--stack", name, in_process=True)
        assert r.returncode == 1 and "[marlin-on-xpu]" in r.stdout, r.stdout + r.stderr
        out[name] = r.stdout.splitlines()[-1]
        assert out[name].count("fix:") == 1
    assert "marlin-xpu-carveout" not in out["dense"] and "model.quantization: none" in out["dense"]
    assert "add patches: [marlin-xpu-carveout]" in out["w4a16"]


def test_max_model_len_above_the_models_is_a_config_error_with_the_derived_length() -> None:
    """vllm/config/model.py (0.32.0 :2646, _get_and_verify_max_len) raises it inside ModelConfig;
    the lines as pydantic prints them under the ValidationError (the real sleep-mode logs' shape)."""
    lines = ["pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
             "  Value error, User-specified max_model_len (4096) is greater than the derived max_model_len "
             "(max_position_embeddings=2048.0 or model_max_length=None in model's config.json). To allow overriding "
             "this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. [type=value_error, "
             "input_value=ArgsKwargs((), {'model': '/models/tiny'}), input_type=ArgsKwargs]",
             "    For further information visit https://errors.pydantic.dev/2.14/v/value_error"]
    d = diagnose(lines)
    assert d is not None and d.id == "config-invalid" and d.line_number == 1
    assert (d.data["max_model_len"], d.data["derived_max_model_len"]) == (4096, 2048)
    assert "set max_model_len: 2048 or less (the model's max_position_embeddings)" in d.fix
    assert "Value error, User-specified max_model_len (4096) is greater than" in d.fix
    assert d.quote == "\n".join(lines)
