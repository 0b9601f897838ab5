"""The inventory loader: shipped examples load and round-trip, and a corpus of bad inventories
and profiles each fail with the file, the YAML path and what is allowed."""

from __future__ import annotations

import os

import pytest
import yaml
from support.inventory_dump import fleet_to_dict, profile_to_dict
from support.inventory_files import PROFILES, REPO, base_fleet, write

from edgetune.cli import main
from edgetune.errors import InventoryError
from edgetune.inventory import load_fleet, load_profile


def test_base_fleet_is_valid(fleet_dir):
    fleet = load_fleet(write(fleet_dir, base_fleet(fleet_dir)))
    assert [b.name for b in fleet.boards_of("avx512")] == ["b1"]
    assert fleet.board("b1").workdir == str(fleet_dir / "w/b1")  # simulated: relative to fleet.yaml
    assert fleet.board("b1").simulated.cpu_quota == 0.5
    assert fleet.board("pi-1").ssh.known_hosts == fleet_dir / "known_hosts"
    assert fleet.tuning.borrow["rpi4"] == "avx512"
    assert fleet.models[1].onnx == fleet_dir / "relu.onnx"
    assert fleet.models[1].inputs[0].dtype == "float32"


def test_emulated_aarch64_board_has_its_own_root_and_round_trips(fleet_dir):
    data = base_fleet(fleet_dir)
    data["sim"]["cache"] = "cache"
    data["boards"].append(
        {
            "name": "arm-1",
            "address": "10.231.99.31",
            "device_class": "rpi4",
            "python": "/opt/tvm/bin/python",
            "workdir": "/root/edgetune",
            "simulated": {"arch": "aarch64"},
        }
    )
    fleet = load_fleet(write(fleet_dir, data))
    board = fleet.board("arm-1")
    assert board.simulated.emulated and board.workdir == "/root/edgetune"  # a path inside its own root
    assert fleet.sim.cache == fleet_dir / "cache"
    again = load_fleet(write(fleet_dir, fleet_to_dict(fleet), "again.yaml"))
    assert again.replace(path=fleet.path) == fleet


def test_deploy_section_pins_and_token_sources(fleet_dir):
    data = base_fleet(fleet_dir)
    data["deploy"] = {"bind": "10.231.99.1:8470", "url": "https://10.231.99.1:8470/"}
    data["device_classes"][0]["pin"] = {"mlp": 2}
    data["boards"][0].update(pin={"relu": 1}, token_env="B1_TOKEN")
    fleet = load_fleet(write(fleet_dir, data))
    assert (fleet.deploy.bind_host, fleet.deploy.port, fleet.deploy.url) == (
        "10.231.99.1",
        8470,
        "https://10.231.99.1:8470",
    )
    assert fleet.deploy.tokens_dir == fleet_dir / "work" / "deploy" / "tokens"
    assert fleet.deploy.keep_releases == 3 and fleet.deploy.decision_ttl_s == 86400
    assert (fleet.deploy.max_connections, fleet.deploy.max_connections_per_client) == (4096, 32)
    assert (fleet.deploy.header_timeout_s, fleet.deploy.keepalive_timeout_s) == (20.0, 5.0)
    assert fleet.deploy.tls.ca_cert == fleet.artifacts.signing_key.parent / "fleet-ca.pem"
    assert fleet.device_class("avx512").pin == {"mlp": 2}
    assert fleet.board("b1").pin == {"relu": 1} and fleet.board("b1").token_env == "B1_TOKEN"
    assert fleet.board("pi-1").pin == {} and fleet.board("pi-1").token_env is None
    again = load_fleet(write(fleet_dir, fleet_to_dict(fleet), "again.yaml"))
    assert again.replace(path=fleet.path) == fleet


def test_shipped_fleet_loads_and_round_trips(tmp_path):
    fleet = load_fleet(REPO / "fleet.yaml")
    assert {c.name for c in fleet.device_classes} == {"gateway-avx2", "gateway-v2"}
    assert all(len(fleet.boards_of(c.name)) == 2 for c in fleet.device_classes)
    assert all(b.simulated is not None for b in fleet.boards)
    again = load_fleet(write(tmp_path, fleet_to_dict(fleet)))
    assert again.replace(path=fleet.path) == fleet


