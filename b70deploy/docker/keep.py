"""Keep tags: each revision's image carries a tag of ours, so `docker image prune` cannot
delete what a rollback needs.

Re-pulling `intel/vllm:latest` moves that tag to the new image and leaves the old one with
no tag at all: dangling. `docker image prune -f` (even without -a) deletes every dangling
image no container uses, and the revision pinned to that image id can no longer be rolled
back to. A tag `b70deploy/keep:<project>-<revision>` keeps the image named until `gc`
removes the tags of revisions that were pruned.
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


def keep_tag(project: str, revision: int) -> str:
    return f"{REPO}:{_prefix(project)}-{revision}"


def revision_of(project: str, ref: str) -> int | None:
    """The revision a keep tag of `project` names, None for any other reference."""
    head = f"{REPO}:{_prefix(project)}-"
    rest = ref[len(head):] if ref.startswith(head) else ""
    return int(rest) if rest.isdigit() else None


