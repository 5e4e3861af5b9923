"""The tuning loop: ask a batch, evaluate it, tell the results, until the budget is spent.

The study in the storage is the only state. A run counts what the study already holds, so running
the same command again continues it: nothing is lost and nothing measured twice. Configurations
that break a known constraint are recorded as FAIL with status ``constraint`` without reaching
the backend, and a configuration measured before is answered from the study (marked
``duplicate_of``); neither counts as an evaluation. The first Ctrl-C stops after the batch in
flight is recorded; a second one stops at once, and the trials it cut short are recorded as
``interrupted`` and measured again on resume.
"""

from __future__ import annotations

import math
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import optuna
from optuna.study import Study
from optuna.trial import FrozenTrial, Trial, TrialState

from surrotune.backends.base import Backend
from surrotune.result import ParamValue, Result, Status
from surrotune.sampling import SpaceLike, distributions
from surrotune.space import SpaceError

__all__ = ["RUNNER_ATTRS", "RunSummary", "Runner", "StudyState", "is_measurement", "read_study"]

#: user attributes the runner adds beside the Result's (documented in docs/trials.md)
RUNNER_ATTRS: dict[str, str] = {
    "duplicate_of": "number of the trial that measured this configuration first; not counted",
    "interrupted": "true on a trial cut short by Ctrl-C; not counted, measured again on resume",
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
        status = _status(trial)
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


ProgressFactory = Callable[[int, int], Any]


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
    ) -> None:
        self.study = study
        self.space = space
        self.backend = backend
        self.trials = trials
        self.timeout_s = timeout_s
        self.batch_size = batch_size
        self.progress = progress
        self._distributions = distributions(space)
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
        start = time.monotonic()
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
            if bar is not None:
                self._show(bar, state, force=True)
                bar.close()
        return RunSummary(
            study_name=self.study.study_name,
            direction=self.study.direction.name.lower(),
            evaluations=state.evaluations,
            new_evaluations=state.evaluations - initial,
            counts=dict(state.counts),
            duplicates=state.duplicates,
            best=state.best,
            interrupted=interrupted,
            stop_reason=stop_reason,
            wall_time_s=time.monotonic() - start,
            simulated_time_ms=getattr(self.backend, "simulated_time_ms", None),
        )

    def _batch(self, size: int, state: StudyState, bar: Any) -> bool:
        """Ask, evaluate and tell one batch. False when the sampler has nothing left."""
        asked: list[Trial] = []
        told: set[int] = set()
        try:
            for _ in range(size):
                try:
                    asked.append(self.study.ask(self._distributions))
                except optuna.exceptions.OptunaError:
                    break  # e.g. brute force has taken every feasible configuration
            if not asked:
                return False
            results: dict[int, Result] = {}
            duplicates: dict[int, int] = {}
            to_measure: list[int] = []
            batch_keys: dict[str, int] = {}
            for i, trial in enumerate(asked):
                config = dict(trial.params)
                key = self.space.key(config)
                feasible = (
                    key in self._feasible_keys
                    if self._feasible_keys is not None
                    else self.space.is_feasible(config)
                )
                if not feasible:
                    broken = "; ".join(self.space.violated(config)) or "not in the search space"
                    results[i] = Result(config, Status.CONSTRAINT, error=f"breaks: {broken}")
                elif key in state.evaluated:
                    first = state.evaluated[key]
                    results[i] = Result.from_user_attrs(config, first.user_attrs)
                    duplicates[i] = first.number
                elif key in batch_keys:
                    duplicates[i] = -1 - batch_keys[key]  # resolved after measuring
                else:
                    batch_keys[key] = i
                    to_measure.append(i)
            measured = self.backend.evaluate([dict(asked[i].params) for i in to_measure])
            for i, result in zip(to_measure, measured, strict=True):
                results[i] = result
            for i, source in duplicates.items():
                if source < 0:
                    results[i] = results[-1 - source]
                    duplicates[i] = asked[-1 - source].number
            for i, trial in enumerate(asked):
                self._tell(trial, results[i], duplicates.get(i), state)
                told.add(i)
            self._show(bar, state)
            return True
        finally:
            for i, trial in enumerate(asked):
                if i not in told:  # cut short by a second Ctrl-C or an error: redo on resume
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
