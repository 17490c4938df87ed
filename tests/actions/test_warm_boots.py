"""Warm boots on the real engine (issue 13): the compile cache survives a switch, keyed by image id.

Checked from outside the tool: the vllm container's own log, its mounts (`docker inspect`),
and the cache folders on the host.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import simkit
import yaml
from kit.simnode import SimNode, docker

pytestmark = pytest.mark.docker

COLD = "Cache the graph for dynamic shape for later use"
WARM = "Directly load the compiled graph(s) for dynamic shape from the cache"


def vllm_container(node: SimNode) -> str:
    out = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={node.project}",
                 "--filter", "label=com.docker.compose.service=vllm").stdout.split()
    assert len(out) == 1, out
    return out[0]


def boot_log(node: SimNode) -> str:
    r = docker("logs", vllm_container(node))
    return r.stdout + r.stderr


def cache_mount(node: SimNode) -> Path:
    mounts = docker("inspect", "-f", '{{range .Mounts}}{{.Source}}={{.Destination}}{{"\\n"}}{{end}}',
                    vllm_container(node)).stdout.split()
    sources = [m.split("=")[0] for m in mounts if m.endswith("=/var/cache/b70deploy")]
    assert len(sources) == 1, mounts
    return Path(sources[0])


def test_second_boot_of_the_same_image_and_stack_loads_its_compile_cache(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    assert COLD in boot_log(node) and WARM not in boot_log(node)
    first = cache_mount(node)
    image = node.running_image()
    assert first == node.state / "caches" / image.replace(":", "-", 1)
    assert list(first.glob("vllm/torch_compile_cache/*/rank_0_0/backbone/vllm_compile_cache.py"))

    node.cli("switch", "beta", "--yes", check=True)  # another --max-model-len: another cache key, cold
    assert COLD in boot_log(node)
    out = node.cli("switch", "alpha", "--yes", check=True)
    log = boot_log(node)
    assert WARM in log and COLD not in log  # the container says it loaded alpha's graphs
    assert cache_mount(node) == first
    assert "before drain" in out.stderr and "page cache: read" in out.stderr
    compile_s = [json.loads((node.state / "revisions" / f"{n:06d}" / "status.json").read_text())["facts"]
                 ["compile_seconds"] for n in (1, 3)]
    assert compile_s[1] < compile_s[0] * 0.2, compile_s  # the boot facts record the shorter compile


def test_another_image_id_gets_its_own_cache_folder(node: SimNode) -> None:
    node.cli("switch", "alpha", "--yes", check=True)
    first = cache_mount(node)
    # Same sim, another image id: a label is enough to make Docker give it a new id.
    tag = f"{node.project}/vllm:next"
    subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=f"FROM {node.tags['bash-c']}\nLABEL b70test=next\n",
                   text=True, capture_output=True, check=True)
    # An image long gone left a cache behind; the cap is below what any folder holds.
    stale = node.state / "caches" / ("sha256-" + "0" * 64)
    (stale / "vllm").mkdir(parents=True)
    (stale / "vllm" / "blob").write_bytes(b"x" * 65536)
    os.utime(stale, (1, 1))
    try:
        cfg = yaml.safe_load(node.config.read_text())
        cfg["image_map"]["intel/vllm:next"] = tag
        cfg["cache_max_gib"] = 0.00001
        node.config.write_text(yaml.safe_dump(cfg))
        doc = {"extends": "alpha", "image": "intel/vllm:next"}
        (node.root / "stacks" / "next.yaml").write_text(yaml.safe_dump(doc))
        node.cli("switch", "next", "--yes", check=True)
        second = cache_mount(node)
        assert node.running_image() != docker("image", "inspect", "-f", "{{.Id}}", node.tags["bash-c"]).stdout.strip()
        assert second != first and second.name == node.running_image().replace(":", "-", 1)
        assert COLD in boot_log(node) and WARM not in boot_log(node)  # alpha's graphs were not offered to it
        assert first.is_dir() and list(second.glob("vllm/torch_compile_cache/*/rank_0_0/backbone/*"))
        # Over the cap the least recently used goes; the running image's and the new one's never.
        assert not stale.exists()
    finally:
        simkit.remove_by_project(node.project)  # nothing may still use the extra image
        docker("rmi", "-f", tag, check=False)
