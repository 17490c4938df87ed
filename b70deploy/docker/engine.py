"""The Docker Engine through its API (docker SDK): images, containers, logs.

Compose does the lifecycle (up, down, create); this module looks and listens, and stops what a
drain stops, starts what a drain created and holds off a booting container's restarts, where
Compose would be slower (its own project load before each call; one service after the other).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import docker
from docker.context import ContextAPI
from docker.errors import APIError, DockerException, ImageNotFound, NotFound

from ..deploy.plan import ImageInfo
from ..errors import OperationError, UserError
from . import endpoint
from .containers import ContainerState, state_from
from .proc import engine_address

# The API version each endpoint negotiated, asked once per process: version="auto" costs one more
# request for every client made (a switch makes a dozen), and over ssh:// the SDK opens a new ssh
# session (and a `docker system dial-stdio` on the host) for every request, about 0.3 s each.
_api_versions: dict[tuple[tuple[str, str], ...], str] = {}


def client() -> Any:
    """An SDK client for the engine of the current endpoint (see endpoint.py)."""
    target = endpoint.current()
    try:
        if "DOCKER_CONTEXT" in target:
            return _context_client(target["DOCKER_CONTEXT"])
        if target:
            key = tuple(sorted(target.items()))
            # use_ssh_client: ssh:// goes through the system ssh (its config, keys, agent).
            made = docker.from_env(version=_api_versions.get(key, "auto"), timeout=60,
                                   environment={**os.environ, **target}, use_ssh_client=True)
            _api_versions.setdefault(key, made.api.api_version)
            return made
        local = (("DOCKER_HOST", os.environ.get("DOCKER_HOST", "")),)  # the environment names the engine
        made = docker.from_env(version=_api_versions.get(local, "auto"), timeout=60)
        _api_versions.setdefault(local, made.api.api_version)
        return made
    except DockerException as e:
        where = engine_address()
        if "paramiko" in str(e):  # the SDK's ssh:// transport imports paramiko even to shell out
            raise OperationError(f"the docker SDK cannot open {where}: paramiko is not installed",
                                 fix="pip install 'docker[ssh]' (b70deploy's own install brings it)") from None
        raise OperationError(f"cannot reach the Docker Engine at {where}: {e}",
                             fix="start dockerd or check the node's docker_host") from None


def _context_client(name: str) -> Any:
    ctx = ContextAPI.get_context(name)
    if ctx is None:
        raise UserError(f"docker context {name!r} does not exist", fix="`docker context ls` lists them")
    host = ctx.Host or "unix:///var/run/docker.sock"
    return docker.DockerClient(base_url=host, tls=ctx.TLSConfig or False, version="auto", timeout=60,
                               use_ssh_client=host.startswith("ssh://"))


def image_info(ref: str) -> ImageInfo:
    """Resolve a tag (or id) to the image it names now; a missing image is bad input."""
    try:
        img = client().images.get(ref)
    except ImageNotFound:
        raise UserError(f"image {ref} is not on this engine",
                        fix=f"pull or build it first (docker pull {ref}); b70deploy never pulls during a switch") \
            from None
    digests = img.attrs.get("RepoDigests") or []
    return ImageInfo(ref=ref, id=img.id, repo_digest=digests[0] if digests else None, tags=tuple(img.tags))


def image_id_of(ref: str) -> str | None:
    """The id of the image `ref` names now; None when it names none."""
    try:
        return str(client().images.get(ref).id)
    except ImageNotFound:
        return None


def image_present(image_id: str) -> bool:
    try:
        client().images.get(image_id)
        return True
    except ImageNotFound:
        return False


def tag_image(image_id: str, ref: str) -> None:
    """Point `ref` (repo:tag) at `image_id`, moving it if it named another image."""
    repo, tag = ref.rsplit(":", 1)
    client().images.get(image_id).tag(repo, tag)


def tagged(repo: str) -> dict[str, str]:
    """Every reference of `repo` on the engine -> the id of the image it names."""
    return {t: str(img.id) for img in client().images.list(name=repo) for t in img.tags if t.startswith(f"{repo}:")}


def untag(ref: str) -> tuple[bool, str | None]:
    """Remove the reference `ref`; the engine deletes the image too when that was its last tag.
    (whether the image was deleted, None) or (False, why the engine refused: e.g. a container
    uses the image and this is its last tag)."""
    try:
        result = client().api.remove_image(ref)
    except ImageNotFound:
        return False, None
    except APIError as e:
        return False, str(e.explanation or e)
    return any("Deleted" in entry for entry in result or []), None


def stop_services(project: str, services: Sequence[str], *, timeout: int) -> None:
    """Stop the project's running containers of `services`, all at once: what `docker compose
    stop --timeout` does (the container's stop signal, SIGKILL after `timeout`), without Compose
    loading the project first and stopping one service after the other (a drain is the start of
    the clients' outage)."""
    found = client().containers.list(ignore_removed=True, filters={
        "label": [f"com.docker.compose.project={project}", "com.docker.compose.oneoff=False"]})
    mine = [c for c in found if c.labels.get("com.docker.compose.service") in services]

    def stop(container: Any) -> None:
        try:
            container.stop(timeout=timeout)
        except NotFound:  # removed meanwhile: stopped enough
            pass
        except APIError as e:
            raise OperationError(f"stopping {container.name} failed: {e.explanation or e}",
                                 fix=f"docker stop {container.name}, then run the command again") from None

    if mine:
        with ThreadPoolExecutor(max_workers=len(mine), thread_name_prefix="stop") as pool:
            for done in [pool.submit(stop, c) for c in mine]:
                done.result()


def compose_name(project: str, service: str) -> str:
    """The name Compose gives the service's (one) container."""
    return f"{project}-{service}-1"


def start_created(project: str, service: str) -> bool:
    """Start the service's container if it is created and never started (a drain made it from
    the deploy dir's files); False when there is no such container (Compose must bring it up)."""
    name = compose_name(project, service)
    try:
        container = client().containers.get(name)
        if container.status != "created":
            return False
        container.start()
    except NotFound:
        return False
    except APIError as e:
        raise OperationError(f"starting {name} failed: {e.explanation or e}",
                             fix=f"docker start {name} for the engine's full answer") from None
    return True


def set_restart_policy(container: Any, policy: dict[str, Any]) -> None:
    """Change the container's restart policy in place (`docker update --restart`); Compose's
    config hash does not include it, so the next `up` does not recreate the container for it."""
    try:
        container.update(restart_policy=policy)
    except NotFound:  # removed meanwhile: nothing left to restart
        pass
    except APIError as e:
        raise OperationError(f"cannot set the restart policy of {container.name}: {e.explanation or e}",
                             fix=f"docker update --restart {policy['Name']} {container.name}") from None


def find_container(project: str, service: str) -> Any | None:
    found = client().containers.list(all=True, ignore_removed=True, filters={  # removed meanwhile: gone
        "label": [f"com.docker.compose.project={project}", f"com.docker.compose.service={service}"]})
    return found[0] if found else None


def network_exists(name: str) -> bool:
    # the engine's `name` filter matches a part of the name: compared whole here
    return any(n.name == name for n in client().networks.list(names=[name]))


def remove_strays(project: str, service: str) -> list[str]:
    """Remove the project's containers for `service` that are not Compose's own
    `<project>-<service>-1`: an interrupted `up --force-recreate` leaves the old one renamed
    `<id>_<project>-<service>-1`, and the next `up` then fails on the name or serves from it."""
    canonical = compose_name(project, service)
    found = client().containers.list(all=True, ignore_removed=True, filters={
        "label": [f"com.docker.compose.project={project}", f"com.docker.compose.service={service}"]})
    removed = []
    for c in found:
        if c.name != canonical:
            c.remove(force=True)
            removed.append(str(c.name))
    return removed


def state_of(container: Any | None) -> ContainerState:
    if container is None:
        return state_from(None)
    try:
        container.reload()
    except Exception:  # removed between list and reload
        return state_from(None)
    return state_from(container.attrs)


def container_log(container: Any, *, tail: int | None = None) -> str:
    raw = container.logs(stdout=True, stderr=True, tail=tail if tail is not None else "all")
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


@dataclass
class LogFollower:
    """Follows a container's log in a thread; `changed` is set on every line and at the end."""

    container: Any
    on_line: Callable[[str], None] | None = None
    lines: list[str] = field(default_factory=list)
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=40))
    changed: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _done: bool = False

    def start(self) -> LogFollower:
        self._thread = threading.Thread(target=self._run, name="log-follower", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        buf = b""
        try:
            for chunk in self.container.logs(stream=True, follow=True, stdout=True, stderr=True):
                buf += chunk
                while b"\n" in buf:
                    raw, buf = buf.split(b"\n", 1)
                    self._emit(raw.decode(errors="replace").rstrip("\r"))
            if buf:
                self._emit(buf.decode(errors="replace"))
        except Exception:  # the container went away; the poller sees that
            pass
        finally:
            self.ended.set()
            self.changed.set()

    def settle(self, seconds: float) -> list[str]:
        """The log of a container that ended: what the stream brought within `seconds`, or, when
        it brought nothing (its stream not started yet: a remote engine under load), one read of
        the whole log instead."""
        self.ended.wait(seconds)
        if not self.lines:
            try:
                text = self.container.logs(stdout=True, stderr=True).decode(errors="replace")
            except Exception:  # gone already: nothing more to read
                text = ""
            self._done = True  # the stream, should it start now, would repeat these lines
            self.lines.extend(line.rstrip("\r") for line in text.splitlines())
        return self.lines

    def _emit(self, line: str) -> None:
        if self._done:
            return
        self.lines.append(line)
        self.recent.append(line)
        if self.on_line is not None:
            self.on_line(line)
        self.changed.set()

    @property
    def last_line(self) -> str:
        for line in reversed(self.recent):
            if line.strip():
                return line.strip()
        return ""
