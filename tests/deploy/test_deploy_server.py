"""The artifact server over real HTTP (uvicorn on loopback): what a board is offered, what it
may download, resumable and conditional downloads, and every refusal with its status."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from support.https_requests import get, raw_get

from edgetune.deploy.tokens import ensure_token, read_token
from edgetune.errors import DeployError


def test_board_is_offered_newest_or_its_pin(deploy_fleet, published, artifact_server):
    _, tokens = published
    status, _, body = get(artifact_server, "/v1/boards/fast-1/models/mlp", tokens["fast-1"])
    offer = json.loads(body)
    assert status == 200 and offer["version"] == 2 and offer["pinned"] is False
    assert offer["tarball_url"] == "/v1/artifacts/mlp/gw-fast/v2.tar.gz"
    pinned = json.loads(get(artifact_server, "/v1/boards/fast-2/models/mlp", tokens["fast-2"])[2])
    assert (pinned["version"], pinned["pinned"]) == (1, True)
    explicit = json.loads(get(artifact_server, "/v1/boards/fast-2/models/mlp/versions/2", tokens["fast-2"])[2])
    assert explicit["version"] == 2
    slow = json.loads(get(artifact_server, "/v1/boards/slow-1/models/mlp", "s" * 40)[2])
    assert (slow["device_class"], slow["version"]) == ("gw-slow", 1)


def test_offered_files_are_the_stored_ones(published, artifact_server):
    versions, tokens = published
    offer = json.loads(get(artifact_server, "/v1/boards/fast-1/models/mlp", tokens["fast-1"])[2])
    _, _, manifest = get(artifact_server, offer["manifest_url"], tokens["fast-1"])
    _, _, signature = get(artifact_server, offer["signature_url"], tokens["fast-1"])
    status, headers, tarball = get(artifact_server, offer["tarball_url"], tokens["fast-1"])
    stored = versions[1]
    assert manifest == (stored.path / "manifest.json").read_bytes()
    assert signature == (stored.path / "manifest.sig").read_bytes()
    assert status == 200 and tarball == stored.tarball.read_bytes() and len(tarball) == offer["tarball_size"]
    import hashlib

    assert headers["etag"] == f'"{hashlib.sha256(tarball).hexdigest()}"'


def test_tarball_resumes_with_range_and_answers_if_none_match(published, artifact_server):
    versions, tokens = published
    path, token, whole = "/v1/artifacts/mlp/gw-fast/v2.tar.gz", tokens["fast-1"], versions[1].tarball.read_bytes()
    etag = get(artifact_server, path, token)[1]["etag"]
    status, headers, rest = get(artifact_server, path, token, {"Range": "bytes=100-", "If-Range": etag})
    assert status == 206 and rest == whole[100:]
    assert headers["content-range"] == f"bytes 100-{len(whole) - 1}/{len(whole)}"
    status, _, body = get(artifact_server, path, token, {"Range": "bytes=100-", "If-Range": '"another-version"'})
    assert status == 200 and body == whole  # the file changed: start again
    assert get(artifact_server, path, token, {"If-None-Match": etag})[0] == 304


@pytest.mark.parametrize(
    "path, token_of, status",
    [
        ("/v1/boards/fast-1/models/mlp", None, 401),
        ("/v1/boards/fast-1/models/mlp", "nobody", 401),
        ("/v1/boards/fast-2/models/mlp", "fast-1", 403),  # another board's offer
        ("/v1/artifacts/mlp/gw-slow/v1.tar.gz", "fast-1", 403),  # another class's artifact
        ("/v1/artifacts/mlp/gw-slow/v1/manifest.json", "fast-1", 403),
        ("/v1/boards/ghost/models/mlp", "fast-1", 404),
        ("/v1/boards/fast-1/models/resnet", "fast-1", 404),
        ("/v1/boards/fast-1/models/other", "fast-1", 404),  # declared, never built
        ("/v1/boards/fast-1/models/mlp/versions/9", "fast-1", 404),
        ("/v1/artifacts/mlp/gw-fast/v9.tar.gz", "fast-1", 404),
        ("/v1/artifacts/mlp/gw-fast/v1/model.so", "fast-1", 404),  # only manifest, signature, tarball
        ("/v1/boards/%2e%2e/models/mlp", "fast-1", 400),
        ("/v1/artifacts/%2e%2e/gw-fast/v1.tar.gz", "fast-1", 400),
        ("/v1/artifacts/mlp/%2E%2E/v1/manifest.json", "fast-1", 400),
    ],
)
def test_refusals_have_their_status_and_serve_nothing(published, artifact_server, path, token_of, status):
    _, tokens = published
    token = tokens.get(token_of, token_of)
    got, headers, body = get(artifact_server, path, token)
    assert got == status
    assert headers["content-type"] == "application/json" and "error" in json.loads(body)


def test_raw_dot_dot_paths_reach_nothing(published, artifact_server):
    _, tokens = published
    for raw in (
        "/v1/artifacts/../../work/keys/signing.key",
        "/v1/artifacts/mlp/gw-fast/../../../fleet.yaml",
        "/v1/boards/../artifacts/mlp/gw-fast/v1.tar.gz",
    ):
        status, body = raw_get(artifact_server, raw, tokens["fast-1"])
        assert status in (400, 404) and b"PRIVATE KEY" not in body and b"version: 1" not in body


def test_every_request_is_one_json_log_line(published, artifact_server, caplog):
    _, tokens = published
    with caplog.at_level(logging.INFO, logger="edgetune.access"):
        get(artifact_server, "/v1/boards/fast-1/models/mlp", tokens["fast-1"])
        get(artifact_server, "/v1/artifacts/mlp/gw-slow/v1.tar.gz", tokens["fast-1"])
        lines = _access_lines(caplog, count=2)
    assert [(line["board"], line["status"]) for line in lines] == [("fast-1", 200), ("fast-1", 403)]
    assert "gw-slow" in lines[1]["error"] and lines[1]["path"] == "/v1/artifacts/mlp/gw-slow/v1.tar.gz"


def _access_lines(caplog, count: int, timeout_s: float = 5.0) -> list[dict]:
    """The access log lines (the server writes each one just after the response is sent)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "edgetune.access"]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


