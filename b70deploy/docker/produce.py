"""Render a stack for a deployment: the one producer of the files a switch writes, with the facts
the engine gave on the way (image, patches applied from it, `docker compose config`, who holds
the port, the GPU access the engine lacks). Lint reads what this produced (lint/gather.py); a
switch writes `Produced.rendered.files`.

Without Docker (`docker=False`) only the pure render runs and the image, compose and port
facts are listed in `skipped`; the Docker SDK is then not even imported (`lint --all
--no-docker` over 1,000 stacks starts without it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import ipaddress
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dotenv import dotenv_values

from ..config.node import Node
from ..config.schema import Stack
from ..config.secrets_file import load_secrets
from ..errors import B70Error, UserError
from ..render.door import DOOR_NETWORK
from ..render.draft import served_draft_path
from ..render.files import DOTENV_FILE, Rendered, render
from ..render.gpu import access_for
from ..render.patches import PatchedFile, PatchSpec, deploy_files, find_patch, materialize, mounts_for, upstream_split
from .keep import keep_tag

if TYPE_CHECKING:
    from .image_inspect import ImageFacts, ImageInspector


@dataclass
class Produced:
    """A stack rendered for a node and what the engine said about it. Fields left None were not
    asked (no Docker)."""

    node: Node
    stack: Stack
    rendered: Rendered
    image: ImageFacts | None = None
    image_error: str | None = None
    patch_errors: dict[str, tuple[str, str]] = field(default_factory=dict)  # patch -> (rule id, message)
    patched: list[PatchedFile] = field(default_factory=list)
    patches_upstream: list[str] = field(default_factory=list)  # a note per patch this vLLM fixed itself
    compose_config: dict[str, Any] | None = None    # `docker compose config --format json`
    compose_error: str | None = None
    port_owner: str | None = None                   # who holds the prod port, when not our project
    subnet_owner: str | None = None                 # the engine's network the host door's subnet overlaps, in words
    gpu_missing: list[str] = field(default_factory=list)  # what the engine lacks for the GPU access
    skipped: list[str] = field(default_factory=list)


def port_owner(node: Node, client: Any) -> str | None:
    """Who holds the node's production port, unless it is free or our own project's."""
    port = node.config.ports.prod
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((node.config.bind_address, port))
            return None
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return None
    for c in client.containers.list(ignore_removed=True):  # one removed meanwhile is not an owner
        ports = (c.attrs.get("NetworkSettings") or {}).get("Ports") or {}
        bound = any(str(b.get("HostPort")) == str(port) for binds in ports.values() if binds for b in binds)
        # The front door on the host's network holds the port itself (render/door.py); its label says which.
        bound = bound or ((c.attrs.get("HostConfig") or {}).get("NetworkMode") == "host"
                          and c.labels.get("b70deploy.door.local", "").endswith(f":{port}"))
        if bound:
            if c.labels.get("com.docker.compose.project") == node.project:
                return None  # our own running stack: the switch drains it first
            return f"container {c.name}"
    return "a process outside Docker"


def subnet_owner(rendered: Rendered, project: str, client: Any) -> str | None:
    """Which of the engine's networks the host door's network (render/door.py `subnet`) would overlap,
    in words, unless it is that network itself (`project`'s); None for files without a host door."""
    env = dotenv_values(stream=io.StringIO(rendered.files.get(DOTENV_FILE, b"").decode(errors="replace")))
    if not env.get("DOOR_SUBNET"):
        return None
    mine = ipaddress.ip_network(str(env["DOOR_SUBNET"]))
    for net in client.networks.list():
        if net.name == f"{project}_{DOOR_NETWORK}":
            continue
        for pool in ((net.attrs.get("IPAM") or {}).get("Config") or []):
            with contextlib.suppress(ValueError, TypeError):
                theirs = ipaddress.ip_network(pool.get("Subnet"), strict=False)
                if theirs.version == 4 and theirs.overlaps(mine):
                    return f"{mine} overlaps the engine's network {net.name} ({theirs})"
    return None


def produce(node: Node, stack: Stack, *, docker: bool = True, inspector: ImageInspector | None = None,
            check_port: bool = True, pin_image: str | None = None, port: int | None = None,
            project: str | None = None) -> Produced:
    """Render `stack` for `node` as a deployment writes it: patches applied from the image,
    .env pinned to `pin_image` (an image id), run under production's keep tag of it, and the
    engine's facts. With docker and no `inspector`, one is made and closed here."""
    if docker and inspector is None:
        from .image_inspect import ImageInspector

        with ImageInspector(node.state_dir) as own:
            return produce(node, stack, docker=True, inspector=own, check_port=check_port,
                           pin_image=pin_image, port=port, project=project)
    skipped: list[str] = []
    patch_errors: dict[str, tuple[str, str]] = {}
    specs: list[PatchSpec] = []
    for name in stack.patches:
        try:
            specs.append(find_patch(node.patches_dir, name))
        except UserError as e:
            patch_errors[name] = ("patch-unknown", e.what)  # the rule gives the fix
    image = None
    image_error = None
    patched: list[PatchedFile] = []
    upstream: list[str] = []
    if docker:
        assert inspector is not None
        try:
            image = inspector.facts(stack.image)
        except UserError as e:
            image_error = e.what
        if image is not None:
            specs, upstream = upstream_split(specs, image.vllm_version)
            for spec in specs:
                try:
                    patched.extend(materialize([spec], stack.image, inspector))
                except UserError as e:
                    patch_errors[spec.name] = ("patch-does-not-apply", e.what)
    else:
        skipped.append("no Docker: image, patch, compose config, GPU runtime and port checks skipped")
    secrets, _warnings = load_secrets(node.secrets_env_file)
    rendered = render(stack, node, access_for(node, stack), secrets=secrets, mounts=mounts_for(patched),
                      patch_files=deploy_files(patched),
                      draft_path=served_draft_path(stack, node.config.models_target),
                      image=pin_image, image_name=keep_tag(node.project, pin_image) if pin_image else None,
                      port=port, project=project,
                      vllm_version=image.vllm_version if image is not None else None)
    if upstream:
        rendered = dataclasses.replace(rendered, notes=(*rendered.notes, *upstream))
    out = Produced(node=node, stack=stack, rendered=rendered, image=image, image_error=image_error,
                   patch_errors=patch_errors, patched=patched, patches_upstream=upstream, skipped=skipped)
    if docker:
        assert inspector is not None
        # `docker compose config` (a subprocess, ~0.1 s) runs while the engine is asked here
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="compose-config") as pool:
            config = pool.submit(_compose_config, out)
            with contextlib.suppress(B70Error):
                out.gpu_missing = _gpu_missing(node, stack, inspector.client)
            if check_port:
                with contextlib.suppress(B70Error):
                    out.port_owner = port_owner(node, inspector.client)
                with contextlib.suppress(B70Error):
                    out.subnet_owner = subnet_owner(rendered, project or node.project, inspector.client)
            config.result()
    return out


def _gpu_missing(node: Node, stack: Stack, client: Any) -> list[str]:
    from .platform import missing_for

    return missing_for(node, stack, client)


def _compose_config(out: Produced) -> None:
    from .node import compose_config

    # The rendered services are in the node's profiles: Compose lists them only with those on.
    cfg = out.node.config
    out.compose_config, out.compose_error = compose_config(out.rendered.files, out.node.project,
                                                           compose_files=cfg.compose_files, profiles=cfg.profiles)
