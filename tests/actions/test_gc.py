"""gc's decision table on the in-memory node: which keep tags go, which images go with them.
The real engine's side (prune -f, then gc) is in test_keep_engine.py."""

from __future__ import annotations

from pathlib import Path

import yaml
from kit.fakenode import FakeNode, Quiet, stack_files

from b70deploy.actions.gc import Gc
from b70deploy.config.node import Node, load_node
from b70deploy.state import caches
from b70deploy.state.statedir import StateDir


def five_revisions(tmp_path: Path) -> tuple[Node, FakeNode]:
    """Revisions 1..5 on images a, a, b, c, c (c is also `intel/vllm:latest`); 4 current, 2 pinned;
    then prune keeps the newest one: 1 and 3 go."""
    cfg = tmp_path / "node.yaml"
    cfg.write_text(yaml.safe_dump({"project": "p1", "state_dir": str(tmp_path / "s"),
                                   "deploy_dir": str(tmp_path / "d")}))
    node = load_node(str(cfg))
    store = StateDir(node.state_dir).revisions
    images = {1: "img-a", 2: "img-a", 3: "img-b", 4: "img-c", 5: "img-c"}
    fake = FakeNode(images=set(images.values()), tags={"img-c": {"intel/vllm:latest"}})
    for n, image in images.items():
        store.create(stack=f"s{n}", kind="switch", files=stack_files(f"s{n}"), image_ref="intel/vllm:latest",
                     image_id=image, repo_digest=None, operator="t@h", message="", created="2026-11-30T00:00:00+0000")
        store.update_status(n, outcome="superseded")
        fake.keep_image(image, n)
    store.update_status(2, pinned=True)
    store.set_current(4)
    assert store.prune(1) == [1, 3]
    return node, fake


def test_gc_plans_the_tags_of_pruned_revisions_only_and_which_image_goes(tmp_path: Path) -> None:
    node, fake = five_revisions(tmp_path)
    items = Gc(node, io=fake).plan()
    assert [(i.kind, i.name, i.reason, i.frees) for i in items] == [
        ("keep-tag", "b70deploy/keep:p1-1", "revision 1 was pruned", None),  # img-a is still pinned revision 2's
        ("keep-tag", "b70deploy/keep:p1-3", "revision 3 was pruned", "img-b"),
    ]
    assert fake.kept == {1: "img-a", 2: "img-a", 3: "img-b", 4: "img-c", 5: "img-c"}  # plan changed nothing


def test_gc_removes_them_and_keeps_pinned_current_and_newer(tmp_path: Path) -> None:
    node, fake = five_revisions(tmp_path)
    done = Gc(node, io=fake).run(Quiet())
    assert [(d.item.revision, d.ok, d.detail) for d in done] == [(1, True, "tag removed"),
                                                                 (3, True, "tag and image removed")]
    assert fake.kept == {2: "img-a", 4: "img-c", 5: "img-c"}
    assert fake.images == {"img-a", "img-c"}
    assert Gc(node, io=fake).plan() == []  # nothing left to do
    assert StateDir(node.state_dir).audit.entries(1)[0]["command"] == "gc"


def test_gc_leaves_an_image_a_container_still_uses(tmp_path: Path) -> None:
    node, fake = five_revisions(tmp_path)
    fake.running["vllm"] = {".env": b"VLLM_IMAGE=img-b\n"}  # e.g. someone's hand-run container
    done = Gc(node, io=fake).run(Quiet())
    assert [(d.item.revision, d.ok) for d in done] == [(1, True), (3, False)]
    assert "a container is using image img-b" in done[1].detail
    assert fake.kept[3] == "img-b" and "img-b" in fake.images


def test_gc_removes_the_cache_folders_of_images_no_revision_runs(tmp_path: Path) -> None:
    node, fake = five_revisions(tmp_path)
    store = StateDir(node.state_dir).revisions
    running = "sha256:" + "c" * 64
    store.create(stack="s6", kind="switch", files=stack_files("s6"), image_ref="intel/vllm:latest", image_id=running,
                 repo_digest=None, operator="t@h", message="", created="2026-11-30T00:00:00+0000")
    gone = "sha256:" + "9" * 64  # revision 3's image in spirit: pruned, nothing runs it
    for image in (running, gone):
        folder = caches.prepare(node.cache_dir, image)
        assert folder is not None
        (folder / "vllm" / "blob").write_bytes(b"x" * 4096)
    stranger = node.cache_dir / "notes"  # not a folder of ours: never planned, never removed
    stranger.mkdir()
    items = [i for i in Gc(node, io=fake).plan() if i.kind == "cache"]
    assert [(Path(i.name).name, i.reason.split(" (")[0]) for i in items] == [
        (caches.image_key(gone), f"no revision runs image {caches.image_key(gone)}")]
    done = [d for d in Gc(node, io=fake).run(Quiet()) if d.item.kind == "cache"]
    assert [(d.ok, d.detail) for d in done] == [(True, "cache folder removed")]
    assert sorted(p.name for p in node.cache_dir.iterdir()) == sorted([caches.image_key(running) or "", "notes"])
