"""`edgetune serve`: the artifact server boards download from (Starlette on uvicorn), over HTTPS
with the certificate the fleet CA made (`deploy.tls`), unless the fleet says `tls: false`.

URL scheme (every request but /v1/health carries `Authorization: Bearer <board token>`):
- `GET /v1/health`: `{"ok": true}`.
- `GET /v1/boards/<board>/models/<model>[?nonce=<32 hex digits>]`: the version the board should
  run (`agent.client.Offer` as JSON: version, pinned, manifest/signature/tarball URLs, manifest
  sha256, tarball size, and the same as a signed, expiring, numbered decision echoing the nonce,
  `deploy.decisions`: what the board acts on).
- `GET /v1/boards/<board>/models/<model>/versions/<N>`: the same for one version.
- `GET /v1/boards/<board>/assigned`: `{"board", "models": {model: version}}`, the versions the
  last rollouts assigned the board (`state/assigned.json`): what its pull timer installs.
- `POST /v1/boards/<board>/status`: the board's report after a pull (`agent.sync.PullReport`,
  schema `edgetune.pull-report` version 1, at most 64 kB), decoded and kept with the server's time in `state/reported/<board>.json`, and
  what it runs in `state/deployed.json` where that changed; `{"ok": true}`.
- `GET /v1/artifacts/<model>/<class>/v<N>/manifest.json` and `.../manifest.sig`, and
  `GET /v1/artifacts/<model>/<class>/v<N>.tar.gz` (strong ETag = its sha256, `If-None-Match`,
  `Range` / `If-Range` for resumed downloads): only for the token's own class.
- `GET /dashboard` (only when the server was given a dashboard): the fleet dashboard's HTML,
  for the operator token alone (`edgetune.deploy.operator`; Bearer, or Basic with the token as password):
  401 without it, 403 for a board's token.
A board's token opens only its own board's routes. Statuses: 400 a malformed name or report (`..`, encoded traversal, a trailing newline), 401 no or unknown
token (the answer says nothing more), 403 another board's or another class's resource, 404
unknown board, model or version. Every error answer, unknown routes' included, is a JSON object
`{"error": ...}`; a 500 says no more than that it happened (the access log has the cause). Only
files of versions `ArtifactStore.servable` accepts are served (complete, no symbolic link, the
manifest its place's, the tarball current); `If-None-Match` takes `*` and weak ETags. Every
request is logged as one JSON line.

Connections pass through `deploy.connections.ConnectionGuard` (`build_server`): how many may be
open, how many from one address, how long a request head and an idle keep-alive may take.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
import ssl
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from uvicorn.config import SSL_PROTOCOL_VERSION, create_ssl_context

from edgetune.agent.sync import REPORT_SCHEMA, REPORT_SCHEMA_VERSION, PullReport
from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.codec import FrozenMap, load_versioned, to_json
from edgetune.artifact_format.decision import NONCE
from edgetune.artifact_format.files import sha256_file
from edgetune.artifact_format.manifest import MANIFEST_NAME, SIGNATURE_NAME
from edgetune.deploy.connections import ConnectionGuard, descriptor_budget
from edgetune.deploy.decisions import DecisionSigner
from edgetune.deploy.log_limit import limit_repeats
from edgetune.deploy.offer import OfferError, check_name, find_board, listed_version, offer
from edgetune.deploy.operator import is_operator_token
from edgetune.deploy.tls import check_server_tls, renew_server_certificate
from edgetune.deploy.tokens import TokenBook
from edgetune.errors import ArtifactError, DeployError
from edgetune.fleet.state import BoardReport, load_assigned, record_reported
from edgetune.inventory.schema import Board, Fleet

log = logging.getLogger(__name__)
RENEW_CHECK_S = 3600.0  # how often a running server looks at its certificate
ACCESS_LOG = logging.getLogger("edgetune.access")
ARTIFACT_FILES = (MANIFEST_NAME, SIGNATURE_NAME)
UNAUTHENTICATED = "a valid board token is required"
OPERATOR_ONLY = "the dashboard needs the operator token (deploy/operator.token under the fleet's workdir)"
DASHBOARD_CHALLENGE = {"www-authenticate": 'Basic realm="edgetune dashboard", charset="UTF-8"'}
DASHBOARD_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
INTERNAL_ERROR = "internal error (the server's log says why)"
MAX_REPORT_BYTES = 64 << 10


class _Digests:
    """sha256 of served tarballs, recomputed only when a file changes (they are immutable)."""

    def __init__(self) -> None:
        self._known: dict[Path, tuple[tuple[int, int], str]] = {}

    def of(self, path: Path) -> str:
        st = os.lstat(path)
        key = (st.st_mtime_ns, st.st_size)
        known = self._known.get(path)
        if known is None or known[0] != key:
            known = (key, sha256_file(path))
            self._known[path] = known
        return known[1]


def create_app(fleet: Fleet, dashboard: Callable[[], bytes] | None = None) -> Starlette:
    """The ASGI application serving `fleet`'s artifact store to its boards; with `dashboard` (the
    page's HTML, drawn when called), also `/dashboard` for the operator."""
    if fleet.deploy is None:
        raise DeployError(f"{fleet.path} has no 'deploy' section (bind, url): add one to serve artifacts to boards")
    store = ArtifactStore(fleet.artifacts.dir)
    tokens = TokenBook(fleet)
    digests = _Digests()
    signer = DecisionSigner(fleet)

    def authenticate(request: Request) -> Board:
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        board = tokens.board_of(presented.strip()) if scheme.lower() == "bearer" and presented else None
        if board is None:
            raise OfferError(401, UNAUTHENTICATED)
        request.state.board = board.name
        return board

    def own_board(request: Request) -> Board:
        caller = authenticate(request)
        board = find_board(fleet, request.path_params["board"])
        if board.name != caller.name:
            raise OfferError(403, f"this token is for board {caller.name}, not {board.name}")
        return board

    def board_offer(request: Request) -> Response:
        board = own_board(request)
        version, nonce = request.path_params.get("version"), request.query_params.get("nonce")
        if nonce is not None and not NONCE.fullmatch(nonce):
            raise OfferError(400, "nonce: 32 lowercase hex digits, or none")
        return JSONResponse(
            to_json(signer.offer(offer(fleet, store, board, request.path_params["model"], version), nonce))
        )

    def board_assigned(request: Request) -> Response:
        board = own_board(request)
        return JSONResponse({"board": board.name, "models": load_assigned(fleet).get(board.name, {})})

    async def board_report(request: Request) -> Response:
        board = own_board(request)
        report = decode_report(board, await _bounded_body(request, MAX_REPORT_BYTES))
        await run_in_threadpool(record_reported, fleet, board.name, report)
        return JSONResponse({"ok": True})

    def stored_version(request: Request):
        caller = authenticate(request)
        model = check_name("model", request.path_params["model"])
        device_class = check_name("device class", request.path_params["device_class"])
        if device_class != caller.device_class:
            raise OfferError(403, f"board {caller.name} is of class {caller.device_class}, not {device_class}")
        if model not in {m.name for m in fleet.models}:
            raise OfferError(404, f"unknown model '{model}'")
        return listed_version(fleet, store, model, device_class, request.path_params["version"])

    def artifact_file(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ARTIFACT_FILES:
            raise OfferError(404, f"no file '{name}' is served (only {', '.join(ARTIFACT_FILES)} and the tarball)")
        stored = stored_version(request)
        return Response(stored.read(name), media_type="application/octet-stream")

    def tarball(request: Request) -> Response:
        stored = stored_version(request)
        etag = f'"{digests.of(stored.tarball)}"'
        if _etag_matches(request.headers.get("if-none-match", ""), etag):
            return Response(status_code=304, headers={"etag": etag})
        return FileResponse(
            stored.tarball, media_type="application/gzip", headers={"etag": etag}, stat_result=os.lstat(stored.tarball)
        )

    async def on_error(request: Request, err: Exception) -> Response:
        request.state.error = str(err)
        if isinstance(err, OfferError):
            return JSONResponse({"error": str(err)}, status_code=err.status)
        return JSONResponse({"error": INTERNAL_ERROR}, status_code=500)

    def operator_page(request: Request) -> Response:
        presented = _presented_token(request.headers.get("authorization", ""))
        refusal = None
        if presented is None or not is_operator_token(fleet, presented):
            board = tokens.board_of(presented) if presented else None
            refusal = (403, "a board token does not open the dashboard") if board else (401, OPERATOR_ONLY)
        if refusal:
            request.state.error = refusal[1]
            return JSONResponse({"error": refusal[1]}, status_code=refusal[0], headers=DASHBOARD_CHALLENGE)
        return HTMLResponse(
            dashboard(), headers={"cache-control": "no-store", "content-security-policy": DASHBOARD_CSP}
        )

    routes = [
        Route("/v1/health", lambda request: JSONResponse({"ok": True})),
        Route("/v1/boards/{board}/models/{model}", board_offer),
        Route("/v1/boards/{board}/models/{model}/versions/{version:int}", board_offer),
        Route("/v1/boards/{board}/assigned", board_assigned),
        Route("/v1/boards/{board}/status", board_report, methods=["POST"]),
        Route("/v1/artifacts/{model}/{device_class}/v{version:int}.tar.gz", tarball, methods=["GET", "HEAD"]),
        Route("/v1/artifacts/{model}/{device_class}/v{version:int}/{name}", artifact_file),
    ]
    if dashboard is not None:
        routes.append(Route("/dashboard", operator_page))
    app = Starlette(routes=routes, exception_handlers={DeployError: on_error, Exception: on_error})
    return _AccessLog(_JsonErrors(app))


def decode_report(board: Board, body: bytes) -> BoardReport:
    """A board's `PullReport`, decoded and checked to be about `board`; a 400 otherwise."""
    try:
        report = load_versioned(
            PullReport,
            body,
            "report",
            REPORT_SCHEMA,
            REPORT_SCHEMA_VERSION,
            what="board's report",
            error=ArtifactError,
            reader="this server",
        )
    except ArtifactError as err:
        raise OfferError(400, f"not a board's report ({str(err)[:300]})") from None
    if report.status.board != board.name:
        raise OfferError(400, f"a report about board {report.status.board!r} sent as {board.name}'s")
    received = datetime.now(timezone.utc).isoformat(timespec="seconds")
    models = {name: model.version for name, model in report.status.models.items()}
    return BoardReport(received, report.status.firmware, FrozenMap(models), FrozenMap(report.errors))


async def _bounded_body(request: Request, limit: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise OfferError(413, f"a report is at most {limit} bytes")
    return bytes(body)


def _presented_token(authorization: str) -> str | None:
    """The token of `Bearer <token>`, or the password of `Basic base64(user:password)` (what a
    browser sends after asking), else None."""
    scheme, _, value = authorization.partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value
    if scheme.lower() == "basic" and value:
        try:
            password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return None
        return password or None
    return None


def _etag_matches(if_none_match: str, etag: str) -> bool:
    """`If-None-Match` names `etag` (weak comparison: `W/"x"` matches `"x"`) or is `*`."""
    listed = [tag.strip() for tag in if_none_match.split(",")]
    return "*" in listed or etag in [tag.removeprefix("W/") for tag in listed]


class _JsonErrors:
    """ASGI middleware: an error answer that is not JSON (Starlette's own 404 and 405 of unknown
    routes, 416 of a bad Range, 500 of an unexpected exception) is sent as `{"error": text}`,
    its other headers (Content-Range) kept; a 500 says no more than that it happened."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held: dict = {}

        async def json_send(message):
            if message["type"] == "http.response.start" and _needs_json(message):
                held["start"], held["body"] = message, b""
                return
            if message["type"] != "http.response.body" or "start" not in held:
                return await send(message)
            held["body"] += message.get("body", b"")
            if not message.get("more_body", False):
                await _send_json_error(send, held["start"], held["body"])

        await self.app(scope, receive, json_send)


def _needs_json(start: dict) -> bool:
    headers = dict(start.get("headers", []))
    return start["status"] >= 400 and not headers.get(b"content-type", b"").startswith(b"application/json")


async def _send_json_error(send, start: dict, body: bytes) -> None:
    status = start["status"]
    text = INTERNAL_ERROR if status >= 500 else body.decode("utf-8", "replace")[:200] or str(status)
    data = json.dumps({"error": text}).encode()
    headers = [(k, v) for k, v in start.get("headers", []) if k not in (b"content-type", b"content-length")]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class _AccessLog:
    """ASGI middleware: one JSON line per request (client, board, method, path, status, bytes, ms)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, sent = time.monotonic(), {"status": 0, "bytes": 0}

        async def counting_send(message):
            if message["type"] == "http.response.start":
                sent["status"] = message["status"]
            elif message["type"] == "http.response.body":
                sent["bytes"] += len(message.get("body", b""))
            await send(message)

        scope.setdefault("state", {})
        try:
            await self.app(scope, receive, counting_send)
        finally:
            state = scope["state"]
            ACCESS_LOG.info(
                json.dumps(
                    {
                        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "client": (scope.get("client") or ("", 0))[0],
                        "board": state.get("board"),
                        "method": scope["method"],
                        "path": scope.get("raw_path", b"").decode("latin-1") or scope["path"],
                        "status": sent["status"],
                        "bytes": sent["bytes"],
                        "ms": round((time.monotonic() - started) * 1e3, 2),
                        "error": state.get("error"),
                    },
                    sort_keys=True,
                )
            )


class RenewingServer(uvicorn.Server):
    """uvicorn's server that, while it runs, checks its certificate every RENEW_CHECK_S and
    makes a new one from the fleet CA when it is due (`tls.renew_server_certificate`); new
    connections are then made with it. The guard's context is replaced whole, never loaded
    into: a context changed in place holds the new certificate with the old key for a moment,
    and a handshake then fails."""

    def __init__(self, config: uvicorn.Config, fleet: Fleet, guard: ConnectionGuard):
        super().__init__(config)
        self.fleet, self.guard = fleet, guard
        self.next_check = time.monotonic() + RENEW_CHECK_S

    async def on_tick(self, counter: int) -> bool:
        if self.guard.tls is not None and time.monotonic() >= self.next_check:
            self.next_check = time.monotonic() + RENEW_CHECK_S
            await asyncio.to_thread(self.renew)
        return await super().on_tick(counter)

    def renew(self) -> None:
        try:
            made = renew_server_certificate(self.fleet)
        except DeployError as err:
            log.warning("warning: the server certificate could not be renewed: %s", err)
            return
        if made:
            files = self.fleet.deploy.tls
            self.guard.tls = _server_context(str(files.server_cert), str(files.server_key))
            log.warning("made a new server certificate (%s): new connections use it", made)


def build_server(
    fleet: Fleet, host: str | None = None, port: int | None = None, dashboard: Callable[[], bytes] | None = None
) -> RenewingServer:
    """uvicorn serving `create_app(fleet, dashboard)` on `host`:`port` (default: deploy.bind),
    every connection through a `ConnectionGuard` holding deploy's connection limits and timeouts
    (TLS inside it); uvicorn's own access log off, repeated warnings limited (`log_limit`). A
    server certificate that is due is made anew first, where the fleet CA's key can be read."""
    settings = fleet.deploy
    if settings is None:
        raise DeployError(f"{fleet.path} has no 'deploy' section (bind, url): add one to serve artifacts to boards")
    if settings.tls is not None and settings.tls.ca_key.exists():
        made = renew_server_certificate(fleet)
        if made:
            log.warning("made a new server certificate (%s)", made)
    tls_files = check_server_tls(fleet)
    tls = _server_context(tls_files["ssl_certfile"], tls_files["ssl_keyfile"]) if tls_files else None
    guard = ConnectionGuard(settings, tls, descriptor_budget(settings.max_connections))
    config = uvicorn.Config(
        create_app(fleet, dashboard),
        host=host or settings.bind_host,
        port=port or settings.port,
        http=guard.protocol,
        ws="none",
        timeout_keep_alive=settings.keepalive_timeout_s,
        access_log=False,
        log_level="warning",
        server_header=False,
    )
    limit_repeats()
    return RenewingServer(config, fleet, guard)


def _server_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    return create_ssl_context(certfile, keyfile, None, SSL_PROTOCOL_VERSION, ssl.CERT_NONE, None, None)


def serve(
    fleet: Fleet, host: str | None = None, port: int | None = None, dashboard: Callable[[], bytes] | None = None
) -> None:
    """Run the server in the foreground until interrupted (`build_server`)."""
    server = build_server(fleet, host, port, dashboard)
    try:
        server.run()
    except OSError as err:
        raise DeployError(
            f"cannot listen on {server.config.host}:{server.config.port}: {err.strerror or err}"
        ) from None
