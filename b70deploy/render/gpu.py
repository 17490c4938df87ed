"""GPU access per platform: what the vllm service needs to see its GPUs, and its read-back from a
compose service (docs/platforms.md cites vLLM's docs for each).

- cuda: a device request (`deploy.resources.reservations.devices`, driver nvidia, `count` or
  `device_ids`, capabilities [gpu]), or CDI names in `devices:` (`nvidia.com/gpu=all`);
- rocm: /dev/kfd and /dev/dri, their owners' numeric gids, `seccomp=unconfined`, SYS_PTRACE;
  a GPU selection goes into CUDA_VISIBLE_DEVICES (vLLM's ROCm platform reads the CUDA name);
- xpu: /dev/dri and its numeric gids, as before, and /dev/dri/by-path bound read-only when the
  host has it; a selection goes into ZE_AFFINITY_MASK (vLLM's XPUPlatform reads it);
- cpu: no devices; SYS_NICE and `seccomp=unconfined` (vLLM's CPU docs).

Every platform keeps `ipc: host` (the template writes it). `access_for` reads the host's device
nodes (the shell half); `access_of` and `read_back` are pure.
"""

from __future__ import annotations

import grp
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .devices import DeviceAccess, scan

if TYPE_CHECKING:
    from ..config.node import Node
    from ..config.schema import Stack

Platform = Literal["cuda", "rocm", "xpu", "cpu"]
PLATFORMS: tuple[Platform, ...] = ("cuda", "rocm", "xpu", "cpu")
Gpus = int | str | list[str] | list[str | int]  # "all", a count, or device ids (strings once validated)
CDI_KIND = "nvidia.com/gpu"
# vLLM's own device_control_env_var (vllm/platforms/rocm.py, xpu.py): the mask its workers read
VISIBLE_VAR: dict[str, str] = {"rocm": "CUDA_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK"}


@dataclass(frozen=True)
class DeviceRequest:
    """One entry of `deploy.resources.reservations.devices` (the Compose Specification's form of
    `docker run --gpus`): `count` and `device_ids` are exclusive."""

    driver: str = "nvidia"
    count: int | Literal["all"] | None = "all"
    device_ids: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ("gpu",)


@dataclass(frozen=True)
class GpuAccess:
    """The service keys that give the vllm container its GPUs."""

    platform: Platform = "xpu"
    devices: tuple[str, ...] = ()         # `devices:` entries: host:container paths or CDI names
    gids: dict[str, int] = field(default_factory=dict)  # group label -> numeric gid (group_add)
    requests: tuple[DeviceRequest, ...] = ()
    cap_add: tuple[str, ...] = ()
    security_opt: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    binds: tuple[str, ...] = ()           # host folders bind-mounted read-only at the same path
    notes: tuple[str, ...] = ()

    @property
    def group_add(self) -> list[str]:
        # Strings of digits: Compose passes them through as gids, never as names.
        return [str(g) for g in sorted(set(self.gids.values()))]


def selected_ids(gpus: Gpus) -> list[str] | None:
    """The device ids a selection names (a count n: 0..n-1); None for all."""
    if isinstance(gpus, list):
        return [str(g) for g in gpus]
    if isinstance(gpus, int):
        return [str(i) for i in range(gpus)]
    return None


def gpu_count(gpus: Gpus) -> int | None:
    """How many GPUs a selection takes; None for all (the node's, not known here)."""
    ids = selected_ids(gpus)
    return None if ids is None else len(ids)


