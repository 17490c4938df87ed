"""The front door on the engine (render/door.py says what it is): its config loaded, its gate
turned, its counters and its request log read, all through `docker exec` in the door container
(a remote engine works the same; nothing of the door is published but the node's port).

One exec per call costs the engine a process start in the container (runc): 0.07-0.2 s on a
busy 2-core host, and a switch turns the gate and reads the counters a dozen times while the
clients are held (issue 35). So each process keeps one `sh` exec open in the door and sends it
the scripts on its stdin (about 2 ms a script); a shell that breaks is dropped and the script
runs again as a plain exec (every script here can run twice). The shell ends with the process:
its stdin closes, and `sh` exits at the end of its input."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..errors import OperationError
from ..render.door import (
    ADMIN,
    ADMIN_PATH,
    ADMIN_SOCKET,
    CLOSED_FILE,
    DOOR_SERVICE,
    FORWARDED,
    GATE_FILE,
    OPENED_FILE,
    PENDING_FILE,
)
from . import engine
from .probe import probe_health

TURN_WAIT = 10.0  # seconds a turned gate may take to show on the door's /health (its check runs every 50 ms)
RELEASE_WAIT = 5.0  # seconds the released requests may take to leave the hold (each tries again every 20 ms)
START_WAIT = 10.0  # seconds a fresh door container's admin API may take to answer
LOCAL_LABEL = "b70deploy.door.local"  # the door's loopback address, where its route to the admin API is
LEGACY_ADMIN = "127.0.0.1:2019"  # Caddy's default admin address (localhost:2019): a door rendered before the socket


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


LOCAL_ENGINE = "http+docker://localhost"  # docker-py's base URL for an engine on its unix socket
SHELL_WAIT = 60.0  # seconds a script may take in the kept shell (a `caddy reload` waits on Caddy's admin API)


class _Shell:
    """One `sh` exec in the door container, kept open: scripts go in on its stdin, and each answers with
    its output and a line `<marker> <exit status>` on the exec's multiplexed stream (8-byte frame headers:
    stream, 0, 0, 0, big-endian length)."""

    def __init__(self, box: Any) -> None:
        api = box.client.api
        # An engine on its unix socket only: over ssh the SDK's socket is a pipe to `ssh` whose reads wait
        # for the whole count and know no timeout; there, and over TCP, the door keeps the plain exec.
        if api.base_url != LOCAL_ENGINE:
            raise OSError(f"no kept shell through {api.base_url}")
        made = api.exec_create(box.id, ["sh"], stdin=True, stdout=True, stderr=True, tty=False)
        opened = api.exec_start(made["Id"], socket=True)
        self.sock = getattr(opened, "_sock", opened)  # the raw socket under docker-py's SocketIO
        if type(self.sock) is not socket.socket:
            opened.close()
            raise OSError(f"no kept shell over a {type(self.sock).__name__}")
        self.sock.settimeout(SHELL_WAIT)
        self.buf = b""

    def run(self, script: str) -> tuple[int, str]:
        marker = uuid.uuid4().hex
        self.sock.sendall(f"( {script} ) 2>&1; echo \"{marker} $?\"\n".encode())
        out = b""
        while True:
            header = self._take(8)
            out += self._take(struct.unpack(">I", header[4:8])[0])
            before, found, after = out.decode(errors="replace").partition(f"{marker} ")
            if found and after.endswith("\n"):
                return int(after.strip()), before

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            got = self.sock.recv(65536)
            if not got:
                raise OSError("the door's shell ended")
            self.buf += got
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def close(self) -> None:
        # shutdown first: close() leaves the descriptor open while docker-py's SocketIO still refers to it,
        # and the `sh` ends only when its stdin does
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


_shells: dict[str, _Shell] = {}  # by container id: one kept shell per door this process talks to
_shells_lock = threading.Lock()


def _exec(box: Any, script: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run `script` in the door: in the kept shell, or a plain exec where it has an environment of its
    own, a newline, or the shell breaks."""
    if env is None and "\n" not in script:
        with _shells_lock:
            try:
                shell = _shells.get(box.id) or _shells.setdefault(box.id, _Shell(box))
                return shell.run(script)
            except Exception:  # any break of the kept shell (socket, SDK, engine): a plain exec
                dropped = _shells.pop(box.id, None)
                if dropped is not None:
                    dropped.close()
    code, out = box.exec_run(["sh", "-c", script], demux=False, environment=env)
    return int(code or 0), out.decode(errors="replace") if isinstance(out, bytes) else str(out or "")


def _sh(box: Any, script: str, env: dict[str, str] | None = None) -> str:
    code, text = _exec(box, script, env)
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
        time.sleep(0.01)  # the door's own check turns it within 50 ms: the held clients wait on this


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
    # One exec: the gate opened and whether a config waits for it (each exec is 0.05-0.4 s of the engine's).
    pending = _sh(box, f"echo {int(revision)} > {GATE_FILE}.new && mv {GATE_FILE}.new {GATE_FILE} "
                       f"&& echo {time.time():.3f} > {OPENED_FILE} && (test -f {PENDING_FILE} && echo pending || true)")
    _wait_health(health_url, want_ok=True, what="200")
    if pending.strip():
        # A config that waited for the hold: the released requests leave it (on vllm, a reload
        # no longer cuts them), then it loads.
        deadline = time.monotonic() + RELEASE_WAIT
        while _holding(box) > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        _load(box, PENDING_FILE)


