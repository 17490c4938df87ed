"""What an image holds, read through the Docker SDK and cached per image id.

Entrypoint and cmd (the entrypoint style), /etc/group, where the vllm package is (found
by asking the image's Python, else by searching, never a hard-coded path), its version,
the Python packages present, and files at patch targets. An image id never changes
content, so the cache (JSON and file copies in the state dir, written atomically) is never
invalidated; a moved tag simply has a new id.

Probe containers (never started with a network, removed when the inspector closes) carry
`b70deploy.role=image-probe` and `b70deploy.state_dir=<the node's state dir>`, so one left by a
killed run can be told apart and traced to the node whose lint made it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import posixpath
import re
import tarfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import docker

from ..errors import OperationError, UserError
from ..render.vllm_args import entrypoint_style
from ..state.fsio import write_atomic
from .engine import client  # the current endpoint's engine (a remote node's, in an inventory)

LABEL = "b70deploy.role"
LABEL_VALUE = "image-probe"
STATE_DIR_LABEL = "b70deploy.state_dir"  # which node's state dir the probe belongs to
CACHE_VERSION = 2  # 2: the probe runs isolated from / (facts of version 1 may name a shadowing folder)

# Run by the image's own Python, isolated (-I) from / (WORKDIR may hold a `vllm/` folder that
# shadows the package: `python3 -c` puts the working dir first on sys.path, the `vllm` console
# script does not). -I also drops PYTHONPATH, so the image's own PYTHONPATH is put back in front,
# where the server's interpreter has it. find_spec on a top-level name does not import the package.
PROBE = r"""
import importlib.metadata as md, importlib.util as u, json, os, re, sys
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
out = {"python": sys.executable, "vllm_dir": None, "vllm_version": None, "packages": [], "modules": {}}
s = u.find_spec("vllm")
if s is not None and s.origin:
    out["vllm_dir"] = os.path.dirname(s.origin)
try:
    out["vllm_version"] = md.version("vllm")
except Exception:
    pass
if out["vllm_version"] is None and out["vllm_dir"]:
    for name in ("_version.py", "version.py", "__init__.py"):
        try:
            m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", open(os.path.join(out["vllm_dir"], name)).read())
        except OSError:
            continue
        if m:
            out["vllm_version"] = m.group(1)
            break
names = set()
for d in md.distributions():
    try:
        names.add(re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower())
    except Exception:
        pass
out["packages"] = sorted(names)
for mod in ("arctic_inference", "vllm_xpu_kernels", "torch"):
    try:
        out["modules"][mod] = u.find_spec(mod) is not None
    except Exception:
        out["modules"][mod] = False
