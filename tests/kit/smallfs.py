"""A small filesystem of the test's own (tmpfs, mounted as root) for the state dir, and a way
to fill it to a level: what an operator's full disk does to a switch."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from simkit import unavailable

from b70deploy.state.space import free_bytes


@contextlib.contextmanager
def small_fs(path: Path, size_kib: int) -> Iterator[Path]:
    """`path` as a tmpfs of `size_kib` KiB for the block; unmounted afterwards, also on failure."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        unavailable("a small filesystem of the test's own needs root and mount")
    path.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if made.returncode != 0:
        unavailable(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(path: Path, leave: int = 0) -> Path:
    """Write a filler file under `path` until only `leave` bytes are free (0: until ENOSPC)."""
    filler = path / f"filler-{uuid.uuid4().hex[:8]}"
    chunk = bytes(1 << 16)
    with filler.open("wb", buffering=0) as fh:
        while (room := free_bytes(path) - leave) > 0:
            try:
                fh.write(chunk[:min(len(chunk), room)])
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
    return filler
