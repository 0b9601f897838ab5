"""Exit codes: one table, in docs/cli.md ("Exit codes"), that the code follows.

The table of codes is the code's own (`edgetune.cli.EXIT_CODES`, from the types of
edgetune/errors.py); the table of verbs has a row for every verb and action the parser has; and
each verb gives its codes for real where that is cheap: an invalid fleet.yaml is 2 for every verb
that reads the inventory, a flag a verb does not have is argparse's 2, each verb's own checks
refuse a name the inventory does not have with the code of its kind, and the verbs that sum up
a result (tune, tune-fleet, regress, build, fleet up, sim up) return the code of what failed.
The library calls behind those results are replaced by stand-ins: no board, no simulated fleet,
nothing started; the module runs in seconds."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import edgetune.errors
from edgetune.cli import EXIT_CODES, USAGE, build_parser, exit_code, main
from edgetune.errors import (
    ArtifactError,
    DeployError,
    EdgetuneError,
    FleetError,
    Interrupted,
    InventoryError,
    TuneError,
)

ROOT = Path(__file__).resolve().parents[1]
CLI_DOC = ROOT / "docs" / "cli.md"

# Every verb (and action) that reads the inventory, with the arguments it needs besides `-f`.
READS_THE_INVENTORY = {
    "check": [],
    "plan": [],
    "sim up": [],
    "sim down": [],
    "sim firmware": ["gw-a1", "--version", "2"],
    "fleet up": [],
    "fleet status": [],
    "fleet down": [],
    "fleet trust": ["gw-a1"],
    "fleet reset-serial": [],
    "tune": [],
    "starters build": ["--profile", "x86-64-v3", "--from", "databases/gateway-avx2"],
    "keys init": [],
    "keys rotate": ["decision"],
    "keys revoke": ["0123456789abcdef"],
    "keys list": [],
    "build": [],
    "verify": ["artifacts"],  # no --public-key: the inventory's artifacts.public_key
    "profile": ["mlp"],
    "tune-fleet": [],
    "serve": [],
    "pull": ["gw-a1"],
    "rollout": ["--model", "mlp"],
    "timer install": [],
    "timer remove": [],
    "regress": [],
    "report": [],
}
# `import` reads `-f` only for a measured trial rate: an inventory that does not load is a note in its output.
OTHER_VERBS = {"import": ["model.onnx"]}


# ---- the documented tables -------------------------------------------------------------------


def _section(markdown: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", markdown, re.MULTILINE | re.DOTALL)
    assert match, f"docs/cli.md has no '## {heading}' section"
    return match.group(1)


def _tables(text: str) -> list[list[list[str]]]:
    """Each markdown table of `text` as rows of cells, header and rule dropped."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append([cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])])
        elif current:
            tables.append(current[2:])
            current = []
    return tables


def _code_names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def documented() -> tuple[dict[int, list[str]], dict[str, set[int]]]:
    """({code: the error types of its row}, {verb: its codes}) from docs/cli.md."""
    codes_table, verbs_table = _tables(_section(CLI_DOC.read_text(), "Exit codes"))
    codes = {int(row[0]): _code_names(row[2]) for row in codes_table}
    verbs = {verb: {int(code) for code in row[1].split(",")} for row in verbs_table for verb in _code_names(row[0])}
    return codes, verbs


def parser_verbs() -> set[str]:
    """Every verb of the CLI, and `verb action` for the verbs that have actions."""

    def choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(actions[0].choices) if actions else {}

    found = set()
    for verb, sub in choices(build_parser()).items():
        actions = choices(sub)
        found |= {f"{verb} {action}" for action in actions} if actions else {verb}
    return found


def test_the_documented_codes_are_those_main_returns():
    codes, _ = documented()
    assert {name: code for code, names in codes.items() for name in names} == {
        error_type.__name__: code for error_type, code in EXIT_CODES.items()
    }
    assert set(codes) == {0, USAGE, *EXIT_CODES.values()}
    assert (
        codes[0] == [] and USAGE == EXIT_CODES[InventoryError] == 2
    )  # argparse's refusal and an invalid inventory share 2


