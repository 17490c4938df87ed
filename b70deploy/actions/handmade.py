"""Deployments the tool did not render (`adopt`, `import`) and their preflight.

    folder_files    a hand-made compose file, its .env and the files it reads from its folder
    image_patches   each bind-mounted file that replaces a file of the image, as a patch record
                    (a unified diff against the exact image's file, both hashes)
    check_files     the preflight `import` and `rollback` run on such files: docker compose
                    config, the image present, and the lint rules over what the command says
    check_drift     a rollback to such files when their image tag has moved: each patched file
                    must still be the one the record was made against
    lint_stack_of   the stack a hand-made vllm service amounts to, for lint
    env_summary     env files fit to print: keys, secret values masked
    check_env_names env files must be named *.env (kept 0600 by that name)
"""

from __future__ import annotations

import difflib
import io
import posixpath
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dotenv import dotenv_values
from pydantic import ValidationError

from ..config.compose_folder import own_files, references
from ..config.node import Node
from ..config.schema import Stack
from ..deploy.nodeio import VLLM
from ..deploy.plan import ImageInfo
from ..docker.engine import image_info
from ..docker.image_inspect import ImageInspector
from ..docker.node import compose_config
from ..errors import UserError
from ..lint import LintContext, lint_stack
from ..render.files import COMPOSE_FILE, DOTENV_FILE, Rendered
from ..render.from_compose import ImageEntrypoint, stack_from_compose
from ..render.masking import is_secret, mask
from ..render.patches import EditError, ImageFiles, apply_unified_diff, sha256
from ..state.revisions import Revision


def folder_files(compose: Path, env: Path | None) -> dict[str, bytes]:
    """The deployment a compose file describes: itself (as docker-compose.yml), the .env
    Compose interpolates from, and every env_file and bind-mounted file it reads from its folder."""
    try:
        text = compose.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {compose}: {e.strerror}", fix="give the path of a saved compose file") from None
    files = {COMPOSE_FILE: text}
    if env is not None:
        try:
            files[DOTENV_FILE] = env.read_bytes()
        except OSError as e:
            raise UserError(f"cannot read {env}: {e.strerror}", fix="give the .env saved with it (--env FILE)") \
                from None
    check_env_names(text, where=str(compose))
    folder = compose.parent
    for ref in references(text):
        path = folder / ref.name
        if not path.exists():
            raise UserError(f"{ref.kind} {ref.name} of service {ref.service} is not in {folder}", where=str(compose),
                            fix=f"put the file back at {path} (the deployment needs it), then run again")
    for name in own_files(text, lambda n: (folder / n).is_file()):
        files[name] = (folder / name).read_bytes()
    return files


def check_env_names(compose_text: bytes, *, where: str) -> None:
    """Env files are kept 0600 by their name (state.fsio.file_mode: `*.env`); an env_file named
    otherwise would be stored and written back world-readable, so it is refused."""
    for ref in references(compose_text):
        if ref.kind == "env_file" and not ref.name.endswith(".env"):
            raise UserError(f"env_file {ref.name} of service {ref.service} does not end in .env: b70deploy keeps "
                            "env files 0600 by that name", where=where,
                            fix=f"rename it to {ref.name}.env and change env_file: to match")


def env_summary(files: Mapping[str, bytes]) -> dict[str, str]:
    """Each env file's keys, fit to print: secret-looking values masked, the others left out."""
    out = {}
    for name, data in sorted(files.items()):
        if name.endswith(".env"):
            shown = []
            for key, value in dotenv_values(stream=io.StringIO(data.decode(errors="replace"))).items():
                shown.append(f"{key}={mask(value or '')}" if is_secret(key) else key)
            out[name] = ", ".join(shown)
    return out


@dataclass(frozen=True)
class PatchRecord:
    file: str                 # in the deploy dir (and the revision)
    target: str               # absolute, inside the container
    package_target: str | None  # relative to the vllm package, as patches/*.yaml name targets
    image_id: str
    vllm_version: str | None
    original_sha256: str
    sha256: str
    diff: str

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def image_patches(files: Mapping[str, bytes], image_ref: str,
                  inspector: ImageFiles) -> tuple[list[PatchRecord], list[str]]:
    """Patch records for the vllm service's bind-mounted files that replace a file of the
    image, and a note for each mounted file that does not (new, or identical)."""
    records: list[PatchRecord] = []
    notes: list[str] = []
    image_id = inspector.image_id(image_ref)
    pkg = inspector.vllm_package_dir(image_ref)
    for ref in references(files.get(COMPOSE_FILE, b"")):
        if ref.kind != "mount" or ref.service != VLLM or ref.name not in files or ref.target is None:
            continue
        original = inspector.read_file(image_ref, ref.target)
        mine = files[ref.name]
        if original is None:
            notes.append(f"{ref.name} -> {ref.target}: the image has no such file; kept as a plain file")
            continue
        if original == mine:
            notes.append(f"{ref.name} -> {ref.target}: identical to the image's file")
            continue
        try:
            old, new = original.decode("utf-8"), mine.decode("utf-8")
        except UnicodeDecodeError:
            notes.append(f"{ref.name} -> {ref.target}: not UTF-8 text; kept as a plain file, no diff")
            continue
        diff = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                            fromfile=f"a{ref.target}", tofile=f"b{ref.target}"))
        rel = posixpath.relpath(ref.target, pkg) if pkg and ref.target.startswith(pkg + "/") else None
        records.append(PatchRecord(file=ref.name, target=ref.target, package_target=rel, image_id=image_id,
                                   vllm_version=inspector.vllm_version(image_ref), original_sha256=sha256(original),
                                   sha256=sha256(mine), diff=diff))
    return records, notes