def access_of(platform: Platform, gpus: Gpus, dri: DeviceAccess, *, kfd: Path | None = None,
              kfd_gid: tuple[str, int] | None = None, cdi: bool = False, by_path: Path | None = None) -> GpuAccess:
    """The access for `platform` from what the host showed (`dri`: its /dev/dri scan; `kfd`:
    the ROCm compute node when present, `kfd_gid` its owner; `by_path`: /dev/dri/by-path when
    present, which vLLM's XPU docs mount beside the devices). Pure."""
    ids = selected_ids(gpus)
    if platform == "cuda":
        if cdi:
            names = tuple(f"{CDI_KIND}={i}" for i in ids) if ids is not None else (f"{CDI_KIND}=all",)
            return GpuAccess(platform, devices=names)
        request = DeviceRequest(count=None, device_ids=tuple(str(g) for g in gpus)) if isinstance(gpus, list) \
            else DeviceRequest(count=gpus if isinstance(gpus, int) else "all")
        return GpuAccess(platform, requests=(request,))
    if platform == "cpu":
        return GpuAccess(platform, cap_add=("SYS_NICE",), security_opt=("seccomp=unconfined",))
    env = {VISIBLE_VAR[platform]: ",".join(ids)} if ids is not None else {}
    paths = (f"{dri.device_dir}:{dri.device_dir}",) if dri.device_dir else ()
    gids = dict(dri.gids)
    notes = list(dri.notes)
    if platform == "xpu":
        binds = (str(by_path),) if by_path is not None and dri.device_dir else ()
        return GpuAccess(platform, devices=paths, gids=gids, environment=env, binds=binds, notes=tuple(notes))
    if kfd is None:
        notes.append("/dev/kfd not found: rendering without the ROCm compute node (preflight refuses a switch)")
    else:
        paths = (f"{kfd}:/dev/kfd", *paths)
    if kfd_gid is not None:
        gids.setdefault(*kfd_gid)
    return GpuAccess(platform, devices=paths, gids=gids, cap_add=("SYS_PTRACE",),
                     security_opt=("seccomp=unconfined",), environment=env, notes=tuple(notes))


def _char_owner(path: Path) -> tuple[str, int] | None:
    """(group label, gid) of a character device node; None when it is not one."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    try:
        return grp.getgrgid(st.st_gid).gr_name, st.st_gid
    except KeyError:
        return f"gid{st.st_gid}", st.st_gid


def access_for(node: Node, stack: Stack) -> GpuAccess:
    """The node's GPU access for `stack` (its `gpus:` over the node's), read from this host."""
    cfg = node.config
    platform: Platform = cfg.platform
    gpus = stack.gpus if stack.gpus is not None else cfg.gpus
    if platform in ("cuda", "cpu"):
        return access_of(platform, gpus, DeviceAccess(device_dir=None), cdi=cfg.nvidia_cdi)
    dri = scan(node.device_dir, cfg.gids)
    kfd = Path(cfg.kfd_device) if platform == "rocm" else None
    owner = _char_owner(kfd) if kfd is not None else None
    by_path = dri.device_dir / "by-path" if dri.device_dir else None
    return access_of(platform, gpus, dri, kfd=kfd if owner else None, kfd_gid=owner,
                     by_path=by_path if by_path is not None and by_path.is_dir() else None)


def from_device_access(dri: DeviceAccess, gpus: Gpus = "all") -> GpuAccess:
    """Today's XPU access from a /dev/dri scan (callers that render without a node's platform)."""
    return access_of("xpu", gpus, dri)


# ---------------------------------------------------------------- read back from a compose service


@dataclass(frozen=True)
class ReadBack:
    """The GPU access a compose service grants, as a node config and a stack would say it."""

    platform: Platform | None = None      # None: the service names no GPU access
    gpus: Gpus | None = None              # None: all
    cdi: bool = False
    device_dir: str | None = None         # the /dev/dri folder, host side
    kfd_device: str | None = None
    notes: tuple[str, ...] = ()


def _device_paths(svc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(host, container) of each `devices:` entry (short `a:b[:perm]` or long form); CDI names
    come back as (name, "")."""
    out: list[tuple[str, str]] = []
    for d in svc.get("devices") or []:
        text = str(d.get("source", "")) if isinstance(d, Mapping) else str(d)
        if isinstance(d, Mapping) and text.startswith("/"):
            out.append((text, str(d.get("target") or text)))
            continue
        if not text.startswith("/"):
            out.append((text, ""))  # a CDI name: vendor.com/class=name
            continue
        parts = text.split(":")
        out.append((parts[0], parts[1] if len(parts) > 1 else parts[0]))
    return out


def _request_gpus(req: Mapping[str, Any]) -> Gpus:
    ids = req.get("device_ids")
    if ids:
        return [str(i) for i in ids]
    count = req.get("count", "all")  # `docker compose config` writes all as -1
    return int(count) if str(count).isdigit() and int(count) > 0 else "all"


