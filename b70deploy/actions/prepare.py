"""Load a stack for a node and render it: the first half of render, diff, lint and switch."""

from __future__ import annotations

from dataclasses import dataclass

from .. import devices as devices_mod
from ..node import Node
from ..render import Rendered, render
from ..schema import Stack
from ..secrets_file import load_secrets


@dataclass(frozen=True)
class Prepared:
    stack: Stack
    rendered: Rendered
    warnings: tuple[str, ...]
    image_id: str | None = None
    repo_digest: str | None = None


def prepare(node: Node, name: str, *, port: int | None = None, project: str | None = None,
            pin_image: bool = False) -> Prepared:
    """Render `name`; with `pin_image`, .env names the image id the tag points at now."""
    stack = node.catalogue().load(name)
    access = devices_mod.scan(node.device_dir, node.config.gids)
    secrets, warnings = load_secrets(node.secrets_env_file)
    image_id = digest = None
    if pin_image:
        from ..engine import image_info

        info = image_info(stack.image)
        image_id, digest = info.id, info.repo_digest
    rendered = render(stack, node, access, secrets=secrets, port=port, project=project, image=image_id)
    return Prepared(stack=stack, rendered=rendered, warnings=tuple(warnings), image_id=image_id, repo_digest=digest)
