"""Load a stack for a node and render it: the first half of render, diff, lint and switch.

`prepare` is the plain render (no Docker): the draft copy's path is pure and included, the
image pin and the patch mounts are not. `prepare_deploy` is what a deployment writes:
patches applied from the image the tag names now, .env pinned to that image id, linted.
`switch_view` is what `render` and `diff` show: `prepare_deploy` when the image is on the
engine, else the plain render and the list of what it could not resolve.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..config.node import Node
from ..config.schema import Stack
from ..config.secrets_file import load_secrets
from ..docker.produce import produce
from ..errors import B70Error
from ..lint import lint_stack
from ..lint.gather import build_context
from ..render.draft import served_draft_path, stack_copy
from ..render.files import Rendered, render
from ..render.gpu import access_for
from ..render.masking import Secrets
from .stacks import check_patches

if TYPE_CHECKING:
    from ..deploy.plan import ImageInfo
    from ..lint.findings import Finding


@dataclass(frozen=True)
class PlainRender:
    stack: Stack
    rendered: Rendered
    warnings: tuple[str, ...]


def prepare(node: Node, name: str, *, port: int | None = None, project: str | None = None) -> PlainRender:
    """Render `name` as the templates say, without asking the engine anything."""
    stack = node.catalogue().load(name)
    check_patches(node, stack)
    secrets, warnings = load_secrets(node.secrets_env_file)
    rendered = render(stack, node, access_for(node, stack), secrets=secrets, port=port, project=project,
                      draft_path=served_draft_path(stack, node.config.models_target))
    return PlainRender(stack=stack, rendered=rendered, warnings=tuple(warnings))


@dataclass(frozen=True)
class Deployable:
    stack: Stack
    files: dict[str, bytes]
    secrets: Secrets
    image: ImageInfo
    findings: list[Finding]
    patches_upstream: tuple[str, ...] = ()  # a note per listed patch this image's vLLM fixed itself


def prepare_deploy(node: Node, name: str, *, port: int | None = None, project: str | None = None) -> Deployable:
    """The files a deployment of `name` writes, and lint's findings on them."""
    from ..docker.engine import image_info  # the SDK (~0.1 s): `render --no-docker` never asks the engine

    stack = node.catalogue().load(name)
    info = image_info(stack.image)
    # The files as a switch writes them (patches applied, .env pinned), then lint reads them
    produced = produce(node, stack, pin_image=info.id, check_port=port is None, port=port, project=project)
    ctx = build_context(produced)
    return Deployable(stack=stack, files=dict(produced.rendered.files), secrets=produced.rendered.secrets,
                      image=info, findings=lint_stack(ctx), patches_upstream=tuple(produced.patches_upstream))


@dataclass(frozen=True)
class SwitchView:
    """The files `switch STACK` would write, as far as they can be resolved here."""

    stack: Stack
    files: dict[str, bytes]
    secrets: Secrets
    command: list[str]
    resolved: list[str] = field(default_factory=list)    # what is exactly as a switch writes it
    unresolved: list[str] = field(default_factory=list)  # what the plain render could not know
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()      # the render's own remarks (gids, secrets)
    lint_errors: int = 0

    @property
    def exact(self) -> bool:
        return not self.unresolved

    def masked(self, name: str) -> str:
        """A file's text fit to print: secret values replaced."""
        return self.secrets.text(self.files[name].decode(errors="replace"))


def _draft_lines(node: Node, stack: Stack) -> list[str]:
    rel = stack_copy(stack)
    if rel is None or stack.speculative is None:
        return []
    state = "present" if (node.models_dir / rel / "config.json").is_file() else "made by the switch if missing"
    return [f"draft: the command serves the copy {served_draft_path(stack, node.config.models_target)} (host "
            f"{node.models_dir / rel}, max_position_embeddings {stack.speculative.draft_max_position_embeddings}, "
            f"weights hard-linked; {state})"]


def switch_view(node: Node, name: str, *, docker: bool = True) -> SwitchView:
    """What `switch name` writes: pinned image, patch files and their mounts, the draft copy's path,
    when the image is on the engine; else the plain render, and each thing it could not resolve."""
    stack = node.catalogue().load(name)
    check_patches(node, stack)
    load_secrets(node.secrets_env_file)  # bad input refused before the engine is asked (its image facts are cached)
    why = "not asked (--no-docker)"
    if docker:
        try:
            d = prepare_deploy(node, name)
        except B70Error as e:
            why = e.what
        else:
            resolved = [f"image: {stack.image} pinned to {d.image.id} (.env VLLM_IMAGE_ID; VLLM_IMAGE "
                        "names it by its keep tag), as a switch pins it"]
            upstream = {p: n for p in stack.patches for n in d.patches_upstream if n.startswith(f"patch {p} ")}
            resolved += [upstream.get(p, f"patch {p}: edited file in patches/, bind-mounted read-only over the "
                                         "image's file") for p in stack.patches]
            resolved += _draft_lines(node, stack)
            plain = prepare(node, name)
            errors = sum(1 for f in d.findings if f.severity == "error")
            return SwitchView(stack=stack, files=d.files, secrets=d.secrets,
                              command=list(plain.rendered.command), resolved=resolved, warnings=plain.warnings,
                              notes=plain.rendered.notes, lint_errors=errors)
    plain = prepare(node, name)
    unresolved = [f"image: .env names the tag {stack.image}, not the image id a switch pins ({why})"]
    unresolved += [f"patch {p}: no edited file and no mount (the file is read from the image)"
                   for p in stack.patches]
    return SwitchView(stack=stack, files=dict(plain.rendered.files), secrets=plain.rendered.secrets,
                      command=list(plain.rendered.command), resolved=_draft_lines(node, stack),
                      unresolved=unresolved, warnings=plain.warnings, notes=plain.rendered.notes)
