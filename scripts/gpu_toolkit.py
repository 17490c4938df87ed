#!/usr/bin/env python3
"""A stand-in for the NVIDIA Container Toolkit on the GPU lane's machine, which has the driver but not the toolkit.

Docker gives an NVIDIA GPU to a container the toolkit's way: a Compose `deploy.resources.reservations.devices`
entry with `driver: nvidia` (what b70deploy renders on `platform: cuda`) is a device request, which dockerd
serves only when `nvidia-container-runtime-hook` is on its PATH (moby 20.10, daemon/nvidia_linux.go: the
driver registers only then; it sets NVIDIA_VISIBLE_DEVICES in the container's environment and adds that hook
as a prestart hook). The toolkit's `nvidia` runtime (nvidia-ctk runtime configure --set-as-default) then edits
the OCI spec before runc runs it: the driver's device nodes with their cgroup rules, and its libraries.

This script is both:
  nvidia-container-runtime-hook prestart   nothing to do (the runtime below already edited the spec)
  nvidia-container-runtime ARGS...         for `create --bundle DIR`: the spec's process environment names
                                           NVIDIA_VISIBLE_DEVICES -> every /dev/nvidia* character device
                                           as a device with an `rwm` cgroup rule, and the hook dropped;
                                           B70GPU_HOST_FILES=/usr:/lib:... (the lane's image says it) ->
                                           those host folders bound read-only (the lane's image has no files:
                                           the machine's own Python, torch and vLLM are its contents);
                                           then runc with the same arguments
Every other call and container goes to runc unchanged (the door, image probes without the variable).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

RUNC = os.environ.get("B70GPU_RUNC", "runc")
HOOK = "nvidia-container-runtime-hook"


def nvidia_devices() -> list[Path]:
    found = sorted(Path("/dev").glob("nvidia*"))
    caps = Path("/dev/nvidia-caps")
    if caps.is_dir():
        found += sorted(caps.iterdir())
    return [p for p in found if p.exists() and stat.S_ISCHR(p.stat().st_mode)]


def edit(spec: dict[str, Any], nodes: list[Path]) -> bool:
    """Edit an OCI spec in place as the toolkit's runtime would (`nodes`: the driver's device nodes).
    Returns whether it changed."""
    env = dict(e.partition("=")[::2] for e in spec.get("process", {}).get("env", []))
    changed = False
    if "NVIDIA_VISIBLE_DEVICES" in env:
        linux = spec.setdefault("linux", {})
        devices = linux.setdefault("devices", [])
        rules = linux.setdefault("resources", {}).setdefault("devices", [])
        have = {d["path"] for d in devices}
        for p in nodes:
            st = p.stat()
            major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
            if str(p) not in have:
                devices.append({"path": str(p), "type": "c", "major": major, "minor": minor,
                                "fileMode": stat.S_IMODE(st.st_mode), "uid": 0, "gid": 0})
            rules.append({"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"})
        hooks = spec.get("hooks", {})
        hooks["prestart"] = [h for h in hooks.get("prestart", []) if not h.get("path", "").endswith(HOOK)]
        changed = True
    folders = [f for f in env.get("B70GPU_HOST_FILES", "").split(":") if f.startswith("/") and os.path.isdir(f)]
    if folders:
        mounts = spec.setdefault("mounts", [])
        taken = {m["destination"] for m in mounts}
        # before Docker's own mounts: /etc/hosts, /etc/resolv.conf, /dev/shm then sit over the host's
        mounts[:0] = [{"destination": f, "type": "bind", "source": f, "options": ["rbind", "ro", "rprivate"]}
                      for f in folders if f not in taken]
        changed = True
    return changed


def main(argv: list[str]) -> int:
    name = os.path.basename(argv[0])
    if name == HOOK or argv[1:2] == ["prestart"]:
        sys.stdin.read()  # the container's state; the spec was edited before runc started
        return 0
    args = argv[1:]
    if "create" in args and "--bundle" in args:
        config = Path(args[args.index("--bundle") + 1]) / "config.json"
        spec = json.loads(config.read_text())
        if edit(spec, nvidia_devices()):
            config.write_text(json.dumps(spec))
    os.execvp(RUNC, [RUNC, *args])
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv))
