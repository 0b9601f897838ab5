"""`plan_rollout` alone (pure: no board, no server): `--batch` as a count or a percentage of each
class's non-canary boards, `--select` narrowing the targets, `--parallel` and `deploy.parallel`.
The versions come from a store of the module's own, as the server would offer them."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.deploy_support import publish_version

from edgetune.artifact_format.codec import FrozenMap
from edgetune.deploy import rollout as rollout_module
from edgetune.deploy.rollout import BatchSize, parse_batch, plan_rollout
from edgetune.errors import DeployError, InventoryError
from edgetune.fleet.parallel import GroupResult
from edgetune.inventory import load_fleet
from edgetune.inventory.schema import TlsFiles
from edgetune.inventory.selectors import parse_selector

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """The shipped fleet with a store and keys of the module's own, mlp v1 published for each class."""
    root = tmp_path_factory.mktemp("plan")
    fleet = load_fleet(REPO / "fleet.yaml")
    artifacts = dataclasses.replace(
        fleet.artifacts,
        dir=root / "artifacts",
        signing_key=root / "keys" / "signing.key",
        public_key=root / "keys" / "signing.pub",
    )
    fleet = fleet.replace(
        artifacts=artifacts, deploy=dataclasses.replace(fleet.deploy, tls=TlsFiles.beside(artifacts.signing_key))
    )
    for device_class in fleet.device_classes:
        publish_version(fleet, "mlp", device_class.name, b"a library")
    return fleet


@pytest.fixture
def fleet_of(published):
    """fleet_of(name=n, ...): the published fleet with `n` boards per class, board i of each class
    labelled site=berlin when i is even, else paris."""

    def make(**classes: int):
        template = published.boards[0]
        boards = [
            dataclasses.replace(
                template,
                name=f"{c}-{i}",
                address=f"{c}-{i}.local",
                device_class=c,
                labels=FrozenMap({"site": "berlin" if i % 2 == 0 else "paris"}),
            )
            for c, n in classes.items()
            for i in range(1, n + 1)
        ]
        return published.replace(boards=tuple(boards))

    return make


def sizes(plan) -> list[tuple[str, int]]:
    return [(stage.name, len(stage.targets)) for stage in plan.stages]


def test_a_percentage_batch_of_a_ten_board_class(fleet_of):
    fleet = fleet_of(**{"gateway-v2": 10})
    assert sizes(plan_rollout(fleet, "mlp", canary=0, batch="30%")) == [
        ("batch 1", 3),
        ("batch 2", 3),
        ("batch 3", 3),
        ("batch 4", 1),
    ]
    # with its canary: 9 others, ceil(30% of 9) = 3 per batch
    assert sizes(plan_rollout(fleet, "mlp", canary=1, batch="30%")) == [
        ("canary gateway-v2", 1),
        ("batch 1", 3),
        ("batch 2", 3),
        ("batch 3", 3),
    ]
    assert sizes(plan_rollout(fleet, "mlp", canary=0, batch="10%")) == [(f"batch {n}", 1) for n in range(1, 11)]
    assert sizes(plan_rollout(fleet, "mlp", canary=0, batch="100%")) == [("batch 1", 10)]
    assert sizes(plan_rollout(fleet, "mlp", canary=0, batch="1%")) == [
        (f"batch {n}", 1) for n in range(1, 11)
    ]  # at least 1
    assert sizes(plan_rollout(fleet, "mlp", canary=0, batch="12.5%")) == [(f"batch {n}", 2) for n in range(1, 6)]


def test_a_percentage_is_of_each_class_and_batches_take_a_share_of_every_class(fleet_of):
    fleet = fleet_of(**{"gateway-avx2": 5, "gateway-v2": 21})  # others after the canaries: 4 and 20
    plan = plan_rollout(fleet, "mlp", canary=1, batch="25%")  # 1 and 5 per batch
    assert sizes(plan) == [("canary gateway-avx2", 1), ("canary gateway-v2", 1)] + [
        (f"batch {n}", 6) for n in range(1, 5)
    ]
    batch_1 = [t.board.name for t in plan.stages[2].targets]
    assert batch_1 == ["gateway-avx2-2", "gateway-v2-2", "gateway-v2-3", "gateway-v2-4", "gateway-v2-5", "gateway-v2-6"]
    assert sorted(t.board.name for t in plan.targets) == sorted(b.name for b in fleet.boards)  # each board once


