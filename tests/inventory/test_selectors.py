"""Board labels in fleet.yaml and `--select` selectors (edgetune/inventory/selectors.py): labels
are validated with the file and path, round-trip, and a selector picks exactly the boards whose
every pair matches; bad selectors are refused before anything starts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.inventory_dump import fleet_to_dict
from support.inventory_files import write
from support.tests_samples import FAKE_PRIVATE_KEY

from edgetune.artifact_format.codec import FrozenMap
from edgetune.errors import InventoryError
from edgetune.inventory import load_fleet
from edgetune.inventory.schema import Board, SshSettings
from edgetune.inventory.selectors import Selector, parse_selector, select_boards

REPO = Path(__file__).resolve().parents[2]


def _fleet_data(tmp: Path) -> dict:
    key = tmp / "id_ed25519"
    key.write_text(FAKE_PRIVATE_KEY)
    key.chmod(0o600)
    return {
        "version": 1,
        "name": "labelled",
        "workdir": "work",
        "trackers": [{"name": "host", "bind_host": "127.0.0.1", "public_address": "127.0.0.1", "port": 9190}],
        "ssh": {"user": "root", "key": str(key), "known_hosts": "known_hosts"},
        "device_classes": [{"name": "rpi4", "profile": str(REPO / "device_profiles/rpi4.yaml")}],
        "boards": [
            {
                "name": "pi-1",
                "address": "pi-1.local",
                "device_class": "rpi4",
                "python": "/usr/bin/python3",
                "workdir": "/var/lib/edgetune",
                "labels": {"site": "berlin", "tier": "field", "rack": "12"},
            },
            {
                "name": "pi-2",
                "address": "pi-2.local",
                "device_class": "rpi4",
                "python": "/usr/bin/python3",
                "workdir": "/var/lib/edgetune",
            },
        ],
        "models": [{"name": "mlp", "builtin": "mlp", "inputs": [{"name": "x", "shape": [1, 256]}]}],
        "tuning": {"trials_per_class": 64},
        "artifacts": {"dir": "artifacts", "signing_key": "keys/signing.key", "public_key": "keys/signing.pub"},
        "deploy": {"bind": "127.0.0.1:8470", "url": "https://127.0.0.1:8470", "parallel": 40},
    }


def test_labels_and_parallel_load_and_round_trip(fleet_dir):
    fleet = load_fleet(write(fleet_dir, _fleet_data(fleet_dir)))
    assert fleet.board("pi-1").labels == {"site": "berlin", "tier": "field", "rack": "12"}
    assert fleet.board("pi-2").labels == {}
    assert fleet.deploy.parallel == 40
    again = load_fleet(write(fleet_dir, fleet_to_dict(fleet), "again.yaml"))
    assert again.replace(path=fleet.path) == fleet


def test_deploy_parallel_defaults_to_a_width_sized_to_the_fleet(fleet_dir):
    data = _fleet_data(fleet_dir)
    del data["deploy"]["parallel"]
    deploy = load_fleet(write(fleet_dir, data)).deploy
    assert deploy.parallel is None
    assert [deploy.parallel_for(n) for n in (1, 320, 321, 1000, 2560, 10000)] == [16, 16, 17, 50, 128, 128]


@pytest.mark.parametrize(
    "labels, expected",
    [
        ({"rack": 12}, "boards[0].labels.rack: must be a string (quote it: '12'), got int 12"),
        ({"canary": True}, "boards[0].labels.canary: must be a string (quote it: 'true'), got bool True"),
        ({"site": None}, "boards[0].labels.site: must be a string value, got nothing"),
        (
            {"class": "x"},
            "boards[0].labels.class: 'class' is not a label name: selectors use it for the board's device class",
        ),
        ({"board": "x"}, "boards[0].labels.board: 'board' is not a label name"),
        (
            {"a b": "x"},
            "is not a valid label name (1-63 letters, digits, '.', '_' and '-', starting with a letter or digit)",
        ),
        ({"-site": "x"}, "'-site' is not a valid label name"),
        ({"site": "a,b"}, "boards[0].labels.site: 'a,b' is not a valid label value"),
        ({"site": "a=b"}, "'a=b' is not a valid label value"),
        ({"site": ""}, "'' is not a valid label value"),
        ({"x" * 64: "y"}, "is too long for a label name (64 characters, at most 63)"),
        ({"site": "y" * 64}, "boards[0].labels.site: 'yyyy"),
        (
            "berlin",
            "boards[0].labels: must be a mapping of label name to value, e.g. {site: berlin, tier: field}, got str 'berlin'",
        ),
        ({f"k{i}": "v" for i in range(65)}, "boards[0].labels: "),
    ],
)
def test_bad_labels_are_refused_with_the_file_and_path(fleet_dir, labels, expected):
    data = _fleet_data(fleet_dir)
    data["boards"][0]["labels"] = labels
    with pytest.raises(InventoryError) as err:
        load_fleet(write(fleet_dir, data))
    assert str(err.value).startswith("fleet.yaml: ")
    assert expected in str(err.value)


@pytest.mark.parametrize(
    "parallel, expected",
    [
        (0, "deploy.parallel: must be between 1 and 1024"),
        (2000, "deploy.parallel: must be between 1 and 1024"),
        ("8", "deploy.parallel: must be an integer"),
    ],
)
def test_bad_deploy_parallel_is_refused(fleet_dir, parallel, expected):
    data = _fleet_data(fleet_dir)
    data["deploy"]["parallel"] = parallel
    with pytest.raises(InventoryError, match=expected):
        load_fleet(write(fleet_dir, data))


# -- selectors (pure) ----------------------------------------------------------------------------------
def _board(name: str, device_class: str = "c1", **labels: str) -> Board:
    return Board(
        name=name,
        address=f"{name}.local",
        device_class=device_class,
        tracker="host",
        python="/usr/bin/python3",
        workdir="/w",
        ssh=SshSettings(),
        labels=FrozenMap(labels),
    )


BOARDS = (
    _board("a1", site="berlin", tier="field"),
    _board("a2", site="berlin", tier="lab"),
    _board("b1", "c2", site="paris", tier="field"),
    _board("b2", "c2"),
)


def _names(boards) -> list[str]:
    return [b.name for b in boards]


def test_parse_selector_keeps_the_pairs_in_order():
    assert parse_selector("site=berlin, tier=field").pairs == (("site", "berlin"), ("tier", "field"))
    assert parse_selector("class=c2").text == "class=c2"


@pytest.mark.parametrize(
    "text, selected",
    [
        ("site=berlin", ["a1", "a2"]),
        ("site=berlin,tier=field", ["a1"]),
        ("tier=field", ["a1", "b1"]),
        ("class=c2", ["b1", "b2"]),
        ("class=c2,tier=field", ["b1"]),
        ("board=b2", ["b2"]),
        ("board=a1,site=berlin", ["a1"]),
    ],
)
def test_select_boards_picks_the_boards_matching_every_pair(text, selected):
    assert _names(select_boards(BOARDS, parse_selector(text))) == selected


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "--select '': '' is not key=value"),
        ("site", "--select 'site': 'site' is not key=value"),
        ("site=", "'site=' is not key=value"),
        ("=berlin", "'=berlin' is not key=value"),
        ("site=berlin,,tier=field", "'' is not key=value"),
        ("site=berlin,site=paris", "'site' is given twice"),
        ("si te=berlin", "'si te' is not a valid label name"),
        ("site=ber lin", "'ber lin' is not a valid label value"),
        ("class=../x", "'../x' is not a valid name"),
    ],
)
def test_bad_selectors_are_refused(text, message):
    with pytest.raises(InventoryError) as err:
        parse_selector(text)
    assert message in str(err.value)


def test_a_label_no_board_has_is_refused_with_the_labels_they_have():
    with pytest.raises(InventoryError) as err:
        select_boards(BOARDS, parse_selector("zone=eu"))
    assert str(err.value) == (
        "--select zone=eu: no board has a label 'zone' (the labels boards have: site, tier; "
        "or class and board: a board's device class and name)"
    )


def test_a_selector_matching_no_board_is_refused_with_the_values_boards_have():
    with pytest.raises(InventoryError) as err:
        select_boards(BOARDS, parse_selector("site=paris,tier=lab"))
    assert (
        str(err.value)
        == "--select site=paris,tier=lab matches no board; the boards have site: berlin, paris; tier: field, lab"
    )
    with pytest.raises(InventoryError, match="matches no board; the boards have class: c1, c2"):
        select_boards(BOARDS, parse_selector("class=c3"))
    assert InventoryError.exit_code == 2  # nothing was started


KEYS = st.sampled_from(["site", "tier", "rack", "class", "board"])
VALUES = st.sampled_from(["a", "b", "c1", "c2", "x-1"])


@st.composite
def boards(draw) -> Board:
    labels = draw(st.dictionaries(st.sampled_from(["site", "tier", "rack"]), VALUES, max_size=3))
    return _board(draw(VALUES), draw(st.sampled_from(["c1", "c2"])), **labels)


@given(board=boards(), pairs=st.dictionaries(KEYS, VALUES, min_size=1, max_size=5))
def test_a_board_is_selected_iff_every_pair_matches(board, pairs):
    selector = parse_selector(",".join(f"{k}={v}" for k, v in pairs.items()))
    assert selector == Selector(tuple(pairs.items()))
    own = {**board.labels, "class": board.device_class, "board": board.name}
    assert selector.matches(board) == all(own.get(key) == value for key, value in pairs.items())
    if all(key in own for key in pairs):  # every key known: selected exactly when it matches, else refused
        if selector.matches(board):
            assert select_boards([board], selector) == (board,)
        else:
            with pytest.raises(InventoryError, match="matches no board"):
                select_boards([board], selector)


def test_fleet_boards_replaced_keep_their_labels(fleet_dir):
    fleet = load_fleet(write(fleet_dir, _fleet_data(fleet_dir)))
    relabelled = dataclasses.replace(fleet.board("pi-2"), labels=FrozenMap({"site": "paris"}))
    assert _names(select_boards((fleet.board("pi-1"), relabelled), parse_selector("site=paris"))) == ["pi-2"]


def test_fleet_status_refuses_a_bad_selector_before_contacting_a_board(capsys):
    from edgetune.cli import main

    assert main(["fleet", "status", "-f", str(REPO / "fleet.yaml"), "--select", "site=berlin"]) == 2
    assert "--select site=berlin: no board has a label 'site' (no board has labels" in capsys.readouterr().err
    assert main(["fleet", "status", "-f", str(REPO / "fleet.yaml"), "--select", "class=gateway-v3"]) == 2
    assert "matches no board; the boards have class: gateway-avx2, gateway-v2" in capsys.readouterr().err
