"""The agent's HTTP client of the artifact server (`edgetune serve`), on `urllib` only.

Every request carries `Authorization: Bearer <token>`. Redirects are refused (the token must
not follow them elsewhere), and the server's URLs must be absolute paths on the configured
server. The tarball download resumes a partial file with `Range` + `If-Range` (the ETag kept
beside it): a server whose file changed answers 200 with the whole file, which replaces it.
Behind an SSH transport the connections go to a forward of the board's SSH connection
(SERVER_VIA_ENV) while the URL still names the server. Over HTTPS the server's certificate must be signed by the fleet CA pinned on the board (no
other authority is trusted) and name the URL's host; a refusal says which of the two failed.
A transient failure (the server unreachable, an HTTP 5xx, a connection reset or a timeout
mid-answer) is tried again after each of `RETRY_DELAYS_S`; a download goes on from the bytes
it already has.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from edgetune.agent.errors import AgentError
from edgetune.artifact_format.codec import from_json
from edgetune.artifact_format.signing import Signature
from edgetune.artifact_format.trust import TrustFile
from edgetune.durable import fsync_dir, write_atomic
from edgetune.errors import ArtifactError

TIMEOUT_S = 30.0
MAX_SMALL_FILE = 16 << 20  # manifest, signature and offers are far smaller
_CHUNK = 1 << 20
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)
# HOST:PORT to open the server's connections to instead of the URL's address: the board's end of
# a forward of the SSH connection that runs the agent (`ssh.transport: ssh`).
SERVER_VIA_ENV = "EDGETUNE_SERVER_VIA"  # waits between attempts: 5 attempts, 7.5 s of waiting at most
T = TypeVar("T")


@dataclass(frozen=True)
class Offer:
    """The server's answer to "which version should this board run?"."""

    board: str
    device_class: str
    model: str
    version: int
    pinned: bool
    manifest_url: str
    signature_url: str
    tarball_url: str
    manifest_sha256: str
    tarball_size: int
    decision: str  # the signed decision (`artifact_format.decision`): what the agent acts on
    decision_signature: Signature
    trust: TrustFile | None = None  # the fleet's keys (`artifact_format.trust`): the decision key's certificate


@dataclass(frozen=True)
class Downloaded:
    """How a tarball download went: bytes already there before it (resumed) and received
    (over all its attempts, net of any restart)."""

    resumed_from: int
    received: int


class HttpStatusError(AgentError):
    """The server answered with an HTTP error status."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class TransientError(AgentError):
    """A failure that may pass: the server unreachable, a reset or timeout mid-answer."""


def is_transient(err: AgentError) -> bool:
    return isinstance(err, TransientError) or (isinstance(err, HttpStatusError) and err.status >= 500)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib then raises HTTPError for the 3xx


class _Via:
    """HTTP(S) connections opened to `via` (a forward of the board's SSH connection to the
    server) instead of the URL's address. Everything else stays the URL's: the Host header, and
    for TLS the server name sent and the name the certificate must carry."""

    def __init__(self, via: tuple[str, int]):
        self.via = via

    def __call__(self, connection_class):
        def open_connection(address, timeout=socket.getdefaulttimeout(), source_address=None):
            return socket.create_connection(self.via, timeout, source_address)

        def make(host, **kwargs):
            connection = connection_class(host, **kwargs)
            connection._create_connection = open_connection  # http.client's own seam for the socket
            return connection

        return make


class _ViaHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, via: _Via):
        super().__init__()
        self._via = via

    def http_open(self, req):
        return self.do_open(self._via(http.client.HTTPConnection), req)


class _ViaHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, via: _Via, context: ssl.SSLContext | None):
        super().__init__(context=context)
        self._via = via

    def https_open(self, req):
        return self.do_open(self._via(http.client.HTTPSConnection), req, context=self._context)


def parse_via(text: str) -> tuple[str, int]:
    """`HOST:PORT` of SERVER_VIA_ENV; AgentError if it is not one."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise AgentError(f"{SERVER_VIA_ENV}={text!r} is not HOST:PORT")
    return host, int(port)


