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
        fake.keep_image(image)
    store.update_status(2, pinned=True)
    store.set_current(4)
    assert store.prune(1) == [1, 3]
    return node, fake


def test_gc_plans_the_tags_of_images_no_revision_left_runs_and_which_image_goes(tmp_path: Path) -> None:
    node, fake = five_revisions(tmp_path)
    assert fake.kept == {"img-a", "img-b", "img-c"}  # five revisions, three images: three keep tags
    items = Gc(node, io=fake).plan()
    # img-a: revision 1 was pruned but pinned revision 2 runs it; img-b: only pruned revision 3 ran it
    assert [(i.kind, i.name, i.reason, i.frees) for i in items] == [
        ("keep-tag", "keep:img-b", "no revision left runs its image", "img-b")]
    assert fake.kept == {"img-a", "img-b", "img-c"}  # plan changed nothing


def test_gc_removes_them_and_keeps_pinned_current_and_newer(tmp_path: Path) -> None:
    node, fake = five_revisions(tmp_path)
    done = Gc(node, io=fake).run(Quiet())
    assert [(d.item.image, d.ok, d.detail) for d in done] == [("img-b", True, "tag and image removed")]
    assert fake.kept == {"img-a", "img-c"}
    assert fake.images == {"img-a", "img-c"}
    assert Gc(node, io=fake).plan() == []  # nothing left to do
    assert StateDir(node.state_dir).audit.entries(1)[0]["command"] == "gc"


def test_gc_leaves_an_image_a_container_still_uses(tmp_path: Path) -> None:
    node, fake = five_revisions(tmp_path)
    fake.running["vllm"] = {".env": b"VLLM_IMAGE=img-b\n"}  # e.g. someone's hand-run container
    done = Gc(node, io=fake).run(Quiet())
    assert [(d.item.image, d.ok) for d in done] == [("img-b", False)]
    assert "a container is using image img-b" in done[0].detail
    assert "img-b" in fake.kept and "img-b" in fake.images


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
