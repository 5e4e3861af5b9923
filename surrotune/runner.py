"""The tuning loop: ask a batch, evaluate it, tell the results, until the budget is spent.

The study in the storage is the only state. A run counts what the study already holds, so running
the same command again continues it: nothing is lost and nothing measured twice. Configurations
that break a known constraint are recorded as FAIL with status ``constraint`` without reaching
the backend, and a configuration measured before is answered from the study (marked
``duplicate_of``); neither counts as an evaluation. The first Ctrl-C stops after the batch in
flight is recorded; a second one stops at once, and the trials it cut short are recorded as
``interrupted`` and measured again on resume.

With a backend that :class:`~surrotune.backends.base.Prepares` (the cuda backend compiles), the
runner asks batch k+1 and has it prepared before evaluating batch k, so the CPU cores compile
while the GPU measures; the sampler sees batch k as RUNNING (pending) trials. The look-ahead never
asks more than the budget leaves once batch k is counted, and a run that stops between the two
records the prepared batch as ``interrupted``, to be measured on resume like any cut-short trial.
"""

from __future__ import annotations

import math
import signal
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Protocol

import optuna
from optuna.study import Study
from optuna.trial import FrozenTrial, Trial, TrialState

from surrotune.backends.base import Backend, DescribesDevice, Prepares
from surrotune.backends.occupancy import DeviceLimits
from surrotune.result import ParamValue, Result, Status
from surrotune.sampling import SpaceLike, distributions
from surrotune.space import SpaceError
from surrotune.verdicts import demoted_trials

__all__ = [
    "RUNNER_ATTRS",
    "Claim",
    "Claims",
    "RunSummary",
    "Runner",
    "StudyState",
    "batches_ahead",
    "is_measurement",
    "read_study",
]

#: user attributes the runner adds beside the Result's (documented in docs/trials.md)
RUNNER_ATTRS: dict[str, str] = {
    "device_limits": "the limits of the GPU that measured this trial (name, compute capability, "
    "SMs, threads, registers and shared memory per block and per SM, blocks per SM)",
    "duplicate_of": "number of the trial that measured this configuration first; not counted",
    "interrupted": "true on a trial cut short by Ctrl-C; not counted, measured again on resume",
    "stale_worker": "the worker that stopped sending heartbeats while it held this (interrupted) "
    "trial: host, pid and device; its configuration is enqueued once more",
}

#: consecutive proposals without a new evaluation before the runner gives up on the sampler
#: (counted in proposals, not batches, so that the limit does not move with --batch-size)
MAX_IDLE_PROPOSALS = 1000


@dataclass
class StudyState:
    """What a study already holds, read from its trials."""

    evaluated: dict[str, FrozenTrial] = field(default_factory=dict)  # config key → first trial
    counts: Counter[Status] = field(default_factory=Counter)
    evaluations: int = 0
    duplicates: int = 0
    measured: int = 0  # distinct configurations evaluated (constraint proposals excluded)
    proposals: int = 0  # trials told in this run, whatever their outcome
    best: FrozenTrial | None = None
    to_redo: list[dict[str, ParamValue]] = field(default_factory=list)


def _status(trial: FrozenTrial) -> Status | None:
    raw = trial.user_attrs.get("status")
    return Status(raw) if raw is not None else None


def is_measurement(trial: FrozenTrial) -> bool:
    """Whether a stored trial is one evaluation of a configuration: finished, with a status
    other than ``constraint``, neither a ``duplicate_of`` another trial nor ``interrupted``."""
    attrs = trial.user_attrs
    status = attrs.get("status")
    return (
        trial.state.is_finished()
        and status is not None
        and status != Status.CONSTRAINT.value
        and "duplicate_of" not in attrs
        and not attrs.get("interrupted")
    )


def read_study(study: Study, space: SpaceLike) -> StudyState:
    """Summarise the finished trials of ``study``; interrupted ones not redone go in to_redo."""
    state = StudyState()
    waiting: set[str] = set()
    interrupted: dict[str, dict[str, ParamValue]] = {}
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    demoted = demoted_trials(study)  # COMPLETE trials a sanitizer finding made not ok
    for trial in study.get_trials(deepcopy=False):
        if set(trial.params) != set(space.names):
            continue
        key = space.key(trial.params)
        if trial.state == TrialState.WAITING:
            waiting.add(key)
            continue
        if trial.user_attrs.get("interrupted"):
            interrupted.setdefault(key, dict(trial.params))
            continue
        status = demoted.get(trial.number, _status(trial))
        if status is None or not trial.state.is_finished():
            continue
        if "duplicate_of" in trial.user_attrs:
            state.duplicates += 1
            continue
        state.counts[status] += 1
        if key not in state.evaluated and status.counts_as_evaluation:
            state.measured += 1
        state.evaluated.setdefault(key, trial)
        if status.counts_as_evaluation:
            state.evaluations += 1
        if status is Status.OK and trial.value is not None:
            best = state.best
            if best is None or (
                trial.value > best.value if maximize else trial.value < best.value
            ):
                state.best = trial
    state.to_redo = [
        params for key, params in interrupted.items()
        if key not in state.evaluated and key not in waiting
    ]  # fmt: skip
    return state