@pytest.mark.parametrize("profile_path", PROFILES, ids=lambda p: p.stem)
def test_shipped_profiles_round_trip_and_build_tvm_targets(profile_path, tmp_path):
    from edgetune.compiler.target import build_target

    profile = load_profile(profile_path)
    again = load_profile(write(tmp_path, profile_to_dict(profile), profile_path.name))
    assert profile_to_dict(again) == profile_to_dict(profile)
    target = build_target(profile)
    assert target.kind.name == "llvm"
    assert str(target.attrs["mcpu"]) == profile.target["mcpu"]


def test_shipped_profiles_cover_the_board_types():
    names = {load_profile(p).name for p in PROFILES}
    assert {"x86-avx512", "x86-64-v2", "rpi4", "rpi5", "jetson-orin-cpu"} <= names


def _set(path: str, value):
    """A mutation that sets a dotted/indexed path of the fleet dict (value None deletes it)."""

    def mutate(data: dict) -> None:
        *parents, last = _parts(path)
        node = data
        for part in parents:
            node = node[part]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return mutate


def _parts(path: str) -> list:
    parts = []
    for piece in path.split("."):
        name, _, rest = piece.partition("[")
        parts.append(name)
        while rest:
            index, _, rest = rest.partition("]")
            parts.append(int(index))
            rest = rest.lstrip("[")
    return parts


_DELETE = object()

