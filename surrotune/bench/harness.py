"""``surrotune bench``: replay recorded datasets through every sampler, many seeds, side by side.

Optuna samplers (``random``, ``tpe``, ``gp``, ``surrogate``, ``brute-force``: whatever
:func:`surrotune.sampling.make_sampler` knows) run through the very loop a user runs: an
:class:`~surrotune.runner.Runner` on a :class:`~surrotune.backends.replay.ReplayBackend`, here with
an in-memory Optuna storage. So the benchmark measures what a user gets, rules included: a failure
costs one evaluation; a configuration outside the known constraints, or one measured before, costs
none. The evaluation sequence is read back from the study's trials in order, leaving out the
trials marked ``constraint``, ``duplicate_of`` or ``interrupted``.

Kernel Tuner's strategies (``kt:<strategy>``) run in Kernel Tuner's own simulation mode on the same
files (:mod:`surrotune.bench.kernel_tuner`).

The known constraints of a dataset are its own (a surrotune recording carries them), else the
expressions of ``spaces/<benchmark>.json`` beside the benchmark's folder (the layout of the shared
Kernel Tuner caches: ``convolution_milo/A100.json.gz`` and ``spaces/convolution_milo.json``), else
the recorded set itself.

Runs go to a :class:`concurrent.futures.ProcessPoolExecutor`, one (sampler, dataset, seed) per
task. Each run has a wall-clock limit: past it the runner stops at the next batch (and a hard
alarm ends a single proposal that crawls, as Optuna's GP can on these spaces); the run is kept
with what it evaluated and marked as not finished.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.util
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import optuna
import pandas as pd
import threadpoolctl
from optuna.trial import FrozenTrial

from surrotune.backends.replay import Dataset, ReplayBackend, load_dataset, load_restrictions
from surrotune.bench import metrics
from surrotune.errors import SurrotuneError
from surrotune.runner import Runner, is_measurement
from surrotune.sampling import SpaceLike, make_sampler
from surrotune.space import RecordedSpace, SearchSpace
from surrotune.surrogate.counter_model import COUNTER_TARGETS
from surrotune.surrogate.geometry import launch_shape_of_recording

__all__ = [
    "ABLATIONS",
    "VARIANTS",
    "BenchDataset",
    "BenchError",
    "BenchResult",
    "RunRecord",
    "RunSpec",
    "SamplerSpec",
    "evaluation_sequence",
    "parse_options",
    "parse_samplers",
    "prepare_dataset",
    "record_runs",
    "resumed_runs",
    "run_bench",
    "run_one",
]

#: what ``--ablate`` can switch off in the surrogate sampler; each becomes a variant
#: ``surrogate-no-<part>`` that is built as ``make_sampler("surrogate", space, seed=...,
#: ablate=("<part>",))``. The surrogate sampler's ``make_sampler`` branch is the one place that
#: has to accept ``ablate``; until it does, the variant is skipped with a note.
ABLATIONS = ("classifier", "diversity", "features")

#: the prefix that names a Kernel Tuner strategy among the samplers
_KT_PREFIX = "kt:"

#: named variants of a sampler, usable in ``--samplers`` like a sampler's name: label ->
#: (sampler name, options). The option ``attrs`` sets attributes of the built sampler, for
#: constructor options that ``make_sampler`` does not pass on.
VARIANTS: dict[str, tuple[str, tuple[tuple[str, Any], ...]]] = {
    # issue 6: predicted Nsight Compute counters as features (docs/BENCHMARKS.md) ...
    "surrogate-counters": ("surrogate", (("attrs", (("counter_features", True),)),)),
    # ... and with every counter target, the throughputs included (measured worse)
    "surrogate-counters-all": (
        "surrogate",
        (("attrs", (("counter_features", True), ("counter_targets", tuple(COUNTER_TARGETS)))),),
    ),
    # launch-geometry features, on recordings whose experiment file is at hand (measured:
    # docs/BENCHMARKS.md, "Launch geometry")
    "surrogate-geometry": ("surrogate", (("attrs", (("launch_features", True),)),)),
}


class BenchError(SurrotuneError, ValueError):
    """A benchmark that cannot start: unknown sampler, unreadable dataset, bad budget."""


class _HardTimeout(BaseException):
    """Raised by the alarm when one run overruns its wall-clock limit.

    A BaseException, so that no ``except Exception`` inside a sampler swallows it.
    """


# ---------------------------------------------------------------------------- datasets


@dataclass(frozen=True)
class BenchDataset:
    """What the report needs of a dataset: its name, direction and feasible values."""

    name: str
    path: str
    direction: metrics.Direction
    optimum: float
    feasible: tuple[float | None, ...]
    constraints_from: str

    @property
    def failures(self) -> int:
        return sum(v is None for v in self.feasible)


def dataset_name(path: Path) -> str:
    """``convolution_milo/A100`` for ``.../convolution_milo/A100.json.gz``."""
    stem = path.name.removesuffix(".gz").removesuffix(".json")
    return f"{path.parent.name}/{stem}" if path.parent.name else stem


def _spaces_file(path: Path) -> Path:
    return path.parent.parent / "spaces" / f"{path.parent.name}.json"


def prepare_dataset(path: str | Path) -> tuple[Dataset, SearchSpace, list[str], BenchDataset]:
    """The dataset, its search space, the restriction expressions and the report's summary.

    The restriction expressions are the ones Kernel Tuner should use: the dataset's own
    constraints or ``spaces/<benchmark>.json``; empty when only the recorded set is known.
    """
    path = Path(path)
    dataset = load_dataset(path)
    constraints = list(dataset.constraints)
    source = "the recording"
    spaces = _spaces_file(path.resolve())
    if not constraints and spaces.is_file():
        constraints = load_restrictions(spaces)
        source = f"{spaces.parent.name}/{spaces.name}"
    space: SearchSpace
    if constraints:
        sizes = dict(dataset.problem_size) if isinstance(dataset.problem_size, Mapping) else {}
        space = SearchSpace(
            {name: tuple(values) for name, values in dataset.parameters.items()},
            constraints,
            sizes,
        )
    else:
        space = RecordedSpace(dataset)
        source = "the recorded set (no constraints known)"
    results = [r for r in dataset.results.values() if r.status.counts_as_evaluation]
    frame = pd.DataFrame(
        [[r.config.get(name) for name in space.names] for r in results], columns=list(space.names)
    )
    inside = space.feasible_mask(frame) if len(frame) else []
    feasible = tuple(
        r.objective if r.ok else None for r, ok in zip(results, inside, strict=True) if ok
    )
    if not any(v is not None for v in feasible):
        raise BenchError(f"{path}: no feasible configuration ran successfully; nothing to find")
    summary = BenchDataset(
        name=dataset_name(path),
        path=str(path),
        direction=dataset.direction,  # type: ignore[arg-type]
        optimum=metrics.optimum_of(feasible, dataset.direction),  # type: ignore[arg-type]
        feasible=feasible,
        constraints_from=source,
    )
    return dataset, space, constraints, summary


# ---------------------------------------------------------------------------- samplers


@dataclass(frozen=True)
class SamplerSpec:
    """One column of the comparison: a sampler name, the options it is built with, a label."""

    name: str
    label: str
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def is_kernel_tuner(self) -> bool:
        return self.name.startswith(_KT_PREFIX)


def parse_options(text: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """``label:name=value,name=value`` as the label and its ``(name, value)`` pairs, each value
    a Python literal. Options split at the commas outside brackets and quotes, so that a value
    may be a dict or a tuple (``feasibility_params={'a': 1, 'b': 2}``). The benchmark scripts
    that compare options of a sampler or a model take their ``--variant`` this way."""
    label, _, options = text.partition(":")
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(options):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(options[start:i])
            start = i + 1
    parts.append(options[start:])
    pairs = []
    for part in filter(None, parts):
        name, _, value = part.partition("=")
        pairs.append((name.strip(), ast.literal_eval(value.strip())))
    return label, tuple(pairs)


def parse_samplers(text: str | Sequence[str], ablate: Sequence[str] = ()) -> list[SamplerSpec]:
    """``"surrogate,tpe,kt:genetic_algorithm"`` as specs; ablations add surrogate variants.

    ``kt:all`` stands for the Kernel Tuner strategies of ``KT_STRATEGIES``.
    """
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text)]
    names = [n for n in names if n]
    if "kt:all" in names:  # Kernel Tuner's strategies the issue compares against
        at = names.index("kt:all")
        names[at : at + 1] = [_KT_PREFIX + strategy for strategy in _kt_defaults()]
    if not names:
        raise BenchError("--samplers: give at least one sampler, e.g. random,tpe")
    unknown = [a for a in ablate if a not in ABLATIONS]
    if unknown:
        raise BenchError(f"--ablate: unknown {unknown}; expected some of {', '.join(ABLATIONS)}")
    specs = []
    for name in dict.fromkeys(names):
        base, options = VARIANTS.get(name, (name, ()))
        specs.append(SamplerSpec(base, name, options))
    for part in ablate:
        specs.append(SamplerSpec("surrogate", f"surrogate-no-{part}", (("ablate", (part,)),)))
    return specs


def _kt_defaults() -> tuple[str, ...]:
    from surrotune.bench.kernel_tuner import KT_STRATEGIES

    return KT_STRATEGIES


def _check_samplers(
    specs: Sequence[SamplerSpec], space: SpaceLike
) -> tuple[list[SamplerSpec], list[str]]:
    """The specs that can run here, and a note for each one that cannot (a missing extra)."""
    from surrotune import sampling
    from surrotune.bench import kernel_tuner as kt

    runnable: list[SamplerSpec] = []
    notes: list[str] = []
    kt_names: tuple[str, ...] | None = None
    for spec in specs:
        if spec.is_kernel_tuner:
            strategy = spec.name.removeprefix(_KT_PREFIX)
            if not kt.available():
                notes.append(
                    f"{spec.label}: skipped, Kernel Tuner is not installed "
                    "(pip install kernel_tuner, or the 'bench' extra)"
                )
                continue
            kt_names = kt_names or kt.kernel_tuner_strategies()
            if strategy not in kt_names:
                raise BenchError(
                    f"--samplers: Kernel Tuner has no strategy {strategy!r}; "
                    f"it has {', '.join(kt_names)}"
                )
            runnable.append(spec)
            continue
        known = (*getattr(sampling, "SAMPLER_NAMES", ()), "surrogate")
        if spec.name not in known:
            raise BenchError(
                f"--samplers: unknown sampler {spec.name!r}; expected one of "
                f"{', '.join(dict.fromkeys(known))} or kt:<Kernel Tuner strategy>"
            )
        if spec.name == "gp" and importlib.util.find_spec("torch") is None:
            notes.append("gp: skipped, Optuna's GPSampler needs PyTorch (pip install torch)")
            continue
        try:
            _make(spec, space, seed=0)
        except (ValueError, TypeError) as exc:
            notes.append(f"{spec.label}: skipped, it cannot be built here: {exc}")
            continue
        runnable.append(spec)
    return runnable, notes


def _make(spec: SamplerSpec, space: SpaceLike, *, seed: int) -> optuna.samplers.BaseSampler:
    """The ablation hook: options reach ``make_sampler`` as keyword arguments (except
    ``enqueue``, which :func:`_run_optuna` applies to the study)."""
    options = {k: v for k, v in spec.options if k not in ("enqueue", "attrs")}
    attrs = dict(dict(spec.options).get("attrs", ()))
    if not options:
        sampler = make_sampler(spec.name, space, seed=seed)
    else:
        try:
            sampler = make_sampler(spec.name, space, seed=seed, **options)  # type: ignore[call-arg]
        except TypeError as exc:
            raise TypeError(
                f"make_sampler({spec.name!r}) does not take the options {sorted(options)} yet "
                f"({exc}); the ablation hook needs it to accept them"
            ) from None
    for name, value in attrs.items():
        if not hasattr(sampler, name):
            raise TypeError(f"{spec.label}: the {spec.name} sampler has no option {name!r}")
        setattr(sampler, name, value)
    return sampler


def with_launch_shape(
    sampler: optuna.samplers.BaseSampler, dataset: Dataset
) -> optuna.samplers.BaseSampler:
    """The sampler, reading the recording's launch geometry where it learns from it (the
    surrogate sampler, on a recording whose experiment file is at hand), as a user's run of
    the same experiment would."""
    if getattr(sampler, "launch_features", False):
        sampler.launch_shape = launch_shape_of_recording(dataset)
    return sampler


# ---------------------------------------------------------------------------- one run


@dataclass(frozen=True)
class RunSpec:
    """One task for a worker: everything it needs, picklable."""

    dataset_path: str
    sampler: SamplerSpec
    seed: int
    budget: int
    time_limit_s: float
    batch_size: int = 1


@dataclass(frozen=True)
class RunRecord:
    """One run's outcome, as written to ``runs.jsonl`` (one JSON object per line)."""

    dataset: str
    sampler: str
    seed: int
    budget: int
    values: list[float | None]
    statuses: list[str]
    finished: bool
    stop_reason: str
    wall_s: float
    proposals: int = 0
    note: str = ""

    @property
    def evaluations(self) -> int:
        return len(self.values)

    def to_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "evaluations": self.evaluations})

    @classmethod
    def from_json(cls, line: str) -> RunRecord:
        data = json.loads(line)
        data.pop("evaluations", None)
        return cls(**data)