def test_token_files_are_secret_and_made_once(deploy_fleet):
    board = deploy_fleet.board("fast-1")
    token = ensure_token(deploy_fleet, board)
    assert ensure_token(deploy_fleet, board) == token and len(token) >= 32
    path = deploy_fleet.deploy.tokens_dir / "fast-1.token"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    path.chmod(0o644)
    with pytest.raises(DeployError, match="readable by others"):
        read_token(deploy_fleet, board)


def test_a_board_whose_token_variable_is_unset_cannot_get_one(deploy_fleet):
    with pytest.raises(DeployError, match=r"\$EDGETUNE_TEST_SLOW1_TOKEN, which is not set"):
        ensure_token(deploy_fleet, deploy_fleet.board("slow-1"))


def test_pull_writes_what_the_board_would_get_verified(deploy_fleet, published, tmp_path, capsys):
    from edgetune.cli import main

    versions, _ = published
    out = tmp_path / "out"
    assert main(["pull", "fast-2", "--model", "mlp", "-o", str(out), "-f", str(deploy_fleet.path)]) == 0
    assert "fast-2: mlp v1 verified" in capsys.readouterr().out  # fast-2 is pinned to v1
    assert (out / "fast-2/mlp/v1.tar.gz").read_bytes() == versions[0].tarball.read_bytes()
    assert (out / "fast-2/mlp/v1/model.so").read_bytes() == b"fast-v1" * 100
    from edgetune.artifact_format.signing import load_public_key
    from edgetune.artifact_format.verify import verify_artifact

    assert verify_artifact(out / "fast-2/mlp/v1", load_public_key(deploy_fleet.artifacts.public_key)).version == 1


