"""What each part of the dashboard says, as plain data computed from `Sources`: one row per board,
per stored artifact version, per class's tuning, and per event of the fleet's history. Pure:
no file is read here, no HTML written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgetune.artifact.release import (
    best_runtime_names,
    best_runtime_ratios,
    board_runtimes,
    board_speedups,
    over_boards,
    runtime_ratios,
)
from edgetune.artifact_format.manifest import LIBRARY_NAME
from edgetune.fleet.board_runtimes import ONNXRUNTIME, RUNTIMES
from edgetune.report.sources import Sources, Version
from edgetune.tune.budget import time_is_the_budget
from edgetune.tune.plan import class_budget
from edgetune.tune.report import TuningSummary


@dataclass(frozen=True)
class Running:
    version: int | str  # or "unknown"
    since: str | None  # when the journal first saw it run there (None: before the journal, or not recorded)


@dataclass(frozen=True)
class LastVerdict:
    verdict: str
    ratio: float | None
    interval: tuple[float, float] | None
    time: str
    version: int | None


@dataclass
class BoardRow:
    name: str
    device_class: str
    role: str  # "pool" (it tunes and measures its class's builds) or "target" (it only runs releases)
    online: str  # "online", "offline" or "not checked" (no `fleet status` recorded)
    checked: str | None  # when the last `fleet status` ran
    firmware: str | None
    firmware_changed: bool | None
    reported: str | None = None  # when its pull timer last reported to the server; None: never
    running: dict[str, Running] = field(default_factory=dict)  # model -> what it runs
    verdicts: dict[str, LastVerdict] = field(default_factory=dict)  # model -> the last regress verdict


def board_rows(sources: Sources) -> list[BoardRow]:
    last_status = (sources.events("status") or [{}])[-1]
    status = {b.get("name"): b for b in last_status.get("boards", []) if isinstance(b, dict)}
    since = _running_since(sources)
    verdicts: dict[str, dict[str, LastVerdict]] = {}
    for (name, model), verdict in _last_verdicts(sources).items():
        verdicts.setdefault(name, {})[model] = verdict
    regress_firmware = _regress_firmware(sources)
    rows = []
    for board in sources.fleet.boards:
        seen = status.get(board.name)
        row = BoardRow(
            board.name,
            board.device_class,
            sources.fleet.role(board),
            online="not checked" if seen is None else ("online" if seen.get("reachable") else "offline"),
            checked=last_status.get("time") if seen else None,
            firmware=_one_line(seen.get("firmware")) if seen else None,
            firmware_changed=_firmware_changed(seen, regress_firmware.get(board.name, [])),
            reported=sources.reported[board.name].received if board.name in sources.reported else None,
        )
        for model, version in sources.deployed.get(board.name, {}).items():
            at = since.get((board.name, model))
            row.running[model] = Running(version, at[1] if at and at[0] == version else None)
        row.verdicts = verdicts.get(board.name, {})
        rows.append(row)
    return rows


def _running_since(sources: Sources) -> dict[tuple[str, str], tuple[int | str, str]]:
    """(board, model) -> (the version it was last read back running, since which rollout)."""
    since: dict[tuple[str, str], tuple[int | str, str]] = {}
    for event in sources.events("rollout"):
        for outcome in event.get("outcomes", []):
            key = (outcome.get("board"), outcome.get("model"))
            runs = outcome.get("runs")
            if runs is not None and (key not in since or since[key][0] != runs):
                since[key] = (runs, event["time"])
    return since


def _last_verdicts(sources: Sources) -> dict[tuple[str, str], LastVerdict]:
    found = {}
    for event in sources.events("regress"):
        for v in event.get("verdicts", []):
            interval = v.get("interval")
            found[(v.get("board"), v.get("model"))] = LastVerdict(
                str(v.get("verdict")),
                v.get("ratio"),
                tuple(interval) if interval else None,
                event["time"],
                v.get("version"),
            )
    return found


def _firmware_changed(status: dict | None, regress_flags: list[bool | None]) -> bool | None:
    """Changed if the last status (against `fleet up`) or the last regress run (against the
    baseline) says so; None when neither could tell."""
    flags = [f for f in [status.get("firmware_changed") if status else None, *regress_flags] if f is not None]
    return any(flags) if flags else None


def _regress_firmware(sources: Sources) -> dict[str, list[bool | None]]:
    """Per board, the firmware_changed flags of its verdicts in the last regress run that checked it."""
    found: dict[str, list[bool | None]] = {}
    for event in sources.events("regress"):
        flags: dict[str, list[bool | None]] = {}
        for v in event.get("verdicts", []):
            flags.setdefault(v.get("board"), []).append(v.get("firmware_changed"))
        found.update(flags)
    return found


@dataclass(frozen=True)
class VersionRow:
    model: str
    device_class: str
    version: int
    created: str
    tuned_ms: float | None
    untuned_ms: float | None
    speedup: float | None  # untuned / tuned, the median over the boards
    speedup_interval: tuple[float, float] | None  # the lowest and highest interval bound over the boards
    vs_onnxruntime: float | None  # onnxruntime / tuned, the median over the boards that ran it
    vs_onnxruntime_interval: tuple[float, float] | None  # as speedup_interval
    onnxruntime: str  # what ran it on how many boards, "" where no board did
    vs_best_runtime: float | None  # the faster runtime / tuned per board, the median over the boards that ran one
    vs_best_runtime_interval: tuple[float, float] | None  # as speedup_interval
    best_runtime: str | None  # which runtime was the faster ("openvino"; "onnxruntime, openvino" where boards differ)
    runtimes: str  # every runtime that ran it and on how many boards, "" where none did
    parity: str  # when its tuning estimate crossed the faster runtime's time (its tuning report's), "" without a report
    library_mb: float | None
    key_id: str | None
    trials: int
    boards: tuple[str, ...]  # the boards that run it (deployed.json)


def version_rows(sources: Sources) -> list[VersionRow]:
    return [_version_row(sources, v) for v in sources.versions]


def _version_row(sources: Sources, v: Version) -> VersionRow:
    m = v.manifest
    of_class = {b.name for b in sources.fleet.boards if b.device_class == v.device_class}
    running = tuple(
        sorted(
            board
            for board, models in sources.deployed.items()
            if board in of_class and models.get(v.model) == v.version
        )
    )
    ran = {name: _ran_text(m.boards, name) for name in RUNTIMES}
    return VersionRow(
        v.model,
        v.device_class,
        v.version,
        m.created,
        m.tuned_median_ms(),
        m.untuned_median_ms(),
        *over_boards(board_speedups(m.boards)),
        *over_boards(runtime_ratios(m.boards, ONNXRUNTIME)),
        ran[ONNXRUNTIME],
        *over_boards(best_runtime_ratios(m.boards)),
        best_runtime_names(m.boards),
        "; ".join(t for t in ran.values() if t),
        v.summary.time_to_parity if v.summary else "",
        next((f.size / 1e6 for f in m.files if f.path == LIBRARY_NAME), None),
        v.key_id,
        m.tuning.trials,
        running,
    )


def _ran_text(boards, runtime: str) -> str:
    """'onnxruntime 1.32.0, 1 thread on 2 of 2 boards': what ran `runtime` on how many boards."""
    runs = [run for b in boards if (run := board_runtimes(b).get(runtime)) is not None]
    if not runs:
        return ""
    return f"{'; '.join(sorted({run.runtime for run in runs}))} on {len(runs)} of {len(boards)} boards"


@dataclass(frozen=True)
class ClassTuning:
    device_class: str
    budget: str  # the budget and what is left of it, in words
    trials: int  # spent on the class's tasks (all its models, deduplicated)
    runs: str  # the runs logged in runs.jsonl, in words
    models: dict[str, TuningSummary]  # model -> its summary.json


def class_tunings(sources: Sources) -> list[ClassTuning]:
    found = []
    for device_class in sources.fleet.device_classes:
        summaries = {m: s for (c, m), s in sources.summaries.items() if c == device_class.name}
        tasks = {t.workload_hash: t.trials for s in summaries.values() for t in s.tasks}
        spent = sum(tasks.values())
        found.append(
            ClassTuning(
                device_class.name,
                _budget_text(sources, device_class.name, len(tasks), spent),
                spent,
                _runs_text(sources, device_class.name),
                summaries,
            )
        )
    return found


def _budget_text(sources: Sources, device_class: str, tasks: int, spent: int) -> str:
    fleet = sources.fleet
    if not tasks:
        return "not tuned yet"
    if time_is_the_budget(fleet.tuning, device_class):
        return f"{fleet.tuning.time_limit_s:g} s per run (a time budget)"
    budget, _, rule = class_budget(fleet.tuning, device_class, fleet.models, fleet.models, tasks)
    return f"{budget} trials ({rule}); {max(budget - spent, 0)} left"


def _runs_text(sources: Sources, device_class: str) -> str:
    rate = sources.throughputs.get(device_class)
    if rate is None:
        return "no run has measured a trial"
    return (
        f"{rate.runs} run(s), {rate.trials} trials in {rate.seconds:.0f} s ({rate.seconds_per_trial:.2f} s per trial)"
    )


@dataclass(frozen=True)
class HistoryRow:
    time: str
    kind: str  # "rollout", "regress", "status" or "firmware"
    what: str


def history_rows(sources: Sources) -> list[HistoryRow]:
    """Every journal event, and each firmware change a status or a regress run found, oldest first."""
    rows, firmware = [], {}
    for event in sources.journal.events:
        kind, time = event["kind"], event["time"]
        if kind == "rollout":
            rows.append(HistoryRow(time, kind, _rollout_text(event)))
        elif kind == "regress":
            rows.append(HistoryRow(time, kind, _regress_text(event)))
            changed = sorted({v.get("board") for v in event.get("verdicts", []) if v.get("firmware_changed")})
            rows += [HistoryRow(time, "firmware", f"{board}: firmware changed since its baseline") for board in changed]
        else:
            boards = [b for b in event.get("boards", []) if isinstance(b, dict)]
            online = sum(1 for b in boards if b.get("reachable"))
            rows.append(HistoryRow(time, kind, f"fleet status: {online} of {len(boards)} boards online"))
            for b in boards:
                now = _one_line(b.get("firmware"))
                before = firmware.get(b.get("name"))
                if now is not None and before is not None and now != before:
                    rows.append(HistoryRow(time, "firmware", f"{b.get('name')}: firmware {before} -> {now}"))
                if now is not None:
                    firmware[b.get("name")] = now
    return rows


def _rollout_text(event: dict) -> str:
    outcomes = [o for o in event.get("outcomes", []) if isinstance(o, dict)]
    results = count_text(o.get("result") for o in outcomes)
    versions = sorted({f"v{o.get('to_version')}" for o in outcomes})
    text = f"rollout of {event.get('model')} {', '.join(versions)} to {len(outcomes)} boards: {results}"
    return text + (f"; stopped: {event['stopped']}" if event.get("stopped") else "")


def _regress_text(event: dict) -> str:
    verdicts = [v for v in event.get("verdicts", []) if isinstance(v, dict)]
    slower = sorted({v.get("board") for v in verdicts if v.get("verdict") == "slower"})
    text = f"regress: {len(verdicts)} checks: {count_text(v.get('verdict') for v in verdicts)}"
    return text + (f"; slower: {', '.join(slower)}" if slower else "")


def count_text(values) -> str:
    """`3 ok, 1 slower`: how many of each value, by name."""
    counted: dict[str, int] = {}
    for value in values:
        counted[str(value)] = counted.get(str(value), 0) + 1
    return ", ".join(f"{n} {name}" for name, n in sorted(counted.items())) or "none"


def _one_line(text: object) -> str | None:
    """A firmware fingerprint (the output of a command, often several lines) on one line."""
    return " | ".join(line.strip() for line in str(text).splitlines() if line.strip()) if text else None
