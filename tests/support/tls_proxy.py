"""TLS-terminating proxies to the artifact server, for tests of a hostile network.

Each holds a server certificate and key (by default the server's own: a TLS-terminating
middlebox, or an attacker who stole the key), so it sees the plain HTTP inside and may change
it. `CuttingProxy` cuts, resets or fails a tarball download; `OfferProxy` rewrites, redirects or
replays offers.
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable


class TlsProxy:
    """A proxy listening on `host` to the server at `upstream` (host, port), presenting the
    certificate of `presented` (TlsFiles; default: the server's own, `tls`); `relay` decides what
    passes. Its upstream side trusts only the fleet CA."""

    def __init__(self, upstream: tuple[str, int], tls, presented=None, host: str = "127.0.0.1"):
        presented = presented or tls
        self.upstream = upstream
        self._server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._server_tls.load_cert_chain(presented.server_cert, presented.server_key)
        self._client_tls = ssl.create_default_context(cafile=str(tls.ca_cert))
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"https://{host}:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            with self._server_tls.wrap_socket(raw, server_side=True) as client:
                head = client.recv(65536)
                connection = socket.create_connection(self.upstream)
                with self._client_tls.wrap_socket(connection, server_hostname=self.upstream[0]) as up:
                    self.relay(head, client, up)
        except OSError:  # the client refused our certificate, or hung up
            raw.close()

    def relay(self, head: bytes, client: ssl.SSLSocket, upstream: ssl.SSLSocket) -> None:
        upstream.sendall(head)
        _pipe(upstream, client, None)


SERVICE_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b'content-length: 26\r\nconnection: close\r\n\r\n{"error": "a server blip"}'
)


class CuttingProxy(TlsProxy):
    """Cuts tarball responses as `cut` asks (a network cut, or a connection reset), or answers
    them 503 as `blip` asks."""

    cut_after: int | None = None
    cuts_left, reset, blips_left = 0, False, 0

    def cut(self, after: int, times: int = 1, reset: bool = False) -> None:
        """Cut the next `times` tarball responses after `after` bytes (headers included): closed,
        or with `reset` ended by a TCP reset."""
        self.cut_after, self.cuts_left, self.reset = after, times, reset

    def blip(self, times: int = 1) -> None:
        """Answer the next `times` tarball requests 503 without passing them on."""
        self.blips_left = times

    def relay(self, head: bytes, client: ssl.SSLSocket, upstream: ssl.SSLSocket) -> None:
        budget, tarball = None, b".tar.gz" in head.split(b"\r\n", 1)[0]
        if tarball and self.blips_left > 0:
            self.blips_left -= 1
            client.sendall(SERVICE_UNAVAILABLE)
            return
        if tarball and self.cuts_left > 0:
            budget, self.cuts_left = self.cut_after, self.cuts_left - 1
        upstream.sendall(head)
        _pipe(upstream, client, budget, self.reset)


class OfferProxy(TlsProxy):
    """Changes what the server answers about offers (`/v1/boards/...`): `path(p)` may send the
    request elsewhere on the server, `answer(response)` may replace the whole HTTP response;
    `answers` keeps every offer response the server gave, for replays."""

    path: Callable[[str], str] | None = None
    answer: Callable[[bytes], bytes] | None = None

    def __init__(self, upstream: tuple[str, int], tls, host: str = "127.0.0.1"):
        super().__init__(upstream, tls, host=host)
        self.answers: list[bytes] = []

    def relay(self, head: bytes, client: ssl.SSLSocket, upstream: ssl.SSLSocket) -> None:
        method, path, rest = head.split(b" ", 2)
        offer = path.startswith(b"/v1/boards/")
        if offer and self.path:
            path = self.path(path.decode()).encode()
        upstream.sendall(b" ".join((method, path, rest)))
        response = _read_all(upstream)
        if offer:
            self.answers.append(response)
            response = self.answer(response) if self.answer else response
        client.sendall(response)


def http_body(response: bytes) -> bytes:
    return response.split(b"\r\n\r\n", 1)[1]


def with_body(response: bytes, body: bytes) -> bytes:
    """`response` with another body (its Content-Length fixed)."""
    head = response.split(b"\r\n\r\n", 1)[0]
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"content-length:")]
    return b"\r\n".join([*lines, b"content-length: %d" % len(body)]) + b"\r\n\r\n" + body


def _read_all(source: ssl.SSLSocket) -> bytes:
    chunks = []
    try:
        while data := source.recv(65536):
            chunks.append(data)
    except OSError:  # a TLS peer that closes without close_notify
        pass
    return b"".join(chunks)


def _pipe(source: socket.socket, sink: socket.socket, budget: int | None, reset: bool = False) -> None:
    """Copy until EOF, or until `budget` bytes have passed (then cut both ways: with `reset`, by
    a TCP reset)."""
    try:
        while data := source.recv(65536):
            if budget is not None:
                data = data[:budget]
                budget -= len(data)
            sink.sendall(data)
            if budget == 0:
                break
        if budget == 0 and reset:
            time.sleep(0.3)  # the peer reads what was sent before the reset (Linux drops unread data)
            sink.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sink.close()
        else:
            sink.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
