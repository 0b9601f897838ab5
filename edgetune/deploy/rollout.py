"""`edgetune rollout`: roll one model's artifact over the fleet in stages, over SSH, and record
only what the boards say they run.

Plan (pure, `plan_rollout`): the targeted boards (a class, or all, narrowed by a `--select`
selector), each with the version it must run (`--version`, else what the server offers it: its
pin or the newest), in stages: every targeted class's own canary stage (its first `--canary`
boards), then batches of the rest (`--batch`: a count, or a percentage of each class's other
boards); `--parallel` (else fleet.yaml's `deploy.parallel`, else a width sized to the targets) boards are driven at once.

Execution (`rollout`); docs/rollout.md says what it guarantees:
- the server must answer before any board is touched;
- a board whose SSH connection cannot be made at its turn (no route, refused, timed out) is
  `pending`: untouched, neither failed nor installed, not counted against the threshold unless
  `count_pending`; a canary that is pending is replaced by the next board of its class; a pending
  board keeps the version assigned to it, which its pull timer installs when it is back;
- each board is assigned the version (`state/assigned.json`, what `GET
  /v1/boards/<board>/assigned` answers a board's pull) at its turn: once its earlier version is
  journalled, just before its install, or when it is found pending; after the stage, a failed or
  lost board gets its earlier assignment back, and a rollout that stops gives it back to every
  board it reached;
- each stage's boards are provisioned, their state read (`agent status`), and run `agent
  install` in parallel, with a deadline shorter than `--timeout-s` and the SSH channel watched:
  the agent switches only after the reference check passed, never after its deadline nor once
  the channel is gone;
- a target below a board's highest installed version is passed `--allow-downgrade` (and
  logged) only when an operator chose it (an inventory pin or `--version`): a deliberate
  downgrade; otherwise the agent refuses it;
- an install whose answer is lost (SSH error, timeout) is `unknown` until the board is read
  back over a fresh session (retried briefly): then `installed` if it switched, `failed` if it
  did not; one that cannot be read stays `unknown`;
- after a stage, if a canary failed or was lost, or failed and lost boards exceed
  `max_failed_pct` of the targets, the rollout stops and every board it switched is rolled
  back (`agent rollback --to <its previous version>`); a rollback that fails is
  `rollback_failed`; boards not reached are `skipped`;
- a model with hooks (fleet.yaml `on_switch`, `health`) has them run by each board's agent after
  its switch, within the agent's deadline: a board whose on_switch or health check fails (or
  outlives that deadline) is switched back by its agent and is `failed`, the command's output
  in its error and every hook run in its outcome's `hooks`;
- at the end every targeted board but the pending ones is read back, and that is what the fleet state records
  (`deployed.json`, shown by `fleet status`) and each outcome's `runs` says;
- all along, the intent journal (`rollout_journal`) says which boards a stage is about to change
  and each board's previous version, and each board's answer or read-back is recorded (in the
  journal and `deployed.json`) as it comes, so a host killed at any point leaves `unknown` where
  a change was under way; the next rollout of the model (or `fleet status`,
  `read_back_interrupted`) reads back every board an interrupted one touched, and a rollout
  that stops rolls back the boards the interrupted one switched too.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, replace

from edgetune.agent.install import ChangeRecord
from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.codec import to_json
from edgetune.deploy.offer import offer
from edgetune.deploy.remote import RemoteAgent
from edgetune.deploy.rollout_journal import RolloutJournal, RolloutUnderWay, journalled_models
from edgetune.deploy.tls import host_client_context
from edgetune.deploy.tokens import ensure_token
from edgetune.errors import DeployError, EdgetuneError, InventoryError
from edgetune.fleet.errors import SshConnectRefused, SshTimeout, SshUnreachable
from edgetune.fleet.journal import record_event
from edgetune.fleet.parallel import MAX_WORKERS, for_each_board
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.state import UNKNOWN, load_assigned, load_deployed, record_assigned, record_deployed
from edgetune.inventory.schema import DEFAULT_PARALLEL, MAX_PARALLEL, Board, Fleet
from edgetune.inventory.selectors import Selector, select_boards

DEFAULT_TIMEOUT_S = 300.0
AGENT_MARGIN_S = 30.0  # the agent's deadline ends this long before the rollout's timeout (at most a quarter of it)
READ_BACK_ATTEMPTS = 3
READ_BACK_PAUSE_S = 2.0
LOST = ("failed", "unknown")  # the outcomes that count against a stage
PENDING = "pending"  # not reachable at its turn: untouched
NOT_REACHED = (SshUnreachable, SshTimeout, SshConnectRefused)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchSize:
    """`--batch`: a count of boards per batch after the canaries (0: one batch), or a percentage
    of each class's non-canary boards (its batch size ceil(percent * n / 100), at least 1)."""

    count: int = 0
    percent: float | None = None

    def size_of(self, boards: int) -> int:
        """Boards per batch out of `boards`."""
        if self.percent is None:
            return self.count or boards or 1
        return max(1, math.ceil(self.percent * boards / 100))

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else str(self.count)


