"""Keep tags: each revision's image carries a tag of ours, so `docker image prune` cannot
delete what a rollback needs.

Re-pulling `intel/vllm:latest` moves that tag to the new image and leaves the old one with
no tag at all: dangling. `docker image prune -f` (even without -a) deletes every dangling
image no container uses, and the revision pinned to that image id can no longer be rolled
back to. A tag `b70deploy/keep:<project>-<image id, 12 hex>` keeps the image named until `gc`
finds no revision left that runs it: one tag per image, however many revisions (failed ones
included) ran it (a tag per revision left a dozen tags on one image: issue 39). The same tag is
the name a rendered .env runs (VLLM_IMAGE, beside the pinned VLLM_IMAGE_ID), so `docker ps` shows
it rather than a bare id; DockerNode puts it back on the pinned id before every compose up.
"""

from __future__ import annotations

import hashlib

REPO = "b70deploy/keep"
MAX_TAG = 128  # Docker's limit for the part after the colon


def _prefix(project: str) -> str:
    """The project part of the tag: compose project names are valid tag characters, but may be
    longer than a tag allows; a long one is cut and made unique with a hash."""
    if len(project) <= MAX_TAG - 12:
        return project
    return f"{project[:100]}-{hashlib.sha256(project.encode()).hexdigest()[:8]}"


def keep_tag(project: str, image_id: str) -> str:
    return f"{REPO}:{_prefix(project)}-{_short(image_id)}"


def is_keep_tag(project: str, ref: str) -> bool:
    """Whether `ref` is a keep tag of `project` (not of another project whose name starts the same):
    one per image, or one of the former per-revision tags (`<project>-<revision>`, before issue 39),
    which gc releases the same way once no revision runs their image."""
    head = f"{REPO}:{_prefix(project)}-"
    rest = ref[len(head):] if ref.startswith(head) else ""
    return (len(rest) == SHORT and all(c in "0123456789abcdef" for c in rest)) or (rest.isascii() and rest.isdigit())


SHORT = 12  # hex digits of the image id in a keep tag (as `docker images` shows ids)


def _short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:SHORT]
