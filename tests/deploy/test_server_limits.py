"""The artifact server under an unauthenticated denial of service, on loopback HTTPS: idle TLS
connections, a slowloris, slow and idle keep-alive requests and one address opening too many
connections, while a board's client still gets `/v1/health` and its tarball; each attacking
connection is closed by the limit that covers it (fleet.yaml's deploy section, with short
timeouts here) and the log stays a few lines. Attackers connect from other loopback addresses
(127.0.1.x ...) than the client (127.0.0.1), as clients on other hosts would."""

from __future__ import annotations

import logging
import select
import socket
import ssl
import threading
import time
import urllib.request

import pytest
from support.artifact_server import RunningServer
from support.fleet_marker import starts_fleet

from edgetune.deploy.log_limit import RepeatFilter

HEADER_TIMEOUT_S, KEEPALIVE_TIMEOUT_S, PER_CLIENT = 2.0, 1.0, 8
IDLE_SOURCES, IDLE_PER_SOURCE = [f"127.0.1.{n}" for n in range(1, 11)], 6  # 60 idle connections
LIMITED_LOGGERS = ("edgetune.deploy.connections", "asyncio", "uvicorn.error")


def limited_server(fleet, **limits):
    """The server of `fleet` with `limits` added to its deploy section."""
    from edgetune.inventory import load_fleet

    text = fleet.path.read_text()
    deploy = next(line for line in text.splitlines() if line.startswith("deploy: {"))
    settings = ", ".join(f"{key}: {value}" for key, value in limits.items())
    fleet.path.write_text(text.replace(deploy, deploy[:-1] + ", " + settings + "}"))
    return RunningServer(load_fleet(fleet.path))


@pytest.fixture
@starts_fleet
def guarded(deploy_fleet, published):
    server = limited_server(
        deploy_fleet,
        max_connections=200,
        max_connections_per_client=PER_CLIENT,
        header_timeout_s=HEADER_TIMEOUT_S,
        keepalive_timeout_s=KEEPALIVE_TIMEOUT_S,
    )
    try:
        yield server, published
    finally:
        server.stop()


def connect(server, source: str) -> ssl.SSLSocket:
    """A TLS connection from `source`, its handshake done."""
    host, port = server.url.removeprefix("https://").split(":")
    raw = socket.create_connection((host, int(port)), timeout=5, source_address=(source, 0))
    return server.context.wrap_socket(raw, server_hostname=host)


def is_closed(sock: ssl.SSLSocket, wait_s: float) -> bool:
    """The server closed `sock` within `wait_s` (EOF or reset; no answer is due on it). Reads
    without blocking: what arrives may be only a TLS 1.3 session ticket."""
    deadline, timeout = time.monotonic() + wait_s, sock.gettimeout()
    sock.settimeout(0)
    try:
        while True:
            try:
                return sock.recv(1) == b""
            except ssl.SSLWantReadError:
                pass
            except OSError:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
                return False
    finally:
        sock.settimeout(timeout)


def closed_after(socks: dict[ssl.SSLSocket, float], limit_s: float) -> list[float]:
    """Seconds from each socket's connect to its close by the server (waiting at most `limit_s`)."""
    ends: dict[ssl.SSLSocket, float] = {}
    deadline = time.monotonic() + limit_s
    while len(ends) < len(socks) and time.monotonic() < deadline:
        for sock in select.select([s for s in socks if s not in ends], [], [], 0.1)[0]:
            if is_closed(sock, 0):
                ends[sock] = time.monotonic() - socks[sock]
    return [ends.get(sock, float("inf")) for sock in socks]


def read_answer(sock: ssl.SSLSocket) -> bytes:
    """One whole HTTP answer (head and its Content-Length of body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    )
    while len(body) < length:
        body += sock.recv(4096)
    return head + b"\r\n\r\n" + body


def drip(server, source: str, first_request: bytes | None, result: dict) -> None:
    """Slowloris from `source`: (after `first_request` and its answer) a request head sent a
    header line every 0.3 s, never finished; `result["after"]`: seconds from its first byte to
    the server's close."""
    sock = connect(server, source)
    if first_request:
        sock.sendall(first_request)
        result["answer"] = read_answer(sock)
    started = time.monotonic()
    lines = [b"GET /v1/health HTTP/1.1\r\n", b"Host: x\r\n"] + [b"X-Drip-%d: a\r\n" % n for n in range(100)]
    for line in lines:
        try:
            sock.sendall(line)
        except OSError:
            break
        if is_closed(sock, 0.3):
            break
    result["after"] = time.monotonic() - started
    sock.close()


def idle_after_answer(server, source: str, result: dict) -> None:
    """One whole request on a kept-alive connection, then nothing: `result["after"]`: seconds
    from the answer to the server's close."""
    sock = connect(server, source)
    sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    result["answer"] = read_answer(sock)
    started = time.monotonic()
    is_closed(sock, 10)
    result["after"] = time.monotonic() - started
    sock.close()


