"""Keep tag names (docker/keep.py): valid Docker references for any compose project name,
read back to the revision of that project only."""

from __future__ import annotations

import re

import pytest

from b70deploy.deploy.plan import recovery
from b70deploy.docker.keep import keep_tag, revision_of

# Docker's reference grammar for repository[:tag] (distribution/reference), lowercase repository.
REF = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
                 r":[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@pytest.mark.parametrize("project", ["b70", "b70-1", "a_b", "x" * 63, "p" + "-q" * 200])
def test_keep_tags_are_valid_refs_and_round_trip(project: str) -> None:
    for rev in (1, 42, 999999):
        ref = keep_tag(project, rev)
        assert REF.match(ref), ref
        assert revision_of(project, ref) == rev


def test_a_keep_tag_belongs_to_one_project() -> None:
    assert revision_of("b70", keep_tag("b70-1", 5)) is None
    assert revision_of("b70-1", keep_tag("b70", 15)) is None
    assert revision_of("b70", "intel/vllm:latest") is None
    assert revision_of("b70", "b70deploy/keep:b70-latest") is None


def test_recovery_prefers_the_registry_digest() -> None:
    pulled = recovery("intel/vllm:latest", "sha256:" + "a" * 64, "intel/vllm@sha256:" + "b" * 64)
    assert pulled.startswith("docker pull intel/vllm@sha256:bbbb")
    assert recovery("intel/vllm:latest", "sha256:" + "a" * 64, None).startswith("docker load -i FILE")
