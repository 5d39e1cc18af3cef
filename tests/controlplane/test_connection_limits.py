"""No client holds the API's connections: a real controld with small limits, and raw sockets playing
slow clients (slowloris: a request head sent a byte at a time; a body that never comes)."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest

from tests.controlplane.controld_proc import API_TOKEN, Controld

PER_CLIENT = 6


@pytest.fixture
def controld(tmp_path, etcd_server):
    c = Controld(tmp_path, etcd_server.port, extra=(
        "--max-connections-per-client", str(PER_CLIENT), "--header-timeout", "1", "--body-timeout", "1")).start()
    yield c
    c.close()


def connect(c: Controld, source: str = "127.0.0.1") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", c.port), timeout=5, source_address=(source, 0))
    return s


def read_all(s: socket.socket, timeout: float) -> tuple[bytes, float]:
    """What the server sends until it closes, and how long that took."""
    s.settimeout(timeout)
    start, data = time.monotonic(), b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except (TimeoutError, socket.timeout):
        raise AssertionError(f"still open after {timeout} s; received {data[:200]!r}") from None
    except ConnectionResetError:
        pass
    return data, time.monotonic() - start


def metric(c: Controld, name: str) -> float:
    req = urllib.request.Request(c.url + "/v1/metrics", headers={"Authorization": f"Bearer {API_TOKEN}"})
    text = urllib.request.urlopen(req, timeout=5).read().decode()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def test_a_client_at_its_limit_is_refused_others_are_served_and_slow_heads_are_cut(controld):
    slow = [connect(controld) for _ in range(PER_CLIENT)]
    try:
        for s in slow:
            s.sendall(b"GET /healthz HTTP/1.1\r\n")  # the head's first line, and no more for now
        # a seventh connection from the same address is answered 503 before it says anything
        extra = connect(controld)
        data, _ = read_all(extra, 3)
        extra.close()
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), data
        assert b"Retry-After: 1" in head and b'"field": "connection"' in body and b"127.0.0.1" in body, data
        # another address is served meanwhile
        other = connect(controld, "127.0.0.2")
        other.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data, _ = read_all(other, 3)
        other.close()
        assert data.startswith(b"HTTP/1.1 200"), data
        # the slow heads keep trickling a byte every 0.2 s: they are closed at the header timeout anyway
        start = time.monotonic()
        open_ = list(slow)
        while open_ and time.monotonic() - start < 5:
            for s in list(open_):
                try:
                    s.sendall(b"X")
                except OSError:  # closed by the server
                    open_.remove(s)
            time.sleep(0.2)
        took = time.monotonic() - start
        assert not open_, f"{len(open_)} slow clients still held after {took:.1f} s"
        assert took < 1 + 1.5, took
    finally:
        for s in slow:
            s.close()
    # their places are free again
    assert urllib.request.urlopen(controld.url + "/healthz", timeout=5).status == 200
    assert metric(controld, "twine_connections_refused_total") >= 1


def test_a_body_that_does_not_come_is_answered_408_and_writes_nothing(controld):
    s = connect(controld)
    try:
        s.sendall(b"POST /v1/entitlements HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_TOKEN.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"name\": \"web\",")
        data, took = read_all(s, 5)
    finally:
        s.close()
    assert data.startswith(b"HTTP/1.1 408"), data
    assert b'"error": "timeout"' in data and b'"field": "body"' in data, data
    assert took < 1 + 2 + 1.5, took  # the body timeout, then at most 2 s draining what is left
    assert controld.call("GET", "/v1/entitlements")[1]["entitlements"] == []
