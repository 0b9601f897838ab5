"""The agent against the real artifact server (`edgetune serve` over loopback HTTPS): install,
refusals before the tarball is downloaded, an interrupted download resumed with Range, and a
token the server does not accept."""

from __future__ import annotations

import pytest
from support.agent_support import current
from support.tls_proxy import CuttingProxy

from edgetune.agent.errors import AgentError
from edgetune.agent.fetch import fetch
from edgetune.agent.install import install
from edgetune.artifact_format.signing import init_keys


def _requests_since(server, mark: int) -> list[tuple[str, int]]:
    return [(r["path"], r["status"]) for r in server.requests()[mark:]]


def test_install_over_https_then_newest_then_unchanged(make_board, server):
    root = make_board(server=server.url)
    first = install(root, "mlp", version=2)
    assert (first.result, first.from_version, first.to_version, first.error) == ("installed", None, 2, None)
    newest = install(root, "mlp")
    assert (newest.result, newest.from_version, newest.to_version) == ("installed", 2, 3)
    assert current(root) == "v3" and not list((root / "downloads").iterdir())
    mark = len(server.requests())
    again = install(root, "mlp")
    assert (again.result, again.to_version) == ("unchanged", 3)
    assert _requests_since(server, mark) == [("/v1/boards/fast-1/models/mlp", 200)]


def test_replayed_older_version_is_refused_before_any_artifact_file(board_on, server):
    root = board_on(1, 2, server=server.url)
    mark = len(server.requests())
    record = install(root, "mlp", version=1)
    assert (record.result, record.from_version, record.to_version) == ("failed", 2, 1)
    assert "older than v2" in record.error and current(root) == "v2"
    assert _requests_since(server, mark) == [("/v1/boards/fast-1/models/mlp/versions/1", 200)]


def test_a_board_pinned_to_another_key_refuses_before_the_tarball(make_board, server, tmp_path):
    root = make_board(server=server.url)
    other = init_keys(tmp_path / "other.key", tmp_path / "other.pub", tmp_path / "artifacts")
    (root / "fleet.pub").write_bytes(other.public_key.read_bytes())
    mark = len(server.requests())
    record = install(root, "mlp")
    assert record.result == "failed" and "a trust file of another fleet" in record.error and current(root) is None
    assert not any(path.endswith(".tar.gz") for path, _ in _requests_since(server, mark))


def test_interrupted_download_is_resumed_with_range(make_board, server, fleet, monkeypatch):
    monkeypatch.setattr("edgetune.agent.client.RETRY_DELAYS_S", (0.0,))  # two attempts
    proxy = CuttingProxy(("127.0.0.1", fleet.port), fleet.tls)
    try:
        root = make_board(server=proxy.url)
        proxy.cut(15_000, times=2)  # response bytes, headers included: the body stops part-way, twice
        with pytest.raises(AgentError, match="run again to resume it"):
            fetch(root, "mlp", version=2)
        partial = root / "downloads" / "mlp-v2.tar.gz.part"
        kept = partial.stat().st_size
        size = fleet.tarball("mlp", "gw-fast", 2).stat().st_size
        assert 0 < kept < size
        mark = len(server.requests())
        fetched = fetch(root, "mlp", version=2)
        assert (fetched.version, fetched.reused, fetched.resumed_from) == (2, False, kept)
        assert fetched.tarball.read_bytes() == fleet.tarball("mlp", "gw-fast", 2).read_bytes()
        assert ("/v1/artifacts/mlp/gw-fast/v2.tar.gz", 206) in _requests_since(server, mark)
        mark = len(server.requests())
        assert install(root, "mlp", version=2).result == "installed"  # from the verified download
        assert not any(path.endswith(".tar.gz") for path, _ in _requests_since(server, mark))
    finally:
        proxy.close()


def test_a_token_the_server_does_not_accept(make_board, server):
    root = make_board(server=server.url)
    (root / "token").write_text("x" * 43)
    record = install(root, "mlp")
    assert record.result == "failed" and "HTTP 401" in record.error and "re-run the rollout" in record.error
    assert current(root) is None