def test_every_error_type_of_edgetune_errors_has_its_code_and_no_subclass_sets_another():
    defined = {
        obj for obj in vars(edgetune.errors).values() if isinstance(obj, type) and issubclass(obj, EdgetuneError)
    }
    assert defined <= set(EXIT_CODES)
    assert all(error_type.exit_code == code for error_type, code in EXIT_CODES.items() if error_type in defined)
    setters = []
    for path in sorted((ROOT / "edgetune").rglob("*.py")):
        if path.name == "errors.py" and path.parent.name == "edgetune":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                setters += [
                    f"{path.relative_to(ROOT)}:{node.name}"
                    for statement in node.body
                    if isinstance(statement, (ast.Assign, ast.AnnAssign))
                    and "exit_code" in ast.unparse(statement).split("=")[0]
                ]
    assert setters == [], "an error type with a code of its own: give it its base's (docs/cli.md, Exit codes)"


def test_a_subclass_takes_its_base_types_code():
    class Unreachable(FleetError):
        pass

    assert exit_code(Unreachable("x")) == 3 and exit_code(Interrupted("x")) == exit_code(KeyboardInterrupt()) == 130
    assert [exit_code(t("x")) for t in (EdgetuneError, InventoryError, TuneError, ArtifactError, DeployError)] == [
        1,
        2,
        4,
        5,
        6,
    ]


def test_every_verb_has_a_row_and_every_verb_is_tried_here():
    _, verbs = documented()
    assert set(verbs) == parser_verbs()
    assert set(READS_THE_INVENTORY) | set(OTHER_VERBS) == parser_verbs()
    for verb, codes in verbs.items():
        assert 0 in codes and codes <= {0, USAGE, *EXIT_CODES.values()}, verb


# ---- each verb, for real -----------------------------------------------------------------------


@pytest.fixture
def cli(monkeypatch, capsys):
    """main() as a user runs it, logging restored after it (main() configures the root logger)."""
    import logging

    root, edgetune = logging.getLogger(), logging.getLogger("edgetune")
    handlers, levels = list(root.handlers), (root.level, edgetune.level)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    yield run
    root.handlers[:] = handlers
    root.setLevel(levels[0])
    edgetune.setLevel(levels[1])


def _fleet_copy(tmp_path: Path, change=None) -> Path:
    """The default fleet, its profiles named by absolute path, its workdir and artifacts in tmp_path."""
    data = yaml.safe_load((ROOT / "fleet.yaml").read_text())
    for device_class in data["device_classes"]:
        device_class["profile"] = str(ROOT / device_class["profile"])
    if change:
        change(data)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def fleet(tmp_path) -> Path:
    return _fleet_copy(tmp_path)


@pytest.fixture
def invalid_fleet(tmp_path) -> Path:
    return _fleet_copy(tmp_path, lambda data: data["boards"][2].update(device_class="rpi5"))


def _documented_codes(verb: str) -> set[int]:
    return documented()[1][verb]


@pytest.mark.parametrize("verb", sorted(READS_THE_INVENTORY))
def test_an_invalid_inventory_is_2_for_every_verb_that_reads_it_and_nothing_starts(cli, invalid_fleet, verb):
    code, out, err = cli(*verb.split(), *READS_THE_INVENTORY[verb], "-f", invalid_fleet)
    assert (code, out) == (2, ""), err
    assert f"error: {invalid_fleet}: boards[2].device_class: 'rpi5' is not a declared device class" in err, err
    assert 2 in _documented_codes(verb)


