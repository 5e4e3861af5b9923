"""Benchmark: surrotune's framework overhead per trial, against a bare Optuna loop, in one run.

Why: on a real GPU a trial costs 0.1 to 10 s of compiling and timing, so the tuner's own cost per
trial (asking the sampler, checking constraints, writing the Result's user attributes, telling the
study) is invisible there. It is not invisible when a study is replayed from a recorded dataset,
which is how search quality is measured over many seeds, nor when several runners share one
journal or SQLite file. This script measures that cost as a user meets it: the whole loop,
:class:`surrotune.runner.Runner` over :class:`surrotune.backends.replay.ReplayBackend` with the
search space of a real Kernel Tuner dataset (its parameters, and the restrictions of its
``spaces/<name>.json``), on each kind of storage. Beside every run, on the same storage kind and
with the same sampler and seed, two plain Optuna loops do the same number of proposals:

``optuna``
    ``study.ask(distributions)`` with the same ``CategoricalDistribution`` s, then
    ``study.tell`` with the recorded objective (FAIL where there is none): no user attributes, no
    constraint check. Optuna's own cost.
``optuna+attrs``
    the same, plus the ``set_user_attr`` calls the runner makes for the recorded Result (only
    with ``--attrs``): what Optuna's storage charges for surrotune's trial record.

So ``surrotune - optuna`` is the framework's overhead, and ``surrotune - optuna+attrs`` the part
spent in surrotune's own Python. Columns: ms per evaluation (wall time over evaluations, the
trials that reach the backend) and ms per proposal (wall time over all trials, including the
``constraint`` ones that the random sampler proposes often and that never reach the backend).
The brute-force sampler reads every trial of the study per proposal, so it is run at 1000 and
4000 trials to show how it scales. ``--profile`` runs one configuration under cProfile and
attributes its time to Optuna's ask / tell / attribute writes, the backend and surrotune's code.

    python benchmarks/bench_overhead.py [--quick] [--attrs] [--profile] [--dir DIR]

(with surrotune installed, e.g. ``pip install -e .``, or ``PYTHONPATH=.`` from the repository).
The numbers are from a single run each: on a busy machine (see the load average printed at the
top and bottom) they are noisy, and the ratios to the bare loop, measured in the same run, are
what to read.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, InMemoryStorage
from optuna.trial import TrialState

from surrotune.backends.replay import Dataset, ReplayBackend, load_dataset, load_restrictions
from surrotune.result import Result, Status
from surrotune.runner import Runner
from surrotune.sampling import distributions, make_sampler
from surrotune.space import SearchSpace
from surrotune.storage import open_storage

DATASETS = Path("/work/shared/datasets/kernel_tuner")
KERNELS = ("convolution_milo", "dedispersion_milo")
DEVICE = "A100"
STORAGES = ("memory", "journal", "sqlite")
SEED = 1


@dataclass(frozen=True)
class Case:
    """One row group: a kernel, a sampler, a storage and an evaluation budget."""

    kernel: str
    sampler: str
    storage: str
    budget: int


@dataclass(frozen=True)
class Row:
    """One measured loop."""

    case: Case
    loop: str
    evaluations: int
    proposals: int
    wall_s: float
    setup_s: float

    @property
    def ms_per_evaluation(self) -> float:
        return 1e3 * self.wall_s / self.evaluations if self.evaluations else float("nan")

    @property
    def ms_per_proposal(self) -> float:
        return 1e3 * self.wall_s / self.proposals if self.proposals else float("nan")


class Workdir:
    """Fresh storage files, one per loop, in one directory removed at the end."""

    def __init__(self, parent: str | None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="surrotune-overhead-", dir=parent))
        self._n = 0

    def storage(self, kind: str) -> BaseStorage:
        self._n += 1
        if kind == "memory":
            return InMemoryStorage()
        suffix = {"journal": ".log", "sqlite": ".db"}[kind]
        return open_storage(str(self.path / f"study{self._n}{suffix}"))

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def load(kernel: str) -> tuple[Dataset, list[str]]:
    """The A100 recording of ``kernel`` and the restrictions of its search space."""
    dataset = load_dataset(DATASETS / kernel / f"{DEVICE}.json.gz")
    restrictions = load_restrictions(DATASETS / "spaces" / f"{kernel}.json")
    return dataset, restrictions


def make_space(dataset: Dataset, restrictions: list[str]) -> SearchSpace:
    return SearchSpace({name: tuple(v) for name, v in dataset.parameters.items()}, restrictions)


def run_surrotune(
    case: Case, dataset: Dataset, restrictions: list[str], work: Workdir
) -> tuple[Row, optuna.Study]:
    """The loop a user runs: Runner + ReplayBackend + SearchSpace + make_sampler."""
    start = time.perf_counter()
    space = make_space(dataset, restrictions)
    study = optuna.create_study(
        storage=work.storage(case.storage),
        sampler=make_sampler(case.sampler, space, seed=SEED),
        direction=dataset.direction,
    )
    runner = Runner(
        study=study, space=space, backend=ReplayBackend(dataset), trials=case.budget
    )
    setup = time.perf_counter() - start
    start = time.perf_counter()
    summary = runner.run()
    wall = time.perf_counter() - start
    proposals = len(study.get_trials(deepcopy=False))
    row = Row(case, "surrotune", summary.evaluations, proposals, wall, setup)
    return row, study


def _attrs(result: Result, names: list[str]) -> dict[str, object]:
    """The user attributes the runner writes for ``result`` (empty fields left out)."""
    return {
        k: v
        for k, v in result.to_user_attrs(names).items()
        if v is not None and v != "" and v != [] and v != {}
    }


def run_bare(
    case: Case,
    dataset: Dataset,
    restrictions: list[str],
    work: Workdir,
    proposals: int,
    *,
    with_attrs: bool,
) -> Row:
    """ask/tell on the same storage kind, sampler and seed, for ``proposals`` trials."""
    start = time.perf_counter()
    space = make_space(dataset, restrictions)
    dists = distributions(space)
    names = list(space.names)
    study = optuna.create_study(
        storage=work.storage(case.storage),
        sampler=make_sampler(case.sampler, space, seed=SEED),
        direction=dataset.direction,
    )
    setup = time.perf_counter() - start
    evaluations = 0
    start = time.perf_counter()
    for _ in range(proposals):
        try:
            trial = study.ask(dists)
        except optuna.exceptions.OptunaError:
            break
        recorded = dataset.lookup(trial.params)
        if recorded is not None and recorded.status.counts_as_evaluation:
            evaluations += 1
        if with_attrs:
            result = recorded or Result(
                dict(trial.params), Status.CONSTRAINT, error="breaks: a constraint"
            )
            for name, value in _attrs(result, names).items():
                trial.set_user_attr(name, value)
        if recorded is not None and recorded.ok:
            study.tell(trial, recorded.objective)
        else:
            study.tell(trial, state=TrialState.FAIL)
    wall = time.perf_counter() - start
    loop = "optuna+attrs" if with_attrs else "optuna"
    return Row(case, loop, evaluations, len(study.get_trials(deepcopy=False)), wall, setup)


def cases(quick: bool) -> list[Case]:
    """Random on every storage, both kernels; brute force scaling on convolution."""
    small, large = (100, 300) if quick else (200, 1000)
    out: list[Case] = []
    for kernel in KERNELS:
        for storage in STORAGES:
            for budget in (small, large):
                if storage == "sqlite" and budget == large:
                    continue  # a commit per attribute: 200 shows the rate
                out.append(Case(kernel, "random", storage, budget))
    for storage in ("memory", "journal"):
        for budget in (300, 1000) if quick else (1000, 4000):
            out.append(Case("convolution_milo", "brute-force", storage, budget))
    return out


def table(rows: list[Row]) -> str:
    lines = [
        "| kernel | sampler | storage | budget | loop | evaluations | proposals | wall s "
        "| ms/evaluation | ms/proposal | × optuna | setup s |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    bare: dict[Case, Row] = {r.case: r for r in rows if r.loop == "optuna"}
    for r in rows:
        base = bare.get(r.case)
        ratio = (
            f"{r.ms_per_proposal / base.ms_per_proposal:.2f}"
            if base is not None and base.ms_per_proposal > 0
            else "-"
        )
        c = r.case
        lines.append(
            f"| {c.kernel} | {c.sampler} | {c.storage} | {c.budget} | {r.loop} "
            f"| {r.evaluations} | {r.proposals} | {r.wall_s:.2f} | {r.ms_per_evaluation:.3f} "
            f"| {r.ms_per_proposal:.3f} | {ratio} | {r.setup_s:.2f} |"
        )
    return "\n".join(lines)


#: (label, predicate on a pstats key (file, line, function)); first match wins, most specific first
BUCKETS: list[tuple[str, Callable[[tuple[str, int, str]], bool]]] = [
    ("Trial.set_user_attr (Optuna storage writes of the Result)",
     lambda k: k[2] == "set_user_attr" and k[0].endswith("optuna/trial/_trial.py")),
    ("Study.ask (Optuna: create trial + sampler)",
     lambda k: k[2] == "ask" and k[0].endswith("optuna/study/study.py")),
    ("Study.tell (Optuna: state, values, sampler.after_trial)",
     lambda k: k[2] == "tell" and k[0].endswith("optuna/study/study.py")),
    ("ReplayBackend.evaluate", lambda k: k[2] == "evaluate" and "replay.py" in k[0]),
    ("SearchSpace.is_feasible + violated",
     lambda k: k[2] in ("is_feasible", "violated") and k[0].endswith("surrotune/space.py")),
    ("SearchSpace.key", lambda k: k[2] == "key" and k[0].endswith("surrotune/space.py")),
    ("Result.to_user_attrs", lambda k: k[2] == "to_user_attrs"),
    ("runner._status (exhaustion check, per batch over all trials)",
     lambda k: k[2] == "_status" and k[0].endswith("surrotune/runner.py")),
    ("Study.direction (a storage read per ok trial)",
     lambda k: k[2] == "direction" and k[0].endswith("optuna/study/study.py")),
]  # fmt: skip


def profile(case: Case, dataset: Dataset, restrictions: list[str], work: Workdir) -> str:
    """Run ``case`` under cProfile; attribute the time of ``Runner.run`` to BUCKETS.

    Buckets are cumulative times of functions the runner calls directly, which do not nest in one
    another, so they add up; "surrotune runner, rest" is what is left of ``Runner.run``.
    """
    space = make_space(dataset, restrictions)
    study = optuna.create_study(
        storage=work.storage(case.storage),
        sampler=make_sampler(case.sampler, space, seed=SEED),
        direction=dataset.direction,
    )
    runner = Runner(
        study=study, space=space, backend=ReplayBackend(dataset), trials=case.budget
    )
    profiler = cProfile.Profile()
    profiler.enable()
    summary = runner.run()
    profiler.disable()
    stats = pstats.Stats(profiler)
    raw = stats.stats  # type: ignore[attr-defined]
    total = next(v[3] for k, v in raw.items() if k[2] == "run" and k[0].endswith("runner.py"))
    proposals = len(study.get_trials(deepcopy=False))
    lines = [
        f"cProfile of {case.kernel} / {case.sampler} / {case.storage} / {case.budget}: "
        f"{summary.evaluations} evaluations, {proposals} proposals, {total:.2f} s in "
        "Runner.run under the profiler (which slows Python code about 1.5-2x)",
        "",
        "| part | s | % | calls | ms/proposal |",
        "|---|---:|---:|---:|---:|",
    ]
    accounted = 0.0
    for label, match in BUCKETS:
        found = [(v[1], v[3]) for k, v in raw.items() if match(k)]
        calls = sum(c for c, _ in found)
        cum = sum(t for _, t in found)
        accounted += cum
        lines.append(
            f"| {label} | {cum:.2f} | {100 * cum / total:.0f} | {calls} "
            f"| {1e3 * cum / proposals:.3f} |"
        )
    rest = total - accounted
    lines.append(
        f"| surrotune runner, rest | {rest:.2f} | {100 * rest / total:.0f} | - "
        f"| {1e3 * rest / proposals:.3f} |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small budgets (about 30 s)")
    parser.add_argument(
        "--attrs", action="store_true", help="also run the optuna+attrs loop beside each case"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile convolution / random / journal at the larger budget",
    )
    parser.add_argument("--dir", help="where the SQLite and journal files go (default: $TMPDIR)")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(
        f"machine: {os.cpu_count()} cores, {platform.platform()}, python "
        f"{platform.python_version()}, optuna {optuna.__version__}"
    )
    load_before = os.getloadavg()
    print(f"load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}")
    work = Workdir(args.dir)
    print(f"storage files in: {work.path}")
    print(f"datasets: {DATASETS}/<kernel>/{DEVICE}.json.gz, restrictions from spaces/<kernel>.json")
    print()
    rows: list[Row] = []
    started = time.perf_counter()
    data = {kernel: load(kernel) for kernel in KERNELS}
    try:
        for case in cases(args.quick):
            dataset, restrictions = data[case.kernel]
            row, _ = run_surrotune(case, dataset, restrictions, work)
            rows.append(row)
            rows.append(run_bare(case, dataset, restrictions, work, row.proposals, with_attrs=False))
            if args.attrs:
                rows.append(
                    run_bare(case, dataset, restrictions, work, row.proposals, with_attrs=True)
                )
            print(f"  done: {case} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        print(table(rows))
        if args.profile:
            print()
            kernel = KERNELS[0]
            case = Case(kernel, "random", "journal", 300 if args.quick else 1000)
            print(profile(case, *data[kernel], work))
    finally:
        work.close()
    load_after = os.getloadavg()
    cores = os.cpu_count() or 1
    print()
    print(f"total {time.perf_counter() - started:.0f} s; load average after: "
          f"{', '.join(f'{x:.2f}' for x in load_after)}")  # fmt: skip
    if max(load_before[0], load_after[0]) > 0.5 * cores:
        print(
            f"note: the 1-minute load reached {max(load_before[0], load_after[0]):.2f} on "
            f"{cores} cores; other processes shared the CPU, so the times are noisy (compare "
            "rows of one case, measured back to back, rather than absolute numbers)"
        )


if __name__ == "__main__":
    main()
