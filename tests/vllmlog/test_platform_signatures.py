"""The XPU-only crash signatures (BMG runtime faults, Level Zero, Marlin on XPU) count only on an
XPU node (issue 28): the same line on an NVIDIA node is no diagnosis of them."""

from __future__ import annotations

import pytest

from b70deploy.vllmlog.diagnosis import CATALOGUE, diagnose

LINES = {
    "bmg-tp2-gp-fault": "[ 4711.482915] traps: VLLM::Worker_TP[48213] general protection fault ip:7f3a2c91d4e2 "
                        "sp:7ffd5b2a9e10 error:0 in libze_intel_gpu.so.1[7f3a2c600000+1a00000]",
    "level-zero-error": "RuntimeError: level_zero backend failed with error: 20 (UR_RESULT_ERROR_DEVICE_LOST)",
    "marlin-on-xpu": "AttributeError: '_OpNamespace' '_C' object has no attribute 'gptq_marlin_repack'",
}


@pytest.mark.parametrize("sig", sorted(LINES))
def test_xpu_signature_only_on_xpu(sig: str) -> None:
    found = diagnose([LINES[sig]], platform="xpu")
    assert found is not None and found.id == sig
    assert diagnose([LINES[sig]]) is not None  # no platform given: as before
    other = diagnose([LINES[sig]], platform="cuda")
    assert other is None or other.id != sig


def test_the_xpu_only_ones_say_so() -> None:
    xpu = {s.id for s in CATALOGUE if s.platforms == ("xpu",)}
    assert {"bmg-inspect-sigabrt", "bmg-tp2-gp-fault", "level-zero-error", "marlin-on-xpu"} <= xpu
