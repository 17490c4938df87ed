"""Patch edits applied to small hand-written stand-ins (never upstream source)."""

from __future__ import annotations

from pathlib import Path

import pytest

from b70deploy.config.resources import data_dir
from b70deploy.errors import UserError
from b70deploy.render.patches import (
    EditError,
    FindReplace,
    PatchSpec,
    apply_edits,
    apply_unified_diff,
    deploy_files,
    load_patch,
    materialize,
    mounts_for,
    sha256,
)

STANDIN = """\
from platform_stub import current_platform


def check_marlin_supported(x):
    if current_platform.is_rocm():
        return False
    return True


def check_moe_marlin_supports_layer(
    layer, group_size: int
) -> bool:
    if current_platform.is_rocm():
        return False
    return group_size in (64, 128)
"""

CARVE = FindReplace(within="def check_moe_marlin_supports_layer(",
                    find="if current_platform.is_rocm():\n        return False",
                    replace="if current_platform.is_rocm() or current_platform.is_xpu():\n        return False")


def test_edit_within_block_only() -> None:
    out = apply_edits(STANDIN, [CARVE])
    assert out.count("is_xpu()") == 1
    assert out.index("is_xpu()") > out.index("def check_moe_marlin_supports_layer(")


def test_edit_count_mismatch_names_the_line() -> None:
    with pytest.raises(EditError) as e:
        apply_edits(STANDIN, [FindReplace(find="if current_platform.is_rocm():\n        return False", replace="x")])
    assert "expected 1 occurrence(s)" in str(e.value) and "found 2" in str(e.value)
    assert e.value.line == "if current_platform.is_rocm():"


def test_already_applied_is_reported() -> None:
    patched = apply_edits(STANDIN, [CARVE])
    with pytest.raises(EditError, match="already there"):
        apply_edits(patched, [CARVE])


def test_missing_anchor() -> None:
    with pytest.raises(EditError, match="anchor not found"):
        apply_edits("x = 1\n", [CARVE])


DIFF = """\
--- a/utils/marlin_utils.py
+++ b/utils/marlin_utils.py
@@ -12,3 +12,3 @@
 ) -> bool:
-    if current_platform.is_rocm():
+    if current_platform.is_rocm() or current_platform.is_xpu():
         return False
"""


def test_unified_diff_applies_and_tolerates_shift() -> None:
    assert apply_unified_diff(STANDIN, DIFF) == apply_edits(STANDIN, [CARVE])
    shifted = "# a new header line\n" + STANDIN
    assert apply_unified_diff(shifted, DIFF) == "# a new header line\n" + apply_edits(STANDIN, [CARVE])


def test_unified_diff_reports_the_line_that_changed() -> None:
    drifted = STANDIN.replace(") -> bool:\n    if current_platform.is_rocm():",
                              ") -> bool:\n    if current_platform.is_rocm() or is_tpu():")
    with pytest.raises(EditError) as e:
        apply_unified_diff(drifted, DIFF)
    assert "if current_platform.is_rocm():" in e.value.line


def test_shipped_patch_files_load() -> None:
    names = {p.stem for p in data_dir("patches").glob("*.yaml")}
    assert {"marlin-xpu-carveout", "gptq-xpu"} <= names
    for name in names:
        spec = load_patch(data_dir("patches") / f"{name}.yaml")
        assert spec.description


def test_bad_patch_file(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("target: /abs/path.py\nedits: [{find: a, replace: b}]\n")
    with pytest.raises(UserError, match=r"bad\.yaml"):
        load_patch(p)
    p.write_text("target: a.py\n")
    with pytest.raises(UserError, match="exactly one of edits"):
        load_patch(p)


class FakeImage:
    def __init__(self, text: str, version: str = "0.21.1.dev17+g0a4756bb5") -> None:
        self.text, self.version = text, version

    def image_id(self, image_ref: str) -> str:
        return "sha256:" + "ab" * 32

    def vllm_package_dir(self, image_ref: str) -> str | None:
        return "/opt/venv/lib/python3.12/site-packages/vllm"

    def vllm_version(self, image_ref: str) -> str | None:
        return self.version

    def read_file(self, image_ref: str, path: str) -> bytes | None:
        return self.text.encode() if path.endswith("marlin_utils.py") else None


SPEC = PatchSpec(name="marlin-xpu-carveout", target="model_executor/layers/quantization/utils/marlin_utils.py",
                 edits=[CARVE])


def test_materialize_and_mounts() -> None:
    [pf] = materialize([SPEC], "b70sim/vllm:bash-c", FakeImage(STANDIN))
    assert pf.target == "/opt/venv/lib/python3.12/site-packages/vllm/model_executor/layers/quantization/utils/" \
                        "marlin_utils.py"
    assert pf.original_sha256 == sha256(STANDIN.encode()) and pf.sha256 == sha256(pf.data)
    assert b"is_xpu()" in pf.data
    (m,) = mounts_for([pf])
    assert m.source == "./patches/marlin-xpu-carveout/marlin_utils.py" and m.target == pf.target
    assert deploy_files([pf]) == {"patches/marlin-xpu-carveout/marlin_utils.py": pf.data}


def test_materialize_drift_names_patch_image_and_line() -> None:
    drifted = STANDIN.replace("    if current_platform.is_rocm():\n        return False\n    return group_size",
                              "    if current_platform.is_rocm(): return False\n    return group_size")
    with pytest.raises(UserError) as e:
        materialize([SPEC], "b70sim/vllm:bash-c-drift", FakeImage(drifted))
    msg = str(e.value)
    assert "patch marlin-xpu-carveout" in msg and "abababababab" in msg
    assert "if current_platform.is_rocm():" in msg


def test_materialize_version_gate() -> None:
    spec = SPEC.model_copy(update={"applies_to": SPEC.applies_to.model_copy(update={"vllm_versions": ["0.19.*"]})})
    with pytest.raises(UserError, match=r"stale for vLLM 0\.21\.1\.dev17"):
        materialize([spec], "x:y", FakeImage(STANDIN))


def test_shipped_marlin_patch_applies_to_the_post_shape() -> None:
    spec = load_patch(data_dir("patches") / "marlin-xpu-carveout.yaml")
    [pf] = materialize([spec], "b70sim/vllm:bash-c", FakeImage(STANDIN))
    assert pf.data.decode() == apply_edits(STANDIN, [CARVE])
