"""Keep tag names (docker/keep.py): valid Docker references for any compose project name, one per
image, and known as that project's only."""

from __future__ import annotations

import re

import pytest

from b70deploy.deploy.plan import recovery
from b70deploy.docker.keep import is_keep_tag, keep_tag

# Docker's reference grammar for repository[:tag] (distribution/reference), lowercase repository.
REF = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
                 r":[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


IMAGES = ["sha256:" + "0123456789abcdef" * 4, "sha256:" + "f" * 64]


@pytest.mark.parametrize("project", ["b70", "b70-1", "a_b", "x" * 63, "p" + "-q" * 200])
def test_keep_tags_are_valid_refs_one_per_image(project: str) -> None:
    refs = [keep_tag(project, image) for image in IMAGES]
    for ref in refs:
        assert REF.match(ref), ref
        assert is_keep_tag(project, ref)
    assert refs[0].endswith("-0123456789ab") and len(set(refs)) == 2


def test_a_keep_tag_belongs_to_one_project() -> None:
    assert not is_keep_tag("b70", keep_tag("b70-1", IMAGES[0]))
    assert not is_keep_tag("b70-1", keep_tag("b70", IMAGES[0]))
    assert not is_keep_tag("b70", "intel/vllm:latest")
    assert not is_keep_tag("b70", "b70deploy/keep:b70-latest")
    # the former per-revision tags (`<project>-<revision>`) are ours too: gc releases them
    assert is_keep_tag("b70", "b70deploy/keep:b70-12") and is_keep_tag("b70-1", "b70deploy/keep:b70-1-3")
    assert not is_keep_tag("b70", "b70deploy/keep:b70-1-3") and not is_keep_tag("b70", "b70deploy/keep:b70-")


def test_recovery_prefers_the_registry_digest() -> None:
    pulled = recovery("intel/vllm:latest", "sha256:" + "a" * 64, "intel/vllm@sha256:" + "b" * 64)
    assert pulled.startswith("docker pull intel/vllm@sha256:bbbb")
    assert recovery("intel/vllm:latest", "sha256:" + "a" * 64, None).startswith("docker load -i FILE")
