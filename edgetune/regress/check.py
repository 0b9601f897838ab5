"""`edgetune regress`: is each board still right and still as fast as its artifact's baseline?

For each targeted board (`--board`, `--class`, or all; `--changed-only`: those whose firmware
fingerprint differs from the baseline's; the others are asked only for it, not timed), over SSH through the board agent:
1. `agent status`: which version of each model runs, and the firmware fingerprint now;
2. `agent run` of that release on its reference input: outputs against the signed expected
   output (within the manifest's tolerance), and timing samples taken the way the build took
   the baseline (`measurement.compare` of the class profile: one call per sample, each sample
   at least `min_repeat_ms`, rounds x repeat samples);
3. the verdict, from the manifest of that version in the store (the signed baseline, never
   what the board says about itself): `wrong_output`; `load_failed` (the release does not
   verify, load or run); else the time ratio now / baseline (this board's baseline samples,
   or its class's when the board was not measured at build) with a bootstrap interval:
   `slower` when it lies above `regress.threshold`, `faster` below its inverse, else `ok`.
   `slower` is timed a second time and stands only if the second timing says so too (a board
   busy for a moment is no regression).
   A board that cannot be reached is `unreachable`; the other boards are still checked.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from edgetune.agent.run_report import RunReport
from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.timing_stats import FASTER, SLOWER, compare, summarize
from edgetune.deploy.remote import RemoteAgent
from edgetune.errors import ArtifactError, DeployError, FleetError
from edgetune.fleet.journal import record_event
from edgetune.fleet.parallel import MAX_WORKERS, for_each_board
from edgetune.fleet.ssh import BoardSession
from edgetune.inventory.schema import Board, CompareSettings, Fleet

OK, WRONG_OUTPUT, LOAD_FAILED, UNREACHABLE, NOT_DEPLOYED = (
    "ok",
    "wrong_output",
    "load_failed",
    "unreachable",
    "not_deployed",
)
REGRESSIONS = (SLOWER, WRONG_OUTPUT, LOAD_FAILED)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    board: str
    device_class: str
    model: str
    version: int | None
    verdict: str  # ok | slower | faster | wrong_output | load_failed | unreachable | not_deployed
    ratio: float | None  # latency now / baseline
    interval: tuple[float, float] | None
    median_ms: float | None
    baseline_ms: float | None
    firmware_changed: bool | None  # None: unknown (unreachable)
    detail: str = ""

    def to_json(self) -> dict:
        record = asdict(self)
        record["interval"] = list(self.interval) if self.interval else None
        return record


@dataclass(frozen=True)
class RegressReport:
    verdicts: tuple[Verdict, ...]

    @property
    def exit_code(self) -> int:
        """The code of the worst verdict (docs/cli.md): a regression (ArtifactError's) before a
        board not reached (FleetError's) before a model not deployed (DeployError's); 0 when
        every verdict is ok or faster."""
        found = {v.verdict for v in self.verdicts}
        if found & set(REGRESSIONS):
            return ArtifactError.exit_code
        if UNREACHABLE in found:
            return FleetError.exit_code
        if NOT_DEPLOYED in found:
            return DeployError.exit_code
        return 0

    def slower_classes(self) -> list[str]:
        return sorted({v.device_class for v in self.verdicts if v.verdict == SLOWER})


def select_boards(fleet: Fleet, boards: Sequence[str] = (), classes: Sequence[str] = ()) -> list[Board]:
    """The boards named, or of the classes named, or all; unknown names are errors."""
    if boards and classes:
        raise DeployError("give --board or --class, not both")
    _check_known("board", boards, [b.name for b in fleet.boards])
    _check_known("device class", classes, [c.name for c in fleet.device_classes])
    return [b for b in fleet.boards if (not boards or b.name in boards) and (not classes or b.device_class in classes)]


def regress(
    fleet: Fleet,
    boards: Sequence[str] = (),
    classes: Sequence[str] = (),
    models: Sequence[str] = (),
    changed_only: bool = False,
) -> RegressReport:
    """Check every selected board; each board's verdicts, or `unreachable` for all its models."""
    _check_known("model", models, [m.name for m in fleet.models])
    store = ArtifactStore(fleet.artifacts.dir)
    targets = select_boards(fleet, boards, classes)
    # Boards sharing this machine's cores are timed one at a time, or they slow each other down.
    workers = 1 if any(b.shares_host_cpus for b in targets) else MAX_WORKERS
    results = for_each_board(
        targets, lambda board: _check_board(fleet, store, board, models, changed_only), workers=workers
    )
    verdicts: list[Verdict] = []
    for board in targets:
        found = results.succeeded.get(board.name)
        if found is None:
            found = [
                _unreachable(board, model, results.failed[board.name])
                for model in (models or [m.name for m in fleet.models])
            ]
        verdicts += found
    for v in verdicts:
        log.info(
            f"{v.board} {v.model}: {v.verdict}"
            + (f" {v.ratio:.2f}x" if v.ratio else "")
            + (f" ({v.detail})" if v.detail else "")
        )
    record_event(fleet, "regress", verdicts=[v.to_json() for v in verdicts])
    return RegressReport(tuple(verdicts))


def _check_board(
    fleet: Fleet, store: ArtifactStore, board: Board, models: Sequence[str], changed_only: bool
) -> list[Verdict]:
    """The board's verdicts; with `changed_only`, none for a model whose firmware is unchanged
    since its baseline (that model is not timed)."""
    compare_settings = fleet.device_class(board.device_class).profile.measurement.compare
    with BoardSession(board) as session:
        agent = RemoteAgent(session, fleet)
        status = agent.status()
        verdicts = []
        for model in models or [m.name for m in fleet.models]:
            entry = status.models.get(model)
            version = None if entry is None else entry.version
            if version is None:
                verdicts.append(
                    _verdict(board, model, None, NOT_DEPLOYED, None, detail="no release of it is active: roll one out")
                )
                continue
            try:
                baseline = _baseline(store, board, model, version, status.firmware, entry.firmware)
            except (OSError, ArtifactError) as err:
                verdicts.append(
                    _verdict(
                        board, model, version, NOT_DEPLOYED, None, detail=f"v{version} is not in the store here ({err})"
                    )
                )
                continue
            if changed_only and not baseline.firmware_changed:
                continue

            def timed() -> Verdict:
                return _judge(fleet, board, model, version, baseline, _time_release(agent, model, compare_settings))

            verdict = timed()
            if verdict.verdict == SLOWER:  # a board busy for a moment is no regression: time it again
                verdict = _confirm(verdict, timed())
            verdicts.append(verdict)
    return verdicts


def _time_release(agent: RemoteAgent, model: str, compare_settings: CompareSettings) -> RunReport | str:
    """`agent run` of the active release: its outputs checked and timed as the build timed it;
    why it could not run (the library did not load, the agent died running it: e.g. SIGSEGV)."""
    try:
        return agent.run(
            model,
            "--number",
            "1",
            "--repeat",
            str(compare_settings.rounds * compare_settings.repeat),
            "--min-repeat-ms",
            str(compare_settings.min_repeat_ms),
        )
    except DeployError as err:
        return str(err)


def _confirm(first: Verdict, second: Verdict) -> Verdict:
    """`slower` stands only when a second timing says so too; the second's figures are reported."""
    if second.verdict == SLOWER:
        return replace(second, detail=f"confirmed: a first timing said {first.ratio:.2f}x")
    if second.verdict in (OK, FASTER):
        return replace(second, detail=f"a first timing said slower {first.ratio:.2f}x, a second did not")
    return second  # the second run failed outright: that is the verdict


@dataclass(frozen=True)
class _Baseline:
    """What the signed manifest of the running version says this board should do."""

    samples_ms: tuple[float, ...]  # the board's own timing at build, or its class's
    firmware_changed: bool  # since the build measured the board (or since the install)


def _baseline(
    store: ArtifactStore, board: Board, model: str, version: int, firmware_now: str, firmware_at_install: str | None
) -> _Baseline:
    manifest = store.get(model, board.device_class, version).manifest
    own = [b for b in manifest.boards if b.board == board.name]
    firmware_then = own[0].firmware if own else firmware_at_install
    samples_ms = tuple(s for b in (own or manifest.boards) for s in b.tuned.samples_ms)
    return _Baseline(samples_ms, firmware_then is not None and firmware_then != firmware_now)


def _judge(fleet: Fleet, board: Board, model: str, version: int, baseline: _Baseline, run: RunReport | str) -> Verdict:
    firmware_changed = baseline.firmware_changed
    if isinstance(run, str):
        return _verdict(board, model, version, LOAD_FAILED, firmware_changed, detail=run)
    if run.outputs_match is not True:
        return _verdict(board, model, version, WRONG_OUTPUT, firmware_changed, detail=run.detail)
    samples_ms = [s * 1e3 for s in run.samples_s if s > 0]
    if not samples_ms:
        return _verdict(
            board, model, version, LOAD_FAILED, firmware_changed, detail="the agent returned no timing samples"
        )
    comparison = compare(baseline.samples_ms, samples_ms, fleet.regress.threshold, fleet.regress.confidence)
    estimate = comparison.estimate
    verdict = comparison.verdict if comparison.verdict in (SLOWER, FASTER) else OK
    return Verdict(
        board.name,
        board.device_class,
        model,
        version,
        verdict,
        estimate.ratio,
        (estimate.low, estimate.high),
        summarize(samples_ms).median,
        summarize(baseline.samples_ms).median,
        firmware_changed,
    )


def _verdict(
    board: Board, model: str, version: int | None, verdict: str, firmware_changed: bool | None, detail: str = ""
) -> Verdict:
    return Verdict(
        board.name, board.device_class, model, version, verdict, None, None, None, None, firmware_changed, detail
    )


def _unreachable(board: Board, model: str, reason: str) -> Verdict:
    return _verdict(board, model, None, UNREACHABLE, None, detail=reason)


def _check_known(kind: str, asked: Sequence[str], known: list[str]) -> None:
    unknown = [name for name in asked if name not in known]
    if unknown:
        raise DeployError(f"unknown {kind} {', '.join(unknown)} (known: {', '.join(known)})")
