"""A TCP proxy on loopback that a test can cut: a process that reaches etcd through it is cut off
from etcd (connections reset, new ones refused) while everything else still reaches etcd; or hold,
so that it sees etcd late."""

from __future__ import annotations

import socket
import threading
import time


class TcpProxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1"):
        self.upstream = (host, upstream_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self.cut_off = False
        self.held = False  # hold(): bytes wait here, in both directions, until released
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut_off:
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or self.cut_off:
                    break
                while self.held and not self.cut_off:
                    time.sleep(0.005)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def hold(self, held: bool = True) -> None:
        """Delay what passes (nothing is lost): the process behind it sees etcd late, not gone."""
        self.held = held

    def cut(self) -> None:
        """From now on nothing passes: open connections are reset, new ones closed at once."""
        self.cut_off = True
        with self._lock:
            for s in self._socks:
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    s.close()
                except OSError:
                    pass
            self._socks.clear()

    def close(self) -> None:
        self.cut()
        self.listener.close()
