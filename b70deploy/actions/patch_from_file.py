"""`patch from-file FILE --target PATH --image REF --name NAME`: a corrected file becomes a patch
definition: edits against the image's own file, checked (drift) on every image it meets."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..config.names import check_name
from ..config.node import Node
from ..config.validation import validate
from ..docker.image_inspect import ImageInspector
from ..errors import OperationError, UserError
from ..render.patch_derive import derive_patch_body
from ..render.patches import PatchSpec, materialize, sha256
from ..state.fsio import write_atomic


class _Dumper(yaml.SafeDumper):
    """Multi-line find/replace text as literal blocks: the file reads like the shipped patches."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def version_pattern(version: str | None) -> str:
    """The vLLM versions a patch written against `version` is for: its minor series (0.21.*)."""
    m = re.match(r"^(\d+)\.(\d+)\.", version or "")
    return f"{m.group(1)}.{m.group(2)}.*" if m else "*"


@dataclass
class Authored:
    path: Path
    spec: PatchSpec
    image: str
    image_id: str
    vllm_version: str | None
    original_sha256: str
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"patch": self.spec.name, "file": str(self.path), "target": self.spec.target, "image": self.image,
                "image_id": self.image_id, "vllm_version": self.vllm_version,
                "vllm_versions": self.spec.applies_to.vllm_versions,
                "kind": "edits" if self.spec.edits else "diff", "edits": len(self.spec.edits),
                "original_sha256": self.original_sha256, "sha256": self.sha256}


@dataclass
class PatchFromFile:
    node: Node
    file: Path
    target: str
    image: str
    name: str

    def plan(self) -> Path:
        """The patch file to write, <patches_dir>/<name>.yaml; the name is checked before it
        becomes a path. Nothing is read."""
        check_name(self.name, what="patch name", where="--name")
        return self.node.patches_dir / f"{self.name}.yaml"

    def run(self) -> Authored:
        path = self.plan()
        if path.exists():
            raise UserError(f"{path} already exists", where="--name",
                            fix="choose another --name, or remove that patch file first")
        try:
            corrected = self.file.read_bytes().decode("utf-8")
        except FileNotFoundError:
            raise UserError("file not found", where=str(self.file), fix="give the corrected file's path") from None
        except UnicodeDecodeError:
            raise UserError("not UTF-8 text", where=str(self.file), fix="patches edit Python source only") from None
        with ImageInspector(self.node.state_dir) as inspector:
            facts = inspector.facts(self.image)
            short = facts.id.removeprefix("sha256:")[:12]
            pkg = facts.vllm_package_dir
            if pkg is None:
                raise UserError(f"image {self.image} ({short}) has no vllm package", where="--image",
                                fix="name the image whose vllm file FILE corrects")
            rel = self._relative(pkg)
            original_bytes = inspector.read_file(self.image, posixpath.join(pkg, rel))
            if original_bytes is None:
                raise UserError(f"{rel} is not in image {short} ({self.image}) under {pkg}", where="--target",
                                fix="give the file's path inside the image's vllm package")
            try:
                original = original_bytes.decode("utf-8")
            except UnicodeDecodeError:
                raise UserError(f"{rel} in image {short} is not UTF-8 text", where="--target",
                                fix="patches edit Python source only") from None
            if original == corrected:
                raise UserError(f"{self.file} is the same as {rel} in image {short}: nothing to patch",
                                where=str(self.file), fix="give the corrected file, not a copy of the original")
            body = derive_patch_body(original, corrected, rel)
            if body is None:
                raise UserError(f"the change to {rel} cannot be written as edits or a diff that rebuild {self.file} "
                                "exactly", where=str(self.file), fix="check the file's line endings match the image's")
            doc = {"name": self.name,
                   "description": f"{self.file.name} as corrected on disk, against {self.image} ({short}, "
                                  f"vLLM {facts.vllm_version or 'unknown'})",
                   "target": rel, "applies_to": {"vllm_versions": [version_pattern(facts.vllm_version)]}, **body}
            spec = validate(PatchSpec, doc, where=str(path))
            # The same code a switch runs: the edit applied to this image's file gives FILE's bytes.
            made = materialize([spec], self.image, inspector)[0]
        if made.data != corrected.encode():
            raise OperationError(f"the edits derived for {rel} do not rebuild {self.file} in the deploy code",
                                 fix="report this with both files; write the patch by hand meanwhile")
        head = (f"# Written by `b70deploy patch from-file` from {self.file} against {self.image}\n"
                f"# (image {facts.id}, vLLM {facts.vllm_version or 'unknown'}): original sha256 "
                f"{made.original_sha256}, corrected sha256 {made.sha256}.\n")
        write_atomic(path, (head + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True,
                                             width=1000)).encode())
        return Authored(path, spec, self.image, facts.id, facts.vllm_version, made.original_sha256,
                        sha256(corrected.encode()))

    def _relative(self, pkg: str) -> str:
        """--target as a path inside the vllm package (given absolute, or already relative to it)."""
        target = posixpath.normpath(self.target)
        if posixpath.isabs(target):
            if not target.startswith(pkg.rstrip("/") + "/"):
                raise UserError(f"{self.target} is outside the image's vllm package ({pkg})", where="--target",
                                fix=f"patches edit files under {pkg}")
            return target[len(pkg.rstrip("/")) + 1:]
        return target.removeprefix("vllm/")