@dataclass(frozen=True)
class RunSummary:
    """What a run did, for the CLI's closing lines and for tests."""

    study_name: str
    direction: str
    evaluations: int
    new_evaluations: int
    counts: Mapping[Status, int]
    duplicates: int
    best: FrozenTrial | None
    interrupted: bool
    stop_reason: str
    wall_time_s: float
    simulated_time_ms: float | None

    @classmethod
    def of(
        cls,
        study: Study,
        state: StudyState,
        *,
        initial: int,
        interrupted: bool,
        stop_reason: str,
        wall_time_s: float,
        simulated_time_ms: float | None = None,
    ) -> RunSummary:
        """The summary of ``study`` as ``state`` reads it, ``initial`` evaluations before."""
        return cls(
            study_name=study.study_name,
            direction=study.direction.name.lower(),
            evaluations=state.evaluations,
            new_evaluations=state.evaluations - initial,
            counts=dict(state.counts),
            duplicates=state.duplicates,
            best=state.best,
            interrupted=interrupted,
            stop_reason=stop_reason,
            wall_time_s=wall_time_s,
            simulated_time_ms=simulated_time_ms,
        )


ProgressFactory = Callable[[int, int], Any]


class Claims(Protocol):
    """How a runner that shares its study with other workers gets its share of the budget
    (``surrotune.workers.Coordinator``): ``claim`` brings ``state`` up to date with the whole
    study and asks, for the study the runner was given, at most ``want`` trials, no more than
    the budget leaves once every trial in flight anywhere is counted."""

    def claim(self, state: StudyState, want: int, budget: int) -> Claim: ...


@dataclass(frozen=True)
class Claim:
    """``trials`` asked for this runner; ``others``: evaluations other workers stored since the
    last claim; ``exhausted``: the sampler has nothing left and no other worker has work in
    flight that could still fail and free a configuration."""

    trials: int
    others: int
    exhausted: bool


@dataclass
class _Batch:
    """Trials asked together, sorted by what each needs before it can be told."""

    asked: list[Trial]
    results: dict[int, Result] = field(default_factory=dict)  # answered without the backend
    #: index -> number of the trial that measured it first, or -1 - j for trial j of this batch
    duplicates: dict[int, int] = field(default_factory=dict)
    #: index -> key of a configuration that the batch evaluated before this one is measuring
    waiting: dict[int, str] = field(default_factory=dict)
    to_measure: list[int] = field(default_factory=list)  # indices that go to the backend
    keys: dict[str, int] = field(default_factory=dict)  # key -> index, for to_measure

    def configs(self) -> list[dict[str, ParamValue]]:
        return [dict(self.asked[i].params) for i in self.to_measure]


#: batches asked ahead of the one being measured, at least, when the backend compiles ahead.
#: Measured on the H200 (docs/BENCHMARKS.md, 300 GEMM configurations, 16 compile processes):
#: one batch of 32 ahead gave 1.9x the sequential loop, two of 16 3.8x, three of 32 4.7x: a
#: kernel that ptxas refuses compiles for up to ten times the median, and holds its batch back
#: while the batches behind it keep the pool busy.
MIN_BATCHES_AHEAD = 3


def batches_ahead(backend: Backend, batch_size: int) -> int:
    """How many batches to ask ahead for ``backend``: :data:`MIN_BATCHES_AHEAD`, or more where
    that would queue fewer than two compiles per compile process; one for a backend that does
    not say how many it runs."""
    workers = getattr(backend, "compile_workers", None)
    if not isinstance(backend, Prepares) or not workers:
        return 1
    return max(MIN_BATCHES_AHEAD, math.ceil(2 * workers / max(1, batch_size)))


#: cudaDeviceProp fields stored with every measured trial besides the occupancy calculator's
_DEVICE_FIELDS = {
    "name": "name",
    "sm_count": "multiProcessorCount",
    "max_blocks_per_sm": "maxBlocksPerMultiProcessor",
    **DeviceLimits.PROPERTY_NAMES,
}


