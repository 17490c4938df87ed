"""The front door's configuration (pure): Caddy's JSON config as the door service runs it.

Caddy 2.6 (Debian's) is the proxy: its `reverse_proxy` holds a request while no upstream is
available, retrying every `try_interval` up to `try_duration`, then fails it (answered 503
with Retry-After here by the server's `errors` routes). A config change through Caddy's admin
API reloads every handler, and 2.6 then cuts the proxied responses and the held requests of
the old ones (tried here: an SSE stream stopped after 2 of 6 chunks, a held request got 503).
So the config never changes during a switch; the switch turns a gate instead:

    clients -> :8080 front -> 127.0.0.1:2022 door --(healthy?)--> 127.0.0.1:2021 relay -> vllm:8000
                                  \\-- active health check: GET 127.0.0.1:2020/gate (file_server)

The relay upstream is healthy while the file GATE_FILE exists in the door container (it holds
the revision the door points at). The deploy removes it to drain: new requests find no
healthy upstream and are held, the door's /health answers 503, requests already on the relay
finish (the relay's own counter for vllm:8000, GET /reverse_proxy/upstreams on the admin
API, says when). Writing it back releases the held requests at their next retry. A held
request is not on any upstream, so the front hop counts every request inside the door: the
held ones are the front's count less the relay's. The door server logs each request (its
start and duration), from which `b70deploy door` tells how many the last switch held.

Only the client API goes through: /v1/*, /health, /metrics, /version (vLLM's entrypoints).
Everything else gets 403, vLLM's development endpoints first among them (attached only with
VLLM_SERVER_DEV_MODE=1: /sleep, /wake_up, /is_sleeping, /collective_rpc, /reset_prefix_cache,
/reset_mm_cache, /server_info in vllm/entrypoints/openai/api_server.py; /scale_elastic_ep and
/is_scaling_elastic_ep in vllm/entrypoints/serve/elastic_ep/api_router.py): those stay
reachable from the project network at vllm:8000.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING, Any

from .vllm_args import CONTAINER_PORT

if TYPE_CHECKING:
    from ..config.schema import Door

DOOR_SERVICE = "door"
DEFAULT_IMAGE = "b70deploy/door:caddy"  # built by `b70deploy door --build` (docker/door_image.py)
DOOR_PORT = 8080             # the door's port in its container (published as the node's port)
INNER = "127.0.0.1:2022"
RELAY = "127.0.0.1:2021"
GATE = "127.0.0.1:2020"
ADMIN = "127.0.0.1:2019"     # Caddy's admin API, inside the container only (docker exec reaches it)
GATE_DIR = "/tmp/door"
GATE_FILE = f"{GATE_DIR}/gate"
CLOSED_FILE = f"{GATE_DIR}/closed_at"   # when the gate was last closed, and opened (epoch seconds)
OPENED_FILE = f"{GATE_DIR}/opened_at"


def upstream(service: str, port: int = CONTAINER_PORT) -> str:
    """The relay's one upstream: the vLLM service on the project network, at the stack's container port."""
    return f"{service}:{port}"
CONFIG_ENV = "DOOR_CONFIG"   # the JSON config, in the service's environment (no extra file to deploy)
CHECK_INTERVAL = "200ms"     # how soon a turned gate is seen
TRY_INTERVAL = "250ms"       # how often a held request tries again
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
FORWARDED = ("/v1/*", "/health", "/metrics", "/version")
DEV_ENDPOINTS = ("/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/reset_prefix_cache",
                 "/reset_mm_cache", "/server_info", "/scale_elastic_ep", "/is_scaling_elastic_ep")
# The door container's command: the config from the environment into a file Caddy reads, the
# gate closed (the folder empty) until the deploy opens it.
COMMAND = ("/bin/sh", "-c", f'mkdir -p {GATE_DIR} && printf "%s" "${CONFIG_ENV}" > /tmp/door.json '
           "&& exec caddy run --config /tmp/door.json")


def caddy_config(*, hold_seconds: float, retry_after: int, service: str = "vllm",
                 port: int = CONTAINER_PORT) -> dict[str, Any]:
    """The door's whole Caddy config: it depends on the revision served only by vLLM's container port."""
    relay = [{"dial": RELAY}]
    health_checks = {"active": {"uri": "/gate", "port": int(GATE.rsplit(":", 1)[1]), "interval": CHECK_INTERVAL,
                                "timeout": "1s"}}
    # No keep-alive between the door's own hops: with it, Caddy 2.6 cut streamed responses now
    # and then (the relay: "use of closed network connection"; 6 of 123 chat streams through
    # the three hops ended after 0 or 1 chunk, 0 of 117 without; a loopback connect costs µs).
    loopback = {"protocol": "http", "keep_alive": {"enabled": False}}
    held = {"handler": "reverse_proxy", "upstreams": relay, "health_checks": health_checks,
            "transport": loopback, "flush_interval": -1,  # chunks as vLLM sends them
            # Caddy tries again only a GET unless told: "no upstreams available" is not a dial
            # error. The request has then reached no upstream, so a POST is safe to try again too.
            "load_balancing": {"try_duration": f"{hold_seconds:g}s", "try_interval": TRY_INTERVAL,
                               "retry_match": [{"method": list(METHODS)}]}}
    # Not held: a router's health check must see 503 at once.
    health = {"handler": "reverse_proxy", "upstreams": relay, "health_checks": health_checks, "transport": loopback}
    busy = {"handler": "static_response", "status_code": 503, "headers": {"Retry-After": [str(retry_after)]},
            "body": "no stack is live behind the door; retry later\n"}
    return {
        "admin": {"listen": ADMIN, "config": {"persist": False}},
        "logging": {"logs": {"default": {"level": "WARN", "exclude": ["http.log.access.door"]},
                             "door": {"level": "INFO", "include": ["http.log.access.door"],
                                      "writer": {"output": "stdout"}, "encoder": {"format": "json"}}}},
        "apps": {"http": {"servers": {
            "front": {
                "listen": [f":{DOOR_PORT}"],
                "routes": [{"handle": [{"handler": "reverse_proxy", "flush_interval": -1, "transport": loopback,
                                        "upstreams": [{"dial": INNER}]}]}],
                "automatic_https": {"disable": True},
            },
            "door": {
                "listen": [INNER],
                "logs": {"default_logger_name": "door"},
                "routes": [
                    {"match": [{"path": ["/health"]}], "handle": [health]},
                    {"match": [{"path": list(FORWARDED)}], "handle": [held]},
                    {"handle": [{"handler": "static_response", "status_code": 403,
                                 "body": "not served through the door\n"}]},
                ],
                "errors": {"routes": [{"handle": [busy]}]},
                "automatic_https": {"disable": True},
            },
            "relay": {
                "listen": [RELAY],
                # No keep-alive to vllm either: each request resolves the service's name again, so on a
                # hot-standby node the network alias moved to another container is followed at once
                # (docker/standby.py), with no pooled connection to the container that left.
                "routes": [{"handle": [{"handler": "reverse_proxy", "flush_interval": -1, "transport": loopback,
                                        "upstreams": [{"dial": upstream(service, port)}]}]}],
                "errors": {"routes": [{"handle": [busy]}]},
                "automatic_https": {"disable": True},
            },
            "gate": {
                "listen": [GATE],
                "routes": [{"handle": [{"handler": "file_server", "root": GATE_DIR}]}],
                "automatic_https": {"disable": True},
            },
        }}},
    }


def config_text(*, hold_seconds: float, retry_after: int, service: str = "vllm", port: int = CONTAINER_PORT) -> str:
    return json.dumps(caddy_config(hold_seconds=hold_seconds, retry_after=retry_after, service=service, port=port),
                      sort_keys=True, separators=(",", ":"))


def interpolation(door: Door, *, port: int, bind_address: str) -> dict[str, str]:
    """The .env values of a project with a door: the node's port is the door's, and vllm's
    port is the probe port, on loopback."""
    return {"DOOR_PORT": str(port), "DOOR_BIND_ADDRESS": bind_address,
            "VLLM_PORT": str(door.probe_port), "VLLM_BIND_ADDRESS": "127.0.0.1"}


def service(door: Door, vllm: str = "vllm", port: int = CONTAINER_PORT) -> dict[str, Any]:
    """What the compose template writes for the door service, in front of the service `vllm`."""
    image, config = door.image or DEFAULT_IMAGE, config_text(hold_seconds=door.hold_seconds,
                                                             retry_after=door.retry_after, service=vllm, port=port)
    digest = hashlib.sha256(json.dumps([image, list(COMMAND), config]).encode()).hexdigest()[:16]
    return {"image": image, "command": list(COMMAND), "container_port": DOOR_PORT, "config": config,
            "digest": digest}


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