def test_pull_by_selector_writes_each_selected_boards_own(deploy_fleet, published, tmp_path, capsys):
    from edgetune.cli import main

    out, fleet = tmp_path / "out", str(deploy_fleet.path)
    assert main(["pull", "--select", "class=gw-fast", "--model", "mlp", "-o", str(out), "-f", fleet]) == 0
    printed = capsys.readouterr().out
    assert "fast-1: mlp v2 verified" in printed and "fast-2: mlp v1 verified" in printed and "slow-1" not in printed
    assert sorted(p.name for p in out.iterdir()) == ["fast-1", "fast-2"]
    assert main(["pull", "fast-1", "--select", "class=gw-fast", "-o", str(out), "-f", fleet]) == 2
    assert main(["pull", "-o", str(out), "-f", fleet]) == 2
    assert "name one BOARD or give --select" in capsys.readouterr().err


def test_pull_refuses_a_tampered_store(deploy_fleet, published, tmp_path, capsys):
    from edgetune.artifact_format.files import pack_tarball
    from edgetune.cli import main

    versions, _ = published
    tampered = tmp_path / "tampered"
    shutil.copytree(versions[1].path, tampered)
    (tampered / "model.so").write_bytes(b"X" * 700)  # its listed size, other bytes
    versions[1].tarball.write_bytes(pack_tarball(tampered))  # the signed manifest first, another library
    assert main(["pull", "fast-1", "-o", str(tmp_path / "out"), "-f", str(deploy_fleet.path), "--model", "mlp"]) == 5
    assert "model.so: sha256 is" in capsys.readouterr().err  # (modified)
    assert main(["pull", "ghost", "-o", str(tmp_path / "out"), "-f", str(deploy_fleet.path)]) == 6


def test_rollout_plan_stages_and_versions(deploy_fleet, published):
    from edgetune.deploy.rollout import plan_rollout

    plan = plan_rollout(deploy_fleet, "mlp", canary=1, batch=1)
    assert [(s.name, [(t.board.name, t.version) for t in s.targets]) for s in plan.stages] == [
        ("canary gw-fast", [("fast-1", 2)]),
        ("canary gw-slow", [("slow-1", 1)]),
        ("batch 1", [("fast-2", 1)]),
    ]  # fast-2 is pinned to v1
    only_fast = plan_rollout(deploy_fleet, "mlp", classes=["gw-fast"], version=1, canary=0)
    assert [[(t.board.name, t.version) for t in stage.targets] for stage in only_fast.stages] == [
        [("fast-1", 1), ("fast-2", 1)]
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "mlp", "--version", "7"], "v7 of mlp does not exist for class gw-fast"),
        (["--model", "mlp", "--class", "rpi9"], "unknown device class rpi9"),
        (["--model", "mlp", "--max-failed", "150"], "--max-failed must be a percentage"),
        (["--model", "mlp", "--timeout-s", "nan"], "--timeout-s must be a positive number"),
        (["--model", "resnet"], "unknown model 'resnet'"),
    ],
)
def test_rollout_refuses_bad_requests_before_touching_a_board(deploy_fleet, published, capsys, args, message):
    from edgetune.cli import main

    assert main(["rollout", "-f", str(deploy_fleet.path), "--dry-run", *args]) == 6
    assert message in capsys.readouterr().err


def test_rollout_dry_run_prints_the_plan(deploy_fleet, published, capsys):
    from edgetune.cli import main

    assert main(["rollout", "-f", str(deploy_fleet.path), "--model", "mlp", "--canary", "1", "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["stages"][0] == {"name": "canary gw-fast", "boards": [{"board": "fast-1", "version": 2}]}


def test_rollout_needs_a_running_server(deploy_fleet, published, capsys):
    from edgetune.cli import main

    assert main(["rollout", "-f", str(deploy_fleet.path), "--model", "mlp"]) == 6
    assert "start it with `edgetune serve" in capsys.readouterr().err