def evaluation_sequence(trials: Sequence[FrozenTrial]) -> tuple[list[float | None], list[str]]:
    """Values (None for a failure) and statuses of the evaluations, in trial order.

    Left out: trials the runner did not finish, those that broke a known constraint, repeats of a
    measured configuration (``duplicate_of``) and trials cut short (``interrupted``).
    """
    values: list[float | None] = []
    statuses: list[str] = []
    for trial in sorted(trials, key=lambda t: t.number):
        if not is_measurement(trial):
            continue
        status = trial.user_attrs["status"]
        values.append(trial.value if status == "ok" else None)
        statuses.append(str(status))
    return values, statuses


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise :class:`_HardTimeout` after ``seconds`` of wall time (main thread only)."""

    def ring(signum: int, frame: FrameType | None) -> None:
        raise _HardTimeout

    try:
        previous = signal.signal(signal.SIGALRM, ring)
    except ValueError:  # not the main thread: no hard limit, the soft one still applies
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _quiet_optuna() -> None:
    """A worker process prints progress lines only, not Optuna's per-trial logging."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def _hard_limit(soft: float) -> float:
    return soft * 1.1 + 5.0


def run_one(spec: RunSpec) -> RunRecord:
    """Run one (sampler, dataset, seed) and return its evaluations; never raises for a run."""
    start = time.monotonic()
    _quiet_optuna()
    dataset, space, restrictions, summary = prepare_dataset(spec.dataset_path)
    base = RunRecord(
        dataset=summary.name, sampler=spec.sampler.label, seed=spec.seed, budget=spec.budget,
        values=[], statuses=[], finished=False, stop_reason="", wall_s=0.0,
    )  # fmt: skip
    try:
        if spec.sampler.is_kernel_tuner:
            record = _run_kernel_tuner(spec, dataset, space, restrictions, base)
        else:
            record = _run_optuna(spec, dataset, space, base)
    except Exception as exc:  # one broken run must not take the benchmark with it
        record = dataclasses.replace(
            base, stop_reason="error", note=f"{type(exc).__name__}: {exc}"
        )
    return dataclasses.replace(record, wall_s=time.monotonic() - start)