BAD_FLEETS = [
    # (id, mutation, expected text in the error)
    ("missing-version", _set("version", _DELETE), "fleet.yaml: version: required field is missing"),
    ("unknown-version", _set("version", 2), "fleet.yaml: version: unsupported version 2"),
    ("unknown-top-key", _set("bords", []), "fleet.yaml: bords: unknown key (did you mean 'boards'?)"),
    (
        "unknown-board-key",
        _set("boards[0].adress", "x"),
        "fleet.yaml: boards[0].adress: unknown key (did you mean 'address'?)",
    ),
    ("missing-boards", _set("boards", _DELETE), "fleet.yaml: boards: required field is missing"),
    (
        "missing-board-address",
        _set("boards[1].address", _DELETE),
        "fleet.yaml: boards[1].address: required field is missing",
    ),
    (
        "undeclared-class",
        _set("boards[1].device_class", "rpi5"),
        "fleet.yaml: boards[1].device_class: 'rpi5' is not a declared device class (declared: avx512, rpi4)",
    ),
    (
        "undeclared-tracker",
        _set("boards[0].tracker", "lab"),
        "fleet.yaml: boards[0].tracker: 'lab' is not a declared tracker",
    ),
    ("duplicate-board", _set("boards[1].name", "b1"), "fleet.yaml: boards[1].name: duplicate board 'b1'"),
    (
        "duplicate-address",
        _set("boards[1].address", "10.231.99.11"),
        "fleet.yaml: boards[1].address: duplicate board address",
    ),
    (
        "duplicate-class",
        _set("device_classes[1].name", "avx512"),
        "fleet.yaml: device_classes[1].name: duplicate device class 'avx512'",
    ),
    ("duplicate-model", _set("models[1].name", "mlp"), "fleet.yaml: models[1].name: duplicate model 'mlp'"),
    (
        "duplicate-tracker",
        _set("trackers", [{"name": "h", "bind_host": "127.0.0.1", "public_address": "127.0.0.1", "port": 1}] * 2),
        "fleet.yaml: trackers[1].name: duplicate tracker 'h'",
    ),
    (
        "missing-profile-file",
        _set("device_classes[0].profile", "device_profiles/nope.yaml"),
        "fleet.yaml: device_classes[0].profile: profile file 'device_profiles/nope.yaml' does not exist",
    ),
    ("port-type", _set("trackers[0].port", "9190"), "fleet.yaml: trackers[0].port: must be an integer, got str '9190'"),
    (
        "port-range",
        _set("trackers[0].port", 70000),
        "fleet.yaml: trackers[0].port: must be a TCP port between 1 and 65535",
    ),
    (
        "port-end-below-port",
        _set("trackers[0].port_end", 9000),
        "fleet.yaml: trackers[0].port_end: must be at least port (9190)",
    ),
    ("no-trackers", _set("trackers", []), "fleet.yaml: trackers: at least one tracker is required"),
    ("password-in-yaml", _set("ssh.password", "hunter2"), "fleet.yaml: ssh.password: secrets are never read from YAML"),
    (
        "passphrase-in-board",
        _set("boards[1].ssh", {"passphrase": "x"}),
        "fleet.yaml: boards[1].ssh.passphrase: secrets are never read from YAML",
    ),
    (
        "bad-passphrase-env",
        _set("ssh.passphrase_env", "1-BAD"),
        "fleet.yaml: ssh.passphrase_env: '1-BAD' is not an environment variable name",
    ),
    (
        "missing-key-file",
        _set("ssh.key", "/nonexistent/id_ed25519"),
        "fleet.yaml: ssh.key: private key file '/nonexistent/id_ed25519' does not exist",
    ),
    (
        "host-key-policy",
        _set("ssh.host_key_policy", "auto-add"),
        "fleet.yaml: ssh.host_key_policy: 'auto-add' is not allowed (allowed: strict)",
    ),
    (
        "transport",
        _set("ssh.transport", "vpn"),
        "fleet.yaml: ssh.transport: 'vpn' is not allowed (allowed: ssh, direct, auto)",
    ),
    (
        "board-transport-type",
        _set("boards[1].ssh", {"transport": True}),
        "fleet.yaml: boards[1].ssh.transport: must be",
    ),
    (
        "model-missing-file",
        _set("models[1].onnx", "missing.onnx"),
        "fleet.yaml: models[1].onnx: ONNX file 'missing.onnx' does not exist",
    ),
    ("model-both-sources", _set("models[0].onnx", "relu.onnx"), "fleet.yaml: models[0]: give exactly one of 'builtin'"),
    (
        "model-unknown-builtin",
        _set("models[0].builtin", "resnet"),
        "fleet.yaml: models[0].builtin: 'resnet' is not allowed (allowed: mlp, mobilenet-mini, transformer-block)",
    ),
    (
        "shape-zero",
        _set("models[0].inputs[0].shape", [1, 0]),
        "fleet.yaml: models[0].inputs[0].shape[1]: input dimensions must be positive integers",
    ),
    (
        "shape-symbolic",
        _set("models[0].inputs[0].shape", ["batch", 256]),
        "fleet.yaml: models[0].inputs[0].shape[0]: input dimensions must be positive integers (fixed shapes), got 'batch'",
    ),
    (
        "shape-float",
        _set("models[0].inputs[0].shape", [1, 2.5]),
        "fleet.yaml: models[0].inputs[0].shape[1]: input dimensions must be positive integers",
    ),
    (
        "dtype",
        _set("models[0].inputs[0].dtype", "float64"),
        "fleet.yaml: models[0].inputs[0].dtype: 'float64' is not allowed",
    ),
    ("weight-negative", _set("models[0].weight", -1), "fleet.yaml: models[0].weight: must be positive, got -1"),
    (
        "trials-type",
        _set("tuning.trials_per_class", "many"),
        "fleet.yaml: tuning.trials_per_class: must be an integer, got str 'many'",
    ),
    (
        "trials-bool",
        _set("tuning.trials_per_class", True),
        "fleet.yaml: tuning.trials_per_class: must be an integer, got boolean True",
    ),
    (
        "borrow-undeclared",
        _set("tuning.borrow", {"rpi4": "jetson"}),
        "fleet.yaml: tuning.borrow.rpi4: 'jetson' is not a declared device class",
    ),
    (
        "borrow-unknown-class",
        _set("tuning.borrow", {"jetson": "rpi4"}),
        "fleet.yaml: tuning.borrow.jetson: unknown key",
    ),
    (
        "borrow-self",
        _set("tuning.borrow", {"rpi4": "rpi4"}),
        "fleet.yaml: tuning.borrow.rpi4: a class cannot borrow tuning from itself",
    ),
    ("borrow-cycle", _set("tuning.borrow", {"rpi4": "avx512", "avx512": "rpi4"}), "borrow from each other"),
    (
        "override-unknown-class",
        _set("tuning.trials_per_class_override", {"rpi9": 10}),
        "fleet.yaml: tuning.trials_per_class_override.rpi9: unknown key",
    ),
    (
        "signing-key-in-artifacts",
        _set("artifacts.signing_key", "artifacts/signing.key"),
        "fleet.yaml: artifacts.signing_key: the private signing key must live outside the artifacts directory",
    ),
    (
        "sim-board-without-sim",
        _set("sim", _DELETE),
        "fleet.yaml: boards[0].simulated: a simulated board needs the top-level 'sim' section",
    ),
    (
        "sim-board-outside-subnet",
        _set("boards[0].address", "10.9.9.9"),
        "fleet.yaml: boards[0].address: '10.9.9.9' is not a free board address in the simulated network 10.231.99.0/24",
    ),
    (
        "sim-bad-bridge",
        _set("sim.bridge", "a-very-long-bridge-name"),
        "fleet.yaml: sim.bridge: 'a-very-long-bridge-name' is not a valid interface name",
    ),
    (
        "real-board-relative-path",
        _set("boards[1].workdir", "var/lib"),
        "fleet.yaml: boards[1].workdir: must be an absolute path on the board",
    ),
    (
        "bad-address",
        _set("boards[1].address", "pi 1"),
        "fleet.yaml: boards[1].address: 'pi 1' is not an IP address or host name",
    ),
    ("bad-name", _set("boards[1].name", "pi/1"), "fleet.yaml: boards[1].name: 'pi/1' is not a valid name"),
    ("boards-not-list", _set("boards", {"b1": {}}), "fleet.yaml: boards: must be a list, got a mapping"),
    (
        "tracker-ambiguous",
        lambda d: (
            d["trackers"].append(
                {"name": "lab", "bind_host": "127.0.0.1", "public_address": "127.0.0.1", "port": 9290}
            ),
            d["boards"][1].pop("tracker"),
        ),
        "fleet.yaml: boards[1].tracker: required when the fleet has several trackers (declared: host, lab)",
    ),
    (
        "sim-arch-unknown",
        _set("boards[0].simulated", {"arch": "riscv64"}),
        "fleet.yaml: boards[0].simulated.arch: 'riscv64' is not allowed (allowed: x86_64, aarch64)",
    ),
    (
        "sim-arch-not-the-profile's",
        _set("boards[0].simulated", {"arch": "aarch64"}),
        "fleet.yaml: boards[0].simulated.arch: an aarch64 board needs a device class whose profile targets aarch64; class 'avx512'",
    ),
    (
        "emulated-board-relative-path",
        lambda d: d["boards"][0].update(device_class="rpi4", simulated={"arch": "aarch64"}),
        "fleet.yaml: boards[0].workdir: must be an absolute path on the board, got 'w/b1'",
    ),
    (
        "quota-not-number",
        _set("boards[0].simulated", {"cpu_quota": "half"}),
        "fleet.yaml: boards[0].simulated.cpu_quota: must be a number, got str 'half'",
    ),
    (
        "deploy-bind-no-port",
        _set("deploy", {"bind": "10.231.99.1", "url": "https://10.231.99.1:8470"}),
        "fleet.yaml: deploy.bind: '10.231.99.1' is not ADDRESS:PORT",
    ),
    (
        "deploy-bad-url",
        _set("deploy", {"bind": "10.231.99.1:8470", "url": "ftp://x"}),
        "fleet.yaml: deploy.url: 'ftp://x' is not a server URL",
    ),
    (
        "deploy-keep-one",
        _set("deploy", {"bind": "10.231.99.1:8470", "url": "https://10.231.99.1:8470", "keep_releases": 1}),
        "fleet.yaml: deploy.keep_releases: must be between 2",
    ),
    (
        "deploy-token-in-yaml",
        _set("deploy", {"bind": "10.231.99.1:8470", "url": "https://h:1", "token": "s3cret"}),
        "fleet.yaml: deploy.token: unknown key",
    ),
    (
        "deploy-http-under-tls",
        _set("deploy", {"bind": "10.231.99.1:8470", "url": "http://10.231.99.1:8470"}),
        "fleet.yaml: deploy.url: 'http://10.231.99.1:8470' is plain HTTP, but the server speaks HTTPS (deploy.tls is on by default): write https://10.231.99.1:8470",
    ),
    (
        "deploy-https-without-tls",
        _set("deploy", {"bind": "10.231.99.1:8470", "url": "https://h:1", "tls": False}),
        "fleet.yaml: deploy.url: 'https://h:1' is HTTPS, but deploy.tls is false: write http://h:1",
    ),
    (
        "deploy-tls-not-bool",
        _set("deploy", {"bind": "10.231.99.1:8470", "url": "https://h:1", "tls": "yes please"}),
        "fleet.yaml: deploy.tls: must be",
    ),
    (
        "deploy-ttl-zero",
        _set("deploy", {"bind": "10.231.99.1:8470", "url": "https://h:1", "decision_ttl_s": 0}),
        "fleet.yaml: deploy.decision_ttl_s: must be positive",
    ),
    (
        "deploy-connections-zero",
        _set("deploy", {"bind": "10.231.99.1:8470", "url": "https://h:1", "max_connections": 0}),
        "fleet.yaml: deploy.max_connections: must be between 1 and 65536, got 0",
    ),
    (
        "deploy-connections-text",
        _set("deploy", {"bind": "10.231.99.1:8470", "url": "https://h:1", "max_connections": "many"}),
        "fleet.yaml: deploy.max_connections: must be an integer, got str 'many'",
    ),
    (
        "deploy-per-client-above-all",
        _set(
            "deploy",
            {"bind": "10.231.99.1:8470", "url": "https://h:1", "max_connections": 16, "max_connections_per_client": 32},
        ),
        "fleet.yaml: deploy.max_connections_per_client: is 32, more than deploy.max_connections (16)",
    ),
    (
        "deploy-header-timeout-zero",
        _set("deploy", {"bind": "10.231.99.1:8470", "url": "https://h:1", "header_timeout_s": 0}),
        "fleet.yaml: deploy.header_timeout_s: must be between 0.1 and 600, got 0",
    ),
    (
        "deploy-keepalive-bool",
        _set("deploy", {"bind": "10.231.99.1:8470", "url": "https://h:1", "keepalive_timeout_s": True}),
        "fleet.yaml: deploy.keepalive_timeout_s: must be a number, got boolean True",
    ),
    (
        "pin-unknown-model",
        _set("device_classes[0].pin", {"resnet": 2}),
        "fleet.yaml: device_classes[0].pin.resnet: 'resnet' is not a declared model",
    ),
    (
        "pin-bad-version",
        _set("boards[0].pin", {"mlp": 0}),
        "fleet.yaml: boards[0].pin.mlp: must map a model name to an artifact version",
    ),
    (
        "pin-version-string",
        _set("boards[0].pin", {"mlp": "v2"}),
        "fleet.yaml: boards[0].pin.mlp: must map a model name to an artifact version",
    ),
    (
        "pin-not-mapping",
        _set("boards[0].pin", [1]),
        "fleet.yaml: boards[0].pin: must be a mapping of model name to artifact version",
    ),
    (
        "regress-threshold-below-one",
        _set("regress", {"threshold": 0.9}),
        "fleet.yaml: regress.threshold: is the time ratio that counts as slower, between 1.0 and 100",
    ),
    (
        "regress-threshold-nan",
        _set("regress", {"threshold": float("nan")}),
        "fleet.yaml: regress.threshold: must be a finite number",
    ),
    ("regress-unknown-key", _set("regress", {"ratio": 2}), "fleet.yaml: regress.ratio: unknown key"),
    (
        "token-env-name",
        _set("boards[0].token_env", "A-B"),
        "fleet.yaml: boards[0].token_env: 'A-B' is not an environment variable name",
    ),
    # what the loader derives is no key of the file
    (
        "path-is-derived",
        _set("path", "/elsewhere/fleet.yaml"),
        "fleet.yaml: path: unknown key; allowed here: name, workdir",
    ),
    (
        "deploy-port-is-derived",
        _set("deploy", {"bind": "10.231.99.1:8470", "url": "https://h:1", "port": 8471}),
        "fleet.yaml: deploy.port: unknown key; allowed here: bind, url, tokens_dir",
    ),
]


