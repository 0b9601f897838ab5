"""Fixtures of the agent tests: real artifacts (a compiled MLP, signed and stored), the real
artifact server (`edgetune serve` in a subprocess on loopback, HTTPS with the fleet CA's
certificate), and boards' agent roots (the CA pinned, as the rollout leaves them).

Published once per session (store `artifacts/`, one key):
- mlp for gw-fast: v1, v2, v3, all good (the same library; their build inputs differ);
- mlp for gw-slow: v1 (another class's artifact); `other` for gw-fast: v1 (another model);
- mlp for gw-bad: v1 good, v2 a library that crashes its process on load (SIGSEGV), v3 a
  library cut in half, v4 a good library whose expected output is wrong: each validly signed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import tvm
from support.agent_support import free_port
from support.fleet_marker import starts_fleet
from support.tests_samples import FAKE_PRIVATE_KEY, sample_inputs
from tvm import relax

from edgetune.agent import AgentConfig, write_config
from edgetune.agent.install import install_tarball
from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.codec import sha256_hex
from edgetune.artifact_format.manifest import (
    Entry,
    Manifest,
    RecordHits,
    Reference,
    TuningStats,
)
from edgetune.artifact_format.reference import npz_bytes
from edgetune.artifact_format.signing import init_keys, load_private_key
from edgetune.artifact_format.trust import anchor_pem
from edgetune.compiler.models import load_model, model_interface, reference_inputs, reference_outputs
from edgetune.deploy.keys import KeyFiles, ensure_decision_key, read_trust
from edgetune.deploy.tls import ensure_tls, host_client_context
from edgetune.deploy.tokens import ensure_token
from edgetune.inventory import load_fleet
from edgetune.inventory.schema import Model, ModelInput

REPO = Path(__file__).resolve().parents[2]
MODEL_INPUT_SHAPE = (1, 64)

FLEET_YAML = """\
version: 1
name: agent-unit
workdir: work
trackers:
  - {{name: host, bind_host: 127.0.0.1, public_address: 127.0.0.1, port: 9390}}
ssh: {{user: root, key: id_ed25519, known_hosts: known_hosts}}
device_classes:
  - {{name: gw-fast, profile: {repo}/device_profiles/x86-64-v3.yaml}}
  - {{name: gw-slow, profile: {repo}/device_profiles/x86-64-v2.yaml}}
  - {{name: gw-bad, profile: {repo}/device_profiles/x86-64-v3.yaml}}
boards:
  - {{name: fast-1, address: 127.0.0.11, device_class: gw-fast, python: /usr/bin/python3, workdir: /tmp/f1}}
  - {{name: slow-1, address: 127.0.0.21, device_class: gw-slow, python: /usr/bin/python3, workdir: /tmp/s1}}
  - {{name: bad-1, address: 127.0.0.31, device_class: gw-bad, python: /usr/bin/python3, workdir: /tmp/b1}}
  - {{name: pinned-1, address: 127.0.0.13, device_class: gw-fast, python: /usr/bin/python3, workdir: /tmp/p1, pin: {{mlp: 2}}}}
models:
  - {{name: mlp, builtin: mlp, inputs: [{{name: x, shape: [1, 64]}}]}}
  - {{name: other, builtin: mlp, inputs: [{{name: x, shape: [1, 64]}}]}}
