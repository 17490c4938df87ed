"""Patches as small edits to files inside an image, never copies of upstream files.

A patch file (patches/<name>.yaml) names its target relative to the vllm package, the
vLLM versions that need it, and the edit: find/replace steps with an expected count, or a
unified diff. At deploy time the original comes out of the exact image, the edit is applied,
and the result (with both hashes) is bind-mounted read-only over the original path.

The image's vLLM version decides: inside `applies_to.vllm_versions` the edit is applied; at or
past `applies_to.upstream.since` vLLM does it itself (the patch file cites where), so the stack
renders without the patch and says so in a note (`upstream_note`); anywhere else the patch is
stale for that image, an error naming the version and what to check.

The edit logic is pure (`apply_edits`, `apply_unified_diff`); `materialize` takes an
inspector (see image_inspect.ImageInspector) for the two facts it needs from the image.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import hashlib
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import Field, field_validator, model_validator

from ..config.schema import Strict, invalid
from ..config.validation import parse_yaml, validate, yaml_text
from ..errors import UserError
from .files import Mount

PATCH_DIR_IN_DEPLOY = "patches"
_REL_TARGET = re.compile(r"^(?!/)(?!.*(^|/)\.\.(/|$))[A-Za-z0-9._/-]+$")


class FindReplace(Strict):
    find: str = Field(min_length=1)
    replace: str
    count: int = Field(default=1, ge=1, description="occurrences expected in the searched region")
    within: str | None = Field(default=None, description="search only the block that starts with this text "
                                                         "(e.g. a def line) up to the next top-level statement")


_RELEASE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def release(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a vLLM version string ("0.21.1.dev17+g0a4756bb5" -> (0, 21, 1))."""
    m = _RELEASE.match(version)
    return None if m is None else (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


class Upstream(Strict):
    since: str = Field(description="the first vLLM release whose own code does what the patch does")
    source: str = Field(min_length=1, description="where that release does it (file:line at a release)")

    @field_validator("since")
    @classmethod
    def _since(cls, v: str) -> str:
        if release(v) is None:
            raise invalid(f"upstream.since {v!r} is not a vLLM release number", "write e.g. 0.23.0")
        return v


class AppliesTo(Strict):
    vllm_versions: list[str] = Field(default_factory=lambda: ["*"], description="fnmatch patterns: the "
                                     "versions that need the patch")
    images: list[str] = Field(default_factory=lambda: ["*"], description="fnmatch patterns on the image ref")
    upstream: Upstream | None = Field(default=None, description="from this release on, vLLM carries the fix")


class PatchSpec(Strict):
    name: str
    description: str = ""
    target: str = Field(description="file path relative to the vllm package folder")
    applies_to: AppliesTo = AppliesTo()
    edits: list[FindReplace] = Field(default_factory=list)
    diff: str | None = None

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        if not _REL_TARGET.match(v):
            raise invalid(f"target {v!r} is not a relative path inside the vllm package",
                        "write e.g. model_executor/layers/quantization/gptq.py")
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> PatchSpec:
        if bool(self.edits) == bool(self.diff):
            raise invalid("a patch needs exactly one of edits: or diff:", "keep one of them")
        return self

    def applies(self, vllm_version: str | None, image_ref: str) -> bool:
        version_ok = vllm_version is None or any(
            fnmatch.fnmatchcase(vllm_version, p) for p in self.applies_to.vllm_versions)
        image_ok = any(fnmatch.fnmatchcase(image_ref, p) for p in self.applies_to.images)
        return version_ok and image_ok

    def upstream_note(self, vllm_version: str | None) -> str | None:
        """Why this vLLM needs no patch (it carries the fix), or None when it may."""
        up = self.applies_to.upstream
        if up is None or vllm_version is None or any(
                fnmatch.fnmatchcase(vllm_version, p) for p in self.applies_to.vllm_versions):
            return None
        have, since = release(vllm_version), release(up.since)
        if have is None or since is None or have < since:
            return None
        return (f"patch {self.name} not applied: vLLM {vllm_version} carries the fix upstream (since {up.since}: "
                f"{up.source})")


def upstream_split(specs: Iterable[PatchSpec], vllm_version: str | None) -> tuple[list[PatchSpec], list[str]]:
    """The patches this vLLM still needs to have applied, and a note for each one it fixed itself."""
    keep: list[PatchSpec] = []
    notes: list[str] = []
    for spec in specs:
        note = spec.upstream_note(vllm_version)
        if note is None:
            keep.append(spec)
        else:
            notes.append(note)
    return keep, notes


class EditError(Exception):
    """An edit does not apply; `line` is the text that no longer matches (or was expected)."""

    def __init__(self, message: str, line: str) -> None:
        super().__init__(message)
        self.line = line


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), text.strip())


