"""Hot standby on the engine (issue 24): vLLM containers in slots of their own, asleep beside the live one.

Why slots, and how the door reaches them without a config change. Compose finds a service's container
by its labels (project, service) and recreates it when the files change: an old container of project P
cannot stay beside a new one of P, and labels cannot be changed on a running container. So a stack that
sleeps runs in a compose project of its own, `P-r<N>` (N: the revision whose files made it, created from
the deploy dir while it holds those files), with its own host port on loopback (VLLM_PORT given to
Compose in the environment, which Compose prefers to the .env file; the files keep their bytes).

The door dials `vllm:8000` on the project network `P_default` (render/door.py). A slot joins that
network with the service's name as its network alias, and every other slot that runs leaves it (a
stopped one has no name there): the engine's DNS then names one container, the one the door and the
tool's probes reach. Moving the alias is a network (dis)connect, no Caddy config change: a reload would
end the requests the door holds (render/door.py), so the config stays as it is for the whole switch.
The door dials without keep-alive on a standby node (render/door.py `caddy_config`), so every request
resolves the name again and none rides a pooled connection to the container that left. The gate is
closed while the alias moves.

Sleep and wake go to the slot's own port, the tool's path, never through the door (which refuses those
routes): sleepmode.py's POST /sleep?level=N, the wake its level needs (level 2: weights, reload_weights,
kv_cache, then the prefix cache reset), GET /is_sleeping ({"is_sleeping": bool}); vLLM's own comment on
both routes says the command "is sent but does not finish yet when we return a response" (in v0 with
frontend multiprocessing; vllm/entrypoints/serve/sleep/api_router.py, 0.21.0), so each is followed by
GET /is_sleeping until it says so.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from docker import errors as docker_errors

from ..errors import OperationError
from ..render.vllm_args import CONTAINER_PORT
from . import engine, sleepmode

ROLE = "b70deploy.role"
_FELL = re.compile(r"It took ([0-9.]+) seconds to (fall asleep|wake up)")


def slot_project(project: str, slot: int) -> str:
    return f"{project}-r{int(slot)}"


def network(project: str) -> str:
    """The project network the door is on (Compose's default network of the project)."""
    return f"{project}_default"


def slot_of(project: str, container_project: str) -> int | None:
    m = re.fullmatch(re.escape(project) + r"-r(\d+)", container_project)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Slot:
    number: int
    box: Any            # the engine's container
    status: str         # created, running, exited, ...
    on_door: bool       # joined to the door's network: what the door and the probes reach
    port: int | None    # its loopback port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


_PORT_FLAG = re.compile(r"--port[= ](\d+)\b")


def listens_on(attrs: dict[str, Any]) -> int:
    """The container port vLLM listens on: the --port its argv (or its script) renders, the stack's
    container_port; 8000 when it names none."""
    config = attrs.get("Config") or {}
    found = _PORT_FLAG.search(" ".join(str(a) for a in [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]))
    return int(found.group(1)) if found else CONTAINER_PORT


def slots(project: str, service: str) -> dict[int, Slot]:
    found = engine.client().containers.list(all=True, ignore_removed=True, filters={
        "label": [f"{ROLE}=vllm", f"com.docker.compose.service={service}"]})
    out: dict[int, Slot] = {}
    for box in found:
        number = slot_of(project, str(box.labels.get("com.docker.compose.project", "")))
        if number is None:
            continue
        attrs = box.attrs
        nets = (attrs.get("NetworkSettings") or {}).get("Networks") or {}
        key = f"{listens_on(attrs)}/tcp"
        bound = ((attrs.get("NetworkSettings") or {}).get("Ports") or {}).get(key) or []
        wanted = (attrs.get("HostConfig") or {}).get("PortBindings", {}).get(key) or []
        port = next((int(b["HostPort"]) for b in [*bound, *wanted] if str(b.get("HostPort", "")).isdigit()), None)
        out[number] = Slot(number, box, str(box.status), network(project) in nets, port)
    return out


def reached(project: str, service: str) -> Slot | None:
    """The slot the door and the probes reach, None when it is the project's own vllm: the one running on the
    door's network, else one that ran there (stopped: `restore` after `drain` starts it). Never one that never
    ran: a new slot joins before it starts (`pre_join`), and a run killed before the start leaves it there."""
    on_door = [s for s in slots(project, service).values() if s.on_door]
    return next((s for s in on_door if s.status == "running"), next((s for s in on_door if s.status != "created"),
                                                                   None))


def is_sleeping(slot: Slot) -> bool | None:
    if slot.status != "running" or slot.port is None:
        return None
    return sleepmode.is_sleeping(slot.url)


def state(slot: Slot) -> str:
    """live (joined to the door's network, awake), asleep, awake (running, not reached), or the engine's status."""
    if slot.status != "running":
        return slot.status
    asleep = is_sleeping(slot)
    if asleep:
        return "asleep"
    return "live" if slot.on_door else "awake"


def free_port(span: list[int] | None = None, *, taken: set[int] | frozenset[int] = frozenset()) -> int:
    """A loopback port for a slot: the kernel's pick, or the first free one of the node config's
    `ports.standby` range that no slot holds (a stopped slot keeps its binding)."""
    if span is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    for port in range(span[0], span[1] + 1):
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OperationError(f"no free port in ports.standby {list(span)} for a standby slot",
                         fix="widen ports.standby in the node config (each slot asleep or live holds one)")


def ports_taken(project: str, service: str) -> set[int]:
    return {s.port for s in slots(project, service).values() if s.port is not None}


def join_door(project: str, service: str, slot: int, found: dict[int, Slot] | None = None) -> Slot:
    """Make `slot` the one container named `service` on the door's network: the others leave it. `found`:
    the slots as listed since the last change of the door's network (the engine is asked when it has not
    `slot`)."""
    net = engine.client().networks.get(network(project))
    if found is None or slot not in found:
        found = slots(project, service)
    for other in found.values():
        # Only a running container has a name on the network (the engine drops a stopped one's endpoint), so
        # one that does not run is left there until its slot is removed: a crashed boot's container is not
        # asked while the engine tears it down (0.3-0.6 s inside the hold, on vfs).
        if other.number != slot and other.on_door and other.status == "running":
            with contextlib.suppress(docker_errors.NotFound, docker_errors.APIError):
                net.disconnect(other.box)
    mine = found.get(slot)
    if mine is None:
        raise OperationError(f"standby slot {slot} has no container", fix="b70deploy status")
    if not mine.on_door:
        net.connect(mine.box, aliases=[service])
    return mine


def pre_join(project: str, service: str, slot: Slot) -> Slot:
    """A created slot joined to the door's network with the service's alias before the door holds, so that
    activate is only its start (issue 35: the clients are held through activate). It answers for the alias
    only once it runs: the engine names a container in its DNS when it starts it (a created one's endpoint
    is only its config; tests/actions/test_standby_engine.py asks the network), so the live slot keeps
    serving meanwhile. No door network yet (a node's first deploy): activate joins it."""
    if slot.on_door or slot.status == "running":
        return slot
    try:
        net = engine.client().networks.get(network(project))
    except docker_errors.NotFound:
        return slot
    net.connect(slot.box, aliases=[service])
    return replace(slot, on_door=True)


def leave_door(project: str, slot: Slot) -> Slot:
    """`slot` off the door's network (the dozing one, while it falls asleep: the door holds and dials nothing)."""
    if slot.on_door:
        with contextlib.suppress(docker_errors.NotFound, docker_errors.APIError):
            engine.client().networks.get(network(project)).disconnect(slot.box)
    return replace(slot, on_door=False)


def said_seconds(box: Any, what: str) -> float | None:
    """vLLM's own "It took X seconds to fall asleep" / "to wake up" (the executor's log line), the last one."""
    found = [float(m.group(1)) for m in _FELL.finditer(engine.container_log(box, tail=200)) if m.group(2) == what]
    return found[-1] if found else None


def doze(project: str, service: str, number: int, level: int, listed: Slot | None = None) -> float:
    """Put slot `number` to sleep; `listed`: that slot as listed before (its port), so the engine is not asked."""
    slot = listed if listed is not None else slots(project, service).get(number)
    if slot is None:
        raise OperationError(f"standby slot {number} has no container", fix="b70deploy status")
    t0 = time.monotonic()
    if is_sleeping(slot):
        return 0.0  # a resumed drain: asleep already
    sleepmode.sleep(slot.url, level, who=f"standby slot {slot.number}")
    return said_seconds(slot.box, "fall asleep") or time.monotonic() - t0


def wake(project: str, service: str, number: int, found: dict[int, Slot] | None = None) -> tuple[float, Slot]:
    """Slot `number` joined to the door's network and woken: the seconds the wake took, and the slot (its port
    and status as listed: joining changes neither). The join runs beside the wake (the door holds and dials
    nothing until both are done; 0.03-0.08 s of engine calls the held clients no longer wait for): a kill
    between leaves the slot asleep or awake, on the door's network or off it, and a recovery's wake joins it
    and wakes it only if it sleeps."""
    listed = found if found is not None and number in found else slots(project, service)
    slot = listed.get(number)
    if slot is None:
        raise OperationError(f"standby slot {number} has no container", fix="b70deploy status")
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="join") as pool:
        # In a copy of this context: a remote node's engine endpoint is a context variable.
        joined = pool.submit(contextvars.copy_context().run, join_door, project, service, number, listed)
        t0 = time.monotonic()
        if is_sleeping(slot):
            sleepmode.wake(slot.url, who=f"standby slot {slot.number}")
        took = time.monotonic() - t0
        return took, joined.result()


