"""A patch's edit from a corrected file: the inverse of patches.apply_edits (pure).

Each changed run of lines becomes one find/replace step shaped like the shipped patches: the
old lines as `find`, scoped `within` the enclosing def or class when that names it once, with
just enough surrounding lines that `find` occurs exactly once where it is searched. So the
patch fails, naming the line, when an image's file no longer holds that text (drift), and
says so when the replacement is already there. When no such steps rebuild the corrected file
exactly, the change is a unified diff instead, which apply_unified_diff checks as strictly.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from .patches import EditError, FindReplace, apply_edits, apply_unified_diff

_HEADER = re.compile(r"^(?P<head>[ \t]*(?:async[ \t]+def|def|class)[ \t]+\w+)[(:]")


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" \t"))]


def _anchor(lines: list[str], at: int, text: str) -> str | None:
    """The def/class line enclosing line `at` (as far as its name and the next character),
    if it occurs once in `text`; None at top level."""
    body = next((ln for ln in lines[at:] if ln.strip()), "")
    depth = len(_indent(body))
    for line in reversed(lines[:at]):
        m = _HEADER.match(line)
        if m and len(_indent(line)) < depth:
            anchor = line[:m.end()]
            return anchor if text.count(anchor) == 1 else None
        if line.strip() and not line.lstrip().startswith("#") and len(_indent(line)) < depth:
            depth = len(_indent(line))  # a statement that opens the block (if/for/with): look above it
    return None


def _trim(old: str, new: str) -> tuple[str, str]:
    """Drop the shared first-line indent and final newline, as a hand-written edit would."""
    indent = _indent(old)
    if indent and new.startswith(indent):
        old, new = old[len(indent):], new[len(indent):]
    if old.endswith("\n") and new.endswith("\n"):
        old, new = old[:-1], new[:-1]
    return old, new


def _step(cur: list[str], start: int, end: int, new: list[str]) -> FindReplace | None:
    """One edit turning cur[start:end] into `new`, found once in its scope, or None."""
    text = "".join(cur)
    want = "".join(cur[:start] + new + cur[end:])
    lo, hi = start, end
    while True:
        old_text = "".join(cur[lo:hi])
        new_text = "".join(cur[lo:start] + new + cur[end:hi])
        if old_text.strip():
            find, replace = _trim(old_text, new_text)
            for within in (_anchor(cur, lo, text), None):
                try:
                    step = FindReplace(find=find, replace=replace, within=within)
                    if apply_edits(text, [step]) == want:
                        return step
                except EditError:
                    continue
        if lo == 0 and hi == len(cur):
            return None
        # Widen by a line: above first (an insertion reads best after the line it follows).
        if lo > 0 and (hi == len(cur) or hi - end >= start - lo):
            lo -= 1
        else:
            hi += 1


def derive_edits(original: str, corrected: str) -> list[FindReplace] | None:
    """Find/replace steps that turn `original` into `corrected`, or None when they cannot."""
    a, b = original.splitlines(keepends=True), corrected.splitlines(keepends=True)
    steps: list[FindReplace] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        # Earlier steps are applied by now: the lines before this change read as in `corrected`.
        step = _step(b[:j1] + a[i1:], j1, j1 + (i2 - i1), b[j1:j2])
        if step is None:
            return None
        steps.append(step)
    return steps if apply_edits(original, steps) == corrected else None


def derive_patch_body(original: str, corrected: str, target: str) -> dict[str, Any] | None:
    """The `edits:` (preferred) or `diff:` part of a patch file, or None when neither rebuilds
    `corrected` exactly (e.g. only the final newline differs in a way a diff cannot say)."""
    steps = derive_edits(original, corrected)
    if steps is not None:
        return {"edits": [s.model_dump(exclude_none=True) for s in steps]}
    diff = "".join(difflib.unified_diff(original.splitlines(keepends=True), corrected.splitlines(keepends=True),
                                        f"a/{target}", f"b/{target}"))
    try:
        return {"diff": diff} if apply_unified_diff(original, diff) == corrected else None
    except EditError:
        return None