def board_gets(server, token: str, version) -> None:
    """What a board does: `/v1/health`, then its tarball (the bytes stored)."""
    with urllib.request.urlopen(server.url + "/v1/health", timeout=5, context=server.context) as answer:
        assert answer.status == 200 and answer.read() == b'{"ok":true}'
    request = urllib.request.Request(
        f"{server.url}/v1/artifacts/mlp/gw-fast/v{version.version}.tar.gz", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=5, context=server.context) as answer:
        assert answer.status == 200 and answer.read() == version.tarball.read_bytes()


def test_idle_connections_and_slowloris_are_cut_while_boards_download(guarded, caplog):
    server, (versions, tokens) = guarded
    caplog.set_level(logging.WARNING)
    idle = {}
    for source in IDLE_SOURCES:
        for _ in range(IDLE_PER_SOURCE):
            started = time.monotonic()
            idle[connect(server, source)] = started
    attacks = {name: {} for name in ("slowloris", "slow second request", "idle after answer")}
    threads = [
        threading.Thread(target=drip, args=(server, "127.0.2.1", None, attacks["slowloris"])),
        threading.Thread(
            target=drip,
            args=(server, "127.0.2.2", b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n", attacks["slow second request"]),
        ),
        threading.Thread(target=idle_after_answer, args=(server, "127.0.2.3", attacks["idle after answer"])),
    ]
    for thread in threads:
        thread.start()

    for _ in range(3):  # the board's client, while all that is open
        board_gets(server, tokens["fast-1"], versions[0])

    crowd = {}  # one address at its limit: each further connection is closed at accept
    for _ in range(PER_CLIENT):
        started = time.monotonic()
        crowd[connect(server, "127.0.3.1")] = started
    refused = 0
    for _ in range(40):
        started = time.monotonic()
        try:
            extra = connect(server, "127.0.3.1")
        except OSError:  # the handshake met a closed connection
            refused += 1
        else:
            refused += is_closed(extra, 1)
            extra.close()
        assert time.monotonic() - started < 1
    assert refused == 40
    board_gets(server, tokens["fast-1"], versions[0])

    opened = {**idle, **crowd}
    waited = closed_after(opened, HEADER_TIMEOUT_S + 3)
    for thread in threads:
        thread.join(timeout=10)
    for sock in opened:
        sock.close()

    assert all(HEADER_TIMEOUT_S - 0.1 <= s <= HEADER_TIMEOUT_S + 1.5 for s in waited), sorted(waited)
    assert HEADER_TIMEOUT_S - 0.1 <= attacks["slowloris"]["after"] <= HEADER_TIMEOUT_S + 1.5, attacks
    assert attacks["slow second request"]["answer"].startswith(b"HTTP/1.1 200")
    assert HEADER_TIMEOUT_S - 0.1 <= attacks["slow second request"]["after"] <= HEADER_TIMEOUT_S + 1.5, attacks
    assert attacks["idle after answer"]["answer"].startswith(b"HTTP/1.1 200")
    assert KEEPALIVE_TIMEOUT_S - 0.1 <= attacks["idle after answer"]["after"] <= KEEPALIVE_TIMEOUT_S + 1.5, attacks
    board_gets(server, tokens["fast-1"], versions[0])

    # 40 refusals and 70 cut connections: the first of each kind is logged, the rest counted
    warned = [r.getMessage() for r in caplog.records if r.name in LIMITED_LOGGERS]
    assert len(warned) <= 4, warned
    assert sum("(deploy.max_connections_per_client)" in w for w in warned) <= 1, warned
    assert sum("(deploy.header_timeout_s)" in w for w in warned) <= 1, warned


def test_a_full_server_closes_its_longest_idle_connection_for_a_new_one(deploy_fleet, published):
    versions, tokens = published
    server = limited_server(deploy_fleet, max_connections=10, max_connections_per_client=10, header_timeout_s=20)
    try:
        held = [connect(server, "127.0.5.1") for _ in range(10)]
        board_gets(server, tokens["fast-1"], versions[0])  # two requests on one connection: one evicted
        assert is_closed(held[0], 2)
        assert not any(is_closed(sock, 0) for sock in held[2:])
        for sock in held:
            sock.close()
    finally:
        server.stop()


def test_repeated_warnings_are_counted_then_summarized():
    logger = logging.getLogger("edgetune.tests.repeats")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    limiter = RepeatFilter(window_s=1.0)
    logger.addHandler(handler)
    logger.addFilter(limiter)
    logger.setLevel(logging.INFO)
    try:
        for n in range(500):
            logger.warning("refused a connection from %s", f"10.0.0.{n % 250}")
        logger.info("not limited")
        assert [r.getMessage() for r in records] == ["refused a connection from 10.0.0.0", "not limited"]
        time.sleep(1.3)
        assert records[-1].getMessage() == "499 more like this in the last 1 s: refused a connection from 10.0.0.0"
        logger.warning("refused a connection from %s", "10.0.0.9")
        assert records[-1].getMessage() == "refused a connection from 10.0.0.9" and len(records) == 4
    finally:
        logger.removeFilter(limiter)
        logger.removeHandler(handler)