def lint_stack_of(name: str, service: Mapping[str, Any], image: ImageEntrypoint | None,
                  model_family: str | None = None) -> Stack | None:
    """The stack a hand-made vllm service amounts to, for lint (render/from_compose is the one
    mapping); None when it does not map (e.g. a model outside the bind mounts). `model_family`
    is the catalogue's word for the model, which no command states."""
    try:
        doc = stack_from_compose(service, image=image).doc
        return Stack.model_validate({"name": name, **doc, **({"model_family": model_family} if model_family else {})})
    except (UserError, ValidationError):
        return None


@dataclass
class Checked:
    image: ImageInfo
    compose: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def check_files(node: Node, files: Mapping[str, bytes], *, name: str, where: str,
                inspector: ImageInspector) -> Checked:
    """The preflight of a hand-made deployment: Compose accepts the files, the image is on the
    engine, and no lint rule finds an error in what the command says. Raises UserError."""
    # Lint reads the bind sources Compose resolved, so the files stay on disk until it is done.
    with tempfile.TemporaryDirectory(prefix="b70deploy-check-") as tmp:
        return _check_in(Path(tmp), node, files, name=name, where=where, inspector=inspector)


def _check_in(folder: Path, node: Node, files: Mapping[str, bytes], *, name: str, where: str,
              inspector: ImageInspector) -> Checked:
    doc, error = compose_config(files, node.project, folder)
    if doc is None:
        # Compose names our scratch copy; the operator knows the file by `where`.
        said = str(error).replace(f"{folder}/", "")
        raise UserError(f"docker compose config rejects the files: {said}", where=where,
                        fix="`docker compose -f FILE config` shows the whole error; a ${VAR} it needs comes from "
                            "the .env saved with it (--env FILE)")
    vllm = (doc.get("services") or {}).get(VLLM)
    if not isinstance(vllm, dict) or not vllm.get("image"):
        raise UserError(f"no service {VLLM!r} with an image in the compose file", where=where,
                        fix=f"b70deploy drives a service named {VLLM}: rename the vLLM service")
    info = image_info(str(vllm["image"]))  # a missing image is a UserError naming it
    facts = inspector.facts(info.ref)
    command = [str(a) for a in vllm.get("command") or []]
    checked = Checked(image=info, compose=doc)
    try:
        family = node.catalogue().load(name).model_family
    except UserError:  # a name the catalogue does not have: no family to compare with
        family = None
    stack = lint_stack_of(name, vllm, facts, family)
    if stack is None:
        checked.warnings.append("the vllm command does not map to a stack (model outside /models, or a flag "
                                "lint cannot read): only compose config and the image were checked")
        return checked
    ctx = LintContext(node=node, stack=stack, rendered=Rendered(stack=name, files=dict(files), command=command),
                      models_dir=node.models_dir if node.models_dir.is_dir() else None, image=facts,
                      compose_config=doc)
    findings = lint_stack(ctx)
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise UserError(f"lint found {len(errors)} error(s): " + "; ".join(f"[{f.id}] {f.message}" for f in errors),
                        where=where, fix=errors[0].fix)
    checked.warnings += [f.one_line() for f in findings]
    return checked


def check_drift(rev: Revision, image_ref: str, inspector: ImageFiles) -> list[str]:
    """`rev`'s patch records against the image `image_ref` names now. The same image: nothing to
    say. A moved tag: each replaced file must be unchanged in the new image (else the mounted
    copy would undo upstream's changes); raises UserError naming the file and, when the recorded
    diff no longer applies, its first mismatching line."""
    now = inspector.image_id(image_ref)
    if rev.meta.image_id in (None, now):
        return []
    notes = [f"image {image_ref} now names {now[:19]}, revision {rev.number} recorded {str(rev.meta.image_id)[:19]}"]
    for rec in rev.meta.patches or []:
        current = inspector.read_file(image_ref, rec["target"])
        if current is not None and sha256(current) == rec["original_sha256"]:
            notes.append(f"{rec['file']}: {rec['target']} unchanged in the new image")
            continue
        why = "is gone from the new image" if current is None else "changed in the new image"
        if current is not None:
            try:
                apply_unified_diff(current.decode("utf-8", "replace"), rec["diff"])
                why += " (the recorded edit still applies to it: redo the corrected file from the new one)"
            except EditError as e:
                why += f" and the recorded edit no longer applies: {e}"
        raise UserError(f"revision {rev.number} mounts {rec['file']} over {rec['target']}, which {why}",
                        fix=f"docker tag {rev.meta.image_id} {image_ref} to run the image it was made for")
    return notes