def test_a_count_batch_is_as_before(fleet_of):
    fleet = fleet_of(**{"gateway-avx2": 3, "gateway-v2": 4})
    assert sizes(plan_rollout(fleet, "mlp", canary=1, batch=2)) == [
        ("canary gateway-avx2", 1),
        ("canary gateway-v2", 1),
        ("batch 1", 2),
        ("batch 2", 2),
        ("batch 3", 1),
    ]
    assert sizes(plan_rollout(fleet, "mlp", canary=1, batch="0")) == [
        ("canary gateway-avx2", 1),
        ("canary gateway-v2", 1),
        ("batch 1", 5),
    ]


@pytest.mark.parametrize(
    "batch, message",
    [
        ("0%", "--batch 0%: a percentage must be above 0% and at most 100%"),
        ("100.5%", "--batch 100.5%: a percentage must be above 0% and at most 100%"),
        ("-5%", "a percentage must be above 0%"),
        ("nan%", "a percentage must be above 0%"),
        ("ten%", "a percentage must be above 0%"),
        ("-1", "--batch -1: must be zero (one batch) or more boards, or a percentage"),
        ("3 boards", "--batch 3 boards: must be a number of boards (0: one batch) or a percentage, e.g. --batch 10%"),
    ],
)
def test_bad_batches_are_refused(fleet_of, batch, message):
    with pytest.raises(DeployError) as err:
        plan_rollout(fleet_of(**{"gateway-v2": 4}), "mlp", batch=batch)
    assert message in str(err.value)


def test_parse_batch():
    assert parse_batch("10%") == BatchSize(percent=10.0) and str(parse_batch("10%")) == "10%"
    assert parse_batch(4) == BatchSize(count=4) == parse_batch(" 4 ")
    assert (
        BatchSize(percent=30).size_of(10) == 3 and BatchSize(percent=30).size_of(1) == 1 and BatchSize().size_of(7) == 7
    )


def test_select_narrows_the_targets_within_classes(fleet_of):
    fleet = fleet_of(**{"gateway-avx2": 4, "gateway-v2": 4})
    plan = plan_rollout(fleet, "mlp", canary=1, select=parse_selector("site=berlin"))
    assert [t.board.name for t in plan.targets] == ["gateway-avx2-2", "gateway-v2-2", "gateway-avx2-4", "gateway-v2-4"]
    plan = plan_rollout(fleet, "mlp", classes=["gateway-v2"], canary=0, select=parse_selector("site=paris"))
    assert [t.board.name for t in plan.targets] == ["gateway-v2-1", "gateway-v2-3"]
    plan = plan_rollout(fleet, "mlp", canary=0, select=parse_selector("class=gateway-avx2,board=gateway-avx2-3"))
    assert [t.board.name for t in plan.targets] == ["gateway-avx2-3"]


def test_a_selector_matching_nothing_is_refused_before_anything_starts(fleet_of):
    fleet = fleet_of(**{"gateway-avx2": 1, "gateway-v2": 2})
    with pytest.raises(InventoryError, match="no board has a label 'zone'"):
        plan_rollout(fleet, "mlp", select=parse_selector("zone=eu"))
    with pytest.raises(
        InventoryError, match="--select site=rome matches no board; the boards have site: berlin, paris"
    ):
        plan_rollout(fleet, "mlp", select=parse_selector("site=rome"))
    with pytest.raises(InventoryError, match="--select board=gateway-v2-2 matches no board of class gateway-avx2"):
        plan_rollout(fleet, "mlp", classes=["gateway-avx2"], select=parse_selector("board=gateway-v2-2"))


