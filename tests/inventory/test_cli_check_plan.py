"""`edgetune check` and `edgetune plan` as a user runs them: output, JSON, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from edgetune.cli import main
from edgetune.inventory.fleet_plan import split_budget

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.tvm  # `edgetune plan` imports the models and extracts their tuning tasks


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgetune", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_check_summarises_the_default_fleet():
    result = run("check")
    assert result.returncode == 0, result.stderr
    assert "fleet.yaml: valid (2 device classes, 4 boards, 2 models)" in result.stdout
    assert "gateway-avx2" in result.stdout and "x86-64-v3" in result.stdout


def test_plan_json_lists_boards_and_budgets_per_class():
    result = run("plan", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    by_class = {c["device_class"]: c for c in plan["classes"]}
    assert by_class["gateway-v2"]["boards"] == ["gw-b1", "gw-b2"]
    assert by_class["gateway-v2"]["borrows_from"] == "gateway-avx2"
    budgets = {b["model"]: b["trials"] for b in by_class["gateway-avx2"]["budgets"]}
    assert budgets == {"mlp": 48, "mobilenet-mini": 144}


def test_invalid_inventory_exits_2_without_traceback(tmp_path):
    data = yaml.safe_load((REPO / "fleet.yaml").read_text())
    data["boards"][2]["device_class"] = "rpi5"
    for c in data["device_classes"]:
        c["profile"] = str(REPO / c["profile"])
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(data))
    result = run("check", "-f", "fleet.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: fleet.yaml: boards[2].device_class: 'rpi5' is not a declared device class "
        "(declared: gateway-avx2, gateway-v2)"
    )
    assert "Traceback" not in result.stderr
    verbose = run("--verbose", "check", "-f", "fleet.yaml", cwd=tmp_path)
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr


def test_main_returns_exit_code_for_missing_file(tmp_path, capsys):
    assert main(["check", "-f", str(tmp_path / "absent.yaml")]) == 2
    assert "absent.yaml: file does not exist" in capsys.readouterr().err


def test_split_budget_adds_up_and_follows_weights():
    assert split_budget(128, {"a": 1, "b": 3}) == {"a": 32, "b": 96}
    parts = split_budget(100, {"a": 1, "b": 1, "c": 1})
    assert sum(parts.values()) == 100 and sorted(parts.values()) == [33, 33, 34]
    assert split_budget(0, {"a": 1}) == {"a": 0}
