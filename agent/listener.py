"""An HTTP listener that bounds what one client can hold: the control daemon's API and the agent's
status port both serve through it.

- **Connections per client and in all**: a connection beyond `per_client` from one address, or
  beyond `total`, is answered 503 at once and closed, before any of its bytes are read (as nginx's
  limit_conn). A client that opens hundreds of connections does not take the others' places.
- **TLS**: a connection is counted from its TCP accept, before its handshake (asyncio's TLS server
  would hand it over only once the handshake is done: a client could hold any number of unfinished
  handshakes). Over the limits it is closed at once (no 503: that needs a handshake); the handshake
  must end within `header_timeout`.
- **Header timeout**: a connection must send a whole request head within `header_timeout` seconds
  of opening (over TLS: of its handshake's end, so at most twice that from its accept), and within
  that long of its last response (aiohttp's keep-alive timer, which the trickle of a slow client's
  bytes does not reset).
- **Body timeout**: the API reads a body within `body_timeout` seconds (controlplane/frontend/app.py);
  what is left of a body the server did not read is drained for at most 2 s before it closes.

aiohttp's sites take the runner's protocol factory as it is; this listener puts a small protocol in
front of each connection, which counts it and then hands every callback to aiohttp's handler.
"""

from __future__ import annotations

import asyncio
import json
import ssl as ssl_module
from collections import Counter
from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True)
class ConnLimits:
    per_client: int = 256
    total: int = 10000
    header_timeout: float = 10.0
    body_timeout: float = 30.0

    def runner_kwargs(self) -> dict:
        """For web.AppRunner: an idle or unfinished request head is closed after header_timeout;
        the rest of a body that was not read (refused, or timed out) is drained for at most 2 s
        (aiohttp's lingering close, 10 s by default), then the connection is closed."""
        return {"keepalive_timeout": self.header_timeout, "lingering_time": min(2.0, self.header_timeout)}


def _refusal(why: str) -> bytes:
    body = json.dumps({"error": "unavailable", "field": "connection", "why": why}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class _Guard(asyncio.Protocol):
    """One connection: admitted (then aiohttp's handler does the work) or refused with a 503. With
    TLS it is counted before its handshake, which it then upgrades to (loop.start_tls)."""

    __slots__ = ("_listener", "_inner", "_client", "_counted", "_early")

    def __init__(self, listener: "Listener"):
        self._listener = listener
        self._inner: asyncio.Protocol | None = None
        self._client = ""
        self._counted = False
        self._early: list[bytes] | None = None  # decrypted bytes that came before the handler was set up

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        client = peer[0] if isinstance(peer, tuple) and peer else ""
        why = self._listener.admit(client)
        if why:
            if self._listener.ssl is None:
                transport.write(_refusal(why))  # type: ignore[attr-defined]
            transport.close()
            return
        self._client, self._counted = client, True
        if self._listener.ssl is not None:
            # no byte is read before start_tls takes the transport over (the ClientHello waits in the socket)
            transport.pause_reading()  # type: ignore[attr-defined]
            self._early = []
            upgrade = asyncio.get_running_loop().create_task(self._handshake(transport))
            self._listener.handshakes.add(upgrade)
            upgrade.add_done_callback(lambda task: self._handshake_done(task, transport))
            return
        self._serve(transport)

    async def _handshake(self, raw: asyncio.BaseTransport) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(raw, self, self._listener.ssl, server_side=True,  # type: ignore[arg-type]
                                       ssl_handshake_timeout=self._listener.limits.header_timeout)
        except Exception:  # a failed or timed-out handshake, a client gone (a cancel: _handshake_done)
            self._release()
            raw.close()
            return
        if tls is None or tls.is_closing():
            self._release()
            return
        early, self._early = self._early or [], None
        self._serve(tls)
        for data in early:  # what the handshake's last flight carried, before the handler was there
            self.data_received(data)

    def _handshake_done(self, task: asyncio.Task, raw: asyncio.BaseTransport) -> None:
        self._listener.handshakes.discard(task)
        if task.cancelled():  # the server stopping, before or during the handshake
            self._release()
            raw.close()

    def _serve(self, transport: asyncio.BaseTransport) -> None:
        try:
            self._inner = self._listener.runner.server()
            self._inner.connection_made(transport)
        except Exception:  # noqa: BLE001 - the server is shutting down (no handler any more)
            self._inner = None
            self._release()
            transport.close()

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            self._listener.release(self._client)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
        elif self._early is not None:
            self._early.append(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        if self._inner is not None:
            inner, self._inner = self._inner, None
            inner.connection_lost(exc)


class Listener:
    """Serves a set-up AppRunner on HOST:PORT, plain or TLS, within `limits`."""

    def __init__(self, runner: web.AppRunner, limits: ConnLimits):
        self.runner = runner
        self.limits = limits
        self.open: Counter[str] = Counter()
        self.total = 0
        self.refused = 0
        self.ssl: ssl_module.SSLContext | None = None
        self.handshakes: set[asyncio.Task] = set()  # TLS handshakes under way
        self._server: asyncio.base_events.Server | None = None

    def admit(self, client: str) -> str:
        """"" if the connection may stay, else why not."""
        if self.total >= self.limits.total:
            why = f"this server holds its limit of {self.limits.total} connections"
        elif self.open[client] >= self.limits.per_client:
            why = f"{client or 'this client'} holds its limit of {self.limits.per_client} connections"
        else:
            self.open[client] += 1
            self.total += 1
            return ""
        self.refused += 1
        return why

    def release(self, client: str) -> None:
        self.total -= 1
        self.open[client] -= 1
        if self.open[client] <= 0:
            del self.open[client]

    async def start(self, host: str, port: int, ssl: ssl_module.SSLContext | None = None) -> "Listener":
        """Plain TCP either way: with `ssl`, each connection is counted and then upgraded (_Guard)."""
        loop = asyncio.get_running_loop()
        self.ssl = ssl
        self._server = await loop.create_server(lambda: _Guard(self), host, port, reuse_address=True, backlog=1024)
        return self

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting; the runner's cleanup then ends the open connections."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self.handshakes):
            task.cancel()
