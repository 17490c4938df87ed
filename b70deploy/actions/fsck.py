"""`fsck [--repair]`: the whole revision store checked from its folders, and mended where it can be.

Checked: every revision's meta.json and status.json read; every stored file hashes to what its
meta.json recorded (and each patch record names its file's hash); index.json lists exactly the
folders, with the summaries their records give; `current` names a revision that reads; the
journal reads; each revision's image is on the engine (a gone one is named with how to get it
back: it is never repaired here); no file others can read that the revision recorded private
(0600: an operator's key), stored or in the deploy dir.

--repair, under the deploy lock, mends only with bytes known to be right:
  - a stored file of the current revision that is damaged while the deploy dir's copy has the
    recorded hash: put back from the deploy dir;
  - a status.json that cannot be read: written anew with the outcome and pin the index had
    for it (else `interrupted`: never a rollback target by stack name);
  - any other damage (meta.json unreadable, stored bytes changed): the folder is set aside to
    revisions/damaged/, where nothing lists, deploys or prunes it (its number is never given
    again); when it was the current one, `current` then names the revision whose files the
    deploy dir holds, else those files kept as a new revision, as a switch's snapshot would;
  - an index that disagrees with the folders: rebuilt from them;
  - a file others can read that its revision recorded private: set back to the recorded mode.
"""

from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..deploy.deploydir import read_deployed, read_modes
from ..render.masking import private_mode
from ..state.revisions import DamagedRecord, RevisionStore, Status, Verdict
from ..state.stamps import now_iso
from ..state.statedir import StateDir
from .mutating import mutating

if TYPE_CHECKING:
    from ..config.node import Node


Mend = Literal["put-back", "rewrite-status", "set-aside", "point-current", "rebuild-index", "chmod"]


@dataclass
class Finding:
    what: str                    # the file and what is wrong with it
    fix: str                     # what --repair does, or what the operator does
    revision: int | None = None
    mend: Mend | None = None     # what --repair does (None: it cannot)
    repaired: str | None = None  # what --repair did
    path: str | None = None      # mend chmod: the file, and the mode its revision recorded
    mode: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fsck(node: Node, *, repair: bool = False) -> list[Finding]:
    if not repair:
        return check(node, StateDir(node.state_dir).revisions)
    with mutating(node, "fsck --repair", wait=10.0) as m:
        found = check(node, m.state.revisions)
        for f in found:
            f.repaired = _mend(node, m.state.revisions, f)
        m.ended("ok" if all(f.repaired for f in found) else "failed",
                repaired=[f.repaired for f in found if f.repaired])
        return found


def check(node: Node, store: RevisionStore) -> list[Finding]:
    from ..deploy.plan import recovery
    from .inspect import image_ids

    out: list[Finding] = []
    present = image_ids()
    cur_no = store.current_number()
    live = read_deployed(node.deploy_dir, node.compose_files) if node.deploy_dir.is_dir() else {}
    for n in store.numbers():
        try:
            rev = store.get(n)
        except DamagedRecord as e:
            if e.path.name == "status.json":
                out.append(Finding(e.what, "--repair writes it anew with the index's outcome", n, "rewrite-status"))
            else:
                out.append(Finding(e.what, "--repair sets the revision aside (revisions/damaged/)", n, "set-aside"))
            continue
        damage = rev.damage()
        if damage is not None and n == cur_no and rev.matches(live):
            out.append(Finding(damage, "--repair puts the stored copy back from the deploy dir (it has the recorded "
                               "hashes)", n, "put-back"))
        elif damage is not None:
            out.append(Finding(damage, "--repair sets the revision aside (revisions/damaged/); roll back to another "
                               "revision", n, "set-aside"))
        recorded = rev.meta.modes or {}  # a revision made before modes were recorded promised none
        out += _opened(recorded, rev.files_dir, n)
        if n == cur_no and rev.matches(live):
            out += _opened(recorded, node.deploy_dir, n)
        image = rev.meta.image_id
        if present is not None and image and image not in present:
            out.append(Finding(f"revision {n}: its image {image[:19]} ({rev.meta.image_ref}) is gone from the engine",
                               recovery(rev.meta.image_ref, image, rev.meta.repo_digest), n))
    if cur_no is None and store.current_path.exists():
        out.append(Finding(f"{store.current_path}: not a revision number",
                           "--repair points it at the revision the deploy dir holds (else keeps that as a new one)",
                           mend="point-current"))
    elif cur_no is not None and not store.exists(cur_no):
        out.append(Finding(f"{store.current_path} names revision {cur_no}, which has no folder",
                           "--repair points it at the revision the deploy dir holds (else keeps that as a new one)",
                           mend="point-current"))
    out += [Finding(line, "--repair rebuilds the index from the folders", mend="rebuild-index")
            for line in store.index_disagreement()]
    try:
        StateDir(node.state_dir).journal.last_run()
    except DamagedRecord as e:
        out.append(Finding(e.what, e.fix))
    return out