def test_parallel_from_the_flag_else_the_inventory(fleet_of):
    fleet = fleet_of(**{"gateway-v2": 2})
    assert plan_rollout(fleet, "mlp").parallel == fleet.deploy.parallel_for(2) == 16
    assert plan_rollout(fleet, "mlp", parallel=3).parallel == 3
    assert plan_rollout(fleet, "mlp", parallel=3).to_json()["parallel"] == 3
    tuned = fleet.replace(deploy=dataclasses.replace(fleet.deploy, parallel=64))
    assert plan_rollout(tuned, "mlp").parallel == 64
    for bad in (0, -1, 5000):
        with pytest.raises(DeployError, match="--parallel must be a number of boards between 1 and 1024"):
            plan_rollout(fleet, "mlp", parallel=bad)


def test_run_stage_drives_plan_parallel_boards_at_once(fleet_of, monkeypatch):
    """The stage's fan-out is given the plan's worker count."""
    fleet = fleet_of(**{"gateway-v2": 3})
    plan = plan_rollout(fleet, "mlp", canary=0, parallel=2)
    seen = []

    def fan_out(boards, step, workers=16):
        seen.append(workers)
        return GroupResult({}, {b.name: f"{b.name}: not run" for b in boards})

    monkeypatch.setattr(rollout_module, "for_each_board", fan_out)
    journal = SimpleNamespace(plan_stage=lambda stage, boards: None)  # nothing runs, nothing to journal
    outcomes = rollout_module._run_stage(fleet, plan, plan.stages[0], b"", {}, journal=journal)
    assert seen == [2] and {o.result for o in outcomes.values()} == {"failed"}


def test_cli_refuses_a_bad_selector_and_batch_with_exit_2_and_6(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "edgetune",
                "rollout",
                "-f",
                str(REPO / "fleet.yaml"),
                "--model",
                "mlp",
                "--dry-run",
                *args,
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )

    bad_selector = run("--select", "zone=eu")
    assert bad_selector.returncode == 2 and "--select zone=eu: no board has a label 'zone'" in bad_selector.stderr
    bad_batch = run("--batch", "0%")
    assert bad_batch.returncode == 6 and "--batch 0%: a percentage must be above 0%" in bad_batch.stderr


def outcome(target, result: str):
    return rollout_module.BoardOutcome(target.board.name, target.board.device_class, "mlp", 1, target.version, result)


def test_a_pending_canary_is_replaced_by_the_next_board_of_its_class_and_counts_only_when_asked(fleet_of):
    fleet = fleet_of(**{"gateway-v2": 4})
    plan = plan_rollout(fleet, "mlp", canary=1, max_failed_pct=0)
    canary = plan.stages[0]
    outcomes = {canary.targets[0].board.name: outcome(canary.targets[0], "pending")}
    assert rollout_module._stop_reason(plan, canary, list(outcomes.values())) is None
    spare = rollout_module._replacement_canaries(plan, canary, outcomes)
    assert spare.canary and [t.board.name for t in spare.targets] == ["gateway-v2-2"] and "gateway-v2-1" in spare.name

    counting = plan_rollout(fleet, "mlp", canary=1, max_failed_pct=0, count_pending=True)
    assert rollout_module._replacement_canaries(counting, canary, outcomes) is None
    assert "failed or were lost or not reachable" in rollout_module._stop_reason(
        counting, canary, list(outcomes.values())
    )


def test_pending_boards_leave_a_rollout_ok_and_are_listed(fleet_of):
    fleet = fleet_of(**{"gateway-v2": 3})
    plan = plan_rollout(fleet, "mlp", canary=0)
    results = ["installed", "pending", "unchanged"]
    done = rollout_module.RolloutResult(plan, tuple(outcome(t, r) for t, r in zip(plan.targets, results)), None)
    assert done.ok and done.pending == ("gateway-v2-2",)
    failed = rollout_module.RolloutResult(
        plan, tuple(outcome(t, r) for t, r in zip(plan.targets, ["installed", "pending", "failed"])), None
    )
    assert not failed.ok
