"""Faults an agent's download survives, against the real artifact server on loopback: a tarball
response cut, reset or answered 503 (retried, resumed with Range, finished in the same run), a
disk too small for the download (refused before its first byte), stale partial downloads, an
offer larger than its signed manifest allows, and `install --from` reading only an archive's
head."""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import tarfile
from dataclasses import replace

import pytest
from support.agent_support import current
from support.tls_proxy import CuttingProxy

from edgetune.agent.errors import AgentError
from edgetune.agent.fetch import DISK_MARGIN_BYTES, fetch, refuse_oversized
from edgetune.agent.install import install, install_tarball
from edgetune.agent.installation import Installation
from edgetune.artifact_format.files import UnpackLimits, packed_size_bound
from edgetune.artifact_format.manifest import Manifest

TARBALL = "/v1/artifacts/mlp/gw-fast/v2.tar.gz"


def tarball_requests(server, mark: int) -> list[int]:
    """The statuses of the requests for TARBALL since `mark`."""
    return [r["status"] for r in server.requests()[mark:] if r["path"] == TARBALL]


@pytest.fixture
def proxy(fleet, server):
    running = CuttingProxy(("127.0.0.1", fleet.port), fleet.tls)
    try:
        yield running
    finally:
        running.close()


@pytest.mark.parametrize("reset", [False, True], ids=["cut", "reset"])
def test_a_download_cut_or_reset_mid_body_is_retried_and_finished(make_board, server, fleet, proxy, reset):
    root = make_board(server=proxy.url)
    proxy.cut(15_000, reset=reset)
    mark = len(server.requests())
    fetched = fetch(root, "mlp", version=2)
    assert fetched.tarball.read_bytes() == fleet.tarball("mlp", "gw-fast", 2).read_bytes()
    assert (fetched.resumed_from, tarball_requests(server, mark)) == (0, [200, 206])  # resumed with Range


def test_a_server_blip_does_not_fail_an_install(make_board, server, proxy):
    root = make_board(server=proxy.url)
    proxy.blip(times=2)
    record = install(root, "mlp", version=2)
    assert (record.result, current(root)) == ("installed", "v2")


@pytest.fixture
def small_disk(tmp_path):
    """mount(size): a fresh tmpfs of `size` bytes (unmounted at teardown)."""
    mounted = []

    def mount(size: int):
        directory = tmp_path / f"disk-{len(mounted)}"
        directory.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True, text=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(directory)
        return directory

    yield mount
    for directory in mounted:
        subprocess.run(["umount", str(directory)], check=True)


def test_a_download_larger_than_the_free_disk_is_refused_before_its_first_byte(make_board, server, fleet, small_disk):
    stored = fleet.store.get("mlp", "gw-fast", 2)
    unpacked, tarball = sum(e.size for e in stored.manifest.files), stored.tarball.stat().st_size
    root = shutil.copytree(
        make_board(server=server.url), small_disk(DISK_MARGIN_BYTES + unpacked + tarball // 2) / "agent"
    )
    mark = len(server.requests())
    with pytest.raises(AgentError, match=r"needs \d+ \(\d+ to download, .*refused before downloading"):
        fetch(root, "mlp", version=2)
    assert tarball_requests(server, mark) == [] and not list((root / "downloads").iterdir())
    roomy = shutil.copytree(
        make_board(server=server.url), small_disk(DISK_MARGIN_BYTES + unpacked + 2 * tarball) / "agent"
    )
    assert fetch(roomy, "mlp", version=2).tarball.stat().st_size == tarball


def test_stale_partial_downloads_are_removed(make_board, server):
    root = make_board(server=server.url)
    downloads = root / "downloads"
    downloads.mkdir()
    stale = [
        downloads / "mlp-v1.tar.gz.part",
        downloads / "mlp-v1.tar.gz.part.etag",
        downloads / "mlp-v2.tar.gz.part",
    ]  # (v2's has no ETag beside it: it cannot be resumed)
    other_model = downloads / "other-v1.tar.gz.part"
    for path in [*stale, other_model]:
        path.write_bytes(b"x" * 1000)
    fetched = fetch(root, "mlp", version=2)
    assert fetched.resumed_from == 0 and not any(path.exists() for path in stale) and other_model.exists()


def test_an_offer_larger_than_its_signed_manifest_packs_into_is_refused(make_board, server, fleet):
    server_of_board = Installation.open(make_board(server=server.url)).server()
    offer = server_of_board.offer("fast-1", "mlp", 2)
    manifest_bytes, signature_bytes = (
        server_of_board.get_bytes(offer.manifest_url),
        server_of_board.get_bytes(offer.signature_url),
    )
    manifest = Manifest.from_bytes(manifest_bytes)
    bound = packed_size_bound(manifest.files, (len(manifest_bytes), len(signature_bytes)))
    assert offer.tarball_size <= bound
    refuse_oversized(offer, manifest, (len(manifest_bytes), len(signature_bytes)))
    with pytest.raises(AgentError, match=f"offered as {bound + 1} bytes, more than the {bound}"):
        refuse_oversized(replace(offer, tarball_size=bound + 1), manifest, (len(manifest_bytes), len(signature_bytes)))


def _archive(members: list[tuple[str, int]]) -> bytes:
    """A .tar.gz of members of zero bytes of the given sizes, in order."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, size in members:
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))
    return gzip.compress(raw.getvalue(), compresslevel=1)


@pytest.mark.parametrize(
    "members, message",
    [
        ([("model.so", 64 << 20), ("manifest.json", 10), ("manifest.sig", 10)], "member #1 must be manifest.json"),
        ([("manifest.json", UnpackLimits.max_manifest_bytes + 1)], "more than the 16777216 allowed"),
    ],
)
def test_install_from_a_file_reads_only_the_archive_head(make_board, tmp_path, members, message):
    root = make_board()
    tarball = tmp_path / "odd.tar.gz"
    tarball.write_bytes(_archive(members))
    record = install_tarball(root, "mlp", tarball)
    assert record.result == "failed" and message in record.error and current(root) is None