BatchSpec = int | str | BatchSize


def parse_batch(value: BatchSpec) -> BatchSize:
    """`--batch N` (boards, 0: one batch) or `--batch P%` (0 < P <= 100)."""
    if isinstance(value, BatchSize):
        return value
    text = str(value).strip()
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            percent = math.nan
        if not (0 < percent <= 100):  # NaN too
            raise DeployError(
                f"--batch {text}: a percentage must be above 0% and at most 100% (of each class's boards "
                "after its canaries), e.g. --batch 10%"
            )
        return BatchSize(percent=percent)
    try:
        count = int(text)
    except ValueError:
        raise DeployError(
            f"--batch {text}: must be a number of boards (0: one batch) or a percentage, e.g. --batch 10%"
        ) from None
    if count < 0:
        raise DeployError(f"--batch {text}: must be zero (one batch) or more boards, or a percentage, e.g. --batch 10%")
    return BatchSize(count=count)


@dataclass(frozen=True)
class Target:
    board: Board
    version: int
    chosen_by: str | None  # "the inventory's pin" or "--version": the operator's choice, which may be a downgrade


@dataclass(frozen=True)
class Stage:
    name: str  # "canary <class>" or "batch <n>"
    targets: tuple[Target, ...]
    canary: bool


@dataclass(frozen=True)
class RolloutPlan:
    model: str
    stages: tuple[Stage, ...]  # each targeted class's canary stage (if any), then the batches
    canary: int  # boards per class in its canary stage
    max_failed_pct: float
    timeout_s: float
    parallel: int = DEFAULT_PARALLEL  # boards driven at once
    count_pending: bool = False  # pending boards count against the canaries and max_failed_pct

    @property
    def targets(self) -> tuple[Target, ...]:
        return tuple(t for stage in self.stages for t in stage.targets)

    @property
    def agent_deadline_s(self) -> float:
        """The agent gives up (before its switch) while the rollout still waits for its answer."""
        return self.timeout_s - min(AGENT_MARGIN_S, self.timeout_s / 4)

    def to_json(self) -> dict:
        stages = [
            {"name": s.name, "boards": [{"board": t.board.name, "version": t.version} for t in s.targets]}
            for s in self.stages
        ]
        return {
            "model": self.model,
            "canary": self.canary,
            "max_failed_pct": self.max_failed_pct,
            "timeout_s": self.timeout_s,
            "agent_deadline_s": self.agent_deadline_s,
            "parallel": self.parallel,
            "count_pending": self.count_pending,
            "stages": stages,
        }


@dataclass(frozen=True)
class BoardOutcome:
    board: str
    device_class: str
    model: str
    from_version: int | None
    to_version: int
    result: str  # installed | unchanged | pending | failed | unknown | rolled_back | rollback_failed | skipped
    error: str | None = None
    downgrade: bool = False  # to_version is below the newest the board had installed, by an operator's choice
    runs: int | str | None = None  # what the board runs, read back at the end (None: no release; UNKNOWN)
    hooks: tuple[dict, ...] | None = None  # the model's hooks the agent ran (its `HookRun`s as JSON); None: none

    @property
    def runs_target(self) -> bool:
        return self.result in ("installed", "unchanged")


