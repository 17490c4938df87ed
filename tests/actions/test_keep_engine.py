"""Keep tags on the real engine with the sim image (issue 11 item 3): `docker image prune`
after the tag moved does not break a rollback; `gc` frees what pruned revisions kept.

Each test builds images only it names (SimNode.own_image, labelled with a token), and prunes
with `--filter label=...`: the same prune of dangling images, scoped so the other sessions
sharing this engine keep theirs."""

from __future__ import annotations

import json

import pytest
from kit.simnode import SimNode, docker

from b70deploy.docker.keep import keep_tag
from b70deploy.sim.image import TAGS as SIM_TAGS
from b70deploy.state.caches import image_key

pytestmark = pytest.mark.docker


def prune(node: SimNode) -> None:
    """`docker image prune -f`, for the images this test built only."""
    docker("image", "prune", "-f", "--filter", f"label=b70test.node={node.project}")


def present(image_id: str) -> bool:
    return docker("image", "inspect", image_id, check=False).returncode == 0


def tags_of(image_id: str) -> list[str]:
    out = docker("image", "inspect", "-f", "{{json .RepoTags}}", image_id).stdout
    return sorted(json.loads(out) or [])


def test_prune_after_the_tag_moved_keeps_the_rollback_and_gc_frees_what_pruned_revisions_kept(
        node: SimNode) -> None:
    old = node.own_image("old")
    docker("tag", old, node.tags["bash-c"])  # intel/vllm:latest names `old` (image_map)
    node.cli("switch", "alpha", "--yes", check=True)
    assert node.running_image() == old
    assert keep_tag(node.project, old) in tags_of(old)
    # A re-pull moves the tag: `old` keeps only our tag. Without it, it would be dangling.
    new = node.own_image("new")
    docker("tag", new, node.tags["bash-c"])
    docker("rmi", f"{node.project}/own:old", f"{node.project}/own:new")
    assert tags_of(old) == [keep_tag(node.project, old)]
    node.cli("switch", "beta", "--yes", check=True)
    assert node.running_image() == new
    prune(node)
    assert present(old), "docker image prune deleted the image revision 1 needs"

    # The tag moves on again (the companion, started from the tag, leaves `new` with it).
    docker("tag", SIM_TAGS["bash-c-drift"], node.tags["bash-c"])
    r = node.cli("rollback", "1", "--yes", check=True)
    assert "node on revision 3 (alpha)" in r.stdout
    assert node.answers() == "alpha" and node.running_image() == old

    # Revision 2 (beta, on `new`) is pruned; 1 is pinned, 3 is current: no revision left runs `new`.
    node.cli("pin", "1", check=True)
    assert "pruned 1 revisions: 2" in node.cli("prune", "--keep", "1", check=True).stdout
    # `new`'s warm-boot cache folder goes too: no remaining revision runs it (docs/warm-boots.md).
    cache = node.state / "caches"
    assert (cache / str(image_key(new))).is_dir() and (cache / str(image_key(old))).is_dir()
    plan = node.json("gc", "--dry-run")
    assert [(i["kind"], i["name"], i["reason"].split(" (")[0], i["frees"]) for i in plan] == [
        ("keep-tag", keep_tag(node.project, new), "no revision left runs its image", new),
        ("cache", str(cache / str(image_key(new))), f"no revision runs image {image_key(new)}", None)]
    assert present(new) and (cache / str(image_key(new))).is_dir()  # a dry run changes nothing
    done = node.json("gc")
    assert [(d["name"], d["ok"], d["detail"]) for d in done] == [
        (keep_tag(node.project, new), True, "tag and image removed"),
        (str(cache / str(image_key(new))), True, "cache folder removed")]
    assert not present(new) and not (cache / str(image_key(new))).exists()
    assert (cache / str(image_key(old))).is_dir()
    # pinned revision 1 and current revision 3 run `old`: its one keep tag stays (one per image, issue 39)
    assert tags_of(old) == [keep_tag(node.project, old)]
    prune(node)
    assert present(old) and node.answers() == "alpha"
    assert node.json("gc", "--dry-run") == []


