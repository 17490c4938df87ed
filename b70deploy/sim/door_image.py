"""Build the front door's image with `docker import`, the way the sim images are built (image.py):
no registry, no network, a second or two.

The root filesystem: Debian's /usr/bin/caddy (2.6, one Go binary) and the libraries `ldd`
names (libc, libzstd, the loader), busybox with the applets the door's command and the deploy's
`docker exec` calls use (sh, mkdir, printf, rm, cat, wget), /tmp and an /etc/passwd. Caddy's
config is not in the image: the door service hands it over in its environment (render/door.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from filelock import FileLock

from ..docker.proc import run
from ..errors import OperationError
from ..render.door import DEFAULT_IMAGE
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
    ldd,
    write_tar,
)

RECIPE = "b70door-rootfs-1"
APPLETS = ("sh", "mkdir", "printf", "rm", "cat", "wget", "echo", "mv", "date")
CONFIG = ["ENV PATH=/usr/bin:/bin", "ENV HOME=/tmp", "ENV XDG_DATA_HOME=/tmp/caddy-data",
          "ENV XDG_CONFIG_HOME=/tmp/caddy-config", "WORKDIR /", 'ENTRYPOINT ["caddy"]']


def caddy_binary() -> Path:
    found = shutil.which("caddy")
    if found is None:
        raise OperationError("caddy is not installed", fix="apt-get install caddy (scripts/setup.sh does)")
    return Path(found).resolve()


def entries(caddy: Path) -> list[Entry]:
    files = [
        Entry("/usr/bin/caddy", "file", source=caddy, mode=0o755),
        *[Entry(p, "file", source=Path(p).resolve(), mode=0o755) for p in sorted(set(ldd(caddy)))],
        Entry("/bin/busybox", "file", source=BUSYBOX.resolve(), mode=0o755),
        *[Entry(f"/bin/{a}", "symlink", target="busybox") for a in APPLETS],
        Entry("/etc/passwd", "data", data=PASSWD.encode()),
        Entry("/tmp", "dir", mode=0o1777),
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