@pytest.mark.parametrize("case", BAD_FLEETS, ids=[c[0] for c in BAD_FLEETS])
def test_bad_fleet_is_refused_with_its_path(fleet_dir, case):
    _, mutate, expected = case
    data = base_fleet(fleet_dir)
    mutate(data)
    with pytest.raises(InventoryError) as err:
        load_fleet(write(fleet_dir, data))
    assert expected in str(err.value)
    assert err.value.exit_code == 2


def test_yaml_syntax_error_names_the_line(fleet_dir):
    (fleet_dir / "fleet.yaml").write_text("version: 1\nboards:\n  - name: a\n   address: [\n")
    with pytest.raises(InventoryError, match=r"fleet.yaml: YAML syntax error \(line \d+, column \d+\)"):
        load_fleet(fleet_dir / "fleet.yaml")


def test_missing_fleet_file(fleet_dir):
    with pytest.raises(InventoryError, match="nope.yaml: file does not exist"):
        load_fleet(fleet_dir / "nope.yaml")


def test_key_readable_by_others_is_refused(fleet_dir):
    data = base_fleet(fleet_dir)
    os.chmod(data["ssh"]["key"], 0o644)
    with pytest.raises(
        InventoryError,
        match=r"fleet.yaml: ssh.key: private key file .* is readable by group or others \(mode 0644\); run: chmod 600",
    ):
        load_fleet(write(fleet_dir, data))