def _run_optuna(spec: RunSpec, dataset: Dataset, space: SpaceLike, base: RunRecord) -> RunRecord:
    study = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(),
        sampler=with_launch_shape(_make(spec.sampler, space, seed=spec.seed), dataset),
        direction=dataset.direction,
        study_name=f"bench-{base.dataset}-{base.sampler}-{spec.seed}",
    )
    for config in _enqueued(spec.sampler):  # a baseline that starts from known configurations
        study.enqueue_trial(config)
    runner = Runner(
        study=study, space=space, backend=ReplayBackend(dataset), trials=spec.budget,
        timeout_s=spec.time_limit_s, batch_size=spec.batch_size,
    )  # fmt: skip
    try:
        with _alarm(_hard_limit(spec.time_limit_s)):
            stop = runner.run().stop_reason
    except _HardTimeout:
        stop = "timeout"
    trials = study.get_trials(deepcopy=False)
    values, statuses = evaluation_sequence(trials)
    values, statuses = values[: spec.budget], statuses[: spec.budget]
    note = ""
    if stop == "timeout":
        note = f"did not finish: {len(values)} of {spec.budget} evaluations in "
        note += f"{spec.time_limit_s:g} s"
    elif stop not in ("budget", "exhausted"):
        note = f"stopped early ({stop}) after {len(values)} evaluations"
    return dataclasses.replace(
        base, values=values, statuses=statuses, finished=stop in ("budget", "exhausted"),
        stop_reason=stop, proposals=len(trials), note=note,
    )  # fmt: skip