@dataclass(frozen=True)
class RolloutResult:
    plan: RolloutPlan
    outcomes: tuple[BoardOutcome, ...]
    stopped: str | None  # why the rollout stopped early, None if it went through

    @property
    def ok(self) -> bool:
        """It went through, and every board runs the target but those not reachable (pending)."""
        return self.stopped is None and all(o.runs_target or o.result == PENDING for o in self.outcomes)

    @property
    def pending(self) -> tuple[str, ...]:
        return tuple(o.board for o in self.outcomes if o.result == PENDING)

    def records(self) -> list[dict]:
        """One JSON record per board: board, class, model, from_version, to_version, result, error,
        downgrade, runs, and `hooks` where the agent ran any."""
        return [
            {("class" if k == "device_class" else k): v for k, v in vars(o).items() if not (k == "hooks" and v is None)}
            for o in self.outcomes
        ]


def plan_rollout(
    fleet: Fleet,
    model: str,
    classes: Sequence[str] = (),
    version: int | None = None,
    canary: int = 1,
    batch: BatchSpec = 0,
    max_failed_pct: float = 0.0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    select: Selector | None = None,
    parallel: int | None = None,
    count_pending: bool = False,
) -> RolloutPlan:
    """Which boards get which version, in which stages (nothing is contacted). `select`: only
    the boards it matches (among `classes`' when given); `parallel`: boards driven at once
    (None: fleet.yaml's `deploy.parallel`, else sized to the targets); `count_pending`: unreachable boards count as failed."""
    batch = parse_batch(batch)
    _check_settings(fleet, model, classes, canary, batch.count, max_failed_pct, timeout_s)
    boards = [b for b in fleet.boards if not classes or b.device_class in classes]
    if select is not None:
        chosen = {b.name for b in select_boards(fleet.boards, select)}
        boards = [b for b in boards if b.name in chosen]
        if not boards:
            raise InventoryError(f"--select {select.text} matches no board of class {', '.join(classes)}")
    store = ArtifactStore(fleet.artifacts.dir)
    targets = [_target(fleet, store, b, model, version) for b in boards]
    parallel = _parallel(fleet, parallel, len(targets))
    return RolloutPlan(
        model, _stages(targets, canary, batch), canary, max_failed_pct, timeout_s, parallel, count_pending
    )


def rollout(fleet: Fleet, plan: RolloutPlan) -> RolloutResult:
    """Carry out `plan`; stop and roll back at the threshold (see the module docstring). The
    outcomes are the targets', then those of boards outside the plan that an interrupted
    rollout of the model switched and this one rolled back."""
    check_server(fleet)
    _warn_of_a_long_health_check(fleet, plan)
    public_key = fleet.artifacts.public_key.read_bytes()
    with RolloutJournal.held(fleet, plan.model) as journal:
        _read_back_interrupted(fleet, journal, plan.parallel)
        before, assigned_before = load_deployed(fleet), load_assigned(fleet)
        outcomes: dict[str, BoardOutcome] = {}
        stopped = None
        for stage in plan.stages:
            stage = replace(stage, targets=tuple(t for t in stage.targets if t.board.name not in outcomes))
            while stage is not None and stage.targets:  # a canary stage, then its replacements for pending canaries
                outcomes.update(_run_stage(fleet, plan, stage, public_key, before, journal))
                _unassign(
                    fleet, plan, [t for t in stage.targets if _counted(plan, outcomes[t.board.name])], assigned_before
                )
                stopped = _stop_reason(plan, stage, list(outcomes.values()))
                stage = None if stopped else _replacement_canaries(plan, stage, outcomes)
            if stopped:
                log.info(f"stopping: {stopped}; rolling back the boards this rollout (or an interrupted one) switched")
                _unassign(fleet, plan, [t for t in plan.targets if t.board.name in outcomes], assigned_before)
                outcomes.update(_roll_back(fleet, plan, outcomes, journal))
                break
        for target in plan.targets:
            if target.board.name not in outcomes:
                outcomes[target.board.name] = _untouched(
                    plan, target, before, "skipped", "the rollout stopped before this board"
                )
        targeted = [t.board.name for t in plan.targets]
        others = [
            name
            for name, entry in journal.boards.items()
            if entry.touched and name not in targeted and _has_board(fleet, name)
        ]
        runs = _record_what_boards_run(fleet, plan, outcomes, others)
        listed = [*targeted, *(name for name in others if name in outcomes)]
        result = RolloutResult(
            plan, tuple(replace(outcomes[name], runs=runs.get(name, outcomes[name].runs)) for name in listed), stopped
        )
        record_event(fleet, "rollout", model=plan.model, stopped=stopped, outcomes=result.records())
        journal.close()
    return result