class ArtifactServer:
    def __init__(
        self,
        base_url: str,
        token: str,
        timeout_s: float = TIMEOUT_S,
        tls: ssl.SSLContext | None = None,
        via: tuple[str, int] | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._timeout = timeout_s
        if via is None:
            handlers = [urllib.request.HTTPSHandler(context=tls)]
        else:
            handlers = [_ViaHTTPHandler(_Via(via)), _ViaHTTPSHandler(_Via(via), tls)]
        self._opener = urllib.request.build_opener(_NoRedirect, *handlers)

    def offer(self, board: str, model: str, version: int | None = None, nonce: str | None = None) -> Offer:
        path = f"/v1/boards/{quote(board, safe='')}/models/{quote(model, safe='')}"
        if version is not None:
            path += f"/versions/{version}"
        if nonce is not None:
            path += f"?nonce={nonce}"
        raw = self._json(path)
        known = {f.name for f in fields(Offer)}
        try:  # fields a newer server adds are ignored; the known ones are checked
            return from_json(Offer, {k: v for k, v in raw.items() if k in known})
        except ArtifactError as err:
            raise AgentError(f"{self.base_url}{path}: not an offer ({err})") from None

    def assigned(self, board: str) -> dict[str, int]:
        """model -> the version the fleet's last rollout of it assigned this board."""
        path = f"/v1/boards/{quote(board, safe='')}/assigned"
        models = self._json(path).get("models")
        if not isinstance(models, dict) or not all(
            isinstance(m, str) and type(v) is int and v >= 1 for m, v in models.items()
        ):
            raise AgentError(f"{self._url(path)}: not an assignment (models: a map of model names to versions)")
        return models

    def report(self, board: str, report: dict) -> None:
        """POST the board's report (its status, what its pull could not do) to the server."""
        path = f"/v1/boards/{quote(board, safe='')}/status"
        body = json.dumps(report, sort_keys=True).encode()
        _retrying(lambda: self._post_once(path, body))

    def _post_once(self, path: str, body: bytes) -> None:
        try:
            with self._open(path, {"Content-Type": "application/json"}, data=body) as response:
                response.read(MAX_SMALL_FILE)
        except (OSError, http.client.HTTPException) as err:
            raise TransientError(f"{self._url(path)}: the answer was cut short ({err!r}); retry") from None

    def get_bytes(self, path: str) -> bytes:
        data = _retrying(lambda: self._get_once(path))
        if len(data) > MAX_SMALL_FILE:
            raise AgentError(f"{self._url(path)}: larger than {MAX_SMALL_FILE} bytes; refused")
        return data

    def download(self, path: str, partial: Path, etag_file: Path, size: int) -> Downloaded:
        """Download `path` into `partial` until it holds `size` bytes, resuming what is there
        (also after a transient failure). `resumed_from`: the bytes there before the first try."""
        kept = partial.stat().st_size if partial.exists() and etag_file.exists() else 0
        last = _retrying(lambda: self._download_once(path, partial, etag_file, size))
        resumed_from = min(kept, last.resumed_from)  # 0 if an attempt had to start over
        return Downloaded(resumed_from=resumed_from, received=size - resumed_from)

    def _get_once(self, path: str) -> bytes:
        try:
            with self._open(path) as response:
                return response.read(MAX_SMALL_FILE + 1)
        except (OSError, http.client.HTTPException) as err:
            raise TransientError(f"{self._url(path)}: the answer was cut short ({err!r}); retry") from None

    def _download_once(self, path: str, partial: Path, etag_file: Path, size: int) -> Downloaded:
        offset = partial.stat().st_size if partial.exists() and etag_file.exists() else 0
        if offset >= size:
            return Downloaded(resumed_from=offset, received=0)
        headers = {"Range": f"bytes={offset}-", "If-Range": etag_file.read_text()} if offset else {}
        try:
            response = self._open(path, headers)
        except HttpStatusError as err:
            if not (offset and err.status == 416):
                raise
            partial.unlink()  # the partial file is not a prefix of the server's: start over
            etag_file.unlink(missing_ok=True)
            return self._download_once(path, partial, etag_file, size)
        with response:
            if response.status == 206:
                _check_content_range(response.headers.get("Content-Range", ""), offset, size, self._url(path))
            else:
                offset = 0
            etag = response.headers.get("ETag")
            if etag:
                write_atomic(etag_file, etag.encode("ascii", "replace"))
            else:
                etag_file.unlink(missing_ok=True)
            received = _copy_body(response, partial, offset, size, self._url(path))
        return Downloaded(resumed_from=offset, received=received)

    def _json(self, path: str) -> dict:
        data = self.get_bytes(path)
        try:
            raw = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise AgentError(f"{self._url(path)}: not JSON ({err})") from None
        if not isinstance(raw, dict):
            raise AgentError(f"{self._url(path)}: expected a JSON object")
        return raw

    def _url(self, path: str) -> str:
        if not path.startswith("/") or path.startswith("//"):
            raise AgentError(f"the server named {path!r}, not a path on {self.base_url}; refused")
        return self.base_url + path

    def _open(self, path: str, headers: dict[str, str] | None = None, data: bytes | None = None):
        url = self._url(path)
        request = urllib.request.Request(
            url, data=data, headers={"Authorization": f"Bearer {self._token}", **(headers or {})}
        )
        try:
            return self._opener.open(request, timeout=self._timeout)
        except urllib.error.HTTPError as err:
            message = f"{url}: HTTP {err.code}: {_error_text(err)}{_HINTS.get(err.code, '')}"
            raise HttpStatusError(message, err.code) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
            reason = getattr(err, "reason", err)
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise AgentError(f"{self.base_url}: {certificate_refusal(reason)}; refused") from None
            raise TransientError(
                f"cannot reach the artifact server {self.base_url} ({reason}); retry when it is up"
            ) from None


_NAME_MISMATCH = (62, 64)  # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
_UNKNOWN_ISSUER = (2, 18, 19, 20, 21)  # the chain does not lead to the pinned CA


def certificate_refusal(err: ssl.SSLCertVerificationError) -> str:
    """Why the server's certificate was refused, in words that say what to check."""
    if err.verify_code in _NAME_MISMATCH:
        return (
            f"name mismatch: the server's certificate does not name the host of this URL ({err.verify_message}); "
            "the operator re-issues it with `edgetune keys init --if-missing` after changing deploy.url"
        )
    if err.verify_code in _UNKNOWN_ISSUER:
        return (
            f"wrong CA: the server's certificate is not signed by the fleet CA pinned on this board "
            f"({err.verify_message}): another server, or the fleet CA was replaced (then roll out again)"
        )
    return f"the server's certificate is not valid ({err.verify_message})"


_HINTS = {
    401: " (the server does not accept this board's token: have the operator re-run the rollout)",
    403: " (this board may not have it: is agent.json's board/device_class right?)",
}


def _error_text(err: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(err.read(4096).decode("utf-8"))
        return str(body["error"]) if isinstance(body, dict) and "error" in body else str(body)
    except (OSError, ValueError, UnicodeDecodeError):
        return err.reason or "error"


def _check_content_range(value: str, offset: int, size: int, url: str) -> None:
    if value != f"bytes {offset}-{size - 1}/{size}":
        raise AgentError(f"{url}: asked for bytes {offset}- of {size}, the server sent range {value!r}; refused")


def _copy_body(response, partial: Path, offset: int, size: int, url: str) -> int:
    """Append the response body to `partial` (truncated to `offset`); at most `size` bytes in all."""
    received = 0
    with open(partial, "r+b" if offset else "wb") as out:
        out.truncate(offset)
        out.seek(offset)
        try:
            while chunk := response.read1(_CHUNK):  # what has arrived: kept even if a reset follows
                received += len(chunk)
                if offset + received > size:
                    raise AgentError(f"{url}: the server sent more than the {size} bytes it announced; refused")
                out.write(chunk)
        except (OSError, http.client.HTTPException) as err:
            raise TransientError(
                f"{url}: download interrupted at {offset + received} of {size} bytes ({err!r}); run again to resume it"
            ) from None
        finally:
            out.flush()
            os.fsync(out.fileno())
    fsync_dir(partial.parent)
    if offset + received != size:
        raise TransientError(f"{url}: download stopped at {offset + received} of {size} bytes; run again to resume it")
    return received


def _retrying(attempt: Callable[[], T]) -> T:
    """`attempt()`, tried again after each of `RETRY_DELAYS_S` while it fails transiently."""
    for delay in RETRY_DELAYS_S:
        try:
            return attempt()
        except AgentError as err:
            if not is_transient(err):
                raise
        time.sleep(delay)
    return attempt()