def device_limits(properties: Mapping[str, Any]) -> dict[str, Any]:
    """The device limits a trial's resources are judged against, from the worker's hello: what
    the issue of a refused launch or an occupancy needs, kept with each trial so that trials
    measured by different GPUs of one study each say which limits applied."""
    return {key: properties[prop] for key, prop in _DEVICE_FIELDS.items() if prop in properties}


class Runner:
    """Drives one study with one backend until ``trials`` evaluations are stored.

    Args:
        study: the Optuna study (its sampler proposes configurations).
        space: the search space: parameter names and values, known constraints, keys.
        backend: turns a batch of configurations into Results.
        trials: the study's total budget of evaluations (not this invocation's).
        timeout_s: wall-clock limit for this invocation.
        batch_size: configurations asked and evaluated together.
        progress: a factory ``(total, initial) -> tqdm-like`` or None for silence.
        coordinator: set where other workers share the study: the budget is the study's, so
            each batch is claimed from it first (see :class:`Claims`).
        ask_ahead: batches asked and handed to a backend that :class:`Prepares` (compiles
            ahead) while the current one is evaluated. One keeps the compile pool busy while the
            GPU measures; more keep it busy while one slow compile holds the current batch back
            (a kernel that ptxas refuses can take ten times the median), at the price of proposals
            made with fewer results known (the sampler sees them as pending).
    """

    def __init__(
        self,
        *,
        study: Study,
        space: SpaceLike,
        backend: Backend,
        trials: int,
        timeout_s: float | None = None,
        batch_size: int = 8,
        progress: ProgressFactory | None = None,
        coordinator: Claims | None = None,
        ask_ahead: int = 1,
    ) -> None:
        self.study = study
        self.space = space
        self.backend = backend
        self.trials = trials
        self.timeout_s = timeout_s
        self.batch_size = batch_size
        self.progress = progress
        self.coordinator = coordinator
        self._distributions = distributions(space)
        self._preparer = backend if isinstance(backend, Prepares) else None
        self._device_limits: dict[str, Any] | None = None  # read at the first measurement
        self.ask_ahead = max(0, ask_ahead)
        self._ahead: deque[_Batch] = deque()  # asked and prepared while an earlier one runs
        self._started = 0.0
        self._stop_requested = False
        self._last_shown = 0.0
        self._feasible_count = self._count_feasible()

    def _count_feasible(self) -> int | None:
        """Enumerate once: the feasible keys answer each proposal's constraint check with a set
        lookup instead of evaluating every constraint again (a third of the loop's own cost)."""
        try:
            frame = self.space.enumerate()
        except SpaceError:  # too large to enumerate: check each proposal, no exhaustion check
            self._feasible_keys: set[str] | None = None
            return None
        self._feasible_keys = set(self.space.keys(frame))
        return len(frame)

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        if self._stop_requested:
            raise KeyboardInterrupt
        self._stop_requested = True

    def run(self) -> RunSummary:
        """Run until the budget, the timeout, the feasible space or a Ctrl-C ends it."""
        previous = None
        try:
            previous = signal.signal(signal.SIGINT, self._request_stop)
        except ValueError:  # not the main thread: no signal handling
            previous = None
        try:
            return self._run()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _run(self) -> RunSummary:
        start = self._started = time.monotonic()
        state = read_study(self.study, self.space)
        for params in state.to_redo:
            self.study.enqueue_trial(params, skip_if_exists=False)
        initial = state.evaluations
        bar = self.progress(self.trials, initial) if self.progress else None
        self._show(bar, state)
        idle_proposals = 0
        stop_reason = "budget"
        interrupted = False
        try:
            while True:
                if state.evaluations >= self.trials:
                    stop_reason = "budget"
                    break
                if self._stop_requested:
                    stop_reason, interrupted = "interrupted", True
                    break
                if self.timeout_s is not None and time.monotonic() - start >= self.timeout_s:
                    stop_reason = "timeout"
                    break
                if self._feasible_count is not None and state.measured >= self._feasible_count:
                    stop_reason = "exhausted"
                    break
                if idle_proposals >= MAX_IDLE_PROPOSALS:
                    stop_reason = "stalled"
                    break
                size = min(self.batch_size, self.trials - state.evaluations)
                if self.coordinator is not None:
                    claim = self.coordinator.claim(state, size, self.trials)
                    initial += claim.others  # "in this run" counts this worker's own
                    if not claim.trials and not claim.exhausted:
                        self._show(bar, state)  # the other workers' progress
                        continue  # the rest of the budget is in flight elsewhere, or spent
                    size = claim.trials
                before = state.evaluations
                proposals_before = state.proposals
                if not self._batch(size, state, bar):
                    stop_reason = "exhausted"
                    break
                proposed = state.proposals - proposals_before
                idle_proposals = idle_proposals + proposed if state.evaluations == before else 0
        except KeyboardInterrupt:
            stop_reason, interrupted = "interrupted", True
        finally:
            self._settle_ahead(state)
            if bar is not None:
                self._show(bar, state, force=True)
                bar.close()
        return RunSummary.of(
            self.study, state, initial=initial, interrupted=interrupted,
            stop_reason=stop_reason, wall_time_s=time.monotonic() - start,
            simulated_time_ms=getattr(self.backend, "simulated_time_ms", None),
        )  # fmt: skip

    def _batch(self, size: int, state: StudyState, bar: Any) -> bool:
        """Evaluate and tell one batch: the one asked ahead during the previous call, else a new
        one of ``size``. False when the sampler has nothing left."""
        batch = self._ahead.popleft() if self._ahead else None
        fresh = batch is None
        if batch is None:
            batch = self._ask(size, state, [])
        if not batch.asked:
            return False
        try:
            self._resolve_waiting(batch, state)
            if self._preparer is not None:
                if fresh and batch.to_measure:
                    self._preparer.prepare(batch.configs())
                if self.coordinator is None:  # a shared budget is claimed one batch at a time
                    while len(self._ahead) < self.ask_ahead:
                        ahead = self._ask_ahead([batch, *self._ahead], state)
                        if ahead is None:
                            break
                        self._ahead.append(ahead)
            measured = self.backend.evaluate(batch.configs())
        except BaseException:  # a second Ctrl-C or an error: redo on resume
            self._interrupt(batch.asked)
            raise
        self._finish(batch, measured, state)
        self._show(bar, state)
        return True

    def _ask(self, size: int, state: StudyState, in_flight: Sequence[_Batch]) -> _Batch:
        """Ask up to ``size`` trials and sort them.

        A configuration that breaks a constraint, or was measured before, is answered from the
        study; a repeat within the batch, or of one that an ``in_flight`` batch is measuring,
        waits for that measurement; the rest go to the backend.
        """
        batch = _Batch([])
        try:
            for _ in range(size):
                try:
                    batch.asked.append(self.study.ask(self._distributions))
                except optuna.exceptions.OptunaError:
                    break  # e.g. brute force has taken every feasible configuration
            for i, trial in enumerate(batch.asked):
                config = dict(trial.params)
                key = self.space.key(config)
                feasible = (
                    key in self._feasible_keys
                    if self._feasible_keys is not None
                    else self.space.is_feasible(config)
                )
                if not feasible:
                    broken = "; ".join(self.space.violated(config)) or "not in the search space"
                    batch.results[i] = Result(config, Status.CONSTRAINT, error=f"breaks: {broken}")
                elif key in state.evaluated:
                    first = state.evaluated[key]
                    batch.results[i] = Result.from_user_attrs(config, first.user_attrs)
                    batch.duplicates[i] = first.number
                elif key in batch.keys:
                    batch.duplicates[i] = -1 - batch.keys[key]  # resolved after measuring
                elif any(key in earlier.keys for earlier in in_flight):
                    batch.waiting[i] = key
                else:
                    batch.keys[key] = i
                    batch.to_measure.append(i)
        except BaseException:
            self._interrupt(batch.asked)
            raise
        return batch

    def _ask_ahead(self, in_flight: Sequence[_Batch], state: StudyState) -> _Batch | None:
        """Ask the next batch and have the backend prepare it, while the ``in_flight`` batches
        (the one evaluated now, then those asked ahead of it) are evaluated.

        Only as many trials as the budget and the feasible space leave once ``in_flight`` is
        counted, and none after a Ctrl-C or past the timeout.
        """
        if self._stop_requested:
            return None
        if self.timeout_s is not None and time.monotonic() - self._started >= self.timeout_s:
            return None
        measuring = sum(len(batch.to_measure) for batch in in_flight)
        room = self.trials - state.evaluations - measuring
        if self._feasible_count is not None:
            room = min(room, self._feasible_count - state.measured - measuring)
        if room <= 0:
            return None
        ahead = self._ask(min(self.batch_size, room), state, in_flight)
        if not ahead.asked:
            return None
        if ahead.to_measure and self._preparer is not None:
            try:
                self._preparer.prepare(ahead.configs())
            except BaseException:
                self._interrupt(ahead.asked)
                raise
        return ahead

    def _resolve_waiting(self, batch: _Batch, state: StudyState) -> None:
        """Answer the trials that waited on the previous batch, now that it is told."""
        for i, key in batch.waiting.items():
            first = state.evaluated.get(key)
            if first is None:  # not stored after all: measure it here
                batch.keys[key] = i
                batch.to_measure.append(i)
            else:
                config = dict(batch.asked[i].params)
                batch.results[i] = Result.from_user_attrs(config, first.user_attrs)
                batch.duplicates[i] = first.number
        batch.waiting.clear()

    def _finish(self, batch: _Batch, measured: list[Result], state: StudyState) -> None:
        """Tell every trial of ``batch``; any that an error leaves untold is marked interrupted."""
        told: set[int] = set()
        try:
            for i, result in zip(batch.to_measure, measured, strict=True):
                batch.results[i] = result
            for i, source in batch.duplicates.items():
                if source < 0:
                    batch.results[i] = batch.results[-1 - source]
                    batch.duplicates[i] = batch.asked[-1 - source].number
            for i, trial in enumerate(batch.asked):
                self._tell(trial, batch.results[i], batch.duplicates.get(i), state)
                told.add(i)
        finally:
            self._interrupt([t for i, t in enumerate(batch.asked) if i not in told])

    def _settle_ahead(self, state: StudyState) -> None:
        """At the end of a run: a batch asked ahead that needs no measurement is told (repeats
        and constraint breakers); one that does is marked interrupted, measured on resume."""
        while self._ahead:
            batch = self._ahead.popleft()
            if batch.to_measure or any(
                key not in state.evaluated for key in batch.waiting.values()
            ):
                self._interrupt(batch.asked)
                continue
            self._resolve_waiting(batch, state)
            self._finish(batch, [], state)

    def _interrupt(self, trials: list[Trial]) -> None:
        """Record trials that were asked but will not be told a result: FAIL and
        ``interrupted``, so that a resumed run measures them again."""
        for trial in trials:
            trial.set_user_attr("interrupted", True)
            self.study.tell(trial, state=TrialState.FAIL)

    def _tell(
        self, trial: Trial, result: Result, duplicate_of: int | None, state: StudyState
    ) -> None:
        for name, value in result.to_user_attrs(list(self.space.names)).items():
            if value is not None and value != "" and value != [] and value != {}:
                trial.set_user_attr(name, value)  # unknown fields are left out: one write less
        if duplicate_of is not None:
            trial.set_user_attr("duplicate_of", duplicate_of)
        elif result.status.counts_as_evaluation:
            limits = self._limits()
            if limits:
                trial.set_user_attr("device_limits", limits)
        if result.ok:
            frozen = self.study.tell(trial, result.objective)
        else:
            frozen = self.study.tell(trial, state=TrialState.FAIL)
        state.proposals += 1
        if duplicate_of is not None:
            state.duplicates += 1
            return
        state.counts[result.status] += 1
        key = self.space.key(result.config)
        if key not in state.evaluated and result.status.counts_as_evaluation:
            state.measured += 1
        state.evaluated.setdefault(key, frozen)
        if result.status.counts_as_evaluation:
            state.evaluations += 1
        if result.ok:
            maximize = self.study.direction == optuna.study.StudyDirection.MAXIMIZE
            best = state.best
            value = frozen.value
            assert value is not None and math.isfinite(value)
            if best is None or (value > best.value if maximize else value < best.value):
                state.best = frozen

    def _limits(self) -> dict[str, Any]:
        """The backend's device limits (:func:`device_limits`), read once; empty when the
        backend describes no device."""
        if self._device_limits is None:
            described = isinstance(self.backend, DescribesDevice)
            self._device_limits = device_limits(self.backend.device()) if described else {}
        return self._device_limits

    def _show(self, bar: Any, state: StudyState, *, force: bool = False) -> None:
        """Update the bar: at most a few times a second, however fast batches go."""
        if bar is None:
            return
        now = time.monotonic()
        if not force and now - self._last_shown < 0.25:
            return
        self._last_shown = now
        bar.n = min(state.evaluations, bar.total) if bar.total else state.evaluations
        best = f"best={state.best.value:.6g}" if state.best is not None else "best=-"
        fails = " ".join(f"{status.value}={n}" for status, n in sorted(state.counts.items()) if n)
        bar.set_postfix_str(f"{best} {fails}", refresh=False)
        bar.refresh()