def read_back_interrupted(fleet: Fleet) -> None:
    """For `fleet status`: the boards every interrupted rollout touched, read back and recorded
    (its journal kept for the next rollout of the model), and what to run, logged."""
    for model in journalled_models(fleet):
        try:
            with RolloutJournal.held(fleet, model) as journal:
                if journal.interrupted is None:
                    continue  # it ended meanwhile
                _read_back_interrupted(fleet, journal)
                switched = [
                    f"{name} (back to {_named(entry.previous)})"
                    for name, entry in sorted(journal.boards.items())
                    if entry.switched
                ]
                rolls_back = f"; if it stops, it rolls back {', '.join(switched)}" if switched else ""
                log.warning(
                    f"run `edgetune rollout -f {fleet.path} --model {model}` (with the options it had) to finish it: it reads "
                    f"these boards back first{rolls_back}"
                )
        except RolloutUnderWay as err:
            log.warning(str(err))


def check_server(fleet: Fleet) -> None:
    """The artifact server must answer before any board is touched."""
    url = f"{fleet.deploy.url}/v1/health"
    try:
        with urllib.request.urlopen(url, timeout=5, context=host_client_context(fleet)) as response:
            if json.loads(response.read()).get("ok") is True:
                return
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise DeployError(
            f"the artifact server does not answer at {url} ({err}): start it with `edgetune serve -f {fleet.path}`"
        ) from None
    raise DeployError(f"{url} is not an edgetune artifact server")


def read_back(fleet: Fleet, board: Board, model: str) -> int | str | None:
    """The version of `model` that `board` runs (None: no release active), read with its agent's
    `status` over a fresh SSH session, retried briefly; UNKNOWN if it cannot be read."""
    for attempt in range(READ_BACK_ATTEMPTS):
        if attempt:
            time.sleep(READ_BACK_PAUSE_S)
        try:
            with BoardSession(board) as session:
                entry = RemoteAgent(session, fleet).status().models.get(model)
                return None if entry is None else entry.version
        except EdgetuneError as err:
            log.debug("%s: reading back what it runs: %s", board.name, err)
    return UNKNOWN


def _target(fleet: Fleet, store: ArtifactStore, board: Board, model: str, version: int | None) -> Target:
    choice = offer(fleet, store, board, model, version)
    chosen_by = "--version" if version is not None else "the inventory's pin" if choice.pinned else None
    return Target(board, choice.version, chosen_by)


def _stages(targets: list[Target], canary: int, batch: BatchSpec) -> tuple[Stage, ...]:
    """Each class's first `canary` boards alone, class after class; then the others in batches:
    of `batch.count` boards (0: one batch), or, by percentage, batch n holds the n-th share of
    every class's other boards (ceil(percent * its boards / 100) of them, at least 1)."""
    batch = parse_batch(batch)
    classes = dict.fromkeys(t.board.device_class for t in targets)
    canaries = (
        [
            Stage(f"canary {c}", tuple([t for t in targets if t.board.device_class == c][:canary]), canary=True)
            for c in classes
        ]
        if canary
        else []
    )
    picked = {t.board.name for stage in canaries for t in stage.targets}
    rest = [t for t in targets if t.board.name not in picked]
    if batch.percent is None:
        size = batch.size_of(len(rest))
        chunks = [rest[i : i + size] for i in range(0, len(rest), size)]
    else:
        shares = []  # per class: its other boards in batches of its own size
        for c in classes:
            of_class = [t for t in rest if t.board.device_class == c]
            size = batch.size_of(len(of_class))
            shares.append([of_class[i : i + size] for i in range(0, len(of_class), size)])
        chunks = [
            [t for share in shares if n < len(share) for t in share[n]] for n in range(max(map(len, shares), default=0))
        ]
    batches = [Stage(f"batch {n}", tuple(chunk), canary=False) for n, chunk in enumerate(chunks, 1)]
    return (*canaries, *batches)


