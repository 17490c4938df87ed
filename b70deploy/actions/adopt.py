"""`adopt`: the live hand-made deployment becomes a revision (kind adopt), nothing restarted.

The deploy dir is the hand-made project's folder (`init` writes it so): its compose file,
.env, every env_file and bind-mounted file it reads (deploy.steps.record_live, as the first
switch snapshots a deploy dir it does not know), pinned to the image id the vllm container
runs, with a patch record for each mounted file that replaces one of the image's files.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.names import check_name
from ..config.node import Node
from ..deploy.steps import record_live
from ..docker import discover, engine
from ..docker.image_inspect import ImageInspector
from ..docker.node import DockerNode, compose_config
from ..errors import UserError
from .handmade import check_env_names, clear_secrets, env_summary, image_patches, outside_mounts, weights_targets
from .mutating import mutating


@dataclass
class Adopted:
    revision: int
    stack: str
    created: bool             # False: an existing revision already holds these bytes
    outcome: str
    image_ref: str
    image_id: str
    files: list[str]
    patches: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)   # env file -> its keys, secret values masked

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class Adopt:
    node: Node
    stack: str = "adopted"
    message: str = ""

    def _live(self) -> tuple[Any, dict[str, bytes]]:
        """The running vllm container and the deploy dir's files; refuses what adopt cannot keep."""
        node = self.node
        container = engine.find_container(node.project, node.service)
        if container is None:
            raise UserError(f"no {node.service} container in compose project {node.project}",
                            where=str(node.source or "node config"),
                            fix="start the hand-made stack (docker compose --profile gpu up -d), or set project: "
                            "to its compose project (b70deploy init finds it)")
        labels = container.labels or {}
        folder = labels.get(discover.WORKING_DIR, "")
        if folder and folder != str(node.deploy_dir):
            raise UserError(f"project {node.project} runs from {folder}, not from deploy_dir {node.deploy_dir}",
                            where=str(node.source or "node config"), fix=f"set deploy_dir: {folder}")
        files = labels.get(discover.CONFIG_FILES, "")
        want = ",".join(str(node.deploy_dir / n) for n in node.config.compose_files)
        if files and files != want:
            names = ", ".join(os.path.relpath(f, node.deploy_dir) for f in files.split(","))
            raise UserError(f"project {node.project} runs from {files}, the node config names {want}",
                            where=str(node.source or "node config"),
                            fix=f"set compose_files: [{names}] (b70deploy init writes it)")
        live = DockerNode.production(node).read_deployed()
        first = node.config.compose_files[0]  # whatever Compose found or was given: compose.yaml, -f vllm.yml
        if first not in live:
            raise UserError(f"no {first} in deploy_dir {node.deploy_dir}", where=str(node.source or "node config"),
                            fix="set compose_files: to the project's files in -f order (b70deploy init writes it)")
        for name in node.config.compose_files:
            if name in live:
                check_env_names(live[name], where=str(node.deploy_dir / name))
        return container, live

    def _outside(self, live: dict[str, bytes], image_id: str,
                 inspector: ImageInspector) -> tuple[list[dict[str, Any]], list[str]]:
        """The vllm service's binds from outside the deploy dir's own files, each recorded with its hash."""
        with tempfile.TemporaryDirectory(prefix="b70deploy-adopt-") as tmp:
            cfg = self.node.config
            doc, error = compose_config(live, self.node.project, Path(tmp), compose_files=cfg.compose_files,
                                        profiles=cfg.profiles)
            if doc is None:
                return [], [f"docker compose config refused the live files ({error}): mounts from outside the "
                            "folder are not recorded"]
            vllm = (doc.get("services") or {}).get(self.node.service) or {}
            return outside_mounts(vllm, Path(tmp), image_id, inspector, weights_targets(vllm))

    def run(self) -> Adopted:
        check_name(self.stack, what="--as stack name")
        with mutating(self.node, "adopt") as m:
            container, live = self._live()
            store = m.state.revisions
            image_ref = str((container.attrs.get("Config") or {}).get("Image", "unknown"))
            image_id = str(container.attrs.get("Image"))
            for number in reversed(store.numbers()):
                rev = store.get(number)
                if rev.read_files() == live:
                    notes = [f"the deploy dir already is revision {number}: nothing to adopt"]
                    m.ended("ok", revision=number, summary=f"already revision {number}")
                    if store.current_number() != number and rev.meta.image_id in (None, image_id):
                        # Its bytes were put back by hand and run: that revision is what the node runs.
                        store.set_current(number)
                        notes.append(f"revision {number} is current again (it is what runs)")
                        m.ended("ok", revision=number, summary=f"revision {number} current")
                    return Adopted(revision=number, stack=rev.meta.stack, created=False,
                                   outcome=rev.status.outcome, image_ref=rev.meta.image_ref,
                                   image_id=str(rev.meta.image_id), files=sorted(live),
                                   patches=list(rev.meta.patches or []), env=env_summary(live), notes=notes)
            with ImageInspector(self.node.state_dir) as inspector:
                records, notes = image_patches(live, image_id, inspector, self.node.service,
                                               self.node.config.compose_files)
                mounts, said = self._outside(live, image_id, inspector)
            patches = [r.to_dict() for r in records] + mounts
            notes += said + clear_secrets(live)
            rev = record_live(store, DockerNode.production(self.node), live, stack=self.stack, image_ref=image_ref,
                              image_id=image_id, patches=patches,
                              message=self.message or f"adopted: the hand-made deployment of project "
                                                      f"{self.node.project}")
            store.set_current(rev.number)
            m.ended("ok", revision=rev.number, summary=f"adopted as revision {rev.number}")
        return Adopted(revision=rev.number, stack=self.stack, created=True, outcome=rev.status.outcome,
                       image_ref=image_ref, image_id=image_id, files=sorted(live), patches=patches, notes=notes,
                       env=env_summary(live))
