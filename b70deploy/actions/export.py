"""`export k8s STACK | --revision N`: a stack's deploy files, or a revision's stored bytes, as
Kubernetes manifests (render/k8s.py translates; this gathers the bytes and writes the file).

A stack is rendered by the one producer of deploy files (docker/produce.py), with standby off:
sleep mode's development endpoints would share the API port the Service exposes. Patched files
come out of the image, so a stack with patches needs the engine (or a revision that ran it);
every other stack is exported without Docker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.node import Node
from ..config.schema import Standby
from ..errors import UserError
from ..render import k8s, production_stack
from ..state.fsio import write_atomic
from .stacks import check_patches


@dataclass(frozen=True)
class Exported:
    export: k8s.Export
    source: k8s.Source
    path: Path | None            # the file written; None: printed
    notes: tuple[str, ...] = field(default_factory=tuple)
    values: dict[str, Any] | None = None  # --helm-values: the chart's values instead of the manifests

    @property
    def yaml(self) -> bytes:
        return self.export.yaml() if self.values is None else k8s.dump([self.values], explicit_start=False)

    def to_json(self) -> dict[str, Any]:
        e = self.export
        return {"stack": self.source.stack, "revision": self.source.revision, "file": str(self.path) if self.path
                else None, "image": self.source.image, "objects": e.summary(), "command": e.command, "args": e.args,
                "helm_values": self.values is not None,
                "secret": {"name": e.secret_name, "keys": list(e.secret_keys)} if e.secret_name else None,
                "notes": [*self.notes, *e.notes]}


def source_for(node: Node, files: Mapping[str, bytes], stack: str, image: str, env: Mapping[str, str], gpus: Any,
               *, revision: int | None = None, secret_keys: frozenset[str] | None = None) -> k8s.Source:
    """What render/k8s.py needs beside the deploy files, from the node config."""
    cfg = node.config
    return k8s.Source(files=files, stack=stack, name=k8s.dns_label(f"{node.project}-{stack}"), service=node.service,
                      image=image, stack_env=env, platform=cfg.platform, gpus=gpus if gpus is not None else cfg.gpus,
                      port=cfg.ports.prod, boot_timeout=cfg.timeouts.health, revision=revision,
                      secret_keys=secret_keys)


@dataclass
class ExportK8s:
    node: Node
    stack: str | None = None
    revision: int | None = None
    out: Path | None = None      # a folder: <out>/<name>.yaml; none: the YAML is the result
    options: k8s.Options = field(default_factory=k8s.Options)
    docker: bool = True
    helm_values: bool = False    # values for vLLM production-stack's chart (render/production_stack.py)

    def plan(self) -> Exported:
        """The manifests, written nowhere."""
        if (self.stack is None) == (self.revision is None):
            raise UserError("export k8s takes a STACK or --revision N", fix="name one of them")
        k8s.check_options(self.options)
        source, notes = self._from_revision() if self.revision is not None else self._from_stack()
        export = k8s.render(source, self.options)
        values = production_stack.values(source, export) if self.helm_values else None
        name = f"{source.name}-values.yaml" if values is not None else f"{source.name}.yaml"
        path = self.out / name if self.out is not None else None
        return Exported(export=export, source=source, path=path, notes=tuple(notes), values=values)

    def run(self) -> Exported:
        done = self.plan()
        if done.path is not None:
            write_atomic(done.path, done.yaml, mode=0o644)  # no secret in it: only the Secret's name
        return done

    def _from_stack(self) -> tuple[k8s.Source, list[str]]:
        from ..docker.produce import produce
        from ..render.standby import standby_of

        assert self.stack is not None
        node = self.node
        stack = node.catalogue().load(self.stack)
        check_patches(node, stack)
        notes = []
        if standby_of(stack, node).sleeps:
            notes.append("standby: exported without sleep mode (its development endpoints would share the API port "
                         "the Service exposes); the switch's standby stays on Compose nodes")
        stack = stack.model_copy(update={"standby": Standby()})
        if stack.patches and not self.docker:
            raise UserError(f"patch {stack.patches[0]}: its edited file is made from the image's own file, which "
                            "--no-docker does not read", where=f"stack {stack.name}",
                            fix="export with the image on the engine (no --no-docker), or export --revision N of a "
                                "switch that ran this stack")
        produced = produce(node, stack, docker=bool(stack.patches), check_port=False)
        if produced.image_error:
            raise UserError(produced.image_error, where=f"stack {stack.name}: image",
                            fix=f"pull {stack.image} on the engine (its patched files come from it)")
        for patch, (_rule, what) in produced.patch_errors.items():
            raise UserError(what, where=f"patch {patch}", fix="`b70deploy lint STACK` says what to change")
        notes += list(produced.patches_upstream)
        if "@sha256:" not in stack.image:
            notes.append(f"image: {stack.image} is a tag; a cluster pulls whatever it names then (export --revision "
                         "N gives the digest that ran, when the engine knew one)")
        rendered = produced.rendered
        return source_for(self.node, rendered.files, stack.name, stack.image, stack.env, stack.gpus,
                          secret_keys=rendered.secret_keys), notes

    def _from_revision(self) -> tuple[k8s.Source, list[str]]:
        from ..state.revisions import RevisionStore

        assert self.revision is not None
        rev = RevisionStore(self.node.state_dir).get(self.revision)
        files = rev.verified_files()
        doc = rev.meta.stack_doc or {}
        image = rev.meta.repo_digest or rev.meta.image_ref
        notes = [] if rev.meta.repo_digest else [f"image: revision {rev.number} knows no registry digest; the "
                                                 f"tag {rev.meta.image_ref} is exported"]
        env = {str(k): str(v) for k, v in (doc.get("env") or {}).items()}
        return source_for(self.node, files, rev.meta.stack, image, env, doc.get("gpus"), revision=rev.number), notes
