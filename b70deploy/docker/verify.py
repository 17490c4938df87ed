"""Is the node idle? Readings from the kernel's socket table and load average.

The load is read before the drain (a switch refuses there, the clients still served: the drain does
not lower it); the connections after it (deploy/steps.py `idle` and `verify`).

Idle means: on the prod port only TIME_WAIT entries from loopback remain, no configured
feeder address holds an ESTABLISHED connection, and the 1-minute load is under the
threshold (the post's checks before benchmarking on the dark port).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

import psutil

from ..deploy.nodeio import Reading


def _is_loopback(ip: str) -> bool:
    addr = _ip(ip)
    return addr is not None and addr.is_loopback


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return None
    # An IPv4 peer on a dual-stack socket shows as ::ffff:a.b.c.d
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped or addr


def load_bound(configured: float | None) -> float:
    """The load average under which the node counts as idle: the node config's `load_threshold`,
    else one runnable task per core (a fixed 2.0 kept a busy 2-core box from ever going idle,
    and would call a 64-core one idle under a heavy load)."""
    return configured if configured is not None else float(os.cpu_count() or 1)


def readings(*, port: int, feeders: list[str], load_threshold: float, conns: list[Any] | None = None,
             load1: float | None = None) -> list[Reading]:
    conns = psutil.net_connections(kind="inet") if conns is None else conns
    conns = [c for c in conns if c.raddr]  # unconnected sockets have an empty tuple here
    on_port = [c for c in conns if c.laddr and c.laddr.port == port and c.status != psutil.CONN_LISTEN and c.raddr]
    busy = [c for c in on_port if not (c.status == psutil.CONN_TIME_WAIT and _is_loopback(c.raddr.ip))]
    waiting = len(on_port) - len(busy)
    if busy:
        sample = ", ".join(f"{c.raddr.ip}:{c.raddr.port} {c.status}" for c in busy[:5])
        out = [Reading(f"port {port}", False, f"{len(busy)} live connection(s): {sample}")]
    else:
        out = [Reading(f"port {port}", True, f"no live connections ({waiting} loopback TIME_WAIT)")]
    feeder_set = {ipaddress.ip_address(f) for f in feeders}
    est = [c for c in conns if c.raddr and c.status == psutil.CONN_ESTABLISHED and _ip(c.raddr.ip) in feeder_set]
    for feeder in feeders:
        mine = [c for c in est if _ip(c.raddr.ip) == ipaddress.ip_address(feeder)]
        out.append(Reading(f"feeder {feeder}", not mine, f"{len(mine)} ESTABLISHED"))
    load = os.getloadavg()[0] if load1 is None else load1
    out.append(Reading("load (1 min)", load < load_threshold,
                       f"{load:.2f} (threshold {load_threshold:g}: node config load_threshold)", drained=False))
    return out


def remote_readings(address: str, port: int, *, timeout: float = 2.0) -> list[Reading]:
    """For a node on another host: we run no agent there, so its socket table and load are
    out of reach; what we can see is that nothing accepts connections on the prod port."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            accepting = True
    except OSError:
        accepting = False
    return [Reading(f"port {port} on {address}", not accepting,
                    "still accepts connections" if accepting else "refuses connections (drained)"),
            Reading("socket table, load", True, f"on {address}; not readable without an agent: not checked",
                    drained=False)]
