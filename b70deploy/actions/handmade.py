"""Deployments the tool did not render (`adopt`, `import`) and their preflight.

    folder_files    a hand-made compose file, its .env and the files it reads from its folder
    folder_modes    the modes of those files (an operator's 0600 key is stored 0600)
    image_patches   each bind-mounted file that replaces a file of the image, as a patch record
                    (a unified diff against the exact image's file, both hashes)
    outside_mounts  every other bind of the vllm service, from outside the revision's files: its
                    source, target and hash (a tree for a folder), kind patch, added or overlay
    mounts_changed  recorded outside mounts whose bytes on this host changed since
    check_files     the preflight `import` and `rollback` run on such files: what would certainly
                    fail refuses (compose config, the image, a bound path or the model missing);
                    the lint rules over what the command says are warnings
    own_stack       what such a revision is smoke-tested against: its own aliases, /health
    check_drift     a rollback to such files when their image tag has moved: each patched file
                    must still be the one the record was made against
    lint_stack_of   the stack a hand-made vllm service amounts to, for lint
    env_summary     env files fit to print: keys, secret values masked
    check_env_names env files must be named *.env (kept 0600 by that name)
"""

from __future__ import annotations

import contextlib
import difflib
import io
import posixpath
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dotenv import dotenv_values
from pydantic import ValidationError

from ..config.compose_folder import own_files, references
from ..config.node import Node
from ..config.schema import Smoke, Stack
from ..deploy.deploydir import compose_names
from ..deploy.nodeio import VLLM
from ..deploy.plan import ImageInfo
from ..docker.engine import image_info
from ..docker.image_inspect import ImageInspector
from ..docker.keep import REPO as KEEP_REPO
from ..docker.node import compose_config
from ..errors import UserError
from ..lint import LintContext, lint_stack
from ..render.files import COMPOSE_FILE, DOTENV_FILE, Rendered
from ..render.from_compose import ImageEntrypoint, serve_arguments, stack_from_compose, weights_bind
from ..render.masking import NONE, is_secret, mask, private_mode
from ..render.patches import EditError, ImageFiles, apply_unified_diff, sha256
from ..state import caches
from ..state.revisions import Revision


def folder_files(compose: Path, env: Path | None, more: Sequence[tuple[Path, str]] = (),
                 name: str = COMPOSE_FILE) -> dict[str, bytes]:
    """The deployment a compose file describes: itself (as `name`), the files Compose reads after it
    (`more`: each path and the name it has in the project, an override file), the .env Compose
    interpolates from, and every env_file and bind-mounted file they read from their folder."""
    files = {name: _read_compose(compose)}
    for path, called in more:
        files[called] = _read_compose(path)
        files.update(_folder_refs(path, files[called], compose.parent))
    if env is not None:
        try:
            files[DOTENV_FILE] = env.read_bytes()
        except OSError as e:
            raise UserError(f"cannot read {env}: {e.strerror}", fix="give the .env saved with it (--env FILE)") \
                from None
    files.update(_folder_refs(compose, files[name]))
    return files


def folder_modes(files: Mapping[str, bytes], compose: Path, env: Path | None, more: Sequence[tuple[Path, str]] = (),
                 name: str = COMPOSE_FILE) -> dict[str, int]:
    """The permission bits of the file each of folder_files' `files` was read from (an operator's
    0600 key is stored 0600: render.masking.private_mode)."""
    paths = {name: compose, **{called: path for path, called in more}}
    if env is not None:
        paths[DOTENV_FILE] = env
    out = {}
    for n in files:
        with contextlib.suppress(OSError):
            out[n] = stat.S_IMODE(paths.get(n, compose.parent / n).stat().st_mode)
    return out


def _read_compose(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}", fix="give the path of a saved compose file") from None


def _folder_refs(compose: Path, text: bytes, folder: Path | None = None) -> dict[str, bytes]:
    """Every env_file and bind-mounted file a compose file reads from the project's folder: its own, or
    for a file given after the first with -f, the first file's (Compose resolves every file's relative
    paths against the project directory, the first file's folder: naptha-node's
    `-f node/compose-files/vllm-models/X.yml` binds `./node/inference/configs` of the project)."""
    check_env_names(text, where=str(compose))
    folder = folder or compose.parent
    for ref in references(text):
        path = folder / ref.name
        if not path.exists():
            raise UserError(f"{ref.kind} {ref.name} of service {ref.service} is not in {folder}", where=str(compose),
                            fix=f"put the file back at {path} (the deployment needs it), then run again")
    return {name: (folder / name).read_bytes() for name in own_files(text, lambda n: (folder / n).is_file())}


