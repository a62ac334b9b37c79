"""A loopback TCP proxy in front of a store stand-in that can fail the way a network or a service fails.

Modes, switched at any time (``proxy.mode = "blackhole"``), and what a client sees:

- ``pass``       the stand-in, byte for byte;
- ``refuse``     nothing listens: a connect is refused (ECONNREFUSED); open connections are reset;
- ``reset``      a connection is accepted and reset (RST), and so is any open one at its next request;
- ``blackhole``  connections are accepted and requests read, but nothing ever answers (a hung store);
- ``503``        every request is answered ``503 Service Unavailable`` (S3's SlowDown body) and closed.

A connection blackholed stays so (its client times out, as it would); new ones follow the mode of the moment.
``s3_proxy`` is the fixture: moto (``s3_standin``) behind a fresh proxy, with env pointing boto3 at the proxy.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
from dataclasses import dataclass, field

import pytest

MODES = ("pass", "refuse", "reset", "blackhole", "503")
_503 = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\nConnection: close\r\n"
        b"Content-Length: 127\r\n\r\n<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
        b"<Message>Please reduce your request rate.</Message></Error>  ")


def _rst(sock: socket.socket) -> None:
    """Close with a reset, as a crashed server's kernel answers."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class FaultProxy:
    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self._mode = "pass"
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._listener: socket.socket | None = None
        self.port = 0
        self._listen()
        self.connections = 0  # accepted so far (a test may wait for a client to come)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        assert mode in MODES, mode
        with self._lock:
            was, self._mode = self._mode, mode
            if mode == "refuse" and self._listener is not None:
                listener, self._listener = self._listener, None
                listener.close()  # the port stays ours: nothing else binds it in the moment we are away
            elif was == "refuse" and mode != "refuse":
                self._listen()

    def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self._listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True, name="fault-proxy-accept").start()

    def _accept(self, listener: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                client, _ = listener.accept()
            except OSError:  # closed: refuse mode, or the proxy stopped
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True, name="fault-proxy-conn").start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        held = False  # blackholed: this connection never answers again
        sel = selectors.DefaultSelector()
        try:
            sel.register(client, selectors.EVENT_READ, "client")
            while not self._closed.is_set():
                mode = self._mode
                if mode in ("reset", "refuse"):
                    _rst(client)
                    return
                for key, _ in sel.select(timeout=0.1):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    if key.data == "upstream":
                        client.sendall(data)
                        continue
                    mode = self._mode
                    if held or mode == "blackhole":
                        held = True  # read and dropped, never answered
                    elif mode == "503":
                        client.sendall(_503)
                        return
                    elif mode in ("reset", "refuse"):
                        _rst(client)
                        return
                    else:
                        if upstream is None:
                            upstream = socket.create_connection(self.upstream)
                            sel.register(upstream, selectors.EVENT_READ, "upstream")
                        upstream.sendall(data)
        except OSError:
            pass
        finally:
            sel.close()
            for s in (client, upstream):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None


@dataclass
class ProxiedS3:
    proxy: FaultProxy
    env: dict[str, str]  # for a child process or apply_env: boto3 goes through the proxy
    bucket: str
    direct: object = field(repr=False)  # a boto3 client straight to moto, for the test's own looks


@pytest.fixture
def s3_proxy(s3_standin, monkeypatch):
    """moto behind a fresh fault proxy; the test process's env points boto3 at the proxy, with a new bucket."""
    import uuid
    from urllib.parse import urlparse

    from stores import apply_env

    up = urlparse(s3_standin.endpoint)
    proxy = FaultProxy((up.hostname, up.port))
    bucket = f"faults-{uuid.uuid4().hex[:12]}"
    direct = s3_standin.client()
    direct.create_bucket(Bucket=bucket)
    env = s3_standin.env(AWS_ENDPOINT_URL=proxy.endpoint)
    apply_env(monkeypatch, env)
    try:
        yield ProxiedS3(proxy, env, bucket, direct)
    finally:
        proxy.close()
