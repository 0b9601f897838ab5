"""The budget rule of a class's run as pure functions, shared by the plan and the task scheduler:
trials dealt to tasks a round at a time (every task one round before any gets a second), the
knee at which a task stops, which task gets the trials a stopped task leaves, and how long a
run takes at the trial rate measured by earlier runs.

A time budget: `tuning.time_limit_s` with no trial budget set (`time_is_the_budget`). Every task
gets one round, then each further round goes to the task whose next round is expected to gain
most (`choose_task`), until the next round would end past the limit (`round_fits`); where the
limit cannot hold a round of `trials_per_iter` for every task, the rounds are smaller
(`round_within_limit`): a few trials lift a kernel from naive loops, more refine it. Without a
limit or a trial budget, a task gets DEFAULT_ROUNDS_PER_TASK rounds. `suggest_time_limit` is the
limit `edgetune import` proposes: a round per task at the measured (or a stated) trial rate.

The kernels of models still slower than their faster runtime on the board (`ParityBars.behind`,
where the class run timed the runtimes: tune/parity.py) go first: among the tasks due the same
round of their share, and for the rounds dealt by expected gain (a time budget's after its first
rounds, a trial budget's freed ones), by expected gain among them; the others' kernels get those
rounds once they have none left to take.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from edgetune.inventory.schema import EarlyStop, TuningPolicy

# The trial bound of a run whose budget is its time: the time limit, the knee or a task's
# `max_trials_per_task` end it long before this many trials.
UNBOUNDED_TRIALS = 1_000_000


def time_is_the_budget(policy: TuningPolicy, device_class: str) -> bool:
    """Whether the class's run is budgeted by `time_limit_s` alone (no trials_per_task,
    trials_per_class or override is set): it measures until the time is spent."""
    return (
        policy.time_limit_s is not None and policy.trials_per_task is None and policy.trials_for(device_class) is None
    )


def first_rounds(done: list[int], remaining: int, per_iter: int, cap: int) -> list[int]:
    """Trials per task (in the given order) for one round each, within `cap` trials per task in
    total, while `remaining` lasts: what a time budget deals before it deals by expected gain."""
    planned = []
    for already in done:
        take = max(min(per_iter, cap - already, remaining), 0)
        planned.append(take)
        remaining -= take
    return planned


def spread_rounds(done: list[int], remaining: int, per_iter: int, cap: int) -> list[int]:
    """Trials per task (in the given order): one round each before any second, up to `cap`
    trials per task in total, until `remaining` is spent."""
    planned = [0] * len(done)
    while remaining > 0:
        progressed = False
        for i, already in enumerate(done):
            room = cap - already - planned[i]
            if room <= 0 or remaining <= 0:
                continue
            take = min(per_iter, room, remaining)
            planned[i] += take
            remaining -= take
            progressed = True
        if not progressed:
            break
    return planned


def _best(latencies: Sequence[float | None]) -> float | None:
    valid = [x for x in latencies if x is not None]
    return min(valid) if valid else None


def reached_knee(latencies: Sequence[float | None], early_stop: EarlyStop | None) -> bool:
    """True when the best of `latencies` (a task's trials in measured order, None for a failed
    one) improved by less than `min_gain` over the last `window` trials; it takes more than
    `window` trials, a valid one among those before the window, to tell."""
    if early_stop is None or len(latencies) <= early_stop.window:
        return False
    before = _best(latencies[: -early_stop.window])
    if before is None:
        return False
    return _best(latencies) > before * (1.0 - early_stop.min_gain)


def recent_gain(latencies: Sequence[float | None], window: int) -> float:
    """Seconds per call the last `window` trials took off the task's best latency (infinite
    while the task has too few trials to tell: it is given trials first)."""
    before = _best(latencies[:-window]) if len(latencies) > window else None
    now = _best(latencies)
    if before is None or now is None:
        return float("inf")
    return before - now


def expected_gain(ledger: TaskLedger, window: int) -> tuple[float, int, float]:
    """How much a further round of the task is expected to save per inference, as a sort key:
    its weight x what its last `window` trials took off its best latency. Tasks too new to
    tell come first, those with fewer rounds this run first among them, then those with the
    largest weighted latency (the largest share of the models' estimated latency)."""
    best = _best(ledger.history)
    weighted_latency = ledger.weight * best if best is not None else float("inf")
    return ledger.weight * recent_gain(ledger.history, window), -ledger.rounds, weighted_latency


@dataclass(frozen=True)
class Throughput:
    """Trials measured per second by a class's earlier runs (borrowed re-measurements included)."""

    trials: int
    seconds: float
    runs: int
    boards: int  # boards of the class during the latest run

    @property
    def seconds_per_trial(self) -> float:
        return self.seconds / self.trials


def estimate(trials: int, throughput: Throughput | None) -> str:
    """`about 12 min (0.93 s per trial measured over 410 trials in 3 runs, 2 boards)`, or why
    there is no estimate."""
    if trials == 0:
        return "nothing to run"
    if throughput is None:
        return "unknown: no run of this class has been measured yet (the first run measures it)"
    return (
        f"about {_duration(trials * throughput.seconds_per_trial)} "
        f"({throughput.seconds_per_trial:.2f} s per trial measured over {throughput.trials} trials "
        f"in {throughput.runs} run{'s' if throughput.runs > 1 else ''}, {throughput.boards} "
        f"board{'s' if throughput.boards != 1 else ''})"
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


AT_KNEE_BEFORE = "knee: its recorded trials had stopped improving before this run"
SEARCH_SPACE_END = "end of its search space: its last round found no candidate it had not measured"


@dataclass
class TaskLedger:
    """One task's account in a running class: what it may spend, what it spent, how it went."""

    workload_hash: str
    weight: float
    share: int  # trials this run gives it before it may take trials a stopped task left
    ceiling: int  # the most trials this run may give it, trials moved to it included
    history: list[float | None]  # every trial of the task in measured order, earlier runs' first
    spent: int = 0  # trials measured this run
    rounds: int = 0  # batches started this run
    stopped: str | None = None  # why the run stopped giving it trials

    def record(self, latencies: list[float | None]) -> None:
        """Count a measured round. A round with no candidate at all means the search found
        nothing it had not measured yet: the task is stopped (MetaSchedule's evolutionary search
        would retry it five times, each a full search of several seconds for nothing)."""
        self.spent += len(latencies)
        self.history.extend(latencies)
        if not latencies and self.stopped is None:
            self.stopped = SEARCH_SPACE_END


def stop_at_knee(ledger: TaskLedger, early_stop: EarlyStop | None) -> bool:
    """Stop a task measured this run that has reached its knee; True if it was stopped now."""
    if ledger.stopped or ledger.rounds == 0 or not reached_knee(ledger.history, early_stop):
        return False
    ledger.stopped = f"knee: best improved less than {early_stop.min_gain:.0%} over its last {early_stop.window} trials"
    return True


def choose_task(
    ledgers: list[TaskLedger],
    alive: list[bool],
    in_flight: dict[int, int],
    budget_left: int,
    per_iter: int,
    window: int,
    behind: Collection[str] = frozenset(),
) -> int | None:
    """The next task to measure a round of: among tasks with room left in their share, the one
    with the fewest rounds this run (so every task gets a round before any gets a second, the
    tasks a time budget's plan gave no share included), a task of a model still slower than its
    faster runtime (`behind`: workload hashes, `ParityBars.behind`) first among equals;
    once every share is spent, the next round goes to a task not measured this run yet (a time
    budget's plan deals rounds only to the tasks its rate estimate fits; a run faster than that
    gives the others theirs first), then to a task of a model still slower than its faster
    runtime, and among those to the task expected to gain most from it (`expected_gain` over its
    last `window` trials), up to its ceiling. None when there is nothing left to give."""
    open_ = [i for i, ledger in enumerate(ledgers) if alive[i] and ledger.stopped is None]

    def used(i: int) -> int:
        return ledgers[i].spent + in_flight.get(i, 0)

    growing = [i for i in open_ if used(i) < ledgers[i].ceiling]
    unstarted = [i for i in growing if ledgers[i].rounds == 0]
    with_room = [i for i in open_ if used(i) < ledgers[i].share]
    if with_room:
        first = min(with_room, key=lambda i: (ledgers[i].rounds, ledgers[i].workload_hash not in behind, i))
        # a round that recorded fewer trials than it asked for leaves room in its task's share;
        # that room waits until a task the plan gave no share has had its first round
        if ledgers[first].rounds == 0 or budget_left <= 0 or not unstarted:
            return first
        growing = unstarted
    if budget_left <= 0 or not growing:
        return None
    chosen = max(
        growing,
        key=lambda i: (
            ledgers[i].rounds == 0,
            ledgers[i].workload_hash in behind,
            *expected_gain(ledgers[i], window),
            -i,
        ),
    )
    ledgers[chosen].share = used(chosen) + min(per_iter, budget_left)
    return chosen


@dataclass(frozen=True)
class ParityBar:
    """A model measured against its faster runtime: its kernels' calls, and that runtime's time."""

    calls: Mapping[str, int]  # workload hash -> calls in the model
    seconds: float


@dataclass(frozen=True)
class ParityBars:
    """The models of a class run with a runtime time, and each kernel's latency before the run
    (its best recorded, else its untuned time)."""

    bars: tuple[ParityBar, ...] = ()
    known: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def behind(self, ledgers: Sequence[TaskLedger]) -> frozenset[str]:
        """The kernels of the models whose estimate (each kernel at its best latency so far, the
        ledgers' history included, else its untuned time) is above their faster runtime's
        time, or cannot be told (a kernel with neither)."""
        if not self.bars:
            return frozenset()
        best = dict(self.known)
        for ledger in ledgers:
            measured = _best(ledger.history)
            if measured is not None:
                best[ledger.workload_hash] = measured
        behind: set[str] = set()
        for bar in self.bars:
            if any(h not in best for h in bar.calls) or sum(n * best[h] for h, n in bar.calls.items()) > bar.seconds:
                behind.update(bar.calls)
        return frozenset(behind)


def round_fits(elapsed_s: float, limit_s: float | None, round_s: float | None, rounds_in_flight: int) -> bool:
    """Whether a round started now ends within the limit: it ends after the rounds still
    measuring, each taking the run's mean round so far (`round_s`; None before the first round
    ended: it starts while the limit is not reached). A run so stops within a round of its
    limit, and overruns it by less than its longest round (a round slower than the mean, as on
    a host busy with other work, ends past the limit by what it took beyond the mean)."""
    if limit_s is None:
        return True
    if round_s is None:
        return elapsed_s < limit_s
    return elapsed_s + (rounds_in_flight + 1) * round_s <= limit_s


# The trial rate assumed where no run of the workdir measured one: float tasks on simulated
# boards measured ~1.5 s per trial (search, builds and measurement together), integer ones more.
DEFAULT_SECONDS_PER_TRIAL = 2.0
# The smallest round a time budget deals: the evolutionary search still has a population and
# the cost model a round to learn from; a limit too short for this round per task leaves tasks
# untuned, and the plan warns.
MIN_TIME_ROUND = 4


def round_within_limit(trials_per_iter: int, tasks: int, limit_s: float, measured: Throughput | None) -> int:
    """The round a time budget deals: `trials_per_iter`, or as many trials as the limit holds
    per task at the measured (or DEFAULT_SECONDS_PER_TRIAL) rate where that is fewer, never
    under MIN_TIME_ROUND (nor above `trials_per_iter`)."""
    seconds = measured.seconds_per_trial if measured else DEFAULT_SECONDS_PER_TRIAL
    per_task = int(limit_s / seconds) // max(tasks, 1)
    return min(trials_per_iter, max(per_task, MIN_TIME_ROUND))


_SUGGESTION_MARGIN = 1.1  # a suggested limit is a tenth over the estimate (rates vary run to run),
_SUGGESTION_STEP_S = 60  # rounded up to whole minutes


@dataclass(frozen=True)
class TimeLimitSuggestion:
    """`tuning.time_limit_s` for `tasks` tasks: a round of `trials_per_iter` each at the rate."""

    tasks: int
    trials_per_iter: int
    seconds_per_trial: float
    measured: Throughput | None  # None: DEFAULT_SECONDS_PER_TRIAL

    @property
    def round_each_s(self) -> float:
        return self.tasks * self.trials_per_iter * self.seconds_per_trial

    @property
    def time_limit_s(self) -> int:
        return max(math.ceil(self.round_each_s * _SUGGESTION_MARGIN / _SUGGESTION_STEP_S), 1) * _SUGGESTION_STEP_S

    def explain(self) -> str:
        rate = (
            f"{self.seconds_per_trial:.2f} s per trial measured over {self.measured.trials} trials in this workdir"
            if self.measured
            else f"{self.seconds_per_trial:.2f} s per trial (a stated default: no run in this workdir measured one)"
        )
        return (
            f"{self.tasks} tasks x a round of {self.trials_per_iter} trials at {rate}: "
            f"about {_duration(self.round_each_s)}; with a tenth more, rounded up to whole minutes: "
            f"{_duration(self.time_limit_s)}"
        )


def suggest_time_limit(tasks: int, trials_per_iter: int, measured: Throughput | None) -> TimeLimitSuggestion:
    """The time limit that gives each of `tasks` tasks a round at the measured trial rate (the
    slowest class's, where several measured one), else at DEFAULT_SECONDS_PER_TRIAL."""
    seconds = measured.seconds_per_trial if measured else DEFAULT_SECONDS_PER_TRIAL
    return TimeLimitSuggestion(tasks, trials_per_iter, seconds, measured)
