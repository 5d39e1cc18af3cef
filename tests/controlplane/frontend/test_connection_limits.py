"""No client holds the API's connections: a real controld with small limits, and raw sockets playing
slow clients (slowloris: a request head sent a byte at a time; a body that never comes)."""

from __future__ import annotations

import json
import socket
import ssl
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from controlplane.security.pki import CA
from tests.controlplane.controld_proc import API_TOKEN, Controld
from tests.controlplane.frontend.test_controld_api import register
from tests.controlplane.security.test_tls import tls_flags

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
    answer = json.loads(data.partition(b"\r\n\r\n")[2])
    assert answer["error"] == "timeout" and answer["field"] == "body", data
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


def test_a_long_poll_waits_at_most_max_long_poll_and_a_bad_version_is_refused(tmp_path, etcd_server):
    c = Controld(tmp_path, etcd_server.port, extra=("--max-long-poll", "1")).start()
    try:
        cred = register(c, "m1", "dc1", "msb1")
        version = c.call("GET", "/v1/agent/desired?wait=0", token=cred)[1]["version"]
        began = time.monotonic()
        status, answer = c.call("GET", f"/v1/agent/desired?version={version}&wait=30", token=cred)
        took = time.monotonic() - began
        assert status == 200 and answer["version"] == version, answer
        assert 0.9 < took < 5, f"asked for 30 s, the daemon's most is 1 s: answered after {took:.1f} s"
        status, answer = c.call("GET", "/v1/agent/desired?version=" + "0" * 65, token=cred)
        assert status == 400 and answer["field"] == "version", answer
    finally:
        c.close()


def _https_healthz(c: Controld, source: str = "127.0.0.1") -> int | str:
    """GET /healthz over a new TLS connection from `source`: the status, or the error that ended it."""
    try:
        raw = socket.create_connection(("127.0.0.1", c.port), timeout=5, source_address=(source, 0))
    except OSError as e:
        return type(e).__name__
    try:
        with c.tls.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data, _ = read_all(s, 5)
    except (OSError, ssl.SSLError) as e:
        return type(e).__name__
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else repr(data[:80])


def test_unfinished_tls_handshakes_count_against_the_clients_limit_and_are_cut_at_the_header_timeout(tmp_path, etcd_server):
    """Over TLS a connection is counted from its accept: PER_CLIENT connections that never finish
    their handshake hold the client's places (a next one is closed at once), not another client's;
    the header timeout ends them, and their places are free again. Every new connection's first
    request is answered (none is lost between the accept and the handshake)."""
    ca = CA(tmp_path / "pki")
    c = Controld(tmp_path, etcd_server.port, ca=ca.cert, extra=(
        *tls_flags(ca.issue("controld"), ca), "--max-connections-per-client", str(PER_CLIENT),
        "--header-timeout", "1", "--body-timeout", "1")).start()
    try:
        assert [_https_healthz(c) for _ in range(40)] == [200] * 40
        c.wait_metrics(lambda m: m["twine_connections_open"] == 1, what="the 40 connections released")  # 1: its own
        stalled = [connect(c) for _ in range(PER_CLIENT)]  # TCP open, no ClientHello (accepted before the next)
        try:
            refused = _https_healthz(c)
            assert refused in ("SSLEOFError", "ConnectionResetError", "SSLZeroReturnError", "BrokenPipeError"), refused
            assert _https_healthz(c, "127.0.0.2") == 200, "another client is served meanwhile"
            start = time.monotonic()
            for s in stalled:
                data, _ = read_all(s, 4)  # closed by the server at the handshake timeout
                assert data == b"", data
            assert time.monotonic() - start < 1 + 2.5
        finally:
            for s in stalled:
                s.close()
        assert _https_healthz(c) == 200, "their places are free again"
        m = c.metrics()
        assert m["twine_connections_refused_total"] >= 1 and m["twine_connections_open"] <= 1, m
    finally:
        c.close()


def test_the_servers_total_limit_refuses_any_client_beyond_it(tmp_path, etcd_server):
    c = Controld(tmp_path, etcd_server.port, extra=("--max-connections", "4", "--header-timeout", "5")).start()
    try:
        held = [connect(c, f"127.0.0.{i}") for i in (1, 2, 3, 4)]
        try:
            for s in held:
                s.sendall(b"GET /healthz HTTP/1.1\r\n")  # a head begun, not finished: the place is held
            time.sleep(0.2)  # accepted and counted; no condition to wait on (a metrics request would be refused)
            extra = connect(c, "127.0.0.5")  # a client with no connection of its own is refused too
            data, _ = read_all(extra, 3)
            extra.close()
            assert data.startswith(b"HTTP/1.1 503") and b"holds its limit of 4 connections" in data, data
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + 5
        while True:  # the closed ones are released as the server sees them go
            try:
                assert urllib.request.urlopen(c.url + "/healthz", timeout=5).status == 200
                break
            except OSError:  # a 503 (HTTPError is an OSError) until then
                assert time.monotonic() < deadline, "no place free after the held connections closed"
                time.sleep(0.1)
    finally:
        c.close()