def _parallel(fleet: Fleet, parallel: int | None, targets: int) -> int:
    """Boards driven at once: `--parallel`, else fleet.yaml's `deploy.parallel`, else sized to the targets."""
    if parallel is None:
        return fleet.deploy.parallel_for(targets)
    if isinstance(parallel, bool) or not isinstance(parallel, int) or not 1 <= parallel <= MAX_PARALLEL:
        raise DeployError(f"--parallel must be a number of boards between 1 and {MAX_PARALLEL}, got {parallel}")
    return parallel


def _read_back_interrupted(fleet: Fleet, journal: RolloutJournal, workers: int = MAX_WORKERS) -> None:
    """The boards the interrupted rollout whose journal `journal` took over touched, read back:
    what each runs is recorded (one that cannot be read stays as recorded: `unknown` if its
    change was under way)."""
    record = journal.interrupted
    if record is None:
        return
    touched = {name: entry for name, entry in record.boards.items() if entry.touched}
    log.warning(
        f"a rollout of {journal.model} (pid {record.pid}, started {record.started}) was interrupted; reading back the "
        f"{len(touched)} board(s) it touched: {', '.join(sorted(touched)) or 'none'}"
    )
    boards = [b for b in fleet.boards if b.name in touched]
    for name in sorted(set(touched) - {b.name for b in boards}):
        log.warning(f"  {name}: no longer in {fleet.path}: not read back")
    results = for_each_board(boards, lambda board: read_back(fleet, board, journal.model), workers)
    for board in boards:
        runs = results.succeeded.get(board.name, UNKNOWN)
        if runs != UNKNOWN:
            journal.read_back(board.name, runs)
        entry = journal.boards[board.name]
        found = "could not be read back" if runs == UNKNOWN else f"runs {_named(runs)}"
        log.warning(
            f"  {board.name}: {found} (before the rollout: {_named(entry.previous)}; its target: v{entry.target})"
        )


def _warn_of_a_long_health_check(fleet: Fleet, plan: RolloutPlan) -> None:
    model = next((m for m in fleet.models if m.name == plan.model), None)
    if model is not None and model.health is not None and model.health.timeout_s >= plan.agent_deadline_s:
        log.warning(
            f"{plan.model}'s health check may take {model.health.timeout_s:g} s, not less than the agent's deadline "
            f"({plan.agent_deadline_s:g} s, from --timeout-s {plan.timeout_s:g}): a board whose check runs that "
            "long is switched back; give --timeout-s more room"
        )


def _has_board(fleet: Fleet, name: str) -> bool:
    return any(b.name == name for b in fleet.boards)


def _run_stage(
    fleet: Fleet, plan: RolloutPlan, stage: Stage, public_key: bytes, before, journal: RolloutJournal
) -> dict[str, BoardOutcome]:
    """Install on the stage's boards in parallel; a board no install reached is `failed`
    (`pending` if it could not be reached)."""
    log.info(f"{stage.name}: {', '.join(t.board.name for t in stage.targets)}")
    journal.plan_stage(stage.name, {t.board.name: t.version for t in stage.targets})
    targets = {t.board.name: t for t in stage.targets}
    results = for_each_board(
        [t.board for t in stage.targets],
        lambda board: _install(fleet, plan, targets[board.name], public_key, journal, before),
        plan.parallel,
    )
    outcomes = {}
    for name, target in targets.items():
        outcomes[name] = results.succeeded.get(name) or _untouched(plan, target, before, "failed", results.failed[name])
        log.info(_line(outcomes[name]))
    return outcomes


