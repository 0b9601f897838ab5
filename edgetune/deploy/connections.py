"""The artifact server's front door: every connection it accepts passes through a
`ConnectionGuard` before uvicorn's HTTP protocol sees it. The guard holds the limits of
fleet.yaml's `deploy` section:

- `max_connections` open at once, TLS handshakes included. At the limit, a new connection
  closes the one that has waited longest with no request in progress (idle, handshaking or
  sending its head slowly); it is refused only when every open connection is serving a request.
- `max_connections_per_client` open at once from one IP address; one more is closed at accept.
- `header_timeout_s`: from accept, TLS handshake included, to a complete request head; on a
  kept-alive connection, from the first byte of each later request to its complete head. A
  connection that sends nothing, or drips its head (slowloris), is closed then.
- `keepalive_timeout_s`: a connection idle between requests is closed (uvicorn's keep-alive timer).

TLS is done here (`loop.start_tls`, within the header deadline) rather than by the listening
socket, so the limits apply from accept. A connection beyond a limit is closed with no answer
and logged as a warning, which `log_limit` keeps to one line per kind and minute under attack.
`descriptor_budget` raises the process's open-file limit to what `max_connections` needs.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import resource
import ssl
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from edgetune.inventory.schema import DeploySettings

LOG = logging.getLogger("edgetune.deploy.connections")
FD_RESERVE = 64  # descriptors beside the connections': the listening socket, logs, the store's reads


def descriptor_budget(max_connections: int) -> int:
    """How many connections this process can hold: the soft limit on open files is raised to
    what `max_connections` needs (a socket and a file being sent each, and `FD_RESERVE`), as far
    as the hard limit allows; below that, fewer connections, with a warning."""
    need = 2 * max_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return max_connections
    fitting = max(1, (soft - FD_RESERVE) // 2)
    LOG.warning(
        "deploy.max_connections is %d, but this process may open only %d files (ulimit -n): "
        "serving at most %d connections at once",
        max_connections,
        soft,
        fitting,
    )
    return fitting


class ConnectionGuard:
    """The limits and the open connections of one server; `protocol` is uvicorn's `http`."""

    def __init__(self, settings: DeploySettings, tls: ssl.SSLContext | None, max_connections: int) -> None:
        self.tls = tls
        self.max_connections = max_connections
        self.per_client = settings.max_connections_per_client
        self.header_timeout_s = settings.header_timeout_s
        self.open: dict[_Connection, None] = {}
        self.waiting: dict[_Connection, None] = {}  # no request in progress, longest waiting first
        self.of_client: collections.Counter[str] = collections.Counter()

    def protocol(
        self, config: Any, server_state: Any, app_state: dict[str, Any], _loop: asyncio.AbstractEventLoop | None = None
    ) -> asyncio.Protocol:
        """A `_Connection` for a socket just accepted (uvicorn calls this as its protocol class)."""
        return _Connection(
            self,
            lambda connection: _Http(
                connection, config=config, server_state=server_state, app_state=app_state, _loop=_loop
            ),
        )

    def admit(self, connection: _Connection) -> bool:
        client = connection.client
        if self.of_client[client] >= self.per_client:
            LOG.warning(
                "refused a connection from %s: %d open from that address (deploy.max_connections_per_client)",
                client,
                self.of_client[client],
            )
            return False
        if len(self.open) >= self.max_connections:
            if not self.waiting:
                LOG.warning(
                    "refused a connection from %s: %d open, each serving a request (deploy.max_connections)",
                    client,
                    len(self.open),
                )
                return False
            oldest = next(iter(self.waiting))
            LOG.warning(
                "closed a connection from %s, the longest waiting without a request, for one from %s: "
                "%d open (deploy.max_connections)",
                oldest.client,
                client,
                len(self.open),
            )
            oldest.close()
        self.open[connection] = self.waiting[connection] = None
        self.of_client[client] += 1
        return True

    def release(self, connection: _Connection) -> None:
        if connection not in self.open:
            return
        del self.open[connection]
        self.waiting.pop(connection, None)
        self.of_client[connection.client] -= 1
        if not self.of_client[connection.client]:
            del self.of_client[connection.client]

    def busy(self, connection: _Connection) -> None:
        self.waiting.pop(connection, None)

    def idle(self, connection: _Connection) -> None:
        if connection in self.open:
            self.waiting.pop(connection, None)
            self.waiting[connection] = None