print(json.dumps(out))
"""
_VERSION_IN_SOURCE = re.compile(rb"__version__\s*=\s*['\"]([^'\"]+)")


def entrypoint_facts(ref: str) -> ImageFacts | None:
    """The image's ENTRYPOINT and CMD only (one image inspect, no probe container): what starts vLLM
    when a service writes flags alone. None when the engine does not have the image."""
    try:
        img = client().images.get(ref)
    except docker.errors.DockerException:
        return None
    cfg = img.attrs.get("Config") or {}
    ep = cfg.get("Entrypoint")
    return ImageFacts(ref=ref, id=str(img.id), entrypoint=ep, cmd=cfg.get("Cmd"), entrypoint_style=entrypoint_style(ep))


@dataclass
class ImageFacts:
    ref: str
    id: str
    entrypoint: list[str] | None
    cmd: list[str] | None
    entrypoint_style: str                          # bash-c | vllm-serve | other
    groups: dict[str, int] = field(default_factory=dict)
    python: str | None = None
    vllm_package_dir: str | None = None
    vllm_version: str | None = None
    packages: list[str] = field(default_factory=list)
    modules: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def has_package(self, name: str) -> bool:
        norm = re.sub(r"[-_.]+", "-", name).lower()
        return norm in self.packages or self.modules.get(name.replace("-", "_"), False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImageFacts:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def parse_group_file(text: str) -> dict[str, int]:
    groups: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[2].isdigit():
            groups[parts[0]] = int(parts[2])
    return groups


def _tar_member(data: bytes) -> bytes | None:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar:
            if member.isfile():
                fh = tar.extractfile(member)
                return fh.read() if fh is not None else None
    return None


class ImageInspector:
    """Image facts and files, cached under `state_dir`/image-cache/<id>."""

    def __init__(self, state_dir: Path, client: Any = None) -> None:
        self.state_dir = state_dir.absolute()
        self.cache_dir = state_dir / "image-cache"
        self._client = client
        self._ids: dict[str, str] = {}
        self._facts: dict[str, ImageFacts] = {}
        self._containers: dict[str, Any] = {}

    # -- docker plumbing

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                self._client = client()
                self._client.ping()
            except docker.errors.DockerException as e:
                raise OperationError(f"cannot reach the Docker engine: {e}",
                                     fix="start dockerd or check the node's docker_host") from None
        return self._client

    def _image(self, ref: str) -> Any:
        try:
            return self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            raise UserError(f"image {ref} is not on this node", fix=f"docker pull {ref} (or docker load it)") from None
        except docker.errors.APIError as e:
            raise OperationError(f"docker: cannot inspect image {ref}: {e}",
                                 fix=f"check the engine can read it: docker image inspect {ref}") from None

    def image_id(self, ref: str) -> str:
        if ref not in self._ids:
            self._ids[ref] = str(self._image(ref).id)
        return self._ids[ref]

    def _key(self, ref: str) -> str:
        return self.image_id(ref).removeprefix("sha256:")

    def _create(self, ref: str, entrypoint: list[str], command: list[str] | None = None) -> Any:
        return self.client.containers.create(
            ref, entrypoint=entrypoint, command=command, name=f"b70deploy-probe-{uuid.uuid4().hex[:10]}",
            working_dir="/",
            labels={LABEL: LABEL_VALUE, STATE_DIR_LABEL: str(self.state_dir)}, network_disabled=True, detach=True)

    def _probe_container(self, ref: str) -> Any:
        """One container per image, made once: it runs the Python probe, and every file read
        (get_archive works on a stopped container) uses it. Removed by close()."""
        key = self._key(ref)
        if key not in self._containers:
            self._containers[key] = self._create(ref, ["python3"], ["-I", "-c", PROBE])
        return self._containers[key]

    def close(self) -> None:
        for c in self._containers.values():
            with contextlib.suppress(docker.errors.DockerException):
                c.remove(force=True)
        self._containers.clear()

    def __enter__(self) -> ImageInspector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, c: Any, timeout: float = 60) -> str | None:
        """stdout of a created container run to the end (exit 0), or None when it cannot run."""
        try:
            c.start()
            rc = c.wait(timeout=timeout).get("StatusCode", 1)
            out = c.logs(stdout=True, stderr=False)
        except (docker.errors.DockerException, OSError):
            return None
        return out.decode("utf-8", "replace") if rc == 0 else None

    def _run(self, ref: str, argv: list[str], timeout: float = 60) -> str | None:
        c = None
        try:
            c = self._create(ref, argv[:1], argv[1:])
            return self._start(c, timeout)
        except docker.errors.DockerException:
            return None
        finally:
            if c is not None:
                with contextlib.suppress(docker.errors.DockerException):
                    c.remove(force=True)

    def _read_live(self, ref: str, path: str) -> bytes | None:
        try:
            stream, _ = self._probe_container(ref).get_archive(path)
            return _tar_member(b"".join(stream))
        except docker.errors.NotFound:
            return None

    # -- facts

    def facts(self, ref: str) -> ImageFacts:
        key = self._key(ref)
        if key in self._facts:
            return self._facts[key]
        path = self.cache_dir / f"{key}.json"
        if path.is_file():
            try:
                data = json.loads(path.read_text())
                if data.get("cache_version") == CACHE_VERSION:
                    facts = ImageFacts.from_dict(data["facts"])
                    facts.ref = ref
                    self._facts[key] = facts
                    return facts
            except (OSError, ValueError, KeyError, TypeError):
                pass  # a damaged cache entry is rebuilt
        facts = self._inspect(ref)
        write_atomic(path, json.dumps({"cache_version": CACHE_VERSION, "facts": facts.to_dict()}, indent=2).encode())
        self._facts[key] = facts
        return facts

    def _inspect(self, ref: str) -> ImageFacts:
        img = self._image(ref)
        cfg = img.attrs.get("Config") or {}
        ep = cfg.get("Entrypoint")
        facts = ImageFacts(ref=ref, id=str(img.id), entrypoint=ep, cmd=cfg.get("Cmd"),
                           entrypoint_style=entrypoint_style(ep))
        group = self.read_file(ref, "/etc/group")
        if group is None:
            facts.notes.append("image has no /etc/group")
        else:
            facts.groups = parse_group_file(group.decode("utf-8", "replace"))
        for python in ("python3", "python"):
            if python == "python3":
                out = self._start(self._probe_container(ref))
            else:
                out = self._run(ref, [python, "-I", "-c", PROBE])
            if out:
                try:
                    probe = json.loads(out.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    continue
                facts.python = probe.get("python")
                facts.vllm_package_dir = probe.get("vllm_dir")
                facts.vllm_version = probe.get("vllm_version")
                facts.packages = list(probe.get("packages") or [])
                facts.modules = dict(probe.get("modules") or {})
                break
        if facts.vllm_package_dir is None:
            self._search(ref, facts)
        return facts

    def _search(self, ref: str, facts: ImageFacts) -> None:
        """No usable Python in the image: find the package with `find`, read its version from source."""
        out = self._run(ref, ["find", "/", "-path", "/proc", "-prune", "-o", "-path", "/sys", "-prune", "-o",
                              "-path", "*-packages/*/__init__.py", "-print"])
        if out is None:
            facts.notes.append("could not run python or find in the image: package facts unknown")
            return
        inits = out.split()
        top: dict[str, str] = {}
        for p in inits:
            pkg_dir = posixpath.dirname(p)
            site = posixpath.dirname(pkg_dir)
            if site.endswith(("-packages",)):
                top.setdefault(posixpath.basename(pkg_dir), pkg_dir)
        facts.packages = sorted(re.sub(r"[-_.]+", "-", n).lower() for n in top)
        facts.modules = {m: m in top for m in ("arctic_inference", "vllm_xpu_kernels", "torch")}
        facts.vllm_package_dir = top.get("vllm")
        facts.notes.append("no python in the image: packages found by searching site-packages")
        if facts.vllm_package_dir:
            for name in ("_version.py", "version.py", "__init__.py"):
                data = self.read_file(ref, posixpath.join(facts.vllm_package_dir, name))
                m = _VERSION_IN_SOURCE.search(data or b"")
                if m:
                    facts.vllm_version = m.group(1).decode()
                    break

    # -- the patches.ImageFiles protocol

    def vllm_package_dir(self, ref: str) -> str | None:
        return self.facts(ref).vllm_package_dir

    def vllm_version(self, ref: str) -> str | None:
        return self.facts(ref).vllm_version

    def read_file(self, ref: str, path: str) -> bytes | None:
        """The bytes of `path` in the image (None if absent), cached per image id."""
        base = self.cache_dir / self._key(ref) / hashlib.sha256(path.encode()).hexdigest()
        data_path, absent = base.with_suffix(".bin"), base.with_suffix(".absent")
        if data_path.is_file():
            return data_path.read_bytes()
        if absent.is_file():
            return None
        data = self._read_live(ref, path)
        if data is None:
            write_atomic(absent, path.encode())
        else:
            write_atomic(data_path, data)
        return data
