"""No client holds the API's connections: a real controld with small limits, and raw sockets playing
slow clients (slowloris: a request head sent a byte at a time; a body that never comes)."""

from __future__ import annotations

import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.controlplane.controld_proc import API_TOKEN, Controld
from tests.controlplane.test_controld_api import register

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
        assert took < 1 + 3.5, took
    finally:
        for s in slow:
            s.close()
    # their places are free again
    assert urllib.request.urlopen(controld.url + "/healthz", timeout=5).status == 200
    assert controld.metric("twine_connections_refused_total") >= 1


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


def test_long_polls_parked_at_once_are_bounded(tmp_path, etcd_server):
    c = Controld(tmp_path, etcd_server.port, extra=("--max-long-polls", "2")).start()
    try:
        creds = {m: register(c, m, "dc1", "msb1") for m in ("m1", "m2", "m3")}
        versions = {m: c.call("GET", "/v1/agent/desired?wait=0", token=cred)[1]["version"] for m, cred in creds.items()}

        def poll(m: str, wait: float) -> tuple[int, dict]:
            return c.call("GET", f"/v1/agent/desired?version={versions[m]}&wait={wait}", token=creds[m])

        with ThreadPoolExecutor(2) as pool:
            parked = [pool.submit(poll, m, 3) for m in ("m1", "m2")]
            deadline = time.monotonic() + 5
            while c.metric("twine_agents_long_polls_total") < 5 and time.monotonic() < deadline:
                time.sleep(0.05)  # 3 unparked reads, then the 2 parked
            status, answer = poll("m3", 3)
            assert status == 503 and answer["field"] == "wait" and "--max-long-polls" in answer["why"], answer
            assert poll("m3", 0)[0] == 200, "a poll that does not wait is served"
            assert [f.result()[0] for f in parked] == [200, 200]
        assert poll("m3", 0.2)[0] == 200, "a place is free again"
        assert c.metric("twine_agents_long_polls_refused_total") == 1
    finally:
        c.close()
