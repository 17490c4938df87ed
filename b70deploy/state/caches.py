"""Warm boots: the compile and kernel caches a vLLM container keeps across switches.

One host folder per image id, `<cache root>/<image key>/`, bind-mounted at CONTAINER_ROOT
in the vllm container; the environment points vLLM's and Triton's caches, and the CUDA driver's
(NVIDIA) or the SYCL runtime's (XPU), into it (docs/warm-boots.md cites where each variable is
read). Keying by image id means a new image never reads what another image compiled: a compile
artefact is only as good as the torch, Triton and driver versions that made it.

The folders are bounded by the node config's `cache_max_gib`: over it, the least recently
used image's folder goes first, never one in `keep` (the images the node runs or may roll
back to). `plan_eviction` is pure (`gc` and the switch call it), `apply_eviction` removes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

CONTAINER_ROOT = "/var/cache/b70deploy"
USED_MARK = ".last-used"   # its mtime is the folder's last use (a boot prepared for it)
GIB = 1 << 30

# Each cache under the one mount: (subfolder, environment it needs, the platforms whose runtime
# reads it; empty: every platform). Values are container paths.
KINDS: tuple[tuple[str, dict[str, str], tuple[str, ...]], ...] = (
    ("vllm", {"VLLM_CACHE_ROOT": f"{CONTAINER_ROOT}/vllm"}, ()),          # torch_compile_cache/ lives here
    ("triton", {"TRITON_CACHE_DIR": f"{CONTAINER_ROOT}/triton"}, ()),
    ("cuda", {"CUDA_CACHE_PATH": f"{CONTAINER_ROOT}/cuda"}, ("cuda",)),  # the CUDA driver's PTX JIT cache
    ("sycl", {"SYCL_CACHE_PERSISTENT": "1", "SYCL_CACHE_DIR": f"{CONTAINER_ROOT}/sycl"}, ("xpu",)),
)

_ID_RE = re.compile(r"^(sha256):([0-9a-f]{12,64})$")


def container_env(platform: str = "xpu") -> dict[str, str]:
    """The variables that send every cache `platform` uses into the mount, sorted."""
    env: dict[str, str] = {}
    for _sub, values, platforms in KINDS:
        if not platforms or platform in platforms:
            env.update(values)
    return dict(sorted(env.items()))


def image_key(image_id: str) -> str | None:
    """The folder name for an image id (`sha256:ab12...` -> `sha256-ab12...`); None when
    `image_id` is not an id (a tag): a cache is never keyed by a name that can move."""
    m = _ID_RE.match(image_id)
    return f"{m.group(1)}-{m.group(2)}" if m else None


def folder_for(root: Path, image_id: str) -> Path | None:
    key = image_key(image_id)
    return root / key if key else None


@dataclass(frozen=True)
class Entry:
    key: str          # the folder name (image_key of its image id)
    size: int         # bytes on disk under it
    last_used: float  # epoch seconds


def _size(folder: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def scan(root: Path) -> list[Entry]:
    """Every image's cache folder under `root` with its size and last use."""
    out: list[Entry] = []
    if not root.is_dir():
        return out
    for p in sorted(root.iterdir()):
        if not p.is_dir() or not p.name.startswith("sha256-"):
            continue
        mark = p / USED_MARK
        used = mark.stat().st_mtime if mark.exists() else p.stat().st_mtime
        out.append(Entry(p.name, _size(p), used))
    return out


def plan_eviction(entries: Sequence[Entry], cap_bytes: int, keep: Iterable[str] = ()) -> list[Entry]:
    """The folders to remove so the rest fit `cap_bytes`: least recently used first, never a
    key in `keep` (kept folders count toward the total; if they alone exceed the cap, every
    other folder goes and the kept ones stay)."""
    kept = set(keep)
    total = sum(e.size for e in entries)
    victims: list[Entry] = []
    for e in sorted(entries, key=lambda e: (e.last_used, e.key)):
        if total <= cap_bytes:
            break
        if e.key in kept:
            continue
        victims.append(e)
        total -= e.size
    return victims


def apply_eviction(root: Path, victims: Iterable[Entry]) -> list[str]:
    """Remove each victim's folder under `root` (only direct children named by a key); returns the keys gone."""
    gone = []
    for e in victims:
        target = root / e.key
        if target.parent != root or image_key(e.key.replace("-", ":", 1)) != e.key:
            continue  # a key that is not one of ours never names a path to delete
        shutil.rmtree(target, ignore_errors=True)
        gone.append(e.key)
    return gone


def prepare(root: Path, image_id: str) -> Path | None:
    """Make the image's cache folder and its subfolders exist and mark it used now; None for a tag."""
    folder = folder_for(root, image_id)
    if folder is None:
        return None
    for sub, _env, _platforms in KINDS:
        (folder / sub).mkdir(parents=True, exist_ok=True)
    mark = folder / USED_MARK
    mark.touch()
    now = time.time()
    os.utime(mark, (now, now))
    return folder


def describe(entries: Sequence[Entry]) -> str:
    return f"{len(entries)} image(s), {sum(e.size for e in entries) / GIB:.2f} GiB"