def check_env_names(compose_text: bytes, *, where: str) -> None:
    """Env files are kept 0600 by their name (state.fsio.file_mode: `*.env`); an env_file named
    otherwise would be stored and written back world-readable, so it is refused."""
    for ref in references(compose_text):
        if ref.kind == "env_file" and not ref.name.endswith(".env"):
            raise UserError(f"env_file {ref.name} of service {ref.service} does not end in .env: b70deploy keeps "
                            "env files 0600 by that name", where=where,
                            fix=f"rename it to {ref.name}.env and change env_file: to match")


def clear_secrets(files: Mapping[str, bytes]) -> list[str]:
    """One note per compose file that holds a secret in clear: it is the operator's and kept as
    written (the revision's copy 0600), with the way to take the secret out of it."""
    notes = []
    for name, data in sorted(files.items()):
        if private_mode(name, data) == 0o600 and not name.endswith(".env"):
            keys = NONE.keys_in(data.decode(errors="replace"))
            notes.append(f"{name} holds a secret in clear ({', '.join(keys)}): kept as you wrote it, stored 0600; "
                         f"move each into an env file of mode 0600: a variable into one the service reads with "
                         f"env_file: (then drop it from {name}), a label's value into the project's .env (then "
                         f"write ${{NAME}} in {name})")
    return notes


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


def image_patches(files: Mapping[str, bytes], image_ref: str, inspector: ImageFiles, service: str = VLLM,
                  compose_files: Sequence[str] = (COMPOSE_FILE,)) -> tuple[list[PatchRecord], list[str]]:
    """Patch records for the vllm service's bind-mounted files that replace a file of the
    image, and a note for each mounted file that does not (new, or identical): read in the
    project's compose files that `files` holds (compose.yaml, an override file)."""
    records: list[PatchRecord] = []
    notes: list[str] = []
    seen: set[tuple[str, str]] = set()  # an override file that repeats a bind: one record
    for ref in (r for n in compose_names(files, compose_files) for r in references(files.get(n, b""))):
        if ref.kind != "mount" or ref.service != service or ref.name not in files or ref.target is None \
                or (ref.name, ref.target) in seen:
            continue
        seen.add((ref.name, ref.target))
        original = inspector.read_file(image_ref, ref.target)
        if original is None:
            notes.append(f"{ref.name} -> {ref.target}: the image has no such file; kept as a plain file")
            continue
        rec, note = _patch_record(ref.name, ref.target, files[ref.name], original, image_ref, inspector)
        records += [rec] if rec is not None else []
        notes += [note] if note is not None else []
    return records, notes


def _patch_record(name: str, target: str, mine: bytes, original: bytes, image_ref: str,
                  inspector: ImageFiles) -> tuple[PatchRecord | None, str | None]:
    """`mine` mounted over the image's `original` at `target`: a patch record, or why there is none."""
    if original == mine:
        return None, f"{name} -> {target}: identical to the image's file"
    try:
        old, new = original.decode("utf-8"), mine.decode("utf-8")
    except UnicodeDecodeError:
        return None, f"{name} -> {target}: not UTF-8 text; kept as a plain file, no diff"
    diff = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"a{target}", tofile=f"b{target}"))
    pkg = inspector.vllm_package_dir(image_ref)
    rel = posixpath.relpath(target, pkg) if pkg and target.startswith(pkg + "/") else None
    return PatchRecord(file=name, target=target, package_target=rel, image_id=inspector.image_id(image_ref),
                       vllm_version=inspector.vllm_version(image_ref), original_sha256=sha256(original),
                       sha256=sha256(mine), diff=diff), None


def tree_sha256(path: Path) -> str | None:
    """A file's sha256, or a directory's as a tree (each file's path below it and sha256, sorted);
    None when it cannot be read here."""
    try:
        if path.is_file():
            return sha256(path.read_bytes())
        if not path.is_dir():
            return None
        lines = [f"{f.relative_to(path).as_posix()}\0{sha256(f.read_bytes())}\n"
                 for f in sorted(path.rglob("*")) if f.is_file()]
    except OSError:
        return None
    return sha256("".join(lines).encode())


