"""Which GPUs a node has, and whether its engine can give them to a container.

`discover` is what `init` prints: NVIDIA device nodes, the engine's runtimes and CDI devices
(`docker info`), /dev/kfd, and the PCI vendor of each /dev/dri card, each with where it was
seen. `missing_for` is the switch's preflight of the GPU access a stack renders
(render/gpu.py): one line per thing the engine or host lacks, asked before anything stops.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..render.gpu import CDI_KIND, Platform, selected_ids

if TYPE_CHECKING:
    from ..config.node import Node
    from ..config.schema import Stack

# PCI vendor ids (/sys/class/drm/cardN/device/vendor) of the GPUs vLLM serves on
VENDORS: dict[str, tuple[Platform, str]] = {"0x10de": ("cuda", "NVIDIA"), "0x1002": ("rocm", "AMD"),
                                             "0x8086": ("xpu", "Intel")}


@dataclass(frozen=True)
class Found:
    platform: Platform
    source: str  # where it was seen, for the operator


def engine_info(client: Any) -> dict[str, Any]:
    """`docker info` through the SDK ({} when the engine does not answer)."""
    try:
        info = client.info()
    except Exception:
        return {}
    return info if isinstance(info, dict) else {}


def cdi_devices(info: dict[str, Any], *, local: bool) -> list[str]:
    """The CDI device names the engine knows: `DiscoveredDevices` (Docker 28.2+), else, on this
    host, the names in the spec files of its CDISpecDirs."""
    found = [str(d.get("ID")) for d in info.get("DiscoveredDevices") or []
             if isinstance(d, dict) and d.get("Source") == "cdi" and d.get("ID")]
    if found or not local:
        return found
    for folder in info.get("CDISpecDirs") or []:
        for path in sorted(Path(folder).glob("*")) if Path(folder).is_dir() else []:
            found += _spec_names(path)
    return found


def _spec_names(path: Path) -> list[str]:
    """`kind=name` of each device in a CDI spec file (JSON or YAML)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    try:
        doc = json.loads(text) if path.suffix == ".json" else _yaml(text)
    except ValueError:
        return []
    if not isinstance(doc, dict):
        return []
    kind = doc.get("kind")
    return [f"{kind}={d['name']}" for d in doc.get("devices") or [] if isinstance(d, dict) and "name" in d]


def _yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(str(e)) from None


def _is_char(path: Path) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def discover(info: dict[str, Any], *, dev: Path = Path("/dev"), drm: Path = Path("/sys/class/drm"),
             local: bool = True) -> list[Found]:
    """Every sign of a GPU platform on the node, strongest first; empty means a CPU node."""
    out: list[Found] = []
    nodes = sorted(p.name for p in dev.glob("nvidia[0-9]*")) if local else []
    if nodes:
        out.append(Found("cuda", f"NVIDIA device nodes {', '.join('/dev/' + n for n in nodes)}"))
    if "nvidia" in (info.get("Runtimes") or {}):
        out.append(Found("cuda", "docker info: the engine has the nvidia runtime"))
    cdi = [n for n in cdi_devices(info, local=local) if n.startswith(CDI_KIND + "=")]
    if cdi:
        out.append(Found("cuda", f"docker info: CDI devices {', '.join(cdi)}"))
    if local and _is_char(dev / "kfd"):
        out.append(Found("rocm", f"{dev / 'kfd'} (the ROCm compute node)"))
    for card in sorted(drm.glob("card[0-9]*")) if local else []:
        if not re.fullmatch(r"card\d+", card.name):
            continue  # card0-DP-1: a connector, not a GPU
        try:
            vendor = (card / "device" / "vendor").read_text().strip().lower()
        except OSError:
            continue
        if vendor in VENDORS:
            platform, name = VENDORS[vendor]
            out.append(Found(platform, f"{card}/device/vendor {vendor} ({name})"))
    return out


def choose(found: list[Found]) -> Found:
    """The platform init writes: the first sign found (NVIDIA before AMD before a card's vendor), else cpu."""
    return found[0] if found else Found("cpu", "no NVIDIA device or runtime, no /dev/kfd, no GPU in /sys/class/drm")


def missing_for(node: Node, stack: Stack, client: Any) -> list[str]:
    """What the engine or this host lacks for the stack's GPU access: at most one line, the first
    thing missing (nothing for xpu without a selection: today's render already notes an absent
    /dev/dri, and cpu needs nothing)."""
    cfg = node.config
    gpus = stack.gpus if stack.gpus is not None else cfg.gpus
    ids = selected_ids(gpus)
    local = node.on_this_host
    if cfg.platform == "cuda":
        info = engine_info(client)
        if cfg.nvidia_cdi:
            if not info.get("CDISpecDirs"):
                return [f"the engine at {node.endpoint} has CDI off (docker info shows no CDISpecDirs): "
                        f"nvidia_cdi: true needs Docker 28.2+ or the cdi feature"]
            names = cdi_devices(info, local=local)
            want = [f"{CDI_KIND}={i}" for i in ids] if ids is not None else [f"{CDI_KIND}=all"]
            absent = [w for w in want if w not in names]
            if absent:
                return [f"CDI device {', '.join(absent)} is not on the engine at {node.endpoint} (it has "
                        f"{', '.join(names) or 'none'}; `nvidia-ctk cdi generate` writes the spec)"]
            return []
        runtimes = sorted(info.get("Runtimes") or {})
        if "nvidia" not in runtimes:
            return [f"the engine at {node.endpoint} has no nvidia runtime (docker info Runtimes: "
                    f"{', '.join(runtimes) or 'none'}): the NVIDIA Container Toolkit is not set up"]
        if local and ids is not None:
            absent = [i for i in ids if i.isdigit() and not _is_char(Path(f"/dev/nvidia{i}"))]
            if absent:
                return [f"GPU {', '.join(absent)} is not on this host (no /dev/nvidia{absent[0]})"]
        return []
    if cfg.platform == "cpu" or not local:
        return []
    if cfg.platform == "rocm" and not _is_char(Path(cfg.kfd_device)):
        return [f"{cfg.kfd_device} is not a device node on this host: the ROCm compute node (amdgpu driver) "
                "is missing"]
    if cfg.platform == "rocm" and (node.device_dir is None or not node.device_dir.is_dir()):
        return [f"device_dir {node.device_dir} is not a folder on this host: ROCm needs /dev/dri"]
    if ids is not None and node.device_dir is not None and node.device_dir.is_dir():
        cards = len([p for p in node.device_dir.iterdir() if re.fullmatch(r"renderD\d+", p.name)])
        absent = [i for i in ids if not i.isdigit() or int(i) >= cards]
        if absent:
            return [f"GPU {', '.join(absent)} is not on this host ({node.device_dir} has {cards} render node(s))"]
    return []