def _enqueued(sampler: SamplerSpec) -> list[dict[str, Any]]:
    """The configurations the ``enqueue`` option names: ``(bundle path, k)``, the best ``k``
    measured configurations of a model bundle (the warm-start benchmark's simple baseline)."""
    option = dict(sampler.options).get("enqueue")
    if not option:
        return []
    from surrotune.surrogate.bundle import load_bundle

    path, k = option
    return [dict(entry["config"]) for entry in load_bundle(path).top[: int(k)]]


def _run_kernel_tuner(
    spec: RunSpec,
    dataset: Dataset,
    space: SpaceLike,
    restrictions: Sequence[str],
    base: RunRecord,
) -> RunRecord:
    from surrotune.bench import kernel_tuner as kt

    strategy = spec.sampler.name.removeprefix(_KT_PREFIX)
    # the soft limit cannot reach inside Kernel Tuner: only the alarm applies
    with tempfile.TemporaryDirectory(prefix="surrotune-bench-") as workdir:
        try:
            with _alarm(spec.time_limit_s):
                values, statuses, stop = kt.run_strategy(
                    dataset, strategy, budget=spec.budget, seed=spec.seed, workdir=Path(workdir),
                    is_feasible=space.is_feasible, restrictions=restrictions,
                    options=dict(spec.sampler.options),
                )  # fmt: skip
        except _HardTimeout:
            note = f"did not finish in {spec.time_limit_s:g} s (Kernel Tuner's partial results "
            return dataclasses.replace(
                base, stop_reason="timeout", note=note + "are not recoverable)"
            )
    note = "" if stop == "budget" else f"the strategy ended by itself after {len(values)}"
    return dataclasses.replace(
        base, values=values, statuses=statuses, stop_reason=stop, proposals=len(values),
        finished=True,  # a strategy that stops by itself has finished: that is its result
        note=note + (" evaluations" if note else ""),
    )  # fmt: skip


