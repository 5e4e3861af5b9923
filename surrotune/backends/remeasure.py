"""Measure the top configurations again, interleaved, and say whether the winner held.

A search reports the best of hundreds of measurements, and the best of many noisy numbers is
biased low: the winner may have been lucky (a quiet moment, a clock boost). Measuring the top K
again settles it, if done fairly: in interleaved rounds, A B C D E A B C D E ..., so that slow
drifts (temperature, clocks, other tenants) hit every configuration alike instead of whichever
happened to run during them. Each round contributes one sample per configuration (the median of
that round's timed repeats), and the verdict compares medians over rounds:

* **held**: the winner's median is still the lowest;
* **held within noise**: another configuration's median is lower, but by less than the
  tolerance: the larger of the two configurations' relative spread (interquartile range over
  median) and a floor (1 %), below which a tuner should not claim a difference;
* **did not hold**: another configuration is faster by more than that.

The comparison is on kernel time. An objective that is a rate over the same work (GFLOP/s,
GB/s) ranks configurations the same way.

Backend-agnostic: anything with :class:`Remeasures` can be used. :func:`remeasurer_for` finds
one for a backend: the backend itself when it has the method, :class:`InterleavedRemeasurer`
(real launches, round after round, through ``Backend.evaluate``; the cuda backend answers from
its compile cache) for the cuda backend, :class:`ReplayRemeasurer` (the recording's repeats,
replayed) for the replay backend, and None otherwise: the step is then skipped.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import optuna

from surrotune.backends.base import Backend
from surrotune.backends.replay import Dataset, ReplayBackend
from surrotune.result import ParamValue, Status
from surrotune.verdicts import (
    REMEASURE_ATTR,
    REMEASURED_PREFIX,
    ranked_ok_trials,
    set_trial_verdict,
)

__all__ = [
    "NOISE_FLOOR",
    "InterleavedRemeasurer",
    "RemeasureReport",
    "Remeasurement",
    "Remeasures",
    "ReplayRemeasurer",
    "Verdict",
    "judge",
    "relative_spread",
    "remeasure_top",
    "remeasurer_for",
]

#: differences smaller than this fraction never count against the winner
NOISE_FLOOR = 0.01


@dataclass(frozen=True)
class Remeasurement:
    """One configuration measured again: one time (ms) per round, or the failure that ended
    it (a configuration that failed when measured again keeps the samples it had)."""

    config: Mapping[str, ParamValue]
    times_ms: tuple[float, ...] = ()
    status: Status = Status.OK
    error: str = ""

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.times_ms) if self.times_ms else None


@runtime_checkable
class Remeasures(Protocol):
    """Measures ``configs`` again in ``rounds`` interleaved rounds; one Remeasurement each."""

    @property
    def source(self) -> str:
        """How the samples were obtained, for the report (``interleaved``, ``replayed``)."""
        ...

    def remeasure(
        self, configs: Sequence[Mapping[str, ParamValue]], rounds: int
    ) -> list[Remeasurement]: ...


class InterleavedRemeasurer:
    """Real measurements through any live backend: round r evaluates every configuration once,
    in order, before round r + 1 starts. Each evaluation verifies and times as during the search
    (warm-up, repeats); the round's sample is the median of its repeats. A configuration whose
    evaluation fails is not measured again."""

    source = "interleaved"

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def remeasure(
        self, configs: Sequence[Mapping[str, ParamValue]], rounds: int
    ) -> list[Remeasurement]:
        samples: list[list[float]] = [[] for _ in configs]
        failed: dict[int, Remeasurement] = {}
        for _ in range(rounds):
            for i, config in enumerate(configs):
                if i in failed:
                    continue
                (result,) = self.backend.evaluate([dict(config)])
                if result.ok and result.time_ms is not None:
                    samples[i].append(result.time_ms)
                else:
                    failed[i] = Remeasurement(
                        dict(config), tuple(samples[i]), result.status, result.error
                    )
        return [
            failed.get(i, Remeasurement(dict(config), tuple(samples[i])))
            for i, config in enumerate(configs)
        ]


class ReplayRemeasurer:
    """The replay backend's stand-in: a recording cannot be measured again, but it holds each
    configuration's timed repeats, and those are returned as the rounds (``rounds`` is ignored:
    the recording has as many as it has). A configuration recorded without repeats gets none."""

    source = "replayed from the recording's repeats"

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def remeasure(
        self, configs: Sequence[Mapping[str, ParamValue]], rounds: int
    ) -> list[Remeasurement]:
        answers = []
        for config in configs:
            recorded = self.dataset.lookup(config)
            if recorded is None:
                answers.append(
                    Remeasurement(dict(config), (), Status.CONSTRAINT, "not in the recording")
                )
            else:
                answers.append(
                    Remeasurement(dict(config), recorded.times_ms, recorded.status, recorded.error)
                )
        return answers


def remeasurer_for(backend: Backend) -> Remeasures | None:
    """The way to measure again with ``backend``, or None when it has none."""
    if isinstance(backend, Remeasures):
        return backend
    if isinstance(backend, ReplayBackend):
        return ReplayRemeasurer(backend.dataset)
    from surrotune.backends.cuda import CudaBackend

    if isinstance(backend, CudaBackend):
        return InterleavedRemeasurer(backend)
    return None


# --------------------------------------------------------------------------- the verdict


class Verdict(enum.StrEnum):
    HELD = "held"
    WITHIN_NOISE = "held within noise"
    LOST = "did not hold"


def relative_spread(times: Sequence[float]) -> float:
    """Interquartile range over median: robust to the odd slow round, 0 for fewer than 2."""
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    median = statistics.median(times)
    return (q3 - q1) / median if median > 0 else 0.0


def judge(
    samples: Sequence[Sequence[float]], *, noise_floor: float = NOISE_FLOOR
) -> tuple[Verdict, int, float, float]:
    """Did entry 0 (the winner) hold against the others? Entries without samples take no part.

    Returns (verdict, index of the fastest median, how much faster it is than the winner as a
    fraction of its own median, the tolerance that difference was held to).
    """
    if not samples or not samples[0]:
        raise ValueError("the winner has no samples")
    medians = {i: statistics.median(times) for i, times in enumerate(samples) if times}
    fastest = min(medians, key=lambda i: (medians[i], i))
    if fastest == 0:
        return Verdict.HELD, 0, 0.0, 0.0
    difference = (medians[0] - medians[fastest]) / medians[fastest]
    tolerance = max(noise_floor, relative_spread(samples[0]), relative_spread(samples[fastest]))
    verdict = Verdict.WITHIN_NOISE if difference <= tolerance else Verdict.LOST
    return verdict, fastest, difference, tolerance


@dataclass(frozen=True)
class RemeasureReport:
    """The re-measurement of the top trials (``trials[0]`` is the winner) and its verdict.

    ``verdict`` is None when the winner could not be measured again (``failure`` says why).
    """

    trials: tuple[int, ...]
    measurements: tuple[Remeasurement, ...]
    values: tuple[float, ...]  # the objective each trial had in the search
    source: str
    rounds: int
    verdict: Verdict | None
    fastest: int | None = None  # trial number
    difference: float = 0.0
    tolerance: float = 0.0
    failure: str = ""

    def to_attrs(self) -> dict[str, Any]:
        return {
            "trials": list(self.trials),
            "rounds": self.rounds,
            "source": self.source,
            "verdict": self.verdict.value if self.verdict is not None else None,
            "fastest": self.fastest,
            "difference": self.difference,
            "tolerance": self.tolerance,
            "failure": self.failure,
        }

    def lines(self) -> list[str]:
        """What the end-of-run summary prints."""
        lines = [
            f"Re-measured the top {len(self.trials)} configurations "
            f"({self.source}, {self.rounds} rounds; median ms, spread):"
        ]
        for rank, (number, m, value) in enumerate(
            zip(self.trials, self.measurements, self.values, strict=True)
        ):
            mark = "  <- winner" if rank == 0 else ""
            if m.median_ms is not None and m.status is Status.OK:
                lines.append(
                    f"  trial {number}: {m.median_ms:.6g} ms, spread "
                    f"{100 * relative_spread(m.times_ms):.1f} % (search: {value:.6g}){mark}"
                )
            else:
                lines.append(
                    f"  trial {number}: {m.status.value} when measured again: "
                    f"{_first_line(m.error)}{mark}"
                )
        if self.verdict is None:
            lines.append(f"The winner could not be checked: {self.failure}")
        elif self.verdict is Verdict.HELD:
            lines.append("The winner held: it is still the fastest.")
        elif self.verdict is Verdict.WITHIN_NOISE:
            lines.append(
                f"The winner held within noise: trial {self.fastest} is "
                f"{100 * self.difference:.1f} % faster, within the {100 * self.tolerance:.1f} % "
                "tolerance."
            )
        else:
            lines.append(
                f"The winner did not hold: trial {self.fastest} is {100 * self.difference:.1f} % "
                f"faster, beyond the {100 * self.tolerance:.1f} % tolerance."
            )
        return lines


def _first_line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0][:200] if stripped else "(no message)"


def remeasure_top(
    study: optuna.Study,
    remeasurer: Remeasures,
    *,
    top: int = 5,
    rounds: int = 10,
    noise_floor: float = NOISE_FLOOR,
    log: Callable[[str], None] | None = None,
) -> RemeasureReport | None:
    """Measure the study's ``top`` best ``ok`` trials again and judge the winner.

    None when fewer than two trials qualify (nothing to compare). The samples are stored as the
    study attributes ``remeasured_ms.<trial>`` and the report as ``remeasure``
    (:mod:`surrotune.verdicts`).
    """
    if top < 2 or rounds < 1:
        raise ValueError(f"need top >= 2 and rounds >= 1, got top={top}, rounds={rounds}")
    trials = ranked_ok_trials(study)[:top]
    if len(trials) < 2:
        return None
    if log is not None:
        log(f"surrotune: measuring the top {len(trials)} configurations again ({rounds} rounds)")
    measured = remeasurer.remeasure([dict(t.params) for t in trials], rounds)
    for trial, m in zip(trials, measured, strict=True):
        if m.times_ms:
            set_trial_verdict(study, REMEASURED_PREFIX, trial.number, list(m.times_ms))
    usable = [list(m.times_ms) if m.status is Status.OK else [] for m in measured]
    numbers = tuple(t.number for t in trials)
    verdict: Verdict | None = None
    fastest: int | None = None
    difference = tolerance = 0.0
    failure = ""
    if usable[0]:
        verdict, index, difference, tolerance = judge(usable, noise_floor=noise_floor)
        fastest = numbers[index]
    else:
        winner = measured[0]
        failure = (
            f"{winner.status.value}: {_first_line(winner.error)}"
            if winner.status is not Status.OK
            else "no samples"
        )
    report = RemeasureReport(
        trials=numbers,
        measurements=tuple(measured),
        values=tuple(float(t.value or 0.0) for t in trials),
        source=remeasurer.source,
        rounds=max((len(m.times_ms) for m in measured), default=0),
        verdict=verdict,
        fastest=fastest,
        difference=difference,
        tolerance=tolerance,
        failure=failure,
    )
    study.set_user_attr(REMEASURE_ATTR, report.to_attrs())
    return report