@pytest.mark.parametrize("verb", sorted({**READS_THE_INVENTORY, **OTHER_VERBS}))
def test_a_flag_the_verb_does_not_have_is_argparses_2(cli, verb, capsys):
    arguments = {**READS_THE_INVENTORY, **OTHER_VERBS}[verb]
    with pytest.raises(SystemExit) as stopped:
        main([*verb.split(), *arguments, "--no-such-flag"])
    assert stopped.value.code == USAGE
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_verbose_goes_before_the_verb(cli, invalid_fleet, capsys):
    code, _, err = cli("--verbose", "check", "-f", invalid_fleet)
    assert code == 2 and "Traceback" in err
    with pytest.raises(SystemExit) as stopped:
        main(["check", "--verbose", "-f", str(invalid_fleet)])
    assert stopped.value.code == USAGE and "unrecognized arguments: --verbose" in capsys.readouterr().err


# The verbs' own checks, on a valid inventory: what each refuses before it touches anything.
REFUSALS = [
    (["check"], 0, ""),
    (["import", "{tmp}/missing.onnx"], 2, "missing.onnx: no such ONNX file"),
    (["fleet", "status", "--select", "site=nowhere"], 2, "--select site=nowhere: no board has a label 'site'"),
    (["rollout", "--model", "mlp", "--select", "site=nowhere", "--dry-run"], 2, "no board has a label 'site'"),
    (["fleet", "reset-serial", "nope"], 3, "no board named nope"),
    (["sim", "firmware", "nope", "--version", "2"], 3, "'nope' is not a simulated board"),
    (["tune", "--class", "nope", "--dry-run"], 4, "--class 'nope': no such device class"),
    (["build", "--class", "nope"], 5, "unknown device class nope"),
    (["profile", "nope"], 5, "unknown model 'nope'"),
    (["verify", "{tmp}/nothing", "--public-key", "{tmp}/missing.pub"], 5, "no public key at"),
    (["serve", "--bind", "nonsense"], 6, "--bind 'nonsense' is not ADDRESS:PORT"),
    (["keys", "rotate", "ca", "--refuse-old-in", "1"], 6, "--refuse-old-in is for the artifact and decision keys"),
    (["pull", "nope"], 6, "unknown board 'nope'"),
    (["rollout", "--model", "nope", "--dry-run"], 6, "unknown model 'nope'"),
    (["regress", "--board", "nope"], 6, "unknown board nope"),
]


@pytest.mark.parametrize(("argv", "expected", "message"), REFUSALS, ids=[" ".join(r[0]) for r in REFUSALS])
def test_each_verbs_own_refusals_have_the_code_of_their_kind(cli, fleet, tmp_path, argv, expected, message):
    argv = [a.format(tmp=tmp_path) for a in argv]
    code, _, err = cli(*argv, "-f", fleet)
    assert code == expected, err
    assert message in err
    verb = " ".join(argv[:2]) if " ".join(argv[:2]) in parser_verbs() else argv[0]
    assert expected in _documented_codes(verb)


# ---- verbs that sum up a result: the code of what failed ---------------------------------------


def _tuning(ok: bool):
    return SimpleNamespace(ok=ok, classes=[], to_dict=lambda: {})


def _build(ok: bool):
    return SimpleNamespace(
        ok=ok,
        table=lambda: "",
        layouts=lambda: [],
        warnings=lambda: [],
        failures=lambda: [] if ok else ["mlp for gateway-v2: outputs differ"],
    )


@pytest.mark.parametrize(
    ("failed_boards", "tuning_ok", "build_ok", "expected"),
    [
        ({}, True, True, 0),
        ({"gw-b1": "gw-b1: unreachable"}, True, True, 3),
        ({"gw-b1": "gw-b1: unreachable"}, False, False, 3),
        ({}, False, True, 4),
        ({}, False, False, 4),
        ({}, True, False, 5),
    ],
)
def test_tune_fleet_returns_the_code_of_the_first_stage_that_failed(
    cli, fleet, monkeypatch, failed_boards, tuning_ok, build_ok, expected
):
    from edgetune.pipeline import PipelineResult

    result = PipelineResult(failed_boards=failed_boards, tuning=_tuning(tuning_ok), build=_build(build_ok))
    monkeypatch.setattr("edgetune.pipeline.run_pipeline", lambda fleet: result)
    code, _, err = cli("tune-fleet", "-f", fleet)
    assert code == expected, err
    assert expected in _documented_codes("tune-fleet")


