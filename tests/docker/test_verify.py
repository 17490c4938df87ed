"""verify against real sockets on loopback, and the readings' pure logic."""

from __future__ import annotations

import os
import socket
import time
from types import SimpleNamespace

import pytest

from b70deploy.docker.verify import load_bound, readings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_established_client_fails_and_time_wait_passes() -> None:
    port = _free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen()
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    try:
        got = readings(port=port, feeders=[], load_threshold=1e9)
        assert not got[0].ok and "ESTABLISHED" in got[0].detail
        conn.close()  # the server side closes first: its end goes to TIME_WAIT on `port`
        client.close()
        time.sleep(0.2)
        got = readings(port=port, feeders=[], load_threshold=1e9)
        assert got[0].ok, got[0].detail
        assert "TIME_WAIT" in got[0].detail
    finally:
        server.close()


def test_feeder_connection_and_load_threshold() -> None:
    def conn(ip: str, port: int, status: str) -> SimpleNamespace:
        return SimpleNamespace(laddr=SimpleNamespace(ip="10.0.0.5", port=port),
                               raddr=SimpleNamespace(ip=ip, port=40000), status=status)

    conns = [conn("192.168.0.62", 22, "ESTABLISHED"), conn("127.0.0.1", 8000, "TIME_WAIT")]
    got = {r.name: r for r in readings(port=8000, feeders=["192.168.0.62", "192.168.0.63"], load_threshold=2.0,
                                       conns=conns, load1=3.5)}
    assert got["port 8000"].ok
    assert not got["feeder 192.168.0.62"].ok and got["feeder 192.168.0.63"].ok
    assert not got["load (1 min)"].ok and "3.50" in got["load (1 min)"].detail
    remote_tw = [conn("192.168.0.70", 8000, "TIME_WAIT")]
    assert not readings(port=8000, feeders=[], load_threshold=9, conns=remote_tw, load1=0)[0].ok


def test_the_load_bound_is_the_core_count_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert load_bound(None) == 16.0
    assert load_bound(2.5) == 2.5
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert load_bound(None) == 1.0