def _install(
    fleet: Fleet, plan: RolloutPlan, target: Target, public_key: bytes, journal: RolloutJournal, before
) -> BoardOutcome:
    """Provision the board, read its state, journal the change, then `agent install` under the
    agent's deadline; its answer (or, lost, a read-back) is recorded at once. A board that
    cannot be connected to is `pending`; an error after that but before the install leaves the
    board untouched (raised: `failed`). `from_version` is what it ran before the rollout (an
    interrupted rollout of the model may have switched it since)."""
    board = target.board
    with BoardSession(board) as session:
        try:
            session.connect()
        except NOT_REACHED as err:
            record_assigned(fleet, board.name, plan.model, target.version)
            return _untouched(
                plan,
                target,
                before,
                PENDING,
                f"not reachable at its turn ({_first_line(str(err))}); "
                f"untouched: it pulls v{target.version} when it is back, or the next rollout installs it",
            )
        agent = RemoteAgent(session, fleet)
        agent.provision(ensure_token(fleet, board), public_key)
        entry = agent.status().models.get(plan.model)
        highest = entry.highest_installed if entry is not None else 0
        running = None if entry is None else entry.version
        previous = journal.changing(board.name, running)
        record_assigned(fleet, board.name, plan.model, target.version)  # its pull may install it from now on
        outcome = BoardOutcome(
            board.name,
            board.device_class,
            plan.model,
            previous,
            target.version,
            "unknown",
            downgrade=target.chosen_by is not None and target.version < highest,
        )
        if outcome.downgrade:
            log.warning(
                "%s: v%d of %s is below v%d, the newest it has installed: a deliberate downgrade (%s)",
                board.name,
                target.version,
                plan.model,
                highest,
                target.chosen_by,
            )
        allow = ["--allow-downgrade"] if outcome.downgrade else []
        try:
            record = agent.change(
                "install",
                "--model",
                plan.model,
                "--version",
                str(target.version),
                *allow,
                *_guarded(plan),
                timeout_s=plan.timeout_s,
            )
        except EdgetuneError as err:
            lost = str(err)
        else:
            result = record.result if record.result in ("installed", "unchanged") else "failed"
            runs = record.to_version if result != "failed" else record.from_version
            journal.read_back(board.name, runs)
            note = f"switched from {_named(previous)} by an interrupted rollout" if previous != running else None
            return replace(
                outcome, result=result, error=record.error or note, runs=runs, hooks=_hook_runs(outcome, record)
            )
    return _after_lost_answer(
        fleet, journal, board, outcome, lost, aimed_at=outcome.to_version, reached="installed", missed="failed"
    )


def _roll_back(
    fleet: Fleet, plan: RolloutPlan, outcomes: dict[str, BoardOutcome], journal: RolloutJournal
) -> dict[str, BoardOutcome]:
    """Every board this rollout, or an interrupted one of the model, switched (read back running
    another version than before the rollout) goes back to the version it had; outcomes as data."""
    entries = journal.boards
    boards = [b for b in fleet.boards if b.name in entries and entries[b.name].switched]
    switched = {b.name: outcomes.get(b.name) or _switched_earlier(plan, b, entries[b.name]) for b in boards}
    results = for_each_board(
        boards, lambda board: _roll_back_board(fleet, plan, board, switched[board.name], journal), plan.parallel
    )
    rolled = dict(results.succeeded)
    rolled.update(
        {
            name: replace(switched[name], result="rollback_failed", error=reason)
            for name, reason in results.failed.items()
        }
    )
    for outcome in rolled.values():
        log.info(_line(outcome))
    return rolled


def _switched_earlier(plan: RolloutPlan, board: Board, entry) -> BoardOutcome:
    """The outcome of a board outside this rollout's installs that an interrupted one switched."""
    return BoardOutcome(
        board.name,
        board.device_class,
        plan.model,
        entry.previous,
        entry.target,
        "installed",
        f"switched from {_named(entry.previous)} by an interrupted rollout",
        runs=entry.runs,
    )


