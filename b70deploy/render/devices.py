"""Numeric gids for GPU device access (the post's pitfall 3).

Docker resolves group names against the image's /etc/group, and intel/vllm has no
`render` group; the host gids that own /dev/dri nodes always work.
"""

from __future__ import annotations

import grp
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class DeviceAccess:
    device_dir: Path | None           # a folder of device nodes, or one device node; None: render without
    gids: dict[str, int] = field(default_factory=dict)  # group label -> numeric gid
    notes: tuple[str, ...] = ()

    @property
    def group_add(self) -> list[str]:
        # Strings of digits: Compose passes them through as gids, never as names.
        return [str(g) for g in sorted(set(self.gids.values()))]


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid{gid}"


def _char_device(path: Path) -> os.stat_result | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if stat.S_ISCHR(st.st_mode) else None


def scan(device_dir: Path | None, pinned: dict[str, int] | None = None) -> DeviceAccess:
    """Read the gids owning the device nodes under `device_dir` (or of `device_dir` itself, when it
    is one device node); pinned gids win."""
    notes: list[str] = []
    found: dict[str, int] = {}
    present: Path | None = None
    node = _char_device(device_dir) if device_dir is not None else None
    if device_dir is None:
        notes.append("no device_dir configured: rendering without GPU devices")
    elif node is not None:  # one device node (/dev/kfd, /dev/dri/card0): the device itself, not a folder
        present = device_dir
        found[_group_name(node.st_gid)] = node.st_gid
    elif not device_dir.is_dir():
        notes.append(f"{device_dir} not found: rendering without GPU devices (no GPU on this host?)")
    else:
        present = device_dir
        for entry in sorted(os.listdir(device_dir)):
            try:
                st = os.stat(device_dir / entry)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                found.setdefault(_group_name(st.st_gid), st.st_gid)
        if not found:
            notes.append(f"{device_dir} has no device nodes: no group_add from it")
    if pinned:
        found.update(pinned)
    return DeviceAccess(device_dir=present, gids=found, notes=tuple(notes))
