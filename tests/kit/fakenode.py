"""An in-memory node behind the NodeIO seam: a deploy dir, containers started from it, a
clock. It serves the stack named in the compose file its vllm container was started from.

`trap` makes it misbehave at the first effect made inside one step: "fail" raises an
OperationError (the effect did not happen), "interrupt" a KeyboardInterrupt (Ctrl-C or
SIGTERM), "kill" raises Killed (SIGKILL in-process).
Writing the deploy dir is itself two effects (the first file, then the rest), so a trap
there leaves it half written, as a real kill between two renames would.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from b70deploy.config.schema import Stack
from b70deploy.deploy.nodeio import Reading, WaitResult
from b70deploy.deploy.runner import Killed
from b70deploy.errors import OperationError
from b70deploy.render.masking import private_mode
from b70deploy.ui.progress import Reporter

VLLM = "vllm"


def stack_files(name: str) -> dict[str, bytes]:
    """The deploy files of a stack, as the fake reads them back."""
    return {"docker-compose.yml": f'services:\n  vllm:\n    labels:\n      b70deploy.stack: "{name}"\n'.encode(),
            ".env": f"VLLM_IMAGE=img-{name}\nVLLM_MODEL=/models/{name}\n".encode(),
            "vllm.env": b"HF_HUB_OFFLINE=1\n"}


def stack_of_files(files: Mapping[str, bytes]) -> str | None:
    text = files.get("docker-compose.yml", b"").decode()
    marker = 'b70deploy.stack: "'
    return text.split(marker, 1)[1].split('"', 1)[0] if marker in text else None


@dataclass
class FakeNode:
    deployed: dict[str, bytes] = field(default_factory=dict)
    deployed_modes: dict[str, int] = field(default_factory=dict)  # as a real deploy dir's (private_mode)
    running: dict[str, dict[str, bytes]] = field(default_factory=dict)  # service -> files it started from
    created: dict[str, dict[str, bytes]] = field(default_factory=dict)  # made by replace, not started yet
    images: set[str] = field(default_factory=set)
    tags: dict[str, set[str]] = field(default_factory=dict)  # image -> references other than our keep tags
    kept: set[str] = field(default_factory=set)      # images with a keep tag (one per image)
    broken: set[str] = field(default_factory=set)   # stacks whose boot never becomes healthy
    dies_after_ready: set[str] = field(default_factory=set)  # healthy, passes its smoke tests, then dies
    died: set[str] = field(default_factory=set)  # of those, the ones whose engine has died (after their smoke)
    clock: float = 0.0
    step: str = ""                                  # the step the runner is in (set by the test's fault hook)
    trap: tuple[str, str] | None = None             # ("fail" | "interrupt" | "kill", step)
    effects: list[str] = field(default_factory=list)
    warmed: list[str] = field(default_factory=list)  # before-drain work: caches prepared, weights read
    door: bool = False                 # a front door runs in the project
    door_points: int | None = None     # the revision the door releases requests to; None: it holds them
    service: str = VLLM
    # hot standby: slot -> the files its container was created from, and its state
    slot_files: dict[int, dict[str, bytes]] = field(default_factory=dict)
    slot_state: dict[int, str] = field(default_factory=dict)  # created | live | asleep
    target: int | None = None          # the slot the door and the probes reach; None: the project's vllm
    smoke_fails: set[str] = field(default_factory=set)  # stacks that answer /health and fail their smoke tests
    load: float = 0.5                  # the host's 1-minute load average (its bound: 2.0)
    starts: dict[str, int] = field(default_factory=dict)  # service -> how often `up` started a container of it

    # ---- misbehaving on cue
    def _effect(self, what: str) -> None:
        self.effects.append(f"{self.step}:{what}")
        # A trap springs in the run's own thread: a step's work started on a worker (the companions in
        # the settle window) is not where a kill or a failure of the step itself lands.
        mine = threading.current_thread() is threading.main_thread()
        if self.trap is not None and self.trap[1] == self.step and mine:
            mode, self.trap = self.trap[0], None
            if mode == "kill":
                raise Killed(f"killed during {self.step} ({what})")
            if mode == "interrupt":
                raise KeyboardInterrupt
            raise OperationError(f"injected failure in {self.step} ({what})")

    # ---- what a test asks from outside
    def _reached(self) -> dict[str, bytes] | None:
        """The files of the vllm the door and the probes reach: a live slot, else the project's vllm."""
        if self.target is not None:
            return self.slot_files[self.target] if self.slot_state.get(self.target) == "live" else None
        return self.running.get(VLLM)

    def serves(self) -> str | None:
        """The stack the node answers with: vllm running and healthy."""
        files = self._reached()
        if files is None:
            return None
        name = stack_of_files(files)
        return None if name in self.broken or name in self.died else name

    # ---- NodeIO
    def read_deployed(self) -> dict[str, bytes]:
        self._effect("read")
        return dict(self.deployed)

    def read_modes(self) -> dict[str, int]:
        return {name: self.deployed_modes.get(name, 0o644) for name in self.deployed}

    def write_deployed(self, files: Mapping[str, bytes], modes: Mapping[str, int] | None = None) -> None:
        self.deployed_modes = {name: private_mode(name, data, (modes or {}).get(name)) for name, data in files.items()}
        items = list(files.items())
        self.deployed[items[0][0]] = items[0][1]
        self._effect("write")
        for name, data in items[1:]:
            self.deployed[name] = data
        for name in list(self.deployed):
            if name not in files:
                del self.deployed[name]

    def has_compose_file(self) -> bool:
        return "docker-compose.yml" in self.deployed

    def compose_config(self, files: Mapping[str, bytes]) -> tuple[dict[str, Any] | None, str | None]:
        self._effect("config")
        name = stack_of_files(files)
        if name is None:
            return None, "no services"
        return {"services": {VLLM: {"command": ["vllm", "serve", f"/models/{name}"]}}}, None

    def up(self, services: Sequence[str], *, recreate: bool = True) -> None:
        self._effect(f"up {','.join(services)}")
        for s in services:
            if not recreate and s != VLLM and s in self.running:
                continue  # compose's "Running": the fake has no companion definitions that could diverge
            self.created.pop(s, None)
            self.running[s] = dict(self.deployed)
            self.starts[s] = self.starts.get(s, 0) + 1
            if s == VLLM:
                self.target = None

    def replace(self, service: str, *, stopping: Sequence[str]) -> None:
        self._effect(f"create {service}")
        self.created[service] = dict(self.deployed)
        self.running.pop(service, None)
        for s in stopping:
            self.running.pop(s, None)

    def start(self, service: str) -> None:
        self._effect(f"start {service}")
        if service == VLLM and self.target is not None and self.slot_state.get(self.target) == "created":
            self.slot_state[self.target] = "live"
            return
        if service in self.created:
            self.running[service] = self.created.pop(service)
        else:
            self.running[service] = dict(self.deployed)

    def stop(self, services: Sequence[str]) -> None:
        self._effect(f"stop {','.join(services)}")
        for s in services:
            self.running.pop(s, None)

    def discard(self, service: str) -> None:
        self._effect(f"discard {service}")
        self.running.pop(service, None)
        self.created.pop(service, None)

    def image_present(self, ref: str) -> bool:
        return ref in self.images

    def image_id(self, ref: str) -> str | None:
        return ref if ref in self.images else None

    def image_tags(self, image_id: str) -> tuple[str, ...]:
        ours = [f"keep:{image_id}"] if image_id in self.kept else []
        return (*sorted(self.tags.get(image_id, ())), *ours)

    def keep_image(self, image_id: str) -> None:
        self._effect(f"keep {image_id}")
        if image_id not in self.images:
            raise OperationError(f"no such image: {image_id}")
        self.kept.add(image_id)

    def kept_images(self) -> dict[str, str]:
        return {f"keep:{image}": image for image in self.kept}

    def release_tag(self, tag: str) -> tuple[bool, str | None]:
        """As the engine does: the last tag of an image no container uses takes the image with it."""
        image_id = tag.removeprefix("keep:")
        if image_id not in self.kept:
            return False, None
        last = self.image_tags(image_id) == (f"keep:{image_id}",)
        if last and any(f"VLLM_IMAGE={image_id}\n".encode() in files.get(".env", b"")
                        for files in self.running.values()):
            return False, f"conflict: a container is using image {image_id}"
        self.kept.discard(image_id)
        if last:
            self.images.discard(image_id)
        return last, None

    def wait_healthy(self, *, timeout: float, reporter: Reporter) -> WaitResult:
        self._effect("wait")
        self.clock += 2.0
        lines = ["INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 0.0.fake",
                 "INFO 01-01 00:00:01 [kv_cache_utils.py:1] GPU KV cache size: 65,536 tokens"]
        if self._reached() is not None and self.serves() is not None:
            return WaitResult(True, 2.0, "healthy", log_lines=lines)
        return WaitResult(False, 2.0, "the vllm container exited (code 1)", exit_code=1, log_lines=lines, ended=True)

    def container_log(self) -> list[str]:
        return ["INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 0.0.fake"]

    def probe_health(self) -> int | None:
        return 200 if self.serves() is not None else None

    def container_status(self) -> str:
        files = self._reached()
        if files is None:
            return "missing" if self.target is None and VLLM not in self.created else "exited"
        return "exited" if stack_of_files(files) in self.died else "running"

    def smoke(self, stack: Stack, *, one: bool = False) -> tuple[list[str], list[str]]:
        self._effect("one completion" if one else "smoke")
        served = self.serves()
        if served != stack.name:
            return [], [f"the node serves {served}, not {stack.name}"]
        if served in self.smoke_fails:
            return [], [f"completion on {served}: garbage output"]
        if served in self.dies_after_ready:
            self.died.add(served)  # the engine dies right after it answered
        return [f"completion on {served}"], []

    def served_version(self) -> str | None:
        return "0.0.fake"

    def idle_readings(self) -> list[Reading]:
        self._effect("readings")
        return [Reading("port 8000", True, "no client connections"),
                Reading("load (1 min)", self.load < 2.0, f"{self.load:.2f} (threshold 2)", drained=False)]

    def ensure_draft(self, stack: Stack) -> str | None:
        return None

    def prepare_caches(self, image_id: str, keep: Sequence[str]) -> str | None:
        self._effect("caches")
        self.warmed.append(f"caches {image_id} keep {','.join(keep)}")
        return None

    def warm_weights(self, stack: Stack) -> str:
        self.warmed.append(f"weights {stack.name}")
        return f"page cache: read {stack.name}"

    def door_sync(self, *, running_only: bool = False) -> bool:
        if self.door:
            self._effect("door sync")
        return self.door

    def door_close(self) -> bool:
        if not self.door:
            return False
        self._effect("door close")
        self.door_points = None
        return True

    def door_open(self, revision: int) -> None:
        if self.door:
            self._effect(f"door open {revision}")
            self.door_points = revision

    def door_in_flight(self) -> int:
        return 0

    def slots(self) -> dict[int, str]:
        return {n: "live" if state == "live" and self.target == n else state for n, state in self.slot_state.items()}

    def doze(self, slot: int, level: int) -> float:
        self._effect(f"doze {slot} level {level}")
        self.slot_state[slot] = "asleep"
        return 0.1

    def boot_beside(self, slot: int) -> None:
        self._effect(f"boot beside {slot}")
        self.slot_files[slot] = dict(self.deployed)
        self.slot_state[slot] = "created"

    def start_beside(self, slot: int) -> None:
        self._effect(f"start beside {slot}")
        if slot not in self.slot_files:
            raise OperationError(f"standby slot {slot} has no container")
        self.target = slot
        self.slot_state[slot] = "live"

    def wake(self, slot: int) -> float:
        self._effect(f"wake {slot}")
        if self.slot_state.get(slot) not in ("asleep", "live"):
            raise OperationError(f"slot {slot} is not asleep")
        self.slot_state[slot] = "live"
        self.target = slot
        return 0.5

    def retire(self, slot: int) -> None:
        self._effect(f"retire {slot}")
        self.slot_state.pop(slot, None)
        self.slot_files.pop(slot, None)
        if self.target == slot:
            self.target = None

    def monotonic(self) -> float:
        return self.clock

    def sleep(self, seconds: float) -> None:
        self.clock += seconds


class Quiet:
    """A Reporter that says nothing."""

    def phase(self, name: str, detail: str = "") -> None: ...
    def info(self, message: str) -> None: ...
    def log_line(self, line: str) -> None: ...
    def tick(self, status: str) -> None: ...
    def close(self) -> None: ...