def test_board_key_override_is_named(fleet_dir):
    data = base_fleet(fleet_dir)
    data["boards"][1]["ssh"] = {"key": "/nonexistent/pi.key"}
    with pytest.raises(
        InventoryError, match=r"fleet.yaml: boards\[1\].ssh.key: private key file '/nonexistent/pi.key' does not exist"
    ):
        load_fleet(write(fleet_dir, data))


def test_a_board_inherits_the_fleets_ssh_settings_it_does_not_give_itself(fleet_dir):
    data = base_fleet(fleet_dir)
    data["ssh"].update(port=2222, connect_timeout_s=5)
    data["boards"][1]["ssh"] = {"port": 2200, "user": "pi"}
    fleet = load_fleet(write(fleet_dir, data))
    b1, pi = fleet.board("b1").ssh, fleet.board("pi-1").ssh
    assert (b1.user, b1.port, b1.connect_timeout_s, b1.command_timeout_s) == ("root", 2222, 5.0, 120.0)
    assert (pi.user, pi.port, pi.connect_timeout_s, pi.key, pi.known_hosts) == (
        "pi",
        2200,
        5.0,
        b1.key,
        fleet_dir / "known_hosts",
    )


def test_simulated_board_key_may_not_exist_yet(fleet_dir):
    data = base_fleet(fleet_dir)
    data["ssh"]["key"] = "sim/id_ed25519"
    data["boards"] = data["boards"][:1]
    data["device_classes"] = data["device_classes"][:1]
    data["tuning"]["borrow"] = {}
    fleet = load_fleet(write(fleet_dir, data))
    assert fleet.board("b1").ssh.key == fleet_dir / "sim/id_ed25519"


