"""The server's pull routes over real HTTPS: a board reads the versions assigned to it and
reports what it runs; a board's token reaches only its own board, and a report that is not a
board's report is refused with nothing recorded."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from edgetune.agent.client import ArtifactServer
from edgetune.agent.errors import AgentError
from edgetune.deploy.tls import host_client_context
from edgetune.fleet.state import load_deployed, load_reported, record_assigned, state_path


def post(server, path: str, token: str, body: bytes):
    request = urllib.request.Request(
        server.url + path,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=server.context) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def report_of(board: str, device_class: str, version: int | None) -> dict:
    model = {
        "version": version,
        "since": "2026-12-05T03:00:00+00:00",
        "firmware": "fw-1",
        "previous": None,
        "highest_installed": version or 0,
        "kept": [version] if version else [],
    }
    return {
        "schema": "edgetune.pull-report",
        "schema_version": 1,
        "status": {"board": board, "device_class": device_class, "firmware": "fw-1", "models": {"mlp": model}},
        "errors": {},
    }


def client(fleet, token: str) -> ArtifactServer:
    return ArtifactServer(fleet.deploy.url, token, tls=host_client_context(fleet))


def test_a_board_reads_its_assignment_and_its_report_is_kept(deploy_fleet, published, artifact_server):
    _, tokens = published
    record_assigned(deploy_fleet, "fast-1", "mlp", 2)
    fast_1 = client(deploy_fleet, tokens["fast-1"])
    assert fast_1.assigned("fast-1") == {"mlp": 2}
    assert client(deploy_fleet, tokens["fast-2"]).assigned("fast-2") == {}

    fast_1.report("fast-1", report_of("fast-1", "gw-fast", 2))
    reported = load_reported(deploy_fleet)["fast-1"]
    assert reported.models == {"mlp": 2} and reported.firmware == "fw-1" and reported.received.startswith("20")
    assert load_deployed(deploy_fleet)["fast-1"] == {"mlp": 2}

    deployed = state_path(deploy_fleet, "deployed")
    written = deployed.stat().st_mtime_ns
    fast_1.report("fast-1", report_of("fast-1", "gw-fast", 2))  # what was recorded: deployed.json is not rewritten
    assert (
        deployed.stat().st_mtime_ns == written and load_reported(deploy_fleet)["fast-1"].received >= reported.received
    )


def test_a_board_token_reaches_only_its_own_board(deploy_fleet, published, artifact_server):
    _, tokens = published
    body = json.dumps(report_of("fast-2", "gw-fast", 1)).encode()
    status, answer = post(artifact_server, "/v1/boards/fast-2/status", tokens["fast-1"], body)
    assert status == 403 and "fast-1, not fast-2" in answer["error"]
    with pytest.raises(AgentError, match="HTTP 403"):
        client(deploy_fleet, tokens["fast-1"]).assigned("fast-2")
    assert post(artifact_server, "/v1/boards/fast-2/status", "x" * 40, body)[0] == 401
    assert load_reported(deploy_fleet) == {} and load_deployed(deploy_fleet) == {}


@pytest.mark.parametrize(
    "body, message",
    [
        (b"not json", "not a board's report"),
        (json.dumps({"status": {"board": "fast-1"}, "errors": {}}).encode(), "schema: not an edgetune.pull-report"),
        (
            json.dumps({**report_of("fast-1", "gw-fast", 1), "schema_version": 2}).encode(),
            "schema_version: 2 is not supported",
        ),
        (
            json.dumps({**report_of("fast-1", "gw-fast", 1), "status": {"board": "fast-1"}}).encode(),
            "status.device_class",
        ),
        (json.dumps({**report_of("fast-1", "gw-fast", 1), "errors": {"mlp": 3}}).encode(), "not a board's report"),
        (json.dumps(report_of("fast-2", "gw-fast", 1)).encode(), "about board 'fast-2' sent as fast-1's"),
        (b"{" + b" " * (70 << 10) + b"}", "at most 65536 bytes"),
    ],
)
def test_a_report_that_is_not_a_boards_is_refused_and_nothing_is_kept(
    deploy_fleet, published, artifact_server, body, message
):
    _, tokens = published
    status, answer = post(artifact_server, "/v1/boards/fast-1/status", tokens["fast-1"], body)
    assert status in (400, 413) and message in answer["error"]
    assert load_reported(deploy_fleet) == {} and load_deployed(deploy_fleet) == {}
