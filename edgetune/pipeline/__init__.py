"""The whole job behind `make tune-fleet`: bring the fleet up, tune, build, sign, report, and
leave the fleet down, whatever happened in between; or, when there is nothing to do, none of it.

Each stage is a library function of its own package; this package only sequences them and
collects what each stage reports, so a failure of one class or board does not hide the others.
`work.find_work` says first, on this host alone, whether any class has trials left or any
artifact would get a new version: when none, no board, simulated board, tracker or cluster is
touched, and the result carries the table of the current versions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from edgetune.artifact.release import BuildReport, build_artifacts
from edgetune.artifact_format.signing import init_keys
from edgetune.deploy.keys import ensure_decision_key
from edgetune.deploy.tls import ensure_tls
from edgetune.errors import EdgetuneError, Interrupted
from edgetune.fleet import fleet_down, fleet_up, sim_down, sim_up
from edgetune.inventory import Fleet
from edgetune.pipeline.work import Work, find_work
from edgetune.tune import TuneOptions, TuneResult, stop_requested, tune_fleet

log = logging.getLogger(__name__)


@dataclass
class PipelineResult:
    failed_boards: dict[str, str] = field(default_factory=dict)
    tuning: TuneResult | None = None
    build: BuildReport | None = None
    # set when there was nothing to do: nothing was started, `build` is the current versions' table
    nothing_to_do: Work | None = None

    @property
    def ok(self) -> bool:
        return (
            not self.failed_boards
            and (self.nothing_to_do is not None or self.tuning is not None and self.tuning.ok)
            and self.build is not None
            and self.build.ok
        )

    def problems(self) -> list[str]:
        lines = [f"board {reason}" for reason in self.failed_boards.values()]
        if self.tuning is not None:
            lines += [c.error for c in self.tuning.classes if c.error]
        if self.build is not None:
            lines += self.build.failures()
        return lines


def run_pipeline(fleet: Fleet) -> PipelineResult:
    """sim up (simulated boards only) -> fleet up -> tune -> keys -> build; then fleet down and
    sim down, always. Boards that fail to come up are reported; the others go on. First, when
    no class has trials left and no artifact's inputs changed (`find_work`): the keys only, and
    the current versions as the build's table; nothing is started or stopped."""
    work = _work(fleet)
    if work is not None and work.nothing:
        log.info(
            "== nothing to do: every class's trial budget is spent and every artifact's inputs are its "
            "latest version's; no board is started"
        )
        _ensure_keys(fleet)
        return PipelineResult(build=work.unchanged_report(), nothing_to_do=work)
    if stop_requested():
        raise Interrupted("stopped on request before anything was started")
    result = PipelineResult()
    simulated = bool(fleet.simulated_boards())
    if fleet.compute is not None:  # an unreachable Ray cluster is refused before any board is touched
        from edgetune.tune import connect_cluster  # Ray: imported only when asked for

        connect_cluster(fleet.compute)
    try:
        if simulated:
            log.info("== sim up: creating the simulated boards")
            result.failed_boards.update(sim_up(fleet).failed)
        log.info("== fleet up: tracker and rpc_servers")
        result.failed_boards.update(fleet_up(fleet).failed)
        log.info("== tune")
        result.tuning = tune_fleet(fleet, TuneOptions())
        for line in _tuning_lines(result.tuning):
            log.info(line)
        if stop_requested():
            raise Interrupted(
                "stopped on request during tuning: every measured trial is kept and nothing was "
                "built; run `make tune-fleet` again to go on from there"
            )
        _ensure_keys(fleet)
        log.info("== build: artifacts, measured on the boards, signed")
        result.build = build_artifacts(fleet)
    finally:
        log.info("== fleet down")
        fleet_down(fleet)
        if simulated:
            sim_down(fleet)
    return result


def _work(fleet: Fleet) -> Work | None:
    """What there is to do, each class and artifact a line; None (the whole job runs) when the
    models cannot even be planned: the tuning then reports why, as it always did."""
    log.info("== plan: what is left to tune and to build (this host only)")
    try:
        work = find_work(fleet)
    except (EdgetuneError, RuntimeError, ValueError, OSError) as err:  # TVM's errors are RuntimeErrors
        log.info(f"could not tell what is left to do ({err}): running the whole job")
        return None
    for line in work.lines():
        log.info(line)
    return work


def _tuning_lines(tuning: TuneResult) -> list[str]:
    return [
        f"{c.device_class}: {c.error}"
        if c.error
        else f"{c.device_class}: {c.trials_run} trials this run ({c.done_before} of {c.budget} were already "
        f"in the database), {c.tuning_time_s:.0f} s" + (f"; stopped: {c.stopped}" if c.stopped else "")
        for c in tuning.classes
    ]


def _ensure_keys(fleet: Fleet) -> None:
    """The signing key, the decision key and its certificate, the fleet CA and the server
    certificate: what is missing or due is made."""
    settings = fleet.artifacts
    if not settings.signing_key.exists():
        pair = init_keys(settings.signing_key, settings.public_key, settings.dir)
        log.info(f"made a signing key {pair.private_key} (public key {pair.public_key}, key id {pair.key_id})")
    log.info(ensure_decision_key(fleet))
    for line in ensure_tls(fleet):
        log.info(line)
