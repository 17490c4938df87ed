"""The real NodeIO: a deploy dir on disk (deploy/deploydir.py), Compose v2 for the project,
the engine API for images and the container's log, HTTP for /health and the smoke tests."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import io
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from docker import errors as docker_errors
from dotenv import dotenv_values

from ..config import hub
from ..deploy.deploydir import DeployDir, compose_names
from ..errors import B70Error, OperationError
from ..render.door import DOOR_NETWORK, DOOR_SERVICE, config_text, digest_in, where_of
from ..render.draft import ensure_draft_copy, stack_copy
from ..render.files import COMPOSE_FILE, DOTENV_FILE
from ..render.vllm_args import api_keys
from ..state import caches
from ..state.fsio import write_tree
from ..vllmlog.diagnosis import diagnose
from . import door, engine, pagecache, standby
from .compose import PROFILE, Compose
from .health import wait_healthy
from .keep import REPO, is_keep_tag, keep_tag
from .probe import probe_health
from .proc import explain, last_line, run
from .smoke import one_completion, run_smoke, served_version
from .verify import load_bound, readings, remote_readings

if TYPE_CHECKING:
    from ..config.node import Node
    from ..config.schema import Stack
    from ..deploy.nodeio import Reading, WaitResult
    from ..ui.progress import Reporter

STOP_TIMEOUT = 30  # seconds from the stop signal to SIGKILL, as `docker compose stop --timeout 30`


def compose_config(files: Mapping[str, bytes], project: str, folder: Path | None = None, *,
                   compose_files: Sequence[str] = (COMPOSE_FILE,),
                   profiles: Sequence[str] = (PROFILE,)) -> tuple[dict[str, Any] | None, str | None]:
    """`docker compose config` of `files` written into `folder` (default: a scratch folder gone
    on return; a caller that reads the bind sources afterwards passes its own), read as the
    project's `compose_files` (those `files` hold) with its `profiles`: (the resolved config,
    None) or (None, why Compose refused them). OperationError when Compose itself cannot run (no
    plugin, no engine)."""
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="b70deploy-config-") as tmp:
            return compose_config(files, project, Path(tmp), compose_files=compose_files, profiles=profiles)
    write_tree(folder, files)
    argv = Compose(folder, project, compose_names(files, compose_files), tuple(profiles)).config(fmt="json")
    try:
        result = run(argv, timeout=60, check=False)
    except B70Error as e:
        return None, e.what  # the caller says the fix
    if result.returncode != 0:
        known = explain(argv, result.stderr)
        if known is not None:  # no Compose plugin, no engine: not the files' fault
            raise known
        return None, last_line(result.stderr)
    try:
        return json.loads(result.stdout), None
    except ValueError:
        return None, "output is not JSON"


NAME_CONFLICT = "Conflict. The container name"


@dataclass(frozen=True)
class DockerNode(DeployDir):
    """One compose project in one folder, served on one port (production, or the dark stack).
    Its deploy dir's files are plain file work, inherited from deploy/deploydir.py."""

    node: Node
    project: str
    port: int
    # The standby slot the probes reach, looked up once per change of slots (the lock holds them still
    # between): every probe asked the engine again, ~0.1-0.3 s of the clients' wait each on a busy host.
    reach: dict[str, standby.Slot | None] = field(default_factory=dict, compare=False, repr=False)
    # The slots as `slots()` last listed them, for doze and wake (their ports, who is on the door's network):
    # kept until a slot joins or leaves that network or is removed. The drain lists them before the door
    # holds; listing them again inside the hold cost the clients 0.05-0.3 s a time.
    listed: dict[int, standby.Slot] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def production(cls, node: Node) -> DockerNode:
        return cls(deploy_dir=node.deploy_dir, node=node, project=node.project, port=node.config.ports.prod)

    @classmethod
    def dark(cls, node: Node, where: Path) -> DockerNode:
        return cls(deploy_dir=where, node=node, project=node.dark_project, port=node.config.ports.dark)

    @property
    def service(self) -> str:
        return self.node.config.service

    @property
    def base_url(self) -> str:
        """Where the tool's own probes reach vllm: the node's port, or, behind a front door, the
        loopback port the deployed .env names (VLLM_PORT; render/door.py), or the port of the standby
        slot the door reaches (docker/standby.py)."""
        return f"http://{self.node.address}:{self._vllm_port()}"

    def _reached(self) -> standby.Slot | None:
        """The standby slot the door and the probes reach; None: the project's own vllm (no door: never a slot)."""
        return standby.reached(self.project, self.service) if "DOOR_PORT" in self._deployed_env() else None

    def _probed(self) -> standby.Slot | None:
        """_reached, kept until this node changes its slots (its status may be old: for ports and names)."""
        if "DOOR_PORT" not in self._deployed_env():
            return None
        if "slot" not in self.reach:
            self.reach["slot"] = standby.reached(self.project, self.service)
        return self.reach["slot"]

    def _moved(self) -> None:
        self.reach.clear()
        self.listed.clear()

    def _vllm_project(self) -> str:
        slot = self._probed()
        return standby.slot_project(self.project, slot.number) if slot is not None else self.project

    @property
    def door_health_url(self) -> str:
        return f"http://{self.node.address}:{self.port}/health"

    def _deployed_env(self) -> dict[str, str]:
        try:
            text = (self.deploy_dir / DOTENV_FILE).read_text(errors="replace")
        except OSError:
            return {}
        return {k: v for k, v in dotenv_values(stream=io.StringIO(text)).items() if v is not None}

    def _vllm_port(self) -> int:
        slot = self._probed()
        if slot is not None and slot.port is not None:
            return slot.port
        env = self._deployed_env()
        return int(env["VLLM_PORT"]) if "DOOR_PORT" in env and env.get("VLLM_PORT", "").isdigit() else self.port

    def compose_files(self) -> tuple[str, ...]:
        return tuple(self.node.config.compose_files)

    @property
    def compose(self) -> Compose:
        """Compose on the deploy dir as it is now: the project's compose files it holds (an adopted
        base + override pair, or a rendered deployment's one file) and the project's profiles."""
        held = [n for n in self.compose_files() if (self.deploy_dir / n).is_file()]
        return Compose(self.deploy_dir, self.project, compose_names(held, self.compose_files()),
                       tuple(self.node.config.profiles))

    # ---- compose
    def compose_config(self, files: Mapping[str, bytes]) -> tuple[dict[str, Any] | None, str | None]:
        return compose_config(files, self.project, compose_files=self.compose_files(),
                              profiles=self.node.config.profiles)

    def up(self, services: Sequence[str], *, recreate: bool = True) -> None:
        self._moved()
        slot = self._reached() if not recreate and self.service in services else None
        if slot is not None:  # `restore` after `drain` on a standby node: the slot the door reaches starts again
            if slot.status != "running":
                slot.box.start()
            services = [s for s in services if s != self.service]
            if not services:
                return
        self._compose(self.compose.up(services, recreate=recreate), services)

    def replace(self, service: str, *, stopping: Sequence[str]) -> None:
        self._moved()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="drain") as pool:
            stopped = pool.submit(contextvars.copy_context().run, self.stop, stopping) if stopping else None
            self._compose(self.compose.create([service], stop_timeout=STOP_TIMEOUT), [service])
            if stopped is not None:
                stopped.result()

    def start(self, service: str) -> None:
        if not engine.start_created(self._vllm_project() if service == self.service else self.project, service):
            self.up([service], recreate=False)

    def _pin(self) -> None:
        """Before Compose reads the deployed .env: the keep tag it runs (VLLM_IMAGE) names the image the
        revision pins (VLLM_IMAGE_ID). A tag of ours moved or removed by hand is put back, so a name
        never changes what a revision runs (docker/keep.py)."""
        env = self._deployed_env()
        name, pinned = env.get("VLLM_IMAGE", ""), env.get("VLLM_IMAGE_ID")
        if pinned and name.startswith(f"{REPO}:") and engine.image_id_of(name) != pinned \
                and engine.image_present(pinned):
            engine.tag_image(pinned, name)

    def _compose(self, argv: list[str], services: Sequence[str], tries: int = 3) -> None:
        """Run a compose call that creates containers, clearing an interrupted call's leftovers."""
        self._pin()
        for attempt in range(1, tries + 1):
            for service in services:
                engine.remove_strays(self.project, service)
            try:
                run(argv, timeout=300)
                return
            except OperationError as e:
                # An interrupted `up` was killed, but the daemon may still be creating its
                # replacement `<old id>_<project>-<service>-1` after the sweep above looked.
                if NAME_CONFLICT not in str(e) or attempt == tries:
                    raise
                time.sleep(1.0)

    def stop(self, services: Sequence[str]) -> None:
        self._moved()
        slot = self._reached() if self.service in services else None
        if slot is not None and slot.status == "running":  # `drain` on a standby node: the slot that serves
            slot.box.stop(timeout=STOP_TIMEOUT)
        engine.stop_services(self.project, services, timeout=STOP_TIMEOUT)

    def discard(self, service: str) -> None:
        container = engine.find_container(self.project, service)
        if container is not None:
            with contextlib.suppress(docker_errors.NotFound):  # gone already
                container.remove(force=True)

    def down(self) -> None:
        run(self.compose.down(), timeout=120)

    # ---- images
    def image_present(self, ref: str) -> bool:
        return engine.image_present(ref)

    def image_id(self, ref: str) -> str | None:
        return engine.image_info(ref).id if engine.image_present(ref) else None

    def image_tags(self, image_id: str) -> tuple[str, ...]:
        return engine.image_info(image_id).tags if engine.image_present(image_id) else ()

    def keep_image(self, image_id: str) -> None:
        engine.tag_image(image_id, keep_tag(self.project, image_id))

    def kept_images(self) -> dict[str, str]:
        return {ref: image for ref, image in engine.tagged(REPO).items() if is_keep_tag(self.project, ref)}

    def release_tag(self, tag: str) -> tuple[bool, str | None]:
        return engine.untag(tag)

    # ---- the serving container
    def wait_healthy(self, *, timeout: float, reporter: Reporter) -> WaitResult:
        t = self.node.config.timeouts
        got = wait_healthy(project=self._vllm_project(), service=self.service, health_url=f"{self.base_url}/health",
                           timeout=timeout, max_interval=t.poll_interval, reporter=reporter,
                           diagnose=functools.partial(diagnose, platform=self.node.config.platform),
                           stall_after=t.stall, restarts_from=self.deploy_dir / self.compose.files[0])
        slot = self._probed()
        if got.ended and slot is not None and slot.number in self.listed:  # listed as it is: it runs no more
            self.listed[slot.number] = replace(self.listed[slot.number], status="exited")
        return got

    def container_log(self) -> list[str]:
        container = engine.find_container(self._vllm_project(), self.service)
        return engine.container_log(container).splitlines() if container is not None else []

    def container_status(self) -> str:
        return str(engine.state_of(engine.find_container(self._vllm_project(), self.service)).status)

    def probe_health(self) -> int | None:
        return probe_health(f"{self.base_url}/health")

    def smoke(self, stack: Stack, *, one: bool = False) -> tuple[list[str], list[str]]:
        check = one_completion if one else run_smoke
        return check(self.base_url, stack, timeout=self.node.config.timeouts.smoke, key=self.api_key())

    def api_key(self) -> str | None:
        """The key the serving vllm asks /v1 requests for, read from its container as vLLM reads it
        (its --api-key, else VLLM_API_KEY): the operator's .env, an adopted file or a rendered stack alike."""
        slot = self._probed()  # a slot as listed (its argv and environment do not change): no engine call
        container = slot.box if slot is not None else engine.find_container(self.project, self.service)
        if container is None:
            return None
        attrs = container.attrs
        keys = api_keys([attrs.get("Path") or "", *(attrs.get("Args") or [])], attrs["Config"].get("Env") or [])
        return keys[0] if keys else None

    def served_version(self) -> str | None:
        return served_version(self.base_url)

    def idle_readings(self) -> list[Reading]:
        cfg = self.node.config
        if self.node.on_this_host:
            # Behind a front door, the clients' connections are the door's: vllm's port has only ours.
            return readings(port=self._vllm_port(), feeders=cfg.feeders, load_threshold=load_bound(cfg.load_threshold))
        return remote_readings(self.node.address, self._vllm_port())

    def ensure_draft(self, stack: Stack) -> str | None:
        if stack_copy(stack) is None:
            return None
        spec = stack.speculative
        assert spec is not None and spec.model and spec.draft_max_position_embeddings is not None  # stack_copy said so
        rel = ensure_draft_copy(self.node.models_dir, spec.model, spec.draft_max_position_embeddings)
        return f"draft copy {rel}: max_position_embeddings {spec.draft_max_position_embeddings}"

    def prepare_caches(self, image_id: str, keep: Sequence[str]) -> str | None:
        if not self.node.on_this_host:  # compose creates the folder there (create_host_path); no cap from here
            return f"caches: {image_id[:19]} on {self.node.address}, made by compose; size cap not enforced remotely"
        root = self.node.cache_dir
        folder = caches.prepare(root, image_id)
        if folder is None:
            return None
        cap = int(self.node.config.cache_max_gib * caches.GIB)
        kept = {k for k in (caches.image_key(i) for i in (image_id, *keep)) if k}
        gone = caches.apply_eviction(root, caches.plan_eviction(caches.scan(root), cap, kept))
        evicted = f"; evicted the least recently used: {', '.join(g[:19] for g in gone)}" if gone else ""
        return f"caches: {folder} ({caches.describe(caches.scan(root))}, cap {self.node.config.cache_max_gib:g} GiB)" \
            + evicted

    def warm_weights(self, stack: Stack) -> str:
        if not self.node.on_this_host:
            return f"page cache: not read ahead: the weights are on {self.node.address}"
        cache = self.node.config.hf_cache
        snap = hub.snapshot(Path(cache), stack.model.path, self.node.config.hf_hub_folder) \
            if stack.model.hub and cache else None
        roots = [snap] if snap is not None else [] if stack.model.hub else [self.node.models_dir / stack.model.path]
        spec = stack.speculative
        if spec is not None and spec.model:
            roots.append(self.node.models_dir / (stack_copy(stack) or spec.model))
        return pagecache.warm(roots)

    # ---- the front door (docker/door.py)
    def door_sync(self, *, running_only: bool = False) -> bool:
        running = door.container(self.project)
        if running_only and running is None:
            return False
        env = self._deployed_env()
        if "DOOR_PORT" not in env:
            if not running_only:
                self.discard(DOOR_SERVICE)
            return False
        # The same door already running (its digest label) needs no compose call: the clients
        # may be held meanwhile, and even a no-op `up` costs them ~1 s of the engine's time.
        compose = (self.deploy_dir / COMPOSE_FILE).read_bytes()
        want = digest_in(compose)
        if running is None or want is None or (running.labels or {}).get("b70deploy.door") != want:
            if "DOOR_VLLM_ADDRESS" in env:
                self._door_network()
            self.up([DOOR_SERVICE], recreate=False)  # compose recreates it when its image or command changed
        # Its config is the node's, loaded in place: a reload cuts no stream (render/door.py). Keep-alive
        # is off where the door follows the service's name from slot to slot (render/door.py).
        keep_alive = "DOOR_VLLM_ADDRESS" in env or not self.node.config.standby.sleeps
        door.configure(self.project, config_text(self.node.config.door, where_of(env, compose, self.service),
                                                 keep_alive=keep_alive))
        return True

    def _door_network(self) -> None:
        """A host door's network to vllm there before the door dials vllm's address on it: Caddy sends the
        requests of a fresh config's first moments before its first health check (an upstream starts
        healthy: reverseproxy/hosts.go `healthy`), and without that network the address routes off the host.
        The network comes when vllm's container is created from these files; a door that moves onto the
        host's network (a node's first switch with this door) comes before that, while the old vllm serves."""
        if not engine.network_exists(f"{self.project}_{DOOR_NETWORK}"):
            self._compose(self.compose.networks_for(self.service), [self.service])

    def door_close(self) -> bool:
        return door.close(self.project, self.door_health_url)

    def door_open(self, revision: int) -> None:
        door.open_to(self.project, self.door_health_url, revision)

    def door_in_flight(self) -> int:
        return door.in_flight(self.project)

    # ---- hot standby (docker/standby.py)
    def slots(self) -> dict[int, str]:
        found = standby.slots(self.project, self.service)
        self.listed.clear()
        self.listed.update(found)
        return {n: standby.state(s) for n, s in found.items()}

    def doze(self, slot: int, level: int) -> float:
        listed = self.listed.get(slot)
        if listed is None or not listed.on_door:
            return standby.doze(self.project, self.service, slot, level, listed)
        # It leaves the door's network while it falls asleep (the door holds and dials nothing), so activate
        # is only the new slot's start: 0.05-0.1 s of engine calls out of the clients' wait (issue 35).
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="leave") as pool:
            left = pool.submit(contextvars.copy_context().run, standby.leave_door, self.project, listed)
            try:
                return standby.doze(self.project, self.service, slot, level, listed)
            finally:  # a sleep that failed left it off the door's network too: the undo's wake joins it back
                if left.exception() is None:
                    self.listed[slot] = left.result()
                else:  # not known whether it left: the next join asks the engine
                    self.listed.clear()

    def boot_beside(self, slot: int) -> None:
        self.reach.clear()  # a new slot, not running: the probes reach what they reached
        name = standby.slot_project(self.project, slot)
        standby.retire(self.project, slot, stop_timeout=STOP_TIMEOUT)  # a killed run's half-made slot
        # Its own loopback port: Compose takes VLLM_PORT from the environment before the .env file.
        port = standby.free_port(self.node.config.ports.standby, taken=standby.ports_taken(self.project, self.service))
        env = {**os.environ, "VLLM_PORT": str(port)}
        compose = Compose(self.deploy_dir, name, self.compose.files, self.compose.profiles)
        self._pin()
        run(compose.create([self.service], stop_timeout=STOP_TIMEOUT), timeout=300, env=env)
        # Listed with the new one while the clients are still served: activate starts it from this. It joins
        # the door's network now, not started (no name in the engine's DNS until it runs: the live slot
        # still answers), so that activate, inside the hold, is only its start.
        self.listed.clear()
        self.listed.update(standby.slots(self.project, self.service))
        if slot in self.listed:
            self.listed[slot] = standby.pre_join(self.project, self.service, self.listed[slot])

    def start_beside(self, slot: int) -> None:
        found = dict(self.listed)
        self._moved()
        joined = standby.join_door(self.project, self.service, slot, found)
        joined.box.start()
        self.reach["slot"] = joined  # what the probes reach now: its port and name (not its status)
        if slot in found:  # the listing stands, but for who is on the door's network and runs: a failed boot's
            # undo wakes the sleeper from it, never asking the engine while it tears the crashed container down
            self.listed.update({n: replace(s, on_door=n == slot) for n, s in found.items()})
            self.listed[slot] = replace(self.listed[slot], status="running")

    def wake(self, slot: int) -> float:
        found = dict(self.listed)
        self._moved()
        took, joined = standby.wake(self.project, self.service, slot, found)
        self.reach["slot"] = joined  # what the probes reach now: its port and name (not its status)
        return took

    def retire(self, slot: int) -> None:
        self._moved()
        standby.retire(self.project, slot, stop_timeout=STOP_TIMEOUT)

    # ---- time
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