def _opened(recorded: dict[str, int], folder: Path, n: int) -> list[Finding]:
    """A file under `folder` others can read that revision `n` recorded private (0600)."""
    out = []
    for name, mode in recorded.items():
        try:
            now = stat.S_IMODE((folder / name).stat().st_mode)
        except OSError:
            continue  # a missing stored file is damage, found above
        if not mode & 0o004 and now & 0o004:
            out.append(Finding(f"{folder / name}: mode {now:o}, others can read it; revision {n} recorded {mode:o}",
                               f"--repair sets it to {mode:o} (chmod {mode:o} {folder / name})", n, "chmod",
                               path=str(folder / name), mode=mode))
    return out


def _mend(node: Node, store: RevisionStore, f: Finding) -> str | None:
    n = f.revision
    if f.mend == "rebuild-index":
        store.rebuild_index()
        return "index rebuilt from the folders"
    if f.mend == "point-current":
        return _keep_serving(node, store)
    if n is None or f.mend is None:
        return None
    if not store.exists(n):
        return "set aside with its revision"  # by an earlier finding of the same revision
    if f.mend == "put-back":
        live = read_deployed(node.deploy_dir, node.compose_files)
        now = read_modes(node.deploy_dir, node.compose_files)
        for name in store.get(n).meta.files:
            store.mend_file(n, name, live[name], mode=private_mode(name, live[name], now.get(name)))
        return "stored copy put back from the deploy dir"
    if f.mend == "chmod":
        assert f.path is not None and f.mode is not None
        os.chmod(f.path, f.mode)
        return f"set to {f.mode:o}"
    if f.mend == "rewrite-status":
        row = next((r for r in store.summaries().rows() if r["number"] == n and not r.get("damage")), None)
        outcome: Verdict = row["outcome"] if row else "interrupted"
        store.reset_status(n, Status(outcome=outcome, pinned=bool(row and row["pinned"]), updated=now_iso(),
                                     failure="status.json was written anew by fsck --repair (it could not be read)"))
        return f"status.json written anew (outcome {outcome})"
    aside = store.set_aside(n, now_iso().replace(":", ""))
    if n != store.current_number():
        return f"set aside to {aside}"
    return f"set aside to {aside}; {_keep_serving(node, store)}"


def _keep_serving(node: Node, store: RevisionStore) -> str:
    """The current revision was set aside: `current` names what serves again, the revision the
    deploy dir matches, else its files kept as a new revision (as a switch's snapshot keeps them)."""
    from ..deploy.steps import keep_live
    from ..docker.node import DockerNode

    live = read_deployed(node.deploy_dir, node.compose_files) if node.deploy_dir.is_dir() else {}
    if not live:
        store.clear_current()
        return "the deploy dir is empty: nothing is current"
    match = next((m for m in reversed(store.numbers()) if store.problem(m) is None and store.get(m).matches(live)),
                 None)
    if match is None:
        match = keep_live(store, DockerNode.production(node), live,
                          message="the live deploy dir, kept by fsck --repair when the current revision was set "
                                  "aside").number
        store.set_current(match)
        return f"the deploy dir kept as revision {match}, now current"
    store.set_current(match)
    if store.get(match).status.outcome == "superseded":  # it ran healthy, and serves again
        store.update_status(match, outcome="deployed", updated=now_iso())
    return f"current points at revision {match}, whose files the deploy dir holds"