tuning: {{trials_per_class: 16}}
artifacts: {{dir: artifacts, signing_key: work/keys/signing.key, public_key: work/keys/signing.pub}}
deploy: {{bind: "127.0.0.1:{port}", url: "https://127.0.0.1:{port}"}}
"""

CRASHING_LIBRARY_C = """
#include <signal.h>
__attribute__((constructor)) static void crash_on_load(void) { raise(SIGSEGV); }
"""


@dataclass(frozen=True)
class Compiled:
    """The built-in MLP compiled for this host, with its reference input and expected output."""

    library: bytes
    reference_input: dict
    expected_output: dict
    interface: object  # the manifest's Interface, from the compiled function's signature


@pytest.fixture(scope="session")
@starts_fleet  # its tests run the agent's processes on real libraries: not unit-level
def compiled(tmp_path_factory) -> Compiled:
    model = Model(name="mlp", inputs=(ModelInput("x", MODEL_INPUT_SHAPE, "float32"),), builtin="mlp")
    mod = load_model(model)
    executable = relax.build(mod, target=tvm.target.Target({"kind": "llvm"}), exec_mode="compiled")
    path = tmp_path_factory.mktemp("build") / "model.so"
    executable.export_library(str(path))
    inputs = reference_inputs(model)
    expected = {f"output{i}": out for i, out in enumerate(reference_outputs(model, inputs))}
    return Compiled(path.read_bytes(), inputs, expected, model_interface(mod, ("x",)))


class Fleet:
    """The host side: fleet.yaml, its store and key, and the published versions."""

    def __init__(self, directory: Path, compiled: Compiled):
        self.port = free_port()
        (directory / "id_ed25519").write_text(FAKE_PRIVATE_KEY)
        (directory / "id_ed25519").chmod(0o600)
        self.path = directory / "fleet.yaml"
        self.path.write_text(FLEET_YAML.format(repo=REPO, port=self.port))
        self.fleet = load_fleet(self.path)
        settings = self.fleet.artifacts
        init_keys(settings.signing_key, settings.public_key, settings.dir)
        ensure_decision_key(self.fleet)
        ensure_tls(self.fleet)
        self.public_key = settings.public_key
        self.tls = self.fleet.deploy.tls
        self.store = ArtifactStore(settings.dir)
        self._key = load_private_key(settings.signing_key)
        self.compiled = compiled
        self.tokens = {board.name: ensure_token(self.fleet, board) for board in self.fleet.boards}

    def publish(
        self, model: str, device_class: str, tag: str, library: bytes | None = None, expected: dict | None = None
    ):
        """Commit a signed version of (model, class); `tag` makes its build inputs unique."""
        expected_npz = npz_bytes(expected or self.compiled.expected_output)
        manifest = Manifest.create(
            version=0,
            created="2026-01-01T00:00:00Z",
            inputs=sample_inputs(model=model, device_class=device_class, database_sha256=sha256_hex(tag.encode())),
            entry=Entry(function="forward", inputs=("x",)),
            files=(),
            tuning=TuningStats(trials=0, tuning_time_s=0.0),
            record_hits=RecordHits(tasks_with_record=0, tasks_without_record=()),
            reference=Reference(source="tvm-untuned-host", output_sha256=sha256_hex(expected_npz)),
            boards=(),
            interface=self.compiled.interface,
        )
        with self.store.stage(model, device_class) as staging:
            (staging.path / "model.so").write_bytes(library if library is not None else self.compiled.library)
            (staging.path / "reference_input.npz").write_bytes(npz_bytes(self.compiled.reference_input))
            (staging.path / "expected_output.npz").write_bytes(expected_npz)
            return self.store.commit(staging, manifest, self._key).stored

    def tarball(self, model: str, device_class: str, version: int) -> Path:
        return self.store.get(model, device_class, version).tarball


def _crashing_library(directory: Path) -> bytes:
    source = directory / "crash.c"
    source.write_text(CRASHING_LIBRARY_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(directory / "crash.so"), str(source)], check=True)
    return (directory / "crash.so").read_bytes()


@pytest.fixture(scope="session")
def fleet(tmp_path_factory, compiled) -> Fleet:
    directory = tmp_path_factory.mktemp("host")
    host = Fleet(directory, compiled)
    for version in (1, 2, 3):
        host.publish("mlp", "gw-fast", f"fast-v{version}")
    host.publish("mlp", "gw-slow", "slow-v1")
    host.publish("other", "gw-fast", "other-v1")
    host.publish("mlp", "gw-bad", "bad-v1")
    host.publish("mlp", "gw-bad", "bad-v2-crash", library=_crashing_library(directory))
    host.publish("mlp", "gw-bad", "bad-v3-cut", library=compiled.library[: len(compiled.library) // 2])
    wrong = {name: out + 1.0 for name, out in compiled.expected_output.items()}
    host.publish("mlp", "gw-bad", "bad-v4-wrong", expected=wrong)
    return host


PROBE_PATH = "/v1/test-probe/"  # not a route: answered 404, and logged like any request


class Server:
    """`python -m edgetune serve` for the session fleet; its JSON access log read back."""

    def __init__(self, fleet: Fleet, log: Path):
        self.url = f"https://127.0.0.1:{fleet.port}"
        self.context = host_client_context(fleet.fleet)
        self.log = log
        self._probes = 0
        self._log_file = open(log, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "edgetune", "serve", "-f", str(fleet.path)],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.url + "/v1/health", timeout=2, context=self.context).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"edgetune serve did not start:\n{log.read_text()}") from None
                time.sleep(0.1)

    def requests(self, timeout_s: float = 30.0) -> list[dict]:
        """Every request logged so far (one JSON object per line). The server logs a request
        just after answering it, so a request answered before this call may not be logged yet:
        a probe (PROBE_PATH + N) is sent last, and its line appearing in the log means
        the lines of the requests answered before it are there too. Probes are left out."""
        self._probes += 1
        probe = f"{PROBE_PATH}{self._probes}"
        try:
            urllib.request.urlopen(self.url + probe, timeout=5, context=self.context).close()
        except urllib.error.HTTPError as answer:
            answer.close()
        deadline = time.monotonic() + timeout_s
        while True:
            # The server's stdout is block-buffered: a line may be half written; only whole lines count.
            whole_lines = self.log.read_text().split("\n")[:-1]
            logged = [json.loads(line) for line in whole_lines if line.startswith("{")]
            if any(entry["path"] == probe for entry in logged):
                return [entry for entry in logged if not entry["path"].startswith(PROBE_PATH)]
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not log {probe} within {timeout_s} s:\n{self.log.read_text()}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=10)
        self._log_file.close()


@pytest.fixture(scope="session")
@starts_fleet
def server(fleet, tmp_path_factory):
    running = Server(fleet, tmp_path_factory.mktemp("server") / "access.log")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
@starts_fleet
def own_host(tmp_path_factory, compiled):
    """A host fleet of the module's own (keys, store, `edgetune serve`), for tests that change its
    keys: (fleet, server), mlp v1 of gw-fast published."""
    fleet = Fleet(tmp_path_factory.mktemp("own-host"), compiled)
    fleet.publish("mlp", "gw-fast", "own-v1")
    server = Server(fleet, tmp_path_factory.mktemp("own-server") / "access.log")
    try:
        yield fleet, server
    finally:
        server.stop()


@pytest.fixture
def board_of():
    """board_of(root, host_fleet, board, server=NO_SERVER): an agent root of that fleet's board."""
    return lambda root, fleet, board, server=NO_SERVER: write_board(root, fleet, board, server)