def _block(text: str, anchor: str) -> tuple[int, int]:
    """(start, end) offsets of the block starting at `anchor`: up to the next line indented no
    deeper than the anchor's line (comments, blank lines and a closing ")" stay in the block)."""
    start = text.find(anchor)
    if start < 0:
        raise EditError(f"anchor not found: {_first_line(anchor)!r}", _first_line(anchor))
    line_start = text.rfind("\n", 0, start) + 1
    head = text[line_start:]
    indent = len(head) - len(head.lstrip(" \t"))
    nl = text.find("\n", start + len(anchor.rstrip("\n")))
    if nl < 0:
        return start, len(text)
    pos = nl + 1
    while pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        line = text[pos:end]
        body = line.lstrip(" \t")
        if body and not body.startswith(("#", ")", "]")) and len(line) - len(body) <= indent:
            return start, pos
        pos = end + 1
    return start, len(text)


def apply_edits(text: str, edits: Sequence[FindReplace]) -> str:
    for n, e in enumerate(edits, 1):
        lo, hi = _block(text, e.within) if e.within else (0, len(text))
        region = text[lo:hi]
        found = region.count(e.find)
        if found != e.count:
            already = e.replace in region and e.replace != e.find and e.find not in e.replace
            hint = " (the replacement is already there: the image may carry the fix)" if already else ""
            where = f" in the block of {_first_line(e.within)!r}" if e.within else ""
            if found == 0 and not hint:
                close = difflib.get_close_matches(_first_line(e.find), [ln.strip() for ln in region.splitlines()],
                                                  n=1, cutoff=0.5)
                hint = f" (closest line now: {close[0]!r})" if close else ""
            raise EditError(f"edit {n}: expected {e.count} occurrence(s) of {_first_line(e.find)!r}{where}, "
                            f"found {found}{hint}", _first_line(e.find))
        text = text[:lo] + region.replace(e.find, e.replace) + text[hi:]
    return text


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def apply_unified_diff(text: str, diff: str) -> str:
    """Apply a unified diff exactly (no fuzz). A hunk may sit at a shifted line number, but
    every context and removed line must match; the first one that does not is reported."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    pos = 0  # next unconsumed index in `lines`
    hunks = _parse_hunks(diff)
    if not hunks:
        raise EditError("diff has no hunks", diff.strip()[:80])
    for start, old, new in hunks:
        at = _locate(lines, old, start - 1, pos)
        out.extend(lines[pos:at])
        out.extend(new)
        pos = at + len(old)
    out.extend(lines[pos:])
    return "".join(out)


def _parse_hunks(diff: str) -> list[tuple[int, list[str], list[str]]]:
    hunks: list[tuple[int, list[str], list[str]]] = []
    cur: tuple[int, list[str], list[str]] | None = None
    for raw in diff.splitlines(keepends=True):
        if raw.startswith(("--- ", "+++ ")) and cur is None:
            continue
        m = _HUNK.match(raw)
        if m:
            cur = (int(m.group(1)), [], [])
            hunks.append(cur)
            continue
        if cur is None:
            continue
        body = raw[1:] if raw[:1] in " +-" else raw
        if not body.endswith("\n"):
            body += "\n"
        if raw.startswith("\\"):  # "\ No newline at end of file"
            continue
        if raw.startswith("-"):
            cur[1].append(body)
        elif raw.startswith("+"):
            cur[2].append(body)
        else:
            cur[1].append(body)
            cur[2].append(body)
    return hunks


def _locate(lines: list[str], old: list[str], hint: int, floor: int) -> int:
    def prefix(at: int) -> int:
        n = 0
        while n < len(old) and at + n < len(lines) and lines[at + n] == old[n]:
            n += 1
        return n

    candidates = range(max(floor, 0), max(len(lines) - len(old), floor) + 1)
    best, best_len = hint, -1
    for at in sorted(candidates, key=lambda a: abs(a - hint)):
        n = prefix(at)
        if n == len(old):
            return at
        if n > best_len:
            best, best_len = at, n
    # Nowhere does the whole hunk match: report the first differing line where most of it does.
    k = max(best_len, 0)
    i = best + k
    return _raise_mismatch(old[k] if k < len(old) else "", lines[i] if 0 <= i < len(lines) else None, i + 1)


def _raise_mismatch(want: str, got: str | None, lineno: int) -> int:
    have = "end of file" if got is None else repr(got.rstrip("\n"))
    raise EditError(f"line {lineno}: expected {want.rstrip(chr(10))!r}, found {have}", want.strip())


def apply_patch_text(spec: PatchSpec, original: str) -> str:
    return apply_edits(original, spec.edits) if spec.edits else apply_unified_diff(original, spec.diff or "")


# ---------------------------------------------------------------- loading


def load_patch(path: Path) -> PatchSpec:
    return _parsed_patch(path, yaml_text(path))


@functools.lru_cache(maxsize=64)  # one parse per file content and process: `lint --all` names a patch 800 times
def _parsed_patch(path: Path, text: str) -> PatchSpec:
    raw = parse_yaml(text, path)
    raw.setdefault("name", path.stem)
    spec = validate(PatchSpec, raw, where=str(path))
    if spec.name != path.stem:
        raise UserError(f"name: {spec.name!r} differs from the file name {path.stem!r}", where=str(path),
                        fix=f"set name: {path.stem}")
    return spec


def find_patch(patches_dir: Path, name: str, *, where: str = "") -> PatchSpec:
    """The patch `name`; an unknown one is a UserError at `where` (the file that named it)."""
    path = patches_dir / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in patches_dir.glob("*.yaml"))) or "none"
        raise UserError(f"{'patches: ' if where else ''}no patch named {name!r} in {patches_dir}", where=where,
                        fix=f"add patches/{name}.yaml, or use one of: {known}")
    return load_patch(path)


# ---------------------------------------------------------------- materialize


class ImageFiles(Protocol):
    """What materialize needs from an image (image_inspect.ImageInspector provides it)."""

    def image_id(self, image_ref: str) -> str: ...

    def vllm_package_dir(self, image_ref: str) -> str | None: ...

    def vllm_version(self, image_ref: str) -> str | None: ...

    def read_file(self, image_ref: str, path: str) -> bytes | None: ...


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class PatchedFile:
    patch: str
    target: str               # absolute path inside the container
    data: bytes
    original_sha256: str
    sha256: str
    image_id: str
    vllm_version: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def deploy_name(self) -> str:
        """Where the file lives in the deploy dir (and in a revision), relative."""
        return f"{PATCH_DIR_IN_DEPLOY}/{self.patch}/{posixpath.basename(self.target)}"

    def mount(self) -> Mount:
        # "./" makes the long-syntax bind source relative to the compose file's folder.
        return Mount(source=f"./{self.deploy_name}", target=self.target)

    def record(self) -> dict[str, str | None]:
        return {"patch": self.patch, "target": self.target, "file": self.deploy_name, "image_id": self.image_id,
                "vllm_version": self.vllm_version, "original_sha256": self.original_sha256, "sha256": self.sha256}


def materialize(specs: Iterable[PatchSpec], image_ref: str, inspector: ImageFiles) -> list[PatchedFile]:
    """Extract each target from `image_ref`, apply its edit, and return the results.

    Raises UserError naming the patch, the image id and the line that no longer matches.
    """
    out: list[PatchedFile] = []
    specs = list(specs)
    if not specs:
        return out
    image_id = inspector.image_id(image_ref)
    short = image_id.removeprefix("sha256:")[:12]
    version = inspector.vllm_version(image_ref)
    pkg = inspector.vllm_package_dir(image_ref)
    targets: set[str] = set()
    for spec in specs:
        where = f"patch {spec.name}"
        if not spec.applies(version, image_ref):
            up = spec.applies_to.upstream
            past = f"; vLLM carries the fix from {up.since} on" if up is not None else ""
            raise UserError(f"stale for vLLM {version or 'unknown'} ({image_ref}, image {short}): it is for vLLM "
                            f"{', '.join(spec.applies_to.vllm_versions)}{past}", where=where,
                            fix=f"check {spec.target} in vLLM {version or 'this image'}'s source against the patch's "
                            "description: extend applies_to.vllm_versions if the edit still fits, set "
                            "applies_to.upstream if vLLM fixed it, else drop the patch from the stack")
        if pkg is None:
            raise UserError(f"image {image_ref} ({short}) has no vllm package to patch", where=where,
                            fix="check the stack's image")
        target = posixpath.join(pkg, spec.target)
        if target in targets:
            raise UserError(f"two patches edit {target}", where=where, fix="merge them into one patch")
        targets.add(target)
        original = inspector.read_file(image_ref, target)
        if original is None:
            raise UserError(f"{spec.target} not found in image {short} ({image_ref}) at {target}", where=where,
                            fix="the file moved in this vLLM version: update the patch's target or applies_to")
        try:
            text = original.decode("utf-8")
            result = apply_patch_text(spec, text).encode("utf-8")
        except UnicodeDecodeError:
            raise UserError(f"{target} in image {short} is not UTF-8 text", where=where,
                            fix="patches edit Python source only") from None
        except EditError as e:
            raise UserError(f"no longer applies to image {short} ({image_ref}): {e}; line: {e.line!r}",
                            where=where, fix="rewrite the edit for this image's file, or pin the image that "
                            "the patch was written for") from None
        out.append(PatchedFile(patch=spec.name, target=target, data=result, original_sha256=sha256(original),
                               sha256=sha256(result), image_id=image_id, vllm_version=version))
    return out


def mounts_for(patched: Sequence[PatchedFile]) -> tuple[Mount, ...]:
    """render.Mount entries for `render(..., mounts=...)`."""
    return tuple(p.mount() for p in patched)


def deploy_files(patched: Sequence[PatchedFile]) -> dict[str, bytes]:
    """Files to write into the deploy dir (and keep in the revision) beside docker-compose.yml."""
    return {p.deploy_name: p.data for p in patched}