def _env(svc: Mapping[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        return dict(str(e).split("=", 1) for e in env if "=" in str(e))
    return {str(k): str(v) for k, v in env.items() if v is not None}


def read_back(svc: Mapping[str, Any]) -> ReadBack:
    """The platform and GPU selection a compose service asks for: device requests (driver nvidia),
    `gpus:`, CDI names, /dev/kfd (ROCm), /dev/dri alone (XPU), SYS_NICE alone (CPU). Pure."""
    reservations = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {})
    for req in reservations.get("devices") or []:
        if isinstance(req, Mapping) and (req.get("driver") == "nvidia" or "gpu" in (req.get("capabilities") or [])):
            return ReadBack(platform="cuda", gpus=_request_gpus(req))
    gpus = svc.get("gpus")
    if gpus is not None:
        first = gpus[0] if isinstance(gpus, list) and gpus else {}
        return ReadBack(platform="cuda", gpus="all" if gpus == "all" else _request_gpus(first))
    paths = _device_paths(svc)
    cdi = [h for h, c in paths if not c and h.startswith(CDI_KIND + "=")]
    if cdi:
        names = [h.split("=", 1)[1] for h in cdi]
        return ReadBack(platform="cuda", gpus="all" if "all" in names else names, cdi=True)
    env = _env(svc)
    kfd = next((h for h, c in paths if c == "/dev/kfd" or h.endswith("/kfd")), None)
    dri = next((h for h, c in paths if c == "/dev/dri" or h.rstrip("/").endswith("/dri")), None)
    platform: Platform | None = "rocm" if kfd else "xpu" if dri else None
    if platform is None:
        caps = [str(c) for c in svc.get("cap_add") or []]
        return ReadBack(platform="cpu") if "SYS_NICE" in caps or "CAP_SYS_NICE" in caps else ReadBack()
    mask = env.get(VISIBLE_VAR[platform])
    selection: Gpus | None = [i for i in mask.split(",") if i] if mask else None
    return ReadBack(platform=platform, gpus=selection, device_dir=dri, kfd_device=kfd)


# Service keys the read-back accounts for (from_compose names every other key it drops).
READ_KEYS = frozenset({"deploy", "gpus", "ipc"})


def _deploy_rest(service: Mapping[str, Any]) -> list[str]:
    """The `deploy:` keys other than the GPU reservation, as dotted paths (none is carried)."""
    deploy = service.get("deploy") or {}
    rest = [f"deploy.{k}" for k in deploy if k != "resources"]
    resources = deploy.get("resources") or {}
    rest += [f"deploy.resources.{k}" for k in resources if k != "reservations"]
    reservations = resources.get("reservations") or {}
    rest += [f"deploy.resources.reservations.{k}" for k in reservations if k != "devices"]
    return rest


def carry(service: Mapping[str, Any], node: dict[str, Any], stack: dict[str, Any]) -> list[str]:
    """Put a compose service's GPU access into the node config values (`node`) and the stack
    document (`stack`) `stack from-compose` writes: the platform and its device paths on the
    node, a GPU selection on the stack. Returns a note naming what of `deploy:` is not carried."""
    rest = _deploy_rest(service)
    notes = [f"not carried over (only the GPU reservation of deploy is read): {', '.join(rest)}"] if rest else []
    rb = read_back(service)
    if rb.platform is None:
        return notes
    if rb.platform != "xpu":  # the node config's default
        node["platform"] = rb.platform
    if rb.cdi:
        node["nvidia_cdi"] = True
    if rb.device_dir:
        node["device_dir"] = rb.device_dir
    if rb.kfd_device:
        node["kfd_device"] = rb.kfd_device
    if rb.gpus is not None and rb.gpus != "all":
        stack["gpus"] = rb.gpus
    if rb.device_dir and isinstance(stack.get("mounts"), list):  # by-path: render binds it with the devices
        stack["mounts"] = [m for m in stack["mounts"] if m.get("target") != f"{rb.device_dir.rstrip('/')}/by-path"]
        if not stack["mounts"]:
            del stack["mounts"]
    env = stack.get("env")
    if isinstance(env, dict) and rb.platform in VISIBLE_VAR:
        env.pop(VISIBLE_VAR[rb.platform], None)  # the selection says it; render writes the mask again
        if not env:
            del stack["env"]
    return notes