def _roll_back_board(
    fleet: Fleet, plan: RolloutPlan, board: Board, outcome: BoardOutcome, journal: RolloutJournal
) -> BoardOutcome:
    to = "none" if outcome.from_version is None else str(outcome.from_version)
    journal.changing(board.name, outcome.runs if isinstance(outcome.runs, int) else None)
    try:
        with BoardSession(board) as session:
            record = RemoteAgent(session, fleet).change(
                "rollback", "--model", plan.model, "--to", to, *_guarded(plan), timeout_s=plan.timeout_s
            )
    except EdgetuneError as err:
        return _after_lost_answer(
            fleet,
            journal,
            board,
            outcome,
            str(err),
            aimed_at=outcome.from_version,
            reached="rolled_back",
            missed="rollback_failed",
        )
    hooks = _hook_runs(outcome, record)
    if record.result in ("rolled_back", "deactivated", "unchanged"):
        journal.read_back(board.name, outcome.from_version)
        error = f"rolled back to {_named(outcome.from_version)}" + (f"; {record.error}" if record.error else "")
        return replace(outcome, result="rolled_back", error=error, runs=outcome.from_version, hooks=hooks)
    journal.read_back(board.name, record.from_version)
    error = f"rolling back to {_named(outcome.from_version)} failed: {record.error}; {_way_back(fleet, plan, board, outcome)}"
    return replace(outcome, result="rollback_failed", error=error, runs=record.from_version, hooks=hooks)


def _hook_runs(outcome: BoardOutcome, record: ChangeRecord) -> tuple[dict, ...] | None:
    """The hooks `outcome` records so far, and those the agent ran for `record`."""
    runs = (*(outcome.hooks or ()), *to_json(record.hooks or ()))
    return runs or None


def _way_back(fleet: Fleet, plan: RolloutPlan, board: Board, outcome: BoardOutcome) -> str:
    if outcome.from_version is None:
        return f"to deactivate it, run the agent's `rollback --model {plan.model} --to none` on {board.name}"
    return (
        f"to install v{outcome.from_version} again, run `edgetune rollout -f {fleet.path} --model {plan.model} "
        f"--class {board.device_class} --version {outcome.from_version}`"
    )


def _after_lost_answer(
    fleet: Fleet,
    journal: RolloutJournal,
    board: Board,
    outcome: BoardOutcome,
    reason: str,
    aimed_at: int | None,
    reached: str,
    missed: str,
) -> BoardOutcome:
    """A change whose answer was lost is `unknown` until the board is read back: then `reached`
    if it runs `aimed_at`, else `missed`; still `unknown` if it cannot be read. Recorded at once."""
    reason = _first_line(reason)
    log.info(f"  {board.name}: unknown ({reason}); reading back what it runs")
    running = read_back(fleet, board, outcome.model)
    journal.read_back(board.name, running)
    if running == UNKNOWN:
        result, found = "unknown", "it could not be read back: see `edgetune fleet status` once it answers"
    else:
        result, found = (reached if running == aimed_at else missed), f"read back: it runs {_named(running)}"
    log.info(f"  {board.name}: {found}")
    return replace(outcome, result=result, error=f"its answer was lost ({reason}); {found}", runs=running)


def _record_what_boards_run(
    fleet: Fleet, plan: RolloutPlan, outcomes: dict[str, BoardOutcome], others: Sequence[str] = ()
) -> dict[str, int | str | None]:
    """Read every targeted board but the pending ones, and the `others` (touched by an
    interrupted rollout), back and record that in the fleet state (UNKNOWN if unreadable)."""
    reached = [t.board for t in plan.targets if outcomes[t.board.name].result != PENDING]
    boards = reached + [b for b in fleet.boards if b.name in others]
    results = for_each_board(boards, lambda board: read_back(fleet, board, plan.model), plan.parallel)
    runs = {board.name: results.succeeded.get(board.name, UNKNOWN) for board in boards}
    for name, version in runs.items():
        record_deployed(fleet, name, plan.model, version)
    return runs