def outside_mounts(vllm: Mapping[str, Any], folder: Path, image_ref: str, inspector: ImageFiles,
                   skip: frozenset[str] = frozenset()) -> tuple[list[dict[str, Any]], list[str]]:
    """A record for every bind mount of the vllm service (resolved by Compose) whose source is not
    one of the revision's own files below `folder` (nor a target in `skip`, the weights): its
    absolute source, target and content hash (a directory as a tree), and kind: `patch` (replaces
    a file of the image: a diff against it, drift-checked like any patch record), `added` (a file
    the image lacks) or `overlay` (a directory). Notes for what cannot be read here."""
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    for b in vllm.get("volumes") or []:
        if not isinstance(b, dict) or b.get("type") != "bind":
            continue
        source, target = str(b.get("source") or ""), str(b.get("target") or "")
        if not source or not target or target in skip or Path(source).is_relative_to(folder):
            continue
        path = Path(source)
        digest = tree_sha256(path)
        if digest is None:
            notes.append(f"{source} -> {target}: not readable on this host; recorded without a hash")
        base = {"file": source, "source": source, "target": target, "sha256": digest}
        if path.is_dir():
            records.append({**base, "kind": "overlay"})
            continue
        original = inspector.read_file(image_ref, target)
        if original is None:
            records.append({**base, "kind": "added"})
            continue
        rec, note = _patch_record(source, target, path.read_bytes() if digest is not None else b"", original,
                                  image_ref, inspector)
        records.append({**rec.to_dict(), **base, "kind": "patch"} if rec is not None else {**base, "kind": "same"})
        notes += [note] if note is not None else []
    return records, notes


def mounts_changed(records: list[dict[str, Any]] | None) -> list[str]:
    """Recorded mounts from outside the revision whose bytes on this host are no longer the recorded ones."""
    out = []
    for rec in records or []:
        if rec.get("source") and rec.get("sha256"):
            now = tree_sha256(Path(rec["source"]))
            if now != rec["sha256"]:
                what = "is gone" if now is None else "changed on the host since it was recorded"
                out.append(f"{rec['source']} (mounted at {rec['target']}) {what}")
    return out


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
    mounts: list[dict[str, Any]] = field(default_factory=list)  # outside_mounts: the binds from outside the files
    service: str = VLLM  # the vLLM service's name (node config service:)

    @property
    def vllm(self) -> dict[str, Any]:
        svc = (self.compose.get("services") or {}).get(self.service)
        return svc if isinstance(svc, dict) else {}


def check_files(node: Node, files: Mapping[str, bytes], *, name: str, where: str,
                inspector: ImageInspector) -> Checked:
    """The preflight of bytes the tool did not render (an import, and a rollback to one): only
    what would certainly fail refuses them (Compose refuses the files, the image is gone, a bound
    host path or the model is missing); what lint finds in the command is a warning, since the
    bytes ran as they are. Raises UserError."""
    # Lint reads the bind sources Compose resolved, so the files stay on disk until it is done.
    with tempfile.TemporaryDirectory(prefix="b70deploy-check-") as tmp:
        return _check_in(Path(tmp), node, files, name=name, where=where, inspector=inspector)


def _check_in(folder: Path, node: Node, files: Mapping[str, bytes], *, name: str, where: str,
              inspector: ImageInspector) -> Checked:
    doc, error = compose_config(files, node.project, folder, compose_files=node.config.compose_files,
                                profiles=node.config.profiles)
    if doc is None:
        # Compose names our scratch copy; the operator knows the file by `where`.
        said = str(error).replace(f"{folder}/", "")
        raise UserError(f"docker compose config rejects the files: {said}", where=where,
                        fix="`docker compose -f FILE config` shows the whole error; a ${VAR} it needs comes from "
                            "the .env saved with it (--env FILE)")
    services = doc.get("services") or {}
    vllm = services.get(node.service)
    if not isinstance(vllm, dict) or not vllm.get("image"):
        others = ", ".join(sorted(services)) or "none"
        raise UserError(f"no service {node.service!r} with an image in the compose file (it has {others})",
                        where=where, fix="name the vLLM service in the node config (service: NAME), or rename it "
                                         f"to {node.service}")
    info = image_info(_image_to_check(str(vllm["image"]), files))  # a missing image is a UserError naming it
    facts = inspector.facts(info.ref)
    checked = Checked(image=info, compose=doc, service=node.service)
    if node.on_this_host:
        _check_bound(vllm, folder, where)
    checked.mounts, notes = outside_mounts(vllm, folder, info.ref, inspector, weights_targets(vllm))
    checked.warnings += notes
    try:
        family = node.catalogue().load(name).model_family
    except UserError:  # a name the catalogue does not have: no family to compare with
        family = None
    stack = lint_stack_of(name, vllm, facts, family)
    if stack is None:
        checked.warnings.append("the vllm command does not map to a stack (a model in no bind mount, or a flag lint "
                                "cannot read): only compose config, the image and the bound paths were checked")
        return checked
    command = [str(a) for a in vllm.get("command") or []]
    models = _weights_dir(vllm)
    ctx = LintContext(node=node, stack=stack, rendered=Rendered(stack=name, files=dict(files), command=command),
                      models_dir=models, image=facts, compose_config=doc)
    checked.warnings += [f.as_warning() for f in lint_stack(ctx)]
    return checked


