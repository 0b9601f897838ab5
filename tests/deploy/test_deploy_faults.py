"""Faults the artifact server and its store survive, over real HTTP (uvicorn on loopback): bad or
shared token files, a commit watched by a polling board, symbolic links and hand-copied versions
in the store, names with a trailing newline, conditional requests, and error answers that are
always JSON and say nothing to a caller without a token."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading

import pytest
from support.deploy_support import publish_version
from support.https_requests import get, raw_get

from edgetune.cli import main
from edgetune.deploy.tokens import token_path

OFFER = "/v1/boards/{board}/models/mlp"
UNAUTHENTICATED = {"error": "a valid board token is required"}


def offered_version(server, board: str, token: str) -> int:
    status, _, body = get(server, OFFER.format(board=board), token)
    assert status == 200, body
    return json.loads(body)["version"]


def warnings(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_a_0644_token_file_disables_only_its_board(deploy_fleet, published, artifact_server, caplog):
    _, tokens = published
    path = token_path(deploy_fleet, deploy_fleet.board("fast-1"))
    assert offered_version(artifact_server, "fast-1", tokens["fast-1"]) == 2
    path.chmod(0o644)  # the content is unchanged: only the mode tells
    status, _, body = get(artifact_server, OFFER.format(board="fast-1"), tokens["fast-1"])
    assert (status, json.loads(body)) == (401, UNAUTHENTICATED)
    assert offered_version(artifact_server, "fast-2", tokens["fast-2"]) == 1  # the others still download
    assert get(artifact_server, "/v1/artifacts/mlp/gw-slow/v1.tar.gz", tokens["slow-1"])[0] == 200
    assert f"board fast-1 may not download: the token file {path} is readable by others" in warnings(caplog)
    path.chmod(0o600)
    assert offered_version(artifact_server, "fast-1", tokens["fast-1"]) == 2


def test_a_token_of_a_wrong_length_disables_only_its_board(deploy_fleet, published, artifact_server, caplog):
    _, tokens = published
    path = token_path(deploy_fleet, deploy_fleet.board("fast-2"))
    path.write_text("short")
    assert get(artifact_server, OFFER.format(board="fast-2"), "short")[0] == 401
    assert offered_version(artifact_server, "fast-1", tokens["fast-1"]) == 2
    assert "board fast-2 may not download: the token in" in warnings(caplog)
    assert "is 5 characters long" in warnings(caplog)


def test_an_unauthenticated_answer_names_no_path_and_gives_no_hint(deploy_fleet, published, artifact_server):
    _, tokens = published
    token_path(deploy_fleet, deploy_fleet.board("fast-1")).chmod(0o640)
    for token in (None, "nobody-" * 6, tokens["fast-1"]):
        for path in (OFFER.format(board="fast-1"), "/v1/artifacts/mlp/gw-fast/v1.tar.gz"):
            status, _, body = get(artifact_server, path, token)
            assert (status, json.loads(body)) == (401, UNAUTHENTICATED)
            assert str(deploy_fleet.path.parent).encode() not in body


def test_two_boards_with_one_token_are_both_refused_naming_both(deploy_fleet, published, artifact_server, caplog):
    _, tokens = published
    token_path(deploy_fleet, deploy_fleet.board("fast-2")).write_text(tokens["fast-1"])
    for board in ("fast-1", "fast-2"):
        assert get(artifact_server, OFFER.format(board=board), tokens["fast-1"])[0] == 401
    assert get(artifact_server, OFFER.format(board="slow-1"), tokens["slow-1"])[0] == 200
    assert "boards fast-1 and fast-2 have the same token" in warnings(caplog)


def test_two_boards_reading_one_token_variable_are_refused_by_check(deploy_fleet, capsys):
    text = deploy_fleet.path.read_text().replace(
        "workdir: /tmp/f1}", "workdir: /tmp/f1, token_env: EDGETUNE_TEST_SLOW1_TOKEN}"
    )
    deploy_fleet.path.write_text(text)
    assert main(["check", "-f", str(deploy_fleet.path)]) == 2
    err = capsys.readouterr().err
    assert "boards[2].token_env: $EDGETUNE_TEST_SLOW1_TOKEN is also the token variable of board fast-1" in err
    assert "boards fast-1 and slow-1 would share one download token" in err


def test_a_polling_board_never_sees_a_404_for_the_newest(deploy_fleet, published, artifact_server):
    _, tokens = published
    answers: list[tuple[int, int | None, int | None]] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            status, _, body = get(artifact_server, OFFER.format(board="fast-1"), tokens["fast-1"])
            offer = json.loads(body) if status == 200 else {}
            tarball = get(artifact_server, offer["tarball_url"], tokens["fast-1"])[0] if status == 200 else None
            answers.append((status, offer.get("version"), tarball))

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        for n in range(3, 9):
            publish_version(deploy_fleet, "mlp", "gw-fast", f"fast-v{n}".encode() * 20_000)
    finally:
        done.set()
        poller.join()
    assert {(s, t) for s, _, t in answers} == {(200, 200)}
    versions = [v for _, v, _ in answers]
    assert versions == sorted(versions) and len(set(versions)) >= 3  # it polled while versions appeared
    assert offered_version(artifact_server, "fast-1", tokens["fast-1"]) == 8


def test_a_commit_that_crashes_before_the_rename_leaves_the_previous_newest(
    deploy_fleet, published, artifact_server, monkeypatch
):
    _, tokens = published
    class_dir = deploy_fleet.artifacts.dir / "mlp" / "gw-fast"
    real_rename = os.rename

    def crash(source, target):
        raise OSError("killed")

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(OSError, match="killed"):
        publish_version(deploy_fleet, "mlp", "gw-fast", b"fast-v3" * 100)
    monkeypatch.setattr(os, "rename", real_rename)
    assert (class_dir / "v3.tar.gz").exists() and not (class_dir / "v3").exists()
    assert offered_version(artifact_server, "fast-1", tokens["fast-1"]) == 2
    assert get(artifact_server, "/v1/artifacts/mlp/gw-fast/v3.tar.gz", tokens["fast-1"])[0] == 404
    assert publish_version(deploy_fleet, "mlp", "gw-fast", b"fast-v4" * 100).version == 4
    assert not (class_dir / "v3.tar.gz").exists()  # the orphan tarball is removed
    assert offered_version(artifact_server, "fast-1", tokens["fast-1"]) == 4


def test_symbolic_links_in_the_store_are_never_followed(deploy_fleet, published, artifact_server, tmp_path, caplog):
    versions, tokens = published
    class_dir = versions[1].path.parent
    (class_dir / "v3").symlink_to("v2")
    (class_dir / "v3.tar.gz").symlink_to("v2.tar.gz")
    assert offered_version(artifact_server, "fast-1", tokens["fast-1"]) == 2
    for path in ("/v1/artifacts/mlp/gw-fast/v3.tar.gz", "/v1/artifacts/mlp/gw-fast/v3/manifest.json"):
        assert get(artifact_server, path, tokens["fast-1"])[0] == 404
    secret = tmp_path / "secret"
    secret.write_bytes(b"host secret")
    versions[0].tarball.unlink()
    versions[0].tarball.symlink_to(secret)  # v1.tar.gz -> a file outside the store
    status, _, body = get(artifact_server, "/v1/artifacts/mlp/gw-fast/v1.tar.gz", tokens["fast-1"])
    assert status == 404 and b"host secret" not in body
    assert get(artifact_server, OFFER.format(board="fast-2"), tokens["fast-2"])[0] == 404  # pinned to v1
    assert "mlp/gw-fast/v1 is not served: mlp/gw-fast/v1.tar.gz is a symbolic link" in warnings(caplog)


def test_a_linked_class_directory_is_not_served(deploy_fleet, published, artifact_server, tmp_path):
    versions, tokens = published
    class_dir = versions[2].path.parent  # mlp/gw-slow
    shutil.move(class_dir, tmp_path / "elsewhere")
    class_dir.symlink_to(tmp_path / "elsewhere")
    assert get(artifact_server, OFFER.format(board="slow-1"), tokens["slow-1"])[0] == 404
    assert get(artifact_server, "/v1/artifacts/mlp/gw-slow/v1.tar.gz", tokens["slow-1"])[0] == 404


def test_hand_copied_and_corrupt_versions_are_skipped_with_a_log_line(deploy_fleet, published, artifact_server, caplog):
    versions, tokens = published
    class_dir = versions[1].path.parent
    shutil.copytree(class_dir / "v1", class_dir / "v7")
    shutil.copyfile(class_dir / "v1.tar.gz", class_dir / "v7.tar.gz")
    assert offered_version(artifact_server, "fast-1", tokens["fast-1"]) == 2
    assert get(artifact_server, "/v1/artifacts/mlp/gw-fast/v7.tar.gz", tokens["fast-1"])[0] == 404
    assert "mlp/gw-fast/v7 is not served: its manifest is mlp/gw-fast/v1" in warnings(caplog)
    versions[1].tarball.write_bytes(versions[1].tarball.read_bytes()[:-40])  # the newest, cut short
    assert offered_version(artifact_server, "fast-1", tokens["fast-1"]) == 1
    assert "mlp/gw-fast/v2 is not served: its tarball is missing or not of its manifest" in warnings(caplog)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/boards/fast-1%0a/models/mlp",
        "/v1/boards/fast-1/models/mlp%0A",
        "/v1/artifacts/mlp/gw-fast%0a/v1.tar.gz",
        "/v1/artifacts/mlp%0a/gw-fast/v1/manifest.sig",
    ],
)
def test_names_are_matched_whole(published, artifact_server, path):
    _, tokens = published
    status, body = raw_get(artifact_server, path, tokens["fast-1"])
    assert status == 400 and "invalid" in json.loads(body)["error"]


def test_if_none_match_star_and_weak_etags_answer_304(published, artifact_server):
    _, tokens = published
    path = "/v1/artifacts/mlp/gw-fast/v2.tar.gz"
    etag = get(artifact_server, path, tokens["fast-1"])[1]["etag"]
    for condition in ("*", f"W/{etag}", f'"other", W/{etag}'):
        status, headers, body = get(artifact_server, path, tokens["fast-1"], {"If-None-Match": condition})
        assert (status, headers["etag"], body) == (304, etag, b"")
    assert get(artifact_server, path, tokens["fast-1"], {"If-None-Match": 'W/"other"'})[0] == 200


@pytest.mark.parametrize(
    "method, path, token_of, status",
    [
        ("GET", "/nowhere", None, 404),
        ("GET", "/v1/nowhere", "fast-1", 404),
        ("POST", "/v1/artifacts/mlp/gw-fast/v2.tar.gz", "fast-1", 405),
        ("DELETE", "/v1/boards/fast-1/models/mlp", None, 405),
        ("GET", "/v1/artifacts/mlp/gw-fast/v2/manifest.json", "nobody", 401),
    ],
)
def test_every_error_answer_is_json(published, artifact_server, method, path, token_of, status):
    _, tokens = published
    got, body = raw_get(artifact_server, path, tokens.get(token_of, token_of), method)
    assert got == status and isinstance(json.loads(body)["error"], str)


def test_an_unsatisfiable_range_is_a_json_416(published, artifact_server):
    versions, tokens = published
    size = versions[1].tarball.stat().st_size
    status, headers, body = get(
        artifact_server, "/v1/artifacts/mlp/gw-fast/v2.tar.gz", tokens["fast-1"], {"Range": f"bytes={size + 10}-"}
    )
    assert status == 416 and headers["content-range"] == f"bytes */{size}" and "error" in json.loads(body)
