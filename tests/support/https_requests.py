"""Requests to the artifact server as a client other than the agent would send them: plain
GETs whose HTTP errors are answers too, and raw paths that no client normalises."""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request


def get(server, path: str, token: str | None = None, headers: dict | None = None):
    """(status, headers, body) of a GET; HTTP errors are answers too."""
    request = urllib.request.Request(
        server.url + path, headers={**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=server.context) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def raw_get(server, raw_path: str, token: str | None, method: str = "GET"):
    """(status, body) of a request whose path is sent exactly as given (no client-side
    normalisation of `..`)."""
    host, port = server.url.removeprefix("https://").split(":")
    conn = http.client.HTTPSConnection(host, int(port), timeout=10, context=server.context)
    conn.putrequest(method, raw_path, skip_accept_encoding=True)
    if token is not None:
        conn.putheader("Authorization", f"Bearer {token}")
    conn.endheaders()
    response = conn.getresponse()
    return response.status, response.read()
