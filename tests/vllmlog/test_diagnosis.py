"""The fatal-signature catalogue against log lines taken from the facts file and the post."""

from __future__ import annotations

from pathlib import Path

import pytest

from b70deploy.vllmlog.diagnosis import (
    CATALOGUE,
    COMPILE_STALL,
    LOG_STALL,
    StallWatch,
    diagnose,
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
