"""TCP forwards over a board's SSH connection (paramiko), both ways:

- `RemoteForward`: the board's sshd listens on the board's loopback and hands each connection to
  this host over the SSH connection (`tcpip-forward`), which connects it to a destination here
  (the tracker, the artifact server);
- `LocalForward`: a listener on this host whose connections go to an address on the board's
  loopback through a `direct-tcpip` channel of the SSH connection (the board's rpc_server). Its
  transport can be swapped when the connection is made again; while there is none, a connection
  is accepted and closed at once, so a client fails fast instead of hanging.

Through bastions the SSH connection is the board's own, carried in channels of each bastion's
(fleet/ssh.py), so both forwards cross every hop without any listener on a bastion.
"""

from __future__ import annotations

import logging
import socket
import threading

import paramiko

CHUNK = 1 << 16
CONNECT_TIMEOUT_S = 10.0

log = logging.getLogger(__name__)


def pump(sock: socket.socket, channel: paramiko.Channel) -> None:
    """Copy bytes both ways between `sock` and `channel` (two daemon threads) until either side
    ends; then both are closed."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def copy(read, write) -> None:
        try:
            while data := read(CHUNK):
                write(data)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            channel.close()
            _close(sock)

    threading.Thread(target=copy, args=(sock.recv, channel.sendall), daemon=True).start()
    threading.Thread(target=copy, args=(channel.recv, sock.sendall), daemon=True).start()


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class RemoteForward:
    """The board's sshd listens on 127.0.0.1:`port` (0: a port it picks) of the board; each
    connection is joined to `destination` on this host. `port` is the one bound."""

    def __init__(self, transport: paramiko.Transport, port: int, destination: tuple[str, int]):
        self.transport, self.destination = transport, destination
        self.port = transport.request_port_forward("127.0.0.1", port, handler=self._accept)

    def _accept(self, channel: paramiko.Channel, origin, server) -> None:
        # paramiko calls this in its transport's thread: connect in another, not to stall it
        threading.Thread(target=self._join, args=(channel,), daemon=True).start()

    def _join(self, channel: paramiko.Channel) -> None:
        try:
            sock = socket.create_connection(self.destination, timeout=CONNECT_TIMEOUT_S)
        except OSError as err:
            log.warning("forward from the board to %s:%d failed: %s", *self.destination, err)
            channel.close()
            return
        sock.settimeout(None)
        pump(sock, channel)

    def close(self) -> None:
        """Stop the board's listener (nothing to do once the connection is gone)."""
        if self.transport.is_active():
            try:
                self.transport.cancel_port_forward("127.0.0.1", self.port)
            except (paramiko.SSHException, OSError, EOFError):
                pass


class LocalForward:
    """A listener on this host at `listen`; each connection goes to 127.0.0.1:`board_port` on
    the board through the current transport."""

    def __init__(self, listen: tuple[str, int], board_port: int):
        self.board_port = board_port
        self._transport: paramiko.Transport | None = None
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(listen)
        self._sock.listen(64)
        self.address = self._sock.getsockname()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def use(self, transport: paramiko.Transport | None) -> None:
        self._transport = transport

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._join, args=(sock,), daemon=True).start()

    def _join(self, sock: socket.socket) -> None:
        transport = self._transport
        try:
            if transport is None or not transport.is_active():
                raise paramiko.SSHException("the SSH connection is down")
            channel = transport.open_channel(
                "direct-tcpip", ("127.0.0.1", self.board_port), sock.getpeername(), timeout=CONNECT_TIMEOUT_S
            )
        except (paramiko.SSHException, OSError, EOFError) as err:
            log.warning("forward to the board's port %d failed: %s", self.board_port, err)
            _close(sock)
            return
        pump(sock, channel)

    def close(self) -> None:
        _close(self._sock)