def test_not_onnx_file_is_refused_by_check(fleet_dir, capsys):
    data = base_fleet(fleet_dir)
    (fleet_dir / "fake.onnx").write_bytes(b"\x00\x01 definitely not protobuf \xff\xff")
    data["models"][1]["onnx"] = "fake.onnx"
    write(fleet_dir, data)
    assert main(["check", "-f", "fleet.yaml"]) == 2
    assert f"fleet.yaml: models[1].onnx: '{fleet_dir / 'fake.onnx'}' is not an ONNX model" in capsys.readouterr().err


def _profile_data() -> dict:
    return yaml.safe_load((REPO / "device_profiles/rpi4.yaml").read_text())


BAD_PROFILES = [
    ("profile-missing-version", _set("version", _DELETE), "rpi4.yaml: version: required field is missing"),
    ("profile-unknown-key", _set("measurment", {}), "rpi4.yaml: measurment: unknown key (did you mean 'measurement'?)"),
    ("profile-missing-target", _set("target", _DELETE), "rpi4.yaml: target: required field is missing"),
    (
        "profile-target-no-kind",
        _set("target", {"mcpu": "cortex-a72"}),
        "rpi4.yaml: target.kind: required field is missing",
    ),
    ("profile-threads-zero", _set("runtime.threads", 0), "rpi4.yaml: runtime.threads: must be positive, got 0"),
    ("profile-repeat-type", _set("measurement.repeat", "3"), "rpi4.yaml: measurement.repeat: must be an integer"),
    (
        "profile-cache-flush-type",
        _set("measurement.enable_cpu_cache_flush", "yes please"),
        "rpi4.yaml: measurement.enable_cpu_cache_flush: must be true or false",
    ),
    (
        "profile-missing-firmware",
        _set("firmware_command", _DELETE),
        "rpi4.yaml: firmware_command: required field is missing",
    ),
    ("profile-mattr-type", _set("target.mattr", [1, 2]), "rpi4.yaml: target.mattr: a list option must hold strings"),
    (
        "profile-cross-compiler-null",
        _set("cross_compiler", None),
        "rpi4.yaml: cross_compiler: required field is missing",
    ),
    ("profile-path-is-derived", _set("path", "x86.yaml"), "rpi4.yaml: path: unknown key"),
]