def _admin(box: Any) -> str:
    """The door's read-only route to its admin API (render/door.py ADMIN_PATH), on its loopback address."""
    return f"http://{(box.labels or {}).get(LOCAL_LABEL, '127.0.0.1:8080')}{ADMIN_PATH}"


def _read(box: Any, path: str) -> tuple[int, str]:
    """GET `path` of the door's admin API, through its route; a door whose compose file came before the
    admin socket (an older revision's: no LOCAL_LABEL, in the project network) serves it on Caddy's
    default address, its own loopback, until the deploy loads the node's config into it."""
    code, out = _exec(box, f"wget -qO- {_admin(box)}{path}")
    if code != 0 and LOCAL_LABEL not in (box.labels or {}):
        code, out = _exec(box, f"wget -qO- http://{LEGACY_ADMIN}{path}")
    return code, out


def _read_ok(box: Any, path: str) -> str:
    code, out = _read(box, path)
    if code != 0:
        raise OperationError(f"the door's admin API did not answer GET {path}: {out.strip()[-200:]}",
                             fix="`docker logs` of the door container says why; `b70deploy restore` starts it again")
    return out


def _loaded(box: Any) -> tuple[bool, str | None, bool]:
    """(whether the door's route to its admin API answered, the config the door runs: canonical JSON,
    whether nothing listens on the door's address: a door that runs no config yet, its admin socket only)."""
    code, out = _read(box, "/config/")
    if code != 0:
        return False, None, "refused" in out  # busybox wget: "can't connect to remote host ...: Connection refused"
    try:
        got = json.loads(out or "null")
    except ValueError:
        return False, None, False
    return True, None if got is None else json.dumps(got, sort_keys=True, separators=(",", ":")), False


def _load(box: Any, path: str) -> None:
    # Caddy's own client, through the admin socket: POST /load of the file; the old servers finish their
    # requests (render/door.py).
    _sh(box, _load_script(box, path))


def _load_script(box: Any, path: str) -> str:
    address = ADMIN
    if LOCAL_LABEL not in (box.labels or {}):
        # A door whose compose file came before the socket (_read) is in the project network: Caddy's default
        # address is its own loopback there. Never tried for a door with the label, which may be on the
        # host's network, where that address is the host's (another Caddy's admin API, say).
        address = f"$(test -S {ADMIN_SOCKET} && echo {ADMIN} || echo {LEGACY_ADMIN})"
    return f"caddy reload --config {path} --address {address} --force 2>&1 && rm -f {PENDING_FILE}"


def _pend(box: Any, config: str) -> None:
    _sh(box, f'printf "%s" "$DOOR_CONFIG" > {PENDING_FILE}.new && mv {PENDING_FILE}.new {PENDING_FILE}',
        env={"DOOR_CONFIG": config})


def configure(project: str, config: str) -> str:
    """Give the door `config` (render/door.py `config_text`): "same" (it runs it), "loaded", or
    "pending": the door holds requests now and a reload would end them (render/door.py), so it
    loads when the gate opens (open_to). A fresh container runs no config until this loads one."""
    box = container(project)
    if box is None:
        return "same"
    deadline = time.monotonic() + START_WAIT
    while not (answered := _loaded(box))[0]:
        # A fresh door takes the config through its socket once Caddy is up (it holds nothing yet).
        if answered[2]:
            _pend(box, config)
            if _exec(box, _load_script(box, PENDING_FILE))[0] == 0:
                return "loaded"
        if time.monotonic() >= deadline:
            raise OperationError(f"the door's admin API ({ADMIN} in its container) did not answer within "
                                 f"{START_WAIT:g} s", fix="`docker logs` of the door container says why")
        time.sleep(0.1)
    now = answered[1]
    if now == config:
        _sh(box, f"rm -f {PENDING_FILE}")
        return "same"
    _pend(box, config)
    if now is not None and _sh(box, f"test -f {GATE_FILE} || echo closed").strip() and _holding(box) > 0:
        return "pending"
    _load(box, PENDING_FILE)
    return "loaded"


def _counts(box: Any) -> dict[str, int]:
    """Requests on each upstream, vllm's: the admin route's own upstream (the socket) left out."""
    rows = json.loads(_read_ok(box, "/reverse_proxy/upstreams") or "[]")
    return {str(r.get("address")): int(r.get("num_requests") or 0) for r in rows
            if ADMIN_SOCKET not in str(r.get("address"))}


def _on_vllm(counts: dict[str, int]) -> int:
    """The door's requests on its one upstream, the vLLM service (whatever the node names it)."""
    return sum(counts.values())


def _inside(box: Any) -> int:
    """Every request inside the door, held or on vllm: Caddy's requests_in_flight gauge of its
    reverse_proxy handlers (admin /metrics). The reading request is not among them: Caddy labels a
    request by its route's first handler, the admin route's `vars`."""
    text = _read_ok(box, "/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith("caddy_http_requests_in_flight{") and 'handler="reverse_proxy"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def _holding(box: Any) -> int:
    return max(0, _inside(box) - _on_vllm(_counts(box)))


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
    inside = _inside(box)
    points = _number(gate)
    busy = _on_vllm(_counts(box))
    return DoorState(points_at=int(points) if points is not None else None, in_flight=busy,
                     holding=max(0, inside - busy), closed_at=_number(closed),
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