def retire(project: str, number: int, *, stop_timeout: int) -> None:
    """The slot's container stopped (its stop signal: vLLM frees the device) and removed, with its network."""
    name = slot_project(project, number)
    for box in engine.client().containers.list(all=True, ignore_removed=True,
                                               filters={"label": [f"com.docker.compose.project={name}"]}):
        with contextlib.suppress(docker_errors.NotFound):
            if box.status == "running":
                box.stop(timeout=stop_timeout)
            box.remove(force=True)
    for net in engine.client().networks.list(names=[network(name)]):
        with contextlib.suppress(docker_errors.NotFound, docker_errors.APIError):
            net.remove()


def live_container(project: str, service: str) -> Any | None:
    """The vllm container that serves: the slot on the door's network, else the project's own."""
    slot = reached(project, service)
    return slot.box if slot is not None else engine.find_container(project, service)


def ours(project: str, container_project: str) -> bool:
    """A container of this node's vllm: the project's own, or one of its standby slots."""
    return container_project == project or slot_of(project, container_project) is not None


def asleep(box: Any) -> bool:
    """The container is one of the slots and says it sleeps (GET /is_sleeping)."""
    m = re.fullmatch(r"(.+)-r(\d+)", str((box.labels or {}).get("com.docker.compose.project", "")))
    if m is None:
        return False
    slot = slots(m.group(1), str((box.labels or {}).get("com.docker.compose.service", "vllm"))).get(int(m.group(2)))
    return bool(slot is not None and is_sleeping(slot))