def _image_to_check(image: str, files: Mapping[str, bytes]) -> str:
    """The image a copy of the tool's own render runs: its keep tag names the id .env pins
    (VLLM_IMAGE_ID), and the tag may be absent here (`render --out` writes it, the first compose up
    puts it on); the id is what must be on the engine. Any other reference as it is."""
    if not image.startswith(f"{KEEP_REPO}:"):
        return image
    env = dotenv_values(stream=io.StringIO(files.get(DOTENV_FILE, b"").decode(errors="replace")))
    return env.get("VLLM_IMAGE_ID") or image


def weights_targets(vllm: Mapping[str, Any]) -> frozenset[str]:
    """The container targets of the binds that hold the command's weights (not recorded as mounts:
    the node config names that folder)."""
    try:
        return frozenset(stack_from_compose(vllm).weights_at)
    except UserError:
        return frozenset()


def _weights_dir(vllm: Mapping[str, Any]) -> Path | None:
    """The host folder lint finds the command's model below (the bind that holds it)."""
    try:
        out = stack_from_compose(vllm)
    except UserError:
        return None
    host = out.node.get("models_dir")
    return Path(host) if host and Path(host).is_dir() else None


def _check_bound(vllm: Mapping[str, Any], scratch: Path, where: str) -> None:
    """Every bind source of the vllm service, and the model folder the command serves from one,
    on this host: the engine refuses a missing source, or vLLM dies on a missing model."""
    binds = [v for v in vllm.get("volumes") or [] if isinstance(v, dict) and v.get("type") == "bind"]
    for b in binds:
        source = str(b.get("source") or "")
        if source.startswith(str(scratch)):
            continue  # the revision's own files: written back with it
        # The warm-boot caches of a file b70deploy rendered: Compose makes the folder (by default,
        # so `config` omits the key).
        if b.get("target") == caches.CONTAINER_ROOT and (b.get("bind") or {}).get("create_host_path", True):
            continue
        if source and not Path(source).exists():
            raise UserError(f"the vllm service binds {source} (at {b.get('target')}), which is not on this host; "
                            "nothing was stopped", where=where,
                            fix=f"put {source} back (the revision ran with it), or roll back to another revision")
    parsed = serve_arguments(vllm)
    model = parsed.model if parsed is not None else None
    found = weights_bind(model, binds) if model else None
    if found is not None and not str(found[0]).startswith(str(scratch)):
        path = Path(found[0]) / found[2]
        if not path.exists():
            raise UserError(f"the model {model} is {path} on this host, which does not exist; nothing was stopped",
                            where=where, fix=f"put the weights back at {path}, or roll back to another revision")


def own_stack(node: Node, name: str, vllm: Mapping[str, Any]) -> Stack:
    """What a revision of bytes the tool did not render is checked against once it boots: the
    aliases its own command serves and /health, never a catalogue stack's expectations (the
    report's TurboQuant copy serves one alias where a catalogue stack of its name expected two)."""
    parsed = serve_arguments(vllm)
    names = parsed.values.get("served_model_names") if parsed is not None else None
    # The node's settle window, as stack_overlay gives every stack one.
    settle = node.config.stack_overlay.get("settle_seconds")
    # No --served-model-name: vLLM serves under the model argument, and /v1/models must list it.
    return Stack.model_validate({
        "name": name, "image": str(vllm.get("image") or "unknown"), "model": {"path": "unknown"},
        "served_model_names": names, "smoke": Smoke(completion=None, tool_call=False, aliases=parsed is not None),
        **({"settle_seconds": float(settle)} if isinstance(settle, (int, float)) else {})})


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
        if rec.get("kind", "patch") != "patch":
            continue  # an added file or an overlay: no file of the image to compare with
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