# ---------------------------------------------------------------------------- the benchmark


@dataclass
class BenchResult:
    """Everything a report needs."""

    datasets: list[BenchDataset]
    samplers: list[str]
    records: list[RunRecord]
    budget: int
    seeds: list[int]
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False
    markdown: str = ""


def run_bench(
    datasets: Sequence[str | Path],
    samplers: str | Sequence[str] | Sequence[SamplerSpec],
    budget: int,
    seeds: int | Sequence[int],
    out_dir: str | Path,
    *,
    jobs: int | None = None,
    time_limit_s: float = 600.0,
    batch_size: int = 1,
    ablate: Sequence[str] = (),
    command: str | None = None,
    log: Callable[[str], None] | None = None,
    plots: bool = True,
    resume: bool = False,
    seed_spec: Callable[[SamplerSpec, int], SamplerSpec] | None = None,
) -> BenchResult:
    """Run every (dataset, sampler, seed), write ``runs.jsonl``, ``bench.md`` and the plots.

    Args:
        datasets: recordings (Kernel Tuner caches, T4 files, surrotune recordings).
        samplers: ``"random,tpe,kt:genetic_algorithm"``, a list of names, or SamplerSpecs.
        budget: evaluations per run.
        seeds: how many (seeds 0..n-1) or which seeds.
        out_dir: where the report goes (created).
        jobs: worker processes (default: the CPU count); 1 runs in this process.
        time_limit_s: wall-clock limit of one run.
        batch_size: configurations the runner asks and evaluates together; 1 (the default) lets
            every sampler see every result before its next proposal, as Kernel Tuner's do.
        ablate: surrogate parts to switch off, each as an extra sampler (see ABLATIONS).
        command: the command line, quoted in the report.
        log: where progress lines go (default: stderr).
        plots: write the convergence plots (needs matplotlib).
        resume: keep the records of ``out_dir/runs.jsonl`` that match a task (sampler label,
            dataset, seed, budget) and run only the rest: a long benchmark survives an
            interruption, and a changed sampler is re-run without re-running its peers.
        seed_spec: the sampler a seed runs under a spec's label, where it differs by seed (a
            warm start from the bundle of source run ``seed mod N``); by default the spec.
    """
    from surrotune.bench import report

    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    if budget < 1:
        raise BenchError(f"--budget must be at least 1, got {budget}")
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seed_list:
        raise BenchError("--seeds must be at least 1")
    if not datasets:
        raise BenchError("--datasets: give at least one recording")
    for path in datasets:
        if not Path(path).is_file():
            raise BenchError(f"--datasets: file not found: {path}")
    start = time.monotonic()
    prepared = [prepare_dataset(path) for path in datasets]
    summaries = [p[3] for p in prepared]
    names = [s.name for s in summaries]
    if len(set(names)) != len(names):
        raise BenchError(f"--datasets: two datasets have the same name: {names}")
    if samplers and isinstance(next(iter(samplers)), SamplerSpec):
        specs = list(samplers)  # type: ignore[arg-type]
    else:
        specs = parse_samplers(samplers, ablate)  # type: ignore[arg-type]
    runnable, notes = _check_samplers(specs, prepared[0][1])
    for note in notes:
        say(f"surrotune bench: {note}")
    tasks = [
        RunSpec(
            str(Path(path)),
            seed_spec(spec, seed) if seed_spec else spec,
            seed,
            budget,
            time_limit_s,
            batch_size,
        )
        for spec in runnable
        for path in datasets
        for seed in seed_list
    ]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records, todo = resumed_runs(out, tasks, resume)
    if records:
        say(f"surrotune bench: resuming: {len(records)} runs kept, {len(todo)} to run")
    interrupted = record_runs(
        out, records, todo, jobs or os.cpu_count() or 1, say,
        lambda record: _progress_line(len(records), len(tasks), record, summaries),
    )  # fmt: skip
    order = {(t.sampler.label, _name_of(t), t.seed): i for i, t in enumerate(tasks)}
    records.sort(key=lambda r: order.get((r.sampler, r.dataset, r.seed), len(order)))
    result = BenchResult(
        datasets=summaries,
        samplers=[s.label for s in runnable],
        records=records,
        budget=budget,
        seeds=seed_list,
        notes=notes,
        wall_s=time.monotonic() - start,
        settings={
            "jobs": jobs or os.cpu_count() or 1,
            "time_limit_s": time_limit_s,
            "batch_size": batch_size,
            "command": command,
        },
        interrupted=interrupted,
    )
    result.markdown = report.write_report(result, out, plots=plots)
    return result


