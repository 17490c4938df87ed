"""Warm-boot caches: keyed by image id, bounded by least recent use (pure plan, real folders)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from b70deploy.state import caches
from b70deploy.state.caches import Entry, apply_eviction, plan_eviction

A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64
C = "sha256:" + "c" * 64


def test_only_an_image_id_names_a_cache_folder() -> None:
    assert caches.image_key(A) == "sha256-" + "a" * 64
    for not_an_id in ("intel/vllm:latest", "sha256:XYZ", "sha256:../../etc", ""):
        assert caches.image_key(not_an_id) is None
    assert caches.folder_for(Path("/c"), "intel/vllm:latest") is None


def test_every_cache_points_into_the_one_mount() -> None:
    env = caches.container_env()
    assert env["VLLM_CACHE_ROOT"] == "/var/cache/b70deploy/vllm"
    assert env["TRITON_CACHE_DIR"] == "/var/cache/b70deploy/triton"
    assert env["SYCL_CACHE_PERSISTENT"] == "1" and env["SYCL_CACHE_DIR"] == "/var/cache/b70deploy/sycl"


@pytest.mark.parametrize(("platform", "runtime_cache"), [
    ("cuda", {"CUDA_CACHE_PATH": "/var/cache/b70deploy/cuda"}),
    ("rocm", {}),
    ("xpu", {"SYCL_CACHE_PERSISTENT": "1", "SYCL_CACHE_DIR": "/var/cache/b70deploy/sycl"}),
    ("cpu", {}),
])
def test_each_platform_gets_the_shared_caches_and_only_its_own_runtimes(platform: str,
                                                                         runtime_cache: dict[str, str]) -> None:
    # No SYCL variables off XPU, no CUDA driver cache off NVIDIA: a variable another runtime
    # never reads would only say the container has a cache it has not.
    assert caches.container_env(platform) == {"TRITON_CACHE_DIR": "/var/cache/b70deploy/triton",
                                              "VLLM_CACHE_ROOT": "/var/cache/b70deploy/vllm", **runtime_cache}


@pytest.mark.parametrize(("cap", "keep", "gone"), [
    (300, (), []),                       # fits: nothing goes
    (250, (), ["k1"]),                   # the least recently used goes first
    (150, (), ["k1", "k2"]),
    (150, ("k1",), ["k2", "k3"]),        # a kept folder is skipped, the next oldest go
    (50, ("k1", "k2", "k3"), []),        # all kept: over the cap, but nothing may go
])
def test_eviction_removes_the_least_recently_used_until_the_rest_fit(cap: int, keep: tuple[str, ...],
                                                                      gone: list[str]) -> None:
    entries = [Entry("k3", 100, 30.0), Entry("k1", 100, 10.0), Entry("k2", 100, 20.0)]
    assert [e.key for e in plan_eviction(entries, cap, keep)] == gone


def test_prepare_scan_and_apply_on_real_folders(tmp_path: Path) -> None:
    root = tmp_path / "caches"
    for i, image in enumerate((A, B, C)):
        folder = caches.prepare(root, image)
        assert folder is not None and sorted(p.name for p in folder.iterdir()) == [".last-used", "cuda", "sycl",
                                                                                     "triton", "vllm"]
        (folder / "vllm" / "blob").write_bytes(b"x" * 100_000)
        os.utime(folder / caches.USED_MARK, (1000 + i, 1000 + i))  # A oldest, C newest
    entries = caches.scan(root)
    assert [e.key[:8] for e in entries] == ["sha256-a", "sha256-b", "sha256-c"]
    assert all(e.size >= 100_000 for e in entries)
    one = max(e.size for e in entries)
    victims = plan_eviction(entries, 2 * one, keep=[caches.image_key(A) or ""])
    assert [v.key[:8] for v in victims] == ["sha256-b"]  # A is kept though oldest
    assert apply_eviction(root, victims) == [victims[0].key]
    assert sorted(p.name[:8] for p in root.iterdir()) == ["sha256-a", "sha256-c"]


def test_apply_never_deletes_outside_the_root(tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    root = tmp_path / "caches"
    root.mkdir()
    assert apply_eviction(root, [Entry("../precious", 1, 0.0), Entry("precious", 1, 0.0)]) == []
    assert outside.is_dir()