def _verdict(board: str, verdict: str):
    from edgetune.regress.check import Verdict

    return Verdict(board, "gateway-v2", "mlp", 1, verdict, None, None, None, None, None)


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        (["ok", "faster"], 0),
        ([], 0),
        (["ok", "unreachable"], 3),
        (["not_deployed"], 6),
        (["unreachable", "not_deployed"], 3),
        (["slower", "unreachable", "not_deployed"], 5),
        (["wrong_output"], 5),
        (["load_failed", "ok"], 5),
    ],
)
def test_regress_returns_the_code_of_its_worst_verdict(cli, fleet, monkeypatch, verdicts, expected):
    from edgetune.regress.check import RegressReport

    report = RegressReport(tuple(_verdict(f"gw-{i}", v) for i, v in enumerate(verdicts)))
    monkeypatch.setattr("edgetune.regress.check.regress", lambda *args, **kwargs: report)
    code, _, err = cli("regress", "-f", fleet)
    assert code == expected, err
    assert expected in _documented_codes("regress")


@pytest.mark.parametrize(
    ("argv", "target", "result", "expected"),
    [
        (["tune"], "edgetune.tune.tune_fleet", _tuning(False), 4),
        (["tune"], "edgetune.tune.tune_fleet", _tuning(True), 0),
        (["build"], "edgetune.artifact.release.build_artifacts", _build(False), 5),
        (["fleet", "up"], "edgetune.fleet.lifecycle.fleet_up", "failed", 3),
        (["fleet", "down"], "edgetune.fleet.lifecycle.fleet_down", "failed", 3),
        (["sim", "up"], "edgetune.cli.sim_cmd.sim_up", "failed", 3),
        (["sim", "down"], "edgetune.cli.sim_cmd.sim_down", "succeeded", 0),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_verbs_failed_result_returns_the_code_of_its_kind(cli, fleet, monkeypatch, argv, target, result, expected):
    from edgetune.fleet import GroupResult

    if result in ("failed", "succeeded"):
        result = (
            GroupResult(failed={"gw-b1": "gw-b1: unreachable"})
            if result == "failed"
            else GroupResult(succeeded={"gw-b1": None})
        )
    monkeypatch.setattr(target, lambda *args, **kwargs: result)
    code, _, err = cli(*argv, "-f", fleet)
    assert code == expected, err
    assert expected in _documented_codes(" ".join(argv) if " ".join(argv) in parser_verbs() else argv[0])


@pytest.mark.parametrize(
    ("argv", "checked"),
    [
        (["--select", "class=gateway-v2"], ["gw-b1", "gw-b2"]),
        (["--select", "board=gw-a2"], ["gw-a2"]),
        (["--class", "gateway-avx2", "--select", "board=gw-a1"], ["gw-a1"]),
    ],
)
def test_regress_checks_the_selected_boards_only(cli, fleet, monkeypatch, argv, checked):
    from edgetune.regress.check import RegressReport

    seen = []
    monkeypatch.setattr(
        "edgetune.regress.check.regress",
        lambda fleet, boards, classes, *rest: seen.append((boards, classes)) or RegressReport(()),
    )
    code, _, err = cli("regress", "-f", fleet, *argv)
    assert code == 0 and seen == [(checked, [])], err
    code, _, err = cli("regress", "-f", fleet, "--class", "gateway-avx2", "--select", "board=gw-b1")
    assert code == 2 and "matches none of the boards --board or --class names" in err