def _name_of(task: RunSpec) -> str:
    return dataset_name(Path(task.dataset_path))


def _resumable(path: Path, tasks: Sequence[RunSpec]) -> list[RunRecord]:
    """The records of an earlier ``runs.jsonl`` that answer one of ``tasks`` exactly (runs that
    errored are run again); nothing when the file does not exist."""
    if not path.is_file():
        return []
    wanted = {(t.sampler.label, _name_of(t), t.seed, t.budget) for t in tasks}
    kept: dict[tuple[str, str, int], RunRecord] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = RunRecord.from_json(line)
        except (ValueError, TypeError) as exc:
            raise BenchError(f"{path}: line {number}: not a run record ({exc})") from None
        key = (record.sampler, record.dataset, record.seed, record.budget)
        if key in wanted and record.stop_reason != "error":
            kept[key[:3]] = record
    return list(kept.values())


def resumed_runs(
    out: Path, tasks: Sequence[RunSpec], resume: bool
) -> tuple[list[RunRecord], list[RunSpec]]:
    """With ``resume``, the records of ``out/runs.jsonl`` that answer one of ``tasks`` and the
    tasks still to run; else nothing kept and every task."""
    records = _resumable(out / "runs.jsonl", tasks) if resume else []
    kept = {(r.sampler, r.dataset, r.seed) for r in records}
    return records, [t for t in tasks if (t.sampler.label, _name_of(t), t.seed) not in kept]