def test_a_gone_image_is_named_by_status_and_history_and_rollback_refuses_before_anything_stops(
        node: SimNode) -> None:
    old = node.own_image("old")
    docker("tag", old, node.tags["bash-c"])
    node.cli("switch", "alpha", "--yes", check=True)
    docker("tag", node.own_image("new"), node.tags["bash-c"])
    docker("rmi", f"{node.project}/own:old", f"{node.project}/own:new")
    node.cli("switch", "beta", "--yes", check=True)
    # Someone removes our tag by hand, then prunes: the image is gone.
    docker("rmi", keep_tag(node.project, old))
    prune(node)
    assert not present(old)

    row = node.json("history")[0]
    assert row["number"] == 1 and row["image_gone"] is True and "docker load" in row["image_fix"]
    shown = node.cli("history", check=True)
    assert "(GONE)" in shown.stdout and f"image {old[:19]} is gone (revision 1); fix: docker load" in shown.stderr
    st = node.json("status")
    assert [(g["revision"], g["stack"]) for g in st["rollback_images_gone"]] == [(1, "alpha")]
    assert "IMAGE GONE: rollback to revision 1 (alpha)" in node.cli("status", check=True).stdout

    before = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={node.project}",
                    "--filter", "label=com.docker.compose.service=vllm").stdout.split()
    r = node.cli("rollback", "1", "--yes")
    assert r.returncode == 2 and "is gone" in r.stderr and "nothing was stopped" in r.stderr
    assert "fix: docker load -i FILE" in r.stderr and "Traceback" not in r.stderr
    after = docker("ps", "-q", "--filter", f"label=com.docker.compose.project={node.project}",
                   "--filter", "label=com.docker.compose.service=vllm").stdout.split()
    assert after == before and node.answers() == "beta"


def test_docker_ps_names_the_image_by_its_keep_tag_and_a_moved_tag_never_changes_what_a_revision_runs(
        node: SimNode) -> None:
    """Issue 39: `docker ps` showed a bare sha256: id. The .env runs the keep tag; the id stays pinned beside it,
    and every compose up puts a moved or removed tag back first (a drain and restore records no revision,
    so no keep step tags it)."""
    old = node.own_image("old")
    docker("tag", old, node.tags["bash-c"])
    node.cli("switch", "alpha", "--yes", check=True)
    name = keep_tag(node.project, old)
    shown = docker("ps", "--format", "{{.Image}}", "--filter", f"label=com.docker.compose.project={node.project}",
                   "--filter", "label=com.docker.compose.service=vllm").stdout.split()
    assert shown == [name]
    env = (node.deploy / ".env").read_text()
    assert f"VLLM_IMAGE='{name}'" in env and f"VLLM_IMAGE_ID='{old}'" in env
    new = node.own_image("new")
    for moved in (lambda: docker("tag", new, name), lambda: docker("rmi", name)):
        node.cli("drain", "--yes", check=True)
        moved()  # someone points the name at another image, or removes it
        node.cli("restore", check=True)
        assert node.answers() == "alpha" and node.running_image() == old
        assert name in tags_of(old) and name not in tags_of(new)


def test_gc_releases_the_former_per_revision_keep_tags_of_images_no_revision_runs(node: SimNode) -> None:
    """Issue 39: keep tags were one per revision (`b70deploy/keep:<project>-<revision>`) before one per image;
    a node upgraded with such tags gets them released by gc like the new ones, and keeps those still needed."""
    old = node.own_image("old")
    docker("tag", old, node.tags["bash-c"])
    node.cli("switch", "alpha", "--yes", check=True)  # revision 1 runs `old`
    former = f"b70deploy/keep:{node.project}"
    docker("tag", old, f"{former}-1")  # as the former tool tagged revision 1
    stale = node.own_image("stale")  # an image only pruned revisions 3 and 4 ran, tagged the former way
    docker("tag", stale, f"{former}-3")
    docker("tag", stale, f"{former}-4")
    docker("rmi", f"{node.project}/own:stale", f"{node.project}/own:old")
    plan = node.json("gc", "--dry-run")
    assert [(i["name"], i["image"], i["frees"]) for i in plan] == [
        (f"{former}-3", stale, None), (f"{former}-4", stale, stale)]
    done = node.json("gc")
    assert [(d["name"], d["ok"], d["detail"]) for d in done] == [
        (f"{former}-3", True, "tag removed"), (f"{former}-4", True, "tag and image removed")]
    assert not present(stale)
    ours = [t for t in tags_of(old) if t.startswith(former)]
    assert ours == sorted([f"{former}-1", keep_tag(node.project, old)])  # revision 1 still runs it
    assert node.answers() == "alpha" and node.json("gc", "--dry-run") == []
