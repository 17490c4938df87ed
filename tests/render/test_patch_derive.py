"""render/patch_derive: the edits of a corrected file rebuild it exactly, read like the shipped
patches, and fail with the line that no longer matches on a changed original (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from b70deploy.render.patch_derive import derive_edits, derive_patch_body
from b70deploy.render.patches import EditError, FindReplace, PatchSpec, apply_patch_text
from b70deploy.sim.vllm_tree import _GPTQ, _MARLIN, _MARLIN_DRIFT

CARVE_OUT = ("if current_platform.is_rocm():", "if current_platform.is_rocm() or current_platform.is_xpu():")


def _apply(body: dict[str, object], text: str) -> str:
    return apply_patch_text(PatchSpec.model_validate({"name": "p", "target": "t.py", **body}), text)


def test_the_marlin_fix_becomes_the_shipped_kind_of_edit_and_refuses_the_drifted_file() -> None:
    fixed = _MARLIN.replace(*CARVE_OUT)
    [step] = derive_edits(_MARLIN, fixed) or []
    assert step == FindReplace(find=CARVE_OUT[0], replace=CARVE_OUT[1], within="def check_moe_marlin_supports_layer(")
    with pytest.raises(EditError, match="closest line now: 'if not _platform_has_marlin\\(\\):'"):
        _apply({"edits": [step.model_dump()]}, _MARLIN_DRIFT)
    with pytest.raises(EditError, match="the replacement is already there"):
        _apply({"edits": [step.model_dump()]}, fixed)


def test_insertions_deletions_and_repeated_lines_are_scoped_until_unique() -> None:
    # `return None` occurs in two methods, the docstring's first line once; lines are added at the end.
    original = _GPTQ + "\n    def other(self):\n        return None\n"
    fixed = (original.replace('"""GPTQ quantization', '"""Patched GPTQ quantization')
             .replace("        self.pack_factor = 32 // weight_bits\n", "")
             .replace('            return "GPTQLinearMethod"\n        return None\n',
                      '            return "GPTQLinearMethod"\n        return "XPU"\n')
             + "\n\nEXTRA = 1\n")
    steps = derive_edits(original, fixed)
    assert steps is not None and len(steps) == 4
    assert [s.within for s in steps] == [None, "    def __init__(", "    def get_quant_method(", "    def other("]
    assert steps[2].find == "return None" and steps[3].find == "return None"  # each unique in its method
    assert _apply({"edits": [s.model_dump() for s in steps]}, original) == fixed


def test_a_change_edits_cannot_anchor_is_a_diff() -> None:
    # Blank lines only: no text for a find step to look for.
    body = derive_patch_body("\n\n", "\n\nX = 1\n", "t.py")
    assert body is not None and set(body) == {"diff"} and _apply(body, "\n\n") == "\n\nX = 1\n"
    assert derive_patch_body("a = 1\nb = 2\n", "a = 1\nb = 2", "t.py") == {
        "edits": [{"find": "b = 2\n", "replace": "b = 2", "count": 1}]}


LINES = st.lists(st.sampled_from(["def f(x):\n", "    return x\n", "    if x:\n", "        pass\n", "\n",
                                  "class C:\n", "    def m(self):\n", "        return 1\n", "# note\n", "X = 1\n"]),
                 min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(original=LINES, edits=st.lists(st.tuples(st.integers(0, 29), st.integers(0, 2), st.sampled_from(
    ["        return 2\n", "    if not x:\n", "Y = 2\n", "\n"])), min_size=1, max_size=4))
def test_random_line_edits_rebuild_exactly(original: list[str], edits: list[tuple[int, int, str]]) -> None:
    lines = list(original)
    for at, kind, text in edits:
        at = min(at, len(lines))
        if kind == 0:
            lines.insert(at, text)
        elif kind == 1 and at < len(lines):
            del lines[at]
        elif at < len(lines):
            lines[at] = text
    before, after = "".join(original), "".join(lines)
    if before == after:
        return
    body = derive_patch_body(before, after, "t.py")
    assert body is not None and _apply(body, before) == after