@pytest.mark.parametrize("case", BAD_PROFILES, ids=[c[0] for c in BAD_PROFILES])
def test_bad_profile_is_refused_with_its_path(fleet_dir, case):
    _, mutate, expected = case
    profile = _profile_data()
    mutate(profile)
    data = base_fleet(fleet_dir)
    data["device_classes"][1]["profile"] = str(write(fleet_dir, profile, "rpi4.yaml"))
    with pytest.raises(InventoryError) as err:
        load_fleet(write(fleet_dir, data))
    assert expected in str(err.value)


@pytest.mark.parametrize(
    "target, expected",
    [
        (
            {"kind": "llvmx"},
            "rpi4.yaml: target: TVM rejects {'kind': 'llvmx', 'num-cores': 4}: Target kind \"llvmx\" is not defined",
        ),
        ({"kind": "llvm", "mcpu": "cortex-a72", "nonsense": 1}, "Unknown config option 'nonsense'"),
        (
            {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-z99"},
            "rpi4.yaml: target.mcpu: 'cortex-z99' is not a CPU LLVM knows for aarch64-linux-gnu",
        ),
    ],
)
def test_target_tvm_rejects_is_refused_with_tvms_message(fleet_dir, target, expected):
    from edgetune.compiler.target import check_targets

    profile = _profile_data()
    profile["target"] = target
    data = base_fleet(fleet_dir)
    data["device_classes"][1]["profile"] = str(write(fleet_dir, profile, "rpi4.yaml"))
    fleet = load_fleet(write(fleet_dir, data))
    with pytest.raises(InventoryError) as err:
        check_targets(fleet)
    assert expected in str(err.value)