class _Connection(asyncio.Protocol):
    """One accepted socket: admitted by the guard, its TLS handshake and header deadline; then
    the HTTP protocol gets its (TLS) transport and every event."""

    def __init__(self, guard: ConnectionGuard, make_http: Callable[[_Connection], _Http]) -> None:
        self.guard = guard
        self.http = make_http(self)
        self.transport: asyncio.BaseTransport | None = None
        self.client = ""
        self.deadline: asyncio.TimerHandle | None = None
        self.handshake: asyncio.Task | None = None
        self.early: list[bytes] = []  # what came after the handshake, before the HTTP protocol had its transport
        self.attached = self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if peer else ""
        if not self.guard.admit(self):
            self.closed = True
            transport.abort()
            return
        self.arm()
        if self.guard.tls is None:
            self.attach(transport)
        else:
            self.handshake = asyncio.get_running_loop().create_task(self.start_tls(transport))

    async def start_tls(self, transport: asyncio.BaseTransport) -> None:
        if self.closed:
            return
        try:
            tls = await asyncio.get_running_loop().start_tls(
                transport, self, self.guard.tls, server_side=True, ssl_handshake_timeout=self.guard.header_timeout_s
            )
        except Exception:  # noqa: BLE001 (a failed, cut or timed-out handshake: start_tls closed the socket)
            self.connection_lost(None)
            return
        if tls is not None and not self.closed:
            self.attach(tls)

    def attach(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.attached = transport, True
        self.http.connection_made(transport)
        early, self.early = b"".join(self.early), []
        if early:
            self.data_received(early)

    def data_received(self, data: bytes) -> None:
        if not self.attached:
            self.early.append(data)
            return
        if self.deadline is None and self in self.guard.waiting:  # the first bytes of a later request
            self.arm()
        self.http.data_received(data)

    def eof_received(self) -> bool | None:
        return self.http.eof_received() if self.attached else None

    def pause_writing(self) -> None:
        if self.attached:
            self.http.pause_writing()

    def resume_writing(self) -> None:
        if self.attached:
            self.http.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.disarm()
        self.guard.release(self)
        if self.attached:
            self.attached = False
            self.http.connection_lost(exc)

    def arm(self) -> None:
        self.deadline = asyncio.get_running_loop().call_later(self.guard.header_timeout_s, self.too_slow)

    def disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def too_slow(self) -> None:
        self.deadline = None
        LOG.warning(
            "closed a connection from %s: no complete request head within %g s (deploy.header_timeout_s)",
            self.client,
            self.guard.header_timeout_s,
        )
        self.close()

    def close(self) -> None:
        """Give up the connection's place now and drop it (its transport reports the end later)."""
        self.disarm()
        self.guard.release(self)
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def head_received(self) -> None:
        self.disarm()
        self.guard.busy(self)

    def response_sent(self) -> None:
        self.guard.idle(self)


class _Http(H11Protocol):
    """uvicorn's h11 protocol, telling its `_Connection` when a request's head is complete and
    when a response is (with no other request behind it)."""

    def __init__(self, connection: _Connection, **uvicorn_args: Any) -> None:
        super().__init__(**uvicorn_args)
        self.connection = connection

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:
            self.connection.head_received()

    def on_response_complete(self) -> None:
        cycle = self.cycle
        super().on_response_complete()
        if self.cycle is cycle and not self.transport.is_closing():
            self.connection.response_sent()
