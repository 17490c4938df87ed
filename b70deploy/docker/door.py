"""The front door on the engine (render/door.py says what it is): its gate turned, its counters
and its request log read, all through `docker exec` in the door container (a remote engine
works the same; nothing of the door is published but the node's port)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from ..errors import OperationError
from ..render.door import (
    ADMIN,
    CLOSED_FILE,
    DOOR_SERVICE,
    FORWARDED,
    GATE_FILE,
    INNER,
    OPENED_FILE,
    RELAY,
)
from . import engine
from .probe import probe_health

TURN_WAIT = 10.0  # seconds a turned gate may take to show on the door's /health (its check runs every 200 ms)


@dataclass(frozen=True)
class DoorState:
    """What the door says now."""

    points_at: int | None    # the revision it releases requests to; None: it holds them
    in_flight: int           # requests it has on vllm
    holding: int             # requests it holds (inside the door, on no upstream)
    closed_at: float | None  # when its gate was last closed / opened (epoch seconds)
    opened_at: float | None


@dataclass(frozen=True)
class LastHold:
    """The last closed window of the gate, from the door's request log."""

    held: int              # requests that arrived while it was closed
    longest: float         # the longest any of them waited for the gate (seconds)
    refused: int           # of them, answered 503 when the bound passed
    seconds: float         # how long the gate was closed


def container(project: str) -> Any | None:
    """The door's running container, None when there is none (or it is not running)."""
    found = engine.find_container(project, DOOR_SERVICE)
    return found if found is not None and engine.state_of(found).status == "running" else None


def _sh(box: Any, script: str) -> str:
    code, out = box.exec_run(["sh", "-c", script], demux=False)
    text = out.decode(errors="replace") if isinstance(out, bytes) else str(out or "")
    if code != 0:
        raise OperationError(f"the door container refused `{script}`: {text.strip()[-200:]}",
                             fix="`docker logs` of the door container says why; `b70deploy restore` starts it again")
    return text


def _wait_health(url: str, *, want_ok: bool, what: str) -> None:
    deadline = time.monotonic() + TURN_WAIT
    while (probe_health(url) == 200) != want_ok:
        if time.monotonic() >= deadline:
            raise OperationError(f"the door's /health did not turn {what} within {TURN_WAIT:g} s ({url})",
                                 fix="`b70deploy door` shows its state; `b70deploy restore` points it at the "
                                     "current revision")
        time.sleep(0.1)


def close(project: str, health_url: str) -> bool:
    box = container(project)
    if box is None:
        return False
    _sh(box, f"rm -f {GATE_FILE} && echo {time.time():.3f} > {CLOSED_FILE}")
    _wait_health(health_url, want_ok=False, what="503")
    return True


def open_to(project: str, health_url: str, revision: int) -> None:
    box = container(project)
    if box is None:
        return
    _sh(box, f"echo {int(revision)} > {GATE_FILE}.new && mv {GATE_FILE}.new {GATE_FILE} "
             f"&& echo {time.time():.3f} > {OPENED_FILE}")
    _wait_health(health_url, want_ok=True, what="200")


def _counts(box: Any) -> dict[str, int]:
    rows = json.loads(_sh(box, f"wget -qO- http://{ADMIN}/reverse_proxy/upstreams") or "[]")
    return {str(r.get("address")): int(r.get("num_requests") or 0) for r in rows}


def _on_vllm(counts: dict[str, int]) -> int:
    """The relay's requests on its one upstream, the vLLM service (whatever the node names it)."""
    return sum(n for address, n in counts.items() if address not in (INNER, RELAY))


def in_flight(project: str) -> int:
    box = container(project)
    return 0 if box is None else _on_vllm(_counts(box))


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def state(project: str) -> DoorState | None:
    box = container(project)
    if box is None:
        return None
    read = " ; ".join(f"echo $(cat {f} 2>/dev/null)" for f in (GATE_FILE, CLOSED_FILE, OPENED_FILE))
    gate, closed, opened = [*_sh(box, read).splitlines(), "", "", ""][:3]
    counts = _counts(box)
    points = _number(gate)
    busy = _on_vllm(counts)
    return DoorState(points_at=int(points) if points is not None else None, in_flight=busy,
                     holding=max(0, counts.get(INNER, 0) - busy), closed_at=_number(closed),
                     opened_at=_number(opened))


def _forwarded(uri: str) -> bool:
    path = uri.split("?", 1)[0]
    return any(path.startswith(p[:-1]) if p.endswith("*") else path == p for p in FORWARDED) and path != "/health"


def last_hold(project: str, now: DoorState) -> LastHold | None:
    """The last closed window's requests, from the door server's access log (one JSON line per
    request, written when it ends: its `ts` and `duration`). None before any window."""
    box = container(project)
    if box is None or now.closed_at is None:
        return None
    start = now.closed_at
    end = now.opened_at if now.opened_at is not None and now.opened_at >= start else time.time()
    text = engine.container_log(box)
    return hold_of(text.splitlines(), start, end)


def hold_of(lines: list[str], start: float, end: float) -> LastHold:
    """Pure: the requests whose arrival fell in [start, end), from access-log lines."""
    held = refused = 0
    longest = 0.0
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or "duration" not in entry or not _forwarded(
                str(entry.get("request", {}).get("uri", ""))):
            continue
        done, took = float(entry.get("ts", 0)), float(entry.get("duration", 0))
        arrived = done - took
        if not start <= arrived < end:
            continue
        held += 1
        refused += int(entry.get("status") == 503)
        longest = max(longest, min(done, end) - arrived)
    return LastHold(held=held, longest=round(longest, 3), refused=refused, seconds=round(end - start, 3))