def _guarded(plan: RolloutPlan) -> list[str]:
    """The agent stops before its switch at its deadline, or when this rollout's channel is gone."""
    return ["--deadline-s", f"{plan.agent_deadline_s:g}", "--abort-on-hangup"]


def _replacement_canaries(plan: RolloutPlan, stage: Stage, outcomes: dict[str, BoardOutcome]) -> Stage | None:
    """For a canary stage's pending boards, as many boards of its class that nothing ran yet."""
    pending = [t.board.name for t in stage.targets if outcomes[t.board.name].result == PENDING]
    if not stage.canary or not pending or plan.count_pending:
        return None
    device_class = stage.targets[0].board.device_class
    spare = [t for t in plan.targets if t.board.device_class == device_class and t.board.name not in outcomes]
    if not spare:
        return None
    return Stage(
        f"canary {device_class} (for {', '.join(pending)}, pending)", tuple(spare[: len(pending)]), canary=True
    )


def _unassign(fleet: Fleet, plan: RolloutPlan, targets: Sequence[Target], assigned_before: dict) -> None:
    """`targets` get back the assignment they had before the rollout (a failed or lost board's
    pull must not try the version again; a stopped rollout's boards keep what they had)."""
    for target in targets:
        record_assigned(
            fleet, target.board.name, plan.model, assigned_before.get(target.board.name, {}).get(plan.model)
        )


def _counted(plan: RolloutPlan, outcome: BoardOutcome) -> bool:
    """Whether `outcome` counts against the canaries and `max_failed_pct`."""
    return outcome.result in LOST or (plan.count_pending and outcome.result == PENDING)


def _stop_reason(plan: RolloutPlan, stage: Stage, outcomes: list[BoardOutcome]) -> str | None:
    bad = [o for o in outcomes if _counted(plan, o)]
    if not bad:
        return None
    if stage.canary:
        unreachable = " or not reachable" if plan.count_pending else ""
        return f"{len(bad)} of {len(stage.targets)} board(s) of the {stage.name} stage failed or were lost{unreachable}"
    allowed = math.floor(len(plan.targets) * plan.max_failed_pct / 100)
    if len(bad) > allowed:
        return f"{len(bad)} board(s) failed or were lost, more than --max-failed {plan.max_failed_pct:g}% of {len(plan.targets)} allows ({allowed})"
    return None


def _untouched(plan: RolloutPlan, target: Target, before, result: str, error: str) -> BoardOutcome:
    """The outcome of a board no install reached (as last recorded, it ran `from_version`)."""
    current = before.get(target.board.name, {}).get(plan.model)
    from_version = current if isinstance(current, int) else None
    return BoardOutcome(
        target.board.name, target.board.device_class, plan.model, from_version, target.version, result, error
    )


def _line(outcome: BoardOutcome) -> str:
    return f"  {outcome.board}: {outcome.result}" + (f" ({outcome.error})" if outcome.error else "")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no answer"


def _named(version: int | str | None) -> str:
    return "no release" if version is None else f"v{version}" if isinstance(version, int) else str(version)


def _check_settings(fleet, model, classes, canary, batch, max_failed_pct, timeout_s) -> None:
    if fleet.deploy is None:
        raise DeployError(f"{fleet.path} has no 'deploy' section (bind, url): add one to roll out artifacts")
    known = [c.name for c in fleet.device_classes]
    unknown = [c for c in classes if c not in known]
    if unknown:
        raise DeployError(f"unknown device class {', '.join(unknown)} (known: {', '.join(known)})")
    if canary < 0 or batch < 0:
        raise DeployError("--canary and --batch must be zero or more")
    if not 0 <= max_failed_pct <= 100 or not math.isfinite(max_failed_pct):
        raise DeployError(f"--max-failed must be a percentage between 0 and 100, got {max_failed_pct}")
    if not timeout_s > 0 or not math.isfinite(timeout_s):
        raise DeployError(f"--timeout-s must be a positive number of seconds, got {timeout_s}")
