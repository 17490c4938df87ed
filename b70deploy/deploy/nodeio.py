"""The seam: every effect a deployment has on the node, as one interface.

The switch's steps (deploy/steps.py) touch the node only through a `NodeIO`: the deploy
dir's files, compose up/stop, image lookups, the health wait with its log watch, the smoke
probes, the idle readings and the clock. `docker.node.DockerNode` is the real one (Compose
v2, the engine API, HTTP; its deploy-dir half is plain file work, `deploy.deploydir.DeployDir`);
tests drive the same steps against an in-memory fake, so the state machine's decision table
runs in milliseconds and the real engine is kept for the end-to-end paths. The deploy dir is
behind the seam so that the fake can cut a run inside its write; the state dir (revisions,
journal, lock) is not: it is plain files the tool owns, the same under both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..config.schema import Stack
    from ..ui.progress import Reporter
    from ..vllmlog.diagnosis import Diagnosis

VLLM = "vllm"


@dataclass(frozen=True)
class Reading:
    """One idle check (docker/verify.py): the prod port, a feeder, the load."""

    name: str
    ok: bool
    detail: str
    # Read after the drain (connections: only a drained node is quiet); False: read before it, where
    # a busy reading costs the clients nothing (the load, which the drain does not lower).
    drained: bool = True


@dataclass
class WaitResult:
    healthy: bool
    elapsed: float
    reason: str
    finding: Diagnosis | None = None
    exit_code: int | None = None
    log_lines: list[str] = field(default_factory=list)
    ended: bool = False  # the container's process ended (its log stream closed): it holds no device

    def tail(self, n: int = 15) -> list[str]:
        return self.log_lines[-n:]


class NodeIO(Protocol):
    """One node as a deployment sees it: a deploy dir, a compose project, a port."""

    @property
    def service(self) -> str:
        """The vLLM service's name in the compose files (node config `service:`, default vllm)."""

    # ---- the deploy dir (the files compose reads)
    def read_deployed(self) -> dict[str, bytes]:
        """Every file of ours in the deploy dir (compose, env files, patched files)."""

    def read_modes(self) -> dict[str, int]:
        """The mode of each file read_deployed reads (an operator's 0600 key is kept 0600)."""

    def write_deployed(self, files: Mapping[str, bytes], modes: Mapping[str, int] | None = None) -> None:
        """Make the deploy dir hold exactly `files`: each written atomically, strays removed; each
        with render.masking.private_mode's mode, from `modes` (a revision's) where it has one."""

    def has_compose_file(self) -> bool: ...

    # ---- compose
    def compose_config(self, files: Mapping[str, bytes]) -> tuple[dict[str, Any] | None, str | None]:
        """`docker compose config` of `files` in a scratch dir: (document, None) or (None, error)."""

    def up(self, services: Sequence[str], *, recreate: bool = True) -> None: ...

    def replace(self, service: str, *, stopping: Sequence[str]) -> None:
        """Create `service`'s container from the deploy dir's files, not started, while its old
        container still serves; then the old one is stopped and removed. `stopping` (the
        companions) are stopped meanwhile. The clients' outage starts only once the new
        container exists."""

    def start(self, service: str) -> None:
        """Start the container `replace` created; bring the service up when there is none."""

    def stop(self, services: Sequence[str]) -> None: ...

    def discard(self, service: str) -> None:
        """Remove the service's container at once (SIGKILL): a failed boot whose log is saved,
        crash-looping under `restart: unless-stopped`, must not cost a graceful stop."""

    # ---- images
    def image_present(self, ref: str) -> bool: ...

    def image_id(self, ref: str) -> str | None:
        """The id `ref` names on this engine now, None when absent."""

    def image_tags(self, image_id: str) -> tuple[str, ...]:
        """Every reference naming the image, ours included."""

    # ---- keep tags (docker/keep.py): what `docker image prune` must not take
    def keep_image(self, image_id: str) -> None:
        """Tag the image with this project's keep tag (one per image; idempotent)."""

    def kept_images(self) -> dict[str, str]:
        """This project's keep tags, the former per-revision ones included: tag -> image id."""

    def release_tag(self, tag: str) -> tuple[bool, str | None]:
        """Remove one of kept_images' tags; the engine deletes the image when that was its last tag.
        (image deleted, None), or (False, why the engine refused)."""

    # ---- the serving container
    def wait_healthy(self, *, timeout: float, reporter: Reporter) -> WaitResult:
        """Poll /health while watching the vllm container and its log; ends at once on a
        fatal line, an exit or a stall."""

    def container_log(self) -> list[str]:
        """The vllm container's whole log (a resumed run's check reads the boot it missed)."""

    def probe_health(self) -> int | None: ...

    def container_status(self) -> str:
        """The vllm container's state: running, exited, restarting, dead, missing, ..."""

    def smoke(self, stack: Stack, *, one: bool = False) -> tuple[list[str], list[str]]:
        """(passed, failed) of the stack's smoke tests; `one`: a single completion (a woken standby's)."""

    def served_version(self) -> str | None: ...

    def idle_readings(self) -> list[Reading]:
        """Connections on the prod port, feeders, load: is the node idle?"""

    def ensure_draft(self, stack: Stack) -> str | None:
        """The EAGLE draft copy with max_position_embeddings raised, when the stack asks for
        one; returns what was done, for the progress line."""

    def prepare_caches(self, image_id: str, keep: Sequence[str]) -> str | None:
        """The warm-boot cache folder of `image_id` made and marked used, the caches held to the
        node's cap (never evicting `keep`, image ids); returns the progress line."""

    def warm_weights(self, stack: Stack) -> str:
        """Read the stack's model (and draft) files into the page cache when they fit in free
        memory; returns the progress line (what was read, or why not)."""

    # ---- the front door (render/door.py): each is a no-op on a node without one
    def door_sync(self, *, running_only: bool = False) -> bool:
        """The door service as the deploy dir's files say: started (recreated when its config
        changed) when they have one, removed when they do not. Called before vllm is started
        from new files: only one of the two may have the node's port. `running_only`: only a door
        that runs now and that the files keep (before the door holds: a door recreated while it
        holds would take the held requests with it). True when a door was brought in line."""

    def door_close(self) -> bool:
        """Hold new requests and answer 503 on the door's /health; returns once the door does
        (False: there is no door running)."""

    def door_open(self, revision: int) -> None:
        """Point the door at the running vllm, as `revision`, and release the held requests;
        returns once the door's /health answers 200."""

    def door_in_flight(self) -> int:
        """Requests the door has on vllm now (its own counter; 0 without a door)."""

    # ---- hot standby (issue 24): vLLM containers asleep beside the live one, each in its own slot
    def slots(self) -> dict[int, str]:
        """The node's standby slots, by the revision whose files made each: "live" (the one the door and
        the tool's probes reach), "asleep" or "stopped"; a container the slots do not hold is not here."""

    def doze(self, slot: int, level: int) -> float:
        """The slot's vLLM falls asleep (POST /sleep?level=N on its dev endpoint, the tool's own path,
        never the door), and stays; returns once GET /is_sleeping says so, with vLLM's own seconds
        when its log said them. It leaves the door's network meanwhile (the door holds)."""

    def boot_beside(self, slot: int) -> None:
        """Create the deploy dir's vllm in slot `slot`, not started, beside every other slot, joined to the
        door's network where there is one: a container that does not run is not reached, so the live one
        still serves (start_beside makes it the one reached)."""

    def start_beside(self, slot: int) -> None:
        """Make the created slot what the door and the tool's probes reach, and start it."""

    def wake(self, slot: int) -> float:
        """Point the door's target and the tool's probes at the sleeping slot and wake it (POST
        /wake_up); returns once GET /is_sleeping says it is awake (seconds taken)."""

    def retire(self, slot: int) -> None:
        """Stop and remove the slot's container (a standby past the count, a failed candidate)."""

    # ---- time
    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...