def write_board(root: Path, fleet: Fleet, board: str, server: str, keep_releases: int = 3, **changes) -> Path:
    """An agent root as the rollout leaves it: agent.json, the token (0600), the pinned anchor key and CA."""
    classes = {b.name: b.device_class for b in fleet.fleet.boards}
    config = AgentConfig(
        board=board,
        device_class=classes[board],
        server=server,
        token_file="token",
        public_key="fleet.pub",
        server_ca="fleet-ca.pem",
        keep_releases=keep_releases,
        firmware_command="uname -srm",
        threads=1,
    )
    write_config(root, replace(config, **changes))
    (root / "token").write_text(fleet.tokens[board])
    (root / "token").chmod(0o600)
    (root / "fleet.pub").write_bytes(anchor_pem(read_trust(KeyFiles.of(fleet.fleet).trust)))  # as the rollout pins it
    shutil.copy(fleet.tls.ca_cert, root / "fleet-ca.pem")
    return root


NO_SERVER = "https://127.0.0.1:9"  # for local installs: nothing listens there


@pytest.fixture
def make_board(tmp_path, fleet):
    """make_board(board="fast-1", server=URL, keep_releases=3, **agent.json changes): a fresh root."""
    count = iter(range(1000))

    def _make(board: str = "fast-1", server: str = NO_SERVER, keep_releases: int = 3, **changes) -> Path:
        return write_board(
            tmp_path / f"{board}-{next(count)}" / "agent", fleet, board, server, keep_releases, **changes
        )

    return _make


@pytest.fixture(scope="session")
def _installed_templates(tmp_path_factory, fleet):
    return tmp_path_factory.mktemp("templates"), {}


@pytest.fixture
def board_on(_installed_templates, fleet, tmp_path):
    """board_on(*versions, board="fast-1"): a fresh copy of a root on which those versions of
    mlp were installed in order (the installs run once per session)."""
    directory, templates = _installed_templates
    copies = iter(range(1000))

    def _on(*versions: int, board: str = "fast-1", server: str = NO_SERVER) -> Path:
        key = (board, versions)
        if key not in templates:
            template = write_board(directory / f"{board}-{len(templates)}", fleet, board, NO_SERVER)
            device_class = {b.name: b.device_class for b in fleet.fleet.boards}[board]
            for version in versions:
                record = install_tarball(template, "mlp", fleet.tarball("mlp", device_class, version))
                assert record.result == "installed", record
            templates[key] = template
        root = tmp_path / f"copy-{next(copies)}" / "agent"
        shutil.copytree(templates[key], root, symlinks=True)
        if server != NO_SERVER:
            write_board(root, fleet, board, server)
        return root

    return _on
