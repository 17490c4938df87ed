"""Load a stack for a node and render it: the first half of render, diff, lint and switch.

`prepare` is the plain render (no Docker). `prepare_deploy` is what a deployment writes:
patches applied from the image the tag names now, .env pinned to that image id, linted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config.node import Node
from ..config.schema import Stack
from ..config.secrets_file import load_secrets
from ..docker.engine import image_info
from ..lint import lint_stack
from ..lint.gather import preflight
from ..render import devices as devices_mod
from ..render.files import Rendered, render
from ..render.patches import deploy_files
from .stacks import check_patches

if TYPE_CHECKING:
    from ..docker.engine import ImageInfo
    from ..lint.findings import Finding


@dataclass(frozen=True)
class Prepared:
    stack: Stack
    rendered: Rendered
    warnings: tuple[str, ...]


def prepare(node: Node, name: str, *, port: int | None = None, project: str | None = None) -> Prepared:
    """Render `name` as the templates say, without asking the engine anything."""
    stack = node.catalogue().load(name)
    check_patches(node, stack)
    access = devices_mod.scan(node.device_dir, node.config.gids)
    secrets, warnings = load_secrets(node.secrets_env_file)
    rendered = render(stack, node, access, secrets=secrets, port=port, project=project)
    return Prepared(stack=stack, rendered=rendered, warnings=tuple(warnings))


@dataclass(frozen=True)
class Deployable:
    stack: Stack
    files: dict[str, bytes]
    secret_keys: frozenset[str]
    image: ImageInfo
    findings: list[Finding]


def prepare_deploy(node: Node, name: str, *, port: int | None = None, project: str | None = None) -> Deployable:
    """The files a deployment of `name` writes, and lint's findings on them."""
    stack = node.catalogue().load(name)
    info = image_info(stack.image)
    ctx = preflight(node, stack, pin_image=info.id, port=port, project=project)
    files = dict(ctx.rendered.files)
    files.update(deploy_files(ctx.patched))
    return Deployable(stack=stack, files=files, secret_keys=ctx.rendered.secret_keys, image=info,
                      findings=lint_stack(ctx))
