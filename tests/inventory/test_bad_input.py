"""Hostile and careless inventories: each is refused with the file, the YAML path (or line)
and what to do, exit code 2, never a traceback, and nothing is written on the way."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from support.inventory_files import REPO, base_fleet, write

from edgetune.cli import main
from edgetune.errors import ArtifactError, InventoryError
from edgetune.inventory import load_fleet, load_profile
from edgetune.inventory.reader import MAX_DEPTH, read_yaml

PROFILE = REPO / "device_profiles/x86-avx512.yaml"


@pytest.fixture
def fleet_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(path: Path, expected: str, capsys) -> str:
    """`edgetune check` on `path` exits 2 with `expected` in its one-line error."""
    assert main(["check", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err
    return err


def fleet_text(fleet_dir: Path, replace: dict[str, str] | None = None) -> Path:
    """The base fleet as YAML text, with textual replacements (for what dicts cannot say)."""
    text = yaml.safe_dump(base_fleet(fleet_dir), sort_keys=False)
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    path = fleet_dir / "fleet.yaml"
    path.write_text(text)
    return path


def profile_with(fleet_dir: Path, text: str) -> Path:
    """The base fleet, its avx512 class using the shipped profile plus `text` appended."""
    profile = fleet_dir / "profile.yaml"
    profile.write_text(PROFILE.read_text() + text)
    data = base_fleet(fleet_dir)
    data["device_classes"][0]["profile"] = str(profile)
    return write(fleet_dir, data)


# -- what used to be tracebacks ------------------------------------------------------------------
def test_board_name_given_as_a_list(fleet_dir, capsys):
    data = base_fleet(fleet_dir)
    data["boards"][0]["name"] = ["b1"]
    refused(write(fleet_dir, data), "fleet.yaml: boards[0].name: must be a string, got a list", capsys)


@pytest.mark.parametrize(
    "data, expected",
    [
        (
            "name: caf\xe9\n".encode("latin-1"),
            "fleet.yaml: is not UTF-8 text (byte 0xe9 on line 1 is invalid); save it as UTF-8",
        ),
        (
            "version: 1\n".encode("utf-16"),
            "fleet.yaml: is UTF-16 or UTF-32 text, or binary (it holds NUL bytes); save it as UTF-8",
        ),
        ("version: 1\n".encode("utf-16-be"), "fleet.yaml: is UTF-16 or UTF-32 text, or binary (it holds NUL bytes)"),
    ],
    ids=["latin-1", "utf-16-bom", "utf-16-no-bom"],
)
def test_text_that_is_not_utf8(fleet_dir, capsys, data, expected):
    (fleet_dir / "fleet.yaml").write_bytes(data)
    refused(fleet_dir / "fleet.yaml", expected, capsys)


def test_utf8_byte_order_mark_is_fine(fleet_dir):
    path = write(fleet_dir, base_fleet(fleet_dir))
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert load_fleet(path).name == "test-fleet"


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_deep_nesting(fleet_dir, capsys, depth):
    err = refused(profile_with(fleet_dir, "  deep: " + "[" * depth + "]" * depth + "\n"), "profile.yaml: ", capsys)
    assert "nest" in err


def test_deep_nesting_names_the_path(fleet_dir):
    with pytest.raises(
        InventoryError, match=r"profile.yaml: hardware.deep(\[0\])+: is nested too deeply \(more than 32 levels\)"
    ):
        load_fleet(profile_with(fleet_dir, "  deep: " + "[" * 40 + "]" * 40 + "\n"))


@pytest.mark.parametrize(
    "replace, expected",
    [
        (
            {"trials_per_class: 64": "trials_per_class: .nan"},
            "fleet.yaml: tuning.trials_per_class: must be a finite number, got .nan",
        ),
        ({"weight: 2": "weight: .inf"}, "fleet.yaml: models[1].weight: must be a finite number, got .inf"),
        ({"weight: 2": "weight: 1.0e+400"}, "fleet.yaml: models[1].weight: must be a finite number"),
        ({"weight: 2": "weight: 1.0e+300"}, "fleet.yaml: models[1].weight: must be at most 1e+06"),
        (
            {"port: 9190": "port: 1" + "0" * 5000},
            "fleet.yaml: trackers[0].port: the integer 10000000000000000000... is too large",
        ),
        (
            {"trials_per_class: 64": "trials_per_class: 100000000000000000000"},
            "fleet.yaml: tuning.trials_per_class: the integer 100000000000000000000 is too large",
        ),
        (
            {"trials_per_class: 64": "trials_per_class: 9000000000"},
            "fleet.yaml: tuning.trials_per_class: must be at most 1e+06",
        ),
        (
            {"trials_per_iter: 16": "trials_per_iter: 100000"},
            "fleet.yaml: tuning.trials_per_iter: must be at most 10000",
        ),
        ({"cpu_quota: 0.5": "cpu_quota: 1.0e+300"}, "fleet.yaml: boards[0].simulated.cpu_quota: must be at most 64"),
        (
            {"shape:\n    - 1\n    - 4": "shape: [65536, 65536]"},
            "fleet.yaml: models[1].inputs[0].shape: holds 4294967296 elements",
        ),
        (
            {"shape:\n    - 1\n    - 4": "shape: [1, 1, 1, 1, 1, 1, 1, 1, 1]"},
            "fleet.yaml: models[1].inputs[0].shape: has 9 elements, more than the 8 allowed",
        ),
        ({"port: 9190": "port: 9190\n  connect_timeout_s: 1.0e+200"}, "trackers[0].connect_timeout_s: unknown key"),
    ],
    ids=[
        "nan",
        "inf",
        "overflow-to-inf",
        "huge-float",
        "int-beyond-digit-limit",
        "int-beyond-2**53",
        "trials",
        "trials-per-iter",
        "quota",
        "shape-elements",
        "shape-rank",
        "unknown-key",
    ],
)
def test_non_finite_and_astronomical_numbers(fleet_dir, capsys, replace, expected):
    refused(fleet_text(fleet_dir, replace), expected, capsys)


@pytest.mark.parametrize(
    "measurement, expected",
    [
        ("number: 1000000000", "profile.yaml: measurement.number: must be at most 10000"),
        ("repeat: 1000000", "profile.yaml: measurement.repeat: must be at most 1000"),
        ("min_repeat_ms: 86400000", "profile.yaml: measurement.min_repeat_ms: must be at most 60000"),
    ],
)
def test_measurement_counts_are_capped(fleet_dir, capsys, measurement, expected):
    key, value = measurement.split(": ")
    profile = yaml.safe_load(PROFILE.read_text())
    profile["measurement"][key] = int(value)
    data = base_fleet(fleet_dir)
    data["device_classes"][0]["profile"] = str(write(fleet_dir, profile, "profile.yaml"))
    refused(write(fleet_dir, data), expected, capsys)


# -- what check used to accept and later stages choked on -----------------------------------------
def test_duplicate_keys_name_both_lines(fleet_dir, capsys):
    path = fleet_text(fleet_dir, {"- name: b1\n": "- name: b1\n  name: b9\n"})
    first = path.read_text().splitlines().index("- name: b1") + 1
    refused(
        path,
        f"fleet.yaml: boards[0].name: duplicate key (first on line {first}; the last would silently win) (line {first + 1})",
        capsys,
    )


def test_duplicate_top_level_section(fleet_dir, capsys):
    path = fleet_text(fleet_dir)
    path.write_text(path.read_text() + "tuning: {trials_per_class: 1}\n")
    refused(path, "fleet.yaml: tuning: duplicate key", capsys)


def test_billion_laughs_in_hardware(fleet_dir, capsys):
    laughs = "".join(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10))
    err = refused(profile_with(fleet_dir, '  l0: &l0 "lol"\n' + laughs), "profile.yaml: hardware.l", capsys)
    assert "expands to more than" in err


def test_hardware_must_be_few_plain_json_values(fleet_dir, capsys):
    refused(profile_with(fleet_dir, "  speed: .nan\n"), "profile.yaml: hardware.speed: must be a finite number", capsys)
    refused(
        profile_with(fleet_dir, "  built: !!timestamp 2024-05-01\n"),
        "profile.yaml: hardware.built: the tag tag:yaml.org,2002:timestamp is not allowed",
        capsys,
    )
    refused(
        profile_with(fleet_dir, "  blob: !!binary aGVsbG8=\n"),
        "profile.yaml: hardware.blob: the tag tag:yaml.org,2002:binary is not allowed",
        capsys,
    )
    refused(
        profile_with(fleet_dir, "  ids: [" + ", ".join(map(str, range(300))) + "]\n"),
        "profile.yaml: hardware.ids: has 300 elements",
        capsys,
    )
    many = "".join(f"  fact{i}: [{i}, {i}]\n" for i in range(100))
    refused(profile_with(fleet_dir, many), "profile.yaml: hardware: holds more than 256 values", capsys)
    refused(profile_with(fleet_dir, "  1: x\n"), "profile.yaml: hardware: the key 1 is not a string; quote it", capsys)


def test_a_date_in_hardware_stays_text_and_serialises(fleet_dir):
    fleet = load_fleet(profile_with(fleet_dir, "  released: 2024-05-01\n  tags: [a, b]\n"))
    hardware = fleet.device_class("avx512").profile.hardware
    assert hardware["released"] == "2024-05-01"
    assert json.loads(json.dumps(dict(hardware), allow_nan=False))["tags"] == ["a", "b"]


def test_recursive_alias(fleet_dir, capsys):
    refused(
        profile_with(fleet_dir, "  loop: &me [*me]\n"),
        "profile.yaml: hardware.loop[0]: the alias *me refers to a value that contains it",
        capsys,
    )


def test_anchors_and_merge_keys_still_work(fleet_dir):
    path = fleet_text(fleet_dir, {"  simulated:\n    cpu_quota: 0.5\n": "  simulated: &quota\n    cpu_quota: 0.5\n"})
    data = yaml.safe_load(path.read_text())
    text = path.read_text().replace(
        "  workdir: /var/lib/edgetune\n", "  workdir: /var/lib/edgetune\n  threads: &two 2\n", 1
    )
    text = text.replace("tuning:\n", "tuning:\n  <<: {trials_per_iter: *two}\n", 1)
    path.write_text(text)
    fleet = load_fleet(path)
    assert fleet.board("pi-1").threads == 2 and fleet.tuning.trials_per_iter == 16  # explicit keys win
    assert data["boards"][0]["simulated"] == {"cpu_quota": 0.5}


def test_borrow_chain_is_ordered_and_loops_of_any_length_refused(fleet_dir, capsys):
    data = base_fleet(fleet_dir)
    data["device_classes"].append({"name": "third", "profile": str(REPO / "device_profiles/rpi5.yaml")})
    data["boards"].append(
        {
            "name": "pi5",
            "address": "pi5.local",
            "device_class": "third",
            "python": "/usr/bin/python3",
            "workdir": "/var/lib/edgetune",
        }
    )
    data["tuning"]["borrow"] = {"third": "rpi4", "rpi4": "avx512"}
    fleet = load_fleet(write(fleet_dir, data))
    assert fleet.tuning.borrow_stages(["third", "rpi4", "avx512"]) == [["avx512"], ["rpi4"], ["third"]]
    assert fleet.tuning.borrow_stages(["third", "rpi4"]) == [["rpi4"], ["third"]]
    assert fleet.tuning.borrow_stages(["third", "avx512"]) == [["third", "avx512"]]
    data["tuning"]["borrow"]["avx512"] = "third"
    refused(
        write(fleet_dir, data),
        "fleet.yaml: tuning.borrow.third: borrowing goes round in a circle (third -> rpi4 -> avx512 -> third)",
        capsys,
    )


@pytest.mark.parametrize("version", ["1.0", "true", "'1'", "[1]"])
def test_version_must_be_the_integer_1(fleet_dir, capsys, version):
    refused(
        fleet_text(fleet_dir, {"version: 1\n": f"version: {version}\n"}),
        "fleet.yaml: version: unsupported version",
        capsys,
    )


@pytest.mark.parametrize("address", ["999.1.1.1", "10.0.0.256", "1.2.3", "10.0.0.1.5", "pi.123"])
def test_addresses_that_look_like_ipv4_but_are_not(fleet_dir, capsys, address):
    data = base_fleet(fleet_dir)
    data["boards"][1]["address"] = address
    refused(write(fleet_dir, data), f"fleet.yaml: boards[1].address: '{address}' is not an", capsys)


def test_host_names_and_ipv6_are_fine(fleet_dir):
    data = base_fleet(fleet_dir)
    for address in ("pi-1.lab.example", "fd00::7", "gw7"):
        data["boards"][1]["address"] = address
        assert load_fleet(write(fleet_dir, data)).board("pi-1").address == address


@pytest.mark.parametrize(
    "target, expected",
    [
        ('{kind: llvm, mcpu: ""}', "profile.yaml: target.mcpu: must not be empty"),
        ("{kind: llvm, mcpu: 5}", "profile.yaml: target.mcpu: must be a string, got int 5"),
        ("{kind: llvm, mcpu: [a]}", "profile.yaml: target.mcpu: must be a string, got a list"),
        ("{kind: llvm, num-cores: 100000}", "profile.yaml: target.num-cores: must be between 1 and 1024"),
        ("{kind: llvm, mattr: ['']}", "profile.yaml: target.mattr: a list option must hold strings"),
        (
            "{kind: llvm, mcpu: x86-64, opt-level: {a: 1}}",
            "profile.yaml: target.opt-level: must be an integer, got a mapping",
        ),
        ("{kind: '', mcpu: x86-64}", "profile.yaml: target.kind: must not be empty"),
    ],
)
def test_target_options_are_typed(fleet_dir, capsys, target, expected):
    profile = fleet_dir / "profile.yaml"
    profile.write_text(
        PROFILE.read_text().replace("target: {kind: llvm, mcpu: icelake-server, num-cores: 1}", f"target: {target}")
    )
    data = base_fleet(fleet_dir)
    data["device_classes"][0]["profile"] = str(profile)
    refused(write(fleet_dir, data), expected, capsys)


def test_ssh_key_that_is_a_folder_or_a_public_key(fleet_dir, capsys):
    data = base_fleet(fleet_dir)
    (fleet_dir / "keys").mkdir()
    data["ssh"]["key"] = "keys"
    refused(
        write(fleet_dir, data), f"fleet.yaml: ssh.key: private key file '{fleet_dir / 'keys'}' is not a file", capsys
    )
    public = fleet_dir / "id_ed25519.pub"
    public.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB user@host\n")
    public.chmod(0o600)
    data["ssh"]["key"] = str(public)
    refused(write(fleet_dir, data), "fleet.yaml: ssh.key: '" + str(public) + "' is a public key", capsys)


def test_known_hosts_unset_or_a_folder(fleet_dir, capsys):
    data = base_fleet(fleet_dir)
    del data["ssh"]["known_hosts"]
    refused(write(fleet_dir, data), "fleet.yaml: ssh.known_hosts: required field is missing", capsys)
    (fleet_dir / "kh").mkdir()
    data["ssh"]["known_hosts"] = "kh"
    refused(
        write(fleet_dir, data), f"fleet.yaml: ssh.known_hosts: '{fleet_dir / 'kh'}' is a folder, not a file", capsys
    )
    data["ssh"]["known_hosts"] = "known_hosts"
    data["boards"][1]["ssh"] = {"known_hosts": "/dev/null"}
    refused(
        write(fleet_dir, data),
        "fleet.yaml: boards[1].ssh.known_hosts: '/dev/null' is a device or other special file",
        capsys,
    )


@pytest.mark.parametrize(
    "workdir, expected",
    [
        ("/dev/null", "fleet.yaml: workdir: '/dev/null' is a device or other special file, not a folder"),
        ("fleet.yaml", "is a file, not a folder"),
        (
            "relu.onnx/work",
            "fleet.yaml: workdir: '{dir}/relu.onnx/work' cannot be made: '{dir}/relu.onnx' is not a folder",
        ),
    ],
)
def test_workdir_that_is_not_a_folder(fleet_dir, capsys, workdir, expected):
    data = base_fleet(fleet_dir)
    data["workdir"] = workdir
    refused(write(fleet_dir, data), expected.format(dir=fleet_dir), capsys)


def test_other_local_folders_and_files_are_checked_too(fleet_dir, capsys):
    data = base_fleet(fleet_dir)
    data["boards"][0]["workdir"] = "relu.onnx"
    refused(write(fleet_dir, data), "fleet.yaml: boards[0].workdir: ", capsys)
    data = base_fleet(fleet_dir)
    data["deploy"] = {"bind": "10.231.99.1:8470", "url": "https://10.231.99.1:8470", "tokens_dir": "relu.onnx"}
    refused(write(fleet_dir, data), "fleet.yaml: deploy.tokens_dir: ", capsys)
    data = base_fleet(fleet_dir)
    data["artifacts"]["public_key"] = "/tmp"
    refused(write(fleet_dir, data), "fleet.yaml: artifacts.public_key: '/tmp' is a folder, not a file", capsys)


def test_class_without_boards_is_named(fleet_dir, capsys):
    data = base_fleet(fleet_dir)
    data["boards"] = data["boards"][:1]
    refused(
        write(fleet_dir, data),
        "fleet.yaml: device_classes[1]: class 'rpi4' has no boards, so it can be neither tuned nor measured",
        capsys,
    )


def test_public_key_equal_to_signing_key_is_refused_before_keys_init_writes(fleet_dir, capsys):
    data = base_fleet(fleet_dir)
    data["artifacts"]["public_key"] = data["artifacts"]["signing_key"]
    path = write(fleet_dir, data)
    refused(path, "fleet.yaml: artifacts.public_key: is the same file as signing_key", capsys)
    assert main(["keys", "init", "-f", str(path)]) == 2
    assert "is the same file as signing_key" in capsys.readouterr().err
    assert not (fleet_dir / "keys").exists()  # nothing half-done


def test_init_keys_refuses_one_file_for_both_keys(tmp_path):
    from edgetune.artifact_format.signing import init_keys

    key = tmp_path / "keys" / "signing.key"
    with pytest.raises(ArtifactError, match="the signing key and the public key are the same file"):
        init_keys(key, tmp_path / "keys" / ".." / "keys" / "signing.key", tmp_path / "artifacts")
    assert not key.exists()


def test_huge_inventory_is_refused_before_parsing(fleet_dir, capsys):
    path = write(fleet_dir, base_fleet(fleet_dir))
    with open(path, "a") as handle:
        handle.write("# padding\n" * (5 << 20 // 10))
        handle.truncate(50 << 20)
    refused(path, "fleet.yaml: is larger than 1 MiB", capsys)


def test_fifo_and_folder_are_refused_without_blocking(fleet_dir, capsys):
    os.mkfifo(fleet_dir / "pipe.yaml")
    refused(fleet_dir / "pipe.yaml", "pipe.yaml: is not a regular file", capsys)
    (fleet_dir / "dir.yaml").mkdir()
    refused(fleet_dir / "dir.yaml", "dir.yaml: is a directory", capsys)


@pytest.mark.parametrize(
    "text, expected",
    [
        ('a: "x\\0y"\n', "f.yaml: a: holds the control character or invalid code point U+0000 (line 1)"),
        ("a: [x, y]\n? [k]\n: v\n", "f.yaml: a mapping key must be a string, not a list or mapping (line 2)"),
        ("yes: 1\n", "f.yaml: the key True is not a string; quote it"),
        ("a: 1\n---\nb: 2\n", "f.yaml: holds more than one YAML document"),
        ("a: *nowhere\n", "f.yaml: a: the alias *nowhere has no anchor"),
        ("a: !custom x\n", "f.yaml: a: the tag !custom is not allowed here"),
        (
            "a: !!python/object:os.system x\n",
            "f.yaml: a: the tag tag:yaml.org,2002:python/object:os.system is not allowed",
        ),
        ("a: " + "x" * 5000 + "\n", "f.yaml: a: a string of 5000 characters is too long"),
    ],
)
def test_reader_refuses_what_json_cannot_hold(tmp_path, text, expected):
    (tmp_path / "f.yaml").write_text(text)
    with pytest.raises(InventoryError) as err:
        read_yaml(tmp_path / "f.yaml")
    assert expected in str(err.value)


def test_reader_keeps_yaml_scalars_it_can(tmp_path):
    (tmp_path / "f.yaml").write_text("a: 0x1F\nb: 1_000\nc: ~\nd: on\ne: 2.5\nf: 2024-05-01\ng: '<<'\nh: [<<]\n")
    assert read_yaml(tmp_path / "f.yaml") == {
        "a": 31,
        "b": 1000,
        "c": None,
        "d": True,
        "e": 2.5,
        "f": "2024-05-01",
        "g": "<<",
        "h": ["<<"],
    }


def test_shipped_profile_loads_unchanged():
    assert load_profile(PROFILE).hardware["cores"] == 2


def test_a_key_file_that_is_not_a_private_key_is_refused(fleet_dir, capsys):
    data = base_fleet(fleet_dir)
    Path(data["ssh"]["key"]).write_text("just some text\n")
    refused(
        write(fleet_dir, data), "fleet.yaml: ssh.key: '" + data["ssh"]["key"] + "' is not a PEM private key", capsys
    )