def record_runs(
    out: Path,
    records: list[RunRecord],
    todo: Sequence[RunSpec],
    jobs: int,
    say: Callable[[str], None],
    progress: Callable[[RunRecord], str],
) -> bool:
    """Run ``todo`` (``jobs`` at a time) after the kept ``records``, appending each record to
    ``records`` and to ``out/runs.jsonl`` as it arrives (the file is rewritten with the kept ones
    first) and saying ``progress(record)``; whether Ctrl-C interrupted it.

    The kept records go to a new file that then replaces the old one whole, so that a run
    killed while they are written (a kill, not Ctrl-C: buffered lines were lost) keeps every
    record it had."""
    path = out / "runs.jsonl"
    handle, kept = tempfile.mkstemp(dir=out, prefix=".runs-", suffix=".jsonl")
    with os.fdopen(handle, "w") as staged:
        for record in records:
            staged.write(record.to_json() + "\n")
    os.replace(kept, path)
    with path.open("a") as sink:

        def done(record: RunRecord) -> None:
            records.append(record)
            sink.write(record.to_json() + "\n")
            sink.flush()
            say(progress(record))

        try:
            _execute(todo, jobs, done)
        except KeyboardInterrupt:
            say("surrotune bench: interrupted; reporting the runs that finished")
            return True
    return False


def _one_thread_each() -> None:
    """A worker's BLAS and OpenMP pools get one thread: ``jobs`` workers already share the
    cores, and NumPy's and SciPy's BLAS, which take every core by default, made each worker of
    16 on a 16-core host wait on the others' threads (no run of 240 finished in 590 s, where
    one run alone takes seconds; 2 workers on 2 cores: 26 s a run against 7.7 s alone).
    threadpoolctl limits the pools already loaded, so every library that brings one is loaded
    first, and the environment tells those loaded later."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    importlib.import_module("scipy.linalg")
    importlib.import_module("sklearn.linear_model")
    importlib.import_module("xgboost")
    threadpoolctl.threadpool_limits(1)


def _execute(tasks: Sequence[RunSpec], jobs: int, done: Callable[[RunRecord], None]) -> None:
    """Run the tasks, ``jobs`` at a time, handing each record to ``done`` as it arrives."""
    if jobs <= 1:
        for task in tasks:
            done(run_one(task))
        return
    # Workers come from a fork server, never forked from this process: checking the samplers
    # (``_check_samplers``) loads warm-start bundles here, which starts XGBoost's OpenMP
    # threads, and a child forked after that hangs in its first XGBoost call.
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(
        max_workers=jobs, mp_context=context, initializer=_one_thread_each
    ) as pool:
        pending: set[Future[RunRecord]] = set()
        try:
            pending = {pool.submit(run_one, task) for task in tasks}
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    done(future.result())
        except BaseException:
            for future in pending:
                future.cancel()
            raise


def _progress_line(
    count: int, total: int, record: RunRecord, datasets: Sequence[BenchDataset]
) -> str:
    summary = next((d for d in datasets if d.name == record.dataset), None)
    reached = ""
    if summary is not None and record.values:
        curve = metrics.fraction_curve(record.values, summary.optimum, summary.direction)
        reached = f", {100 * curve[-1]:.1f} % of the optimum"
    note = f" [{record.note}]" if record.note else ""
    return (
        f"[{count}/{total}] {record.sampler} on {record.dataset} seed {record.seed}: "
        f"{record.evaluations} evaluations{reached}, {record.wall_s:.1f} s{note}"
    )
