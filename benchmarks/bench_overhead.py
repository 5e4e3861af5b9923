"""Benchmark: surrotune's framework overhead per trial, against a bare Optuna loop, in one run.

Why: on a real GPU a trial costs 0.1 to 10 s of compiling and timing, so the tuner's own cost per
trial (asking the sampler, checking constraints, writing the Result's user attributes, telling the
study) hides behind it. It does not hide when a study is replayed from a recorded dataset, which
is how search quality is measured over many seeds, nor when the storage is a journal or SQLite
file that every write has to reach. This script measures that cost as a user meets it: the whole
loop, :class:`surrotune.runner.Runner` over :class:`surrotune.backends.replay.ReplayBackend`,
with the search space of a real Kernel Tuner dataset (its parameters, and the restrictions of its
``spaces/<name>.json``), on each kind of storage. Beside every surrotune run, on a fresh storage of
the same kind, with the same sampler and seed, plain Optuna loops make the same number of
proposals (with the random sampler, the very same configurations):

``optuna``
    ``study.ask(distributions)`` with the same ``CategoricalDistribution`` s, then ``study.tell``
    with the recorded objective (FAIL where there is none): no user attributes, no constraint
    check. Optuna's own cost.
``optuna+attrs``
    the same plus the ``set_user_attr`` calls the runner makes for that Result: what Optuna's
    storage charges for surrotune's trial record (random sampler, budgets up to 200; left out
    with ``--no-attrs``).

So ``surrotune - optuna`` is the framework's overhead and ``surrotune - optuna+attrs`` the part
spent in surrotune's own Python. ms/evaluation is wall time over evaluations (trials that reach
the backend); ms/proposal is wall time over all trials, including the ``constraint`` trials that
the random sampler proposes often and that never reach the backend. The bare loops count as
evaluations the proposals that the recording answers, repeats included (the runner answers a
repeat from the study and does not count it), so compare the loops by ms/proposal.

The brute-force sampler reads every trial of the study per proposal, so its cost grows with the
study. It is measured at a study size: the study is first filled with that many recorded trials
(as surrotune writes them), then 100 more proposals (50 with ``--quick``) are timed, the
runner's resume of the filled study included.

``--profile`` runs the random sampler under cProfile on the in-memory and journal storages and
attributes the time of ``Runner.run`` to the functions it calls directly (Optuna's ask, tell and
attribute writes, the search space, the backend) and to the runner's own lines.

    python benchmarks/bench_overhead.py [--quick] [--no-attrs] [--profile] [--dir DIR]

(with surrotune installed, e.g. ``pip install -e .``, or ``PYTHONPATH=.`` from the repository).
Each number is one run: on a busy machine (the load average is printed at the top and bottom)
they are noisy; the ratios to the bare loop, measured back to back, are what to read.
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
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
SEED = 1
#: the optuna+attrs loop runs at budgets up to this: an attribute write costs the same whatever
#: the study's size, and on the file storages a large budget would take minutes
ATTRS_MAX = 200


@dataclass(frozen=True)
class Case:
    """One group of rows: a kernel, a sampler, a storage and a size."""

    kernel: str
    sampler: str
    storage: str
    budget: int  # random: evaluations of the run; brute force: trials in the study beforehand
    proposals: int = 0  # brute force: proposals timed on top of ``budget`` trials


@dataclass(frozen=True)
class Row:
    """One measured loop."""

    case: Case
    loop: str
    evaluations: int
    proposals: int
    wall_s: float

    @property
    def ms_per_evaluation(self) -> float:
        return 1e3 * self.wall_s / self.evaluations if self.evaluations else float("nan")

    @property
    def ms_per_proposal(self) -> float:
        return 1e3 * self.wall_s / self.proposals if self.proposals else float("nan")


class Workdir:
    """Fresh storages, one per loop; their files in one directory, removed at the end."""

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


@dataclass
class Kernel:
    """A recording and its search space's restrictions, read once."""

    dataset: Dataset
    restrictions: list[str]

    @classmethod
    def load(cls, name: str) -> Kernel:
        dataset = load_dataset(DATASETS / name / f"{DEVICE}.json.gz")
        return cls(dataset, load_restrictions(DATASETS / "spaces" / f"{name}.json"))

    def space(self) -> SearchSpace:
        """A fresh space each time, so that no loop inherits another's cached enumeration."""
        params = {name: tuple(v) for name, v in self.dataset.parameters.items()}
        return SearchSpace(params, self.restrictions)


def _attrs(result: Result, names: list[str]) -> dict[str, object]:
    """The user attributes the runner writes for ``result`` (empty fields left out)."""
    return {
        k: v
        for k, v in result.to_user_attrs(names).items()
        if v is not None and v != "" and v != [] and v != {}
    }


def new_study(case: Case, kernel: Kernel, space: SearchSpace, work: Workdir) -> optuna.Study:
    """A fresh study; for brute force, filled with ``case.budget`` recorded trials first."""
    study = optuna.create_study(
        storage=work.storage(case.storage),
        sampler=make_sampler(case.sampler, space, seed=SEED),
        direction=kernel.dataset.direction,
    )
    if case.sampler == "brute-force":
        frame = space.enumerate()
        order = np.random.default_rng(SEED + 1).permutation(len(frame))[: case.budget]
        dists = distributions(space)
        names = list(space.names)
        trials = []
        for record in frame.iloc[order].to_dict("records"):
            config = {k: v.item() if isinstance(v, np.generic) else v for k, v in record.items()}
            result = kernel.dataset.lookup(config)
            assert result is not None, "every feasible configuration is in the recording"
            trials.append(
                optuna.trial.create_trial(
                    params=config,
                    distributions=dists,
                    value=result.objective if result.ok else None,
                    state=TrialState.COMPLETE if result.ok else TrialState.FAIL,
                    user_attrs=_attrs(result, names),
                )
            )
        study.add_trials(trials)
    return study


def run_surrotune(case: Case, kernel: Kernel, work: Workdir) -> Row:
    """The loop a user runs: Runner + ReplayBackend + SearchSpace + make_sampler."""
    space = kernel.space()
    study = new_study(case, kernel, space, work)
    before = len(study.get_trials(deepcopy=False))
    trials = case.budget + case.proposals if case.sampler == "brute-force" else case.budget
    runner = Runner(study=study, space=space, backend=ReplayBackend(kernel.dataset), trials=trials)
    start = time.perf_counter()
    summary = runner.run()
    wall = time.perf_counter() - start
    proposals = len(study.get_trials(deepcopy=False)) - before
    return Row(case, "surrotune", summary.new_evaluations, proposals, wall)


def run_bare(
    case: Case, kernel: Kernel, work: Workdir, proposals: int, *, with_attrs: bool
) -> Row:
    """ask/tell on a fresh storage of the same kind, same sampler and seed, ``proposals`` times."""
    space = kernel.space()
    study = new_study(case, kernel, space, work)
    dists = distributions(space)
    names = list(space.names)
    dataset = kernel.dataset
    evaluations = done = 0
    start = time.perf_counter()
    for _ in range(proposals):
        trial = study.ask(dists)
        recorded = dataset.lookup(trial.params)
        if recorded is not None and recorded.status.counts_as_evaluation:
            evaluations += 1
        if with_attrs:
            result = recorded or Result(trial.params, Status.CONSTRAINT, error="breaks: (any)")
            for name, value in _attrs(result, names).items():
                trial.set_user_attr(name, value)
        if recorded is not None and recorded.ok:
            study.tell(trial, recorded.objective)
        else:
            study.tell(trial, state=TrialState.FAIL)
        done += 1
    wall = time.perf_counter() - start
    return Row(case, "optuna+attrs" if with_attrs else "optuna", evaluations, done, wall)


def cases(quick: bool) -> list[Case]:
    """Random: every storage, both kernels (SQLite and the big journal run on one kernel only,
    they are slow). Brute force: on convolution, whose 4362 feasible configurations allow 4000."""
    conv, dedisp = KERNELS
    if quick:
        return [
            Case(conv, "random", "memory", 100),
            Case(dedisp, "random", "memory", 100),
            Case(conv, "random", "journal", 100),
            Case(conv, "random", "sqlite", 50),
            Case(conv, "brute-force", "memory", 1000, 50),
            Case(conv, "brute-force", "journal", 1000, 50),
        ]
    return [
        Case(conv, "random", "memory", 200),
        Case(conv, "random", "memory", 1000),
        Case(dedisp, "random", "memory", 200),
        Case(dedisp, "random", "memory", 1000),
        Case(conv, "random", "journal", 200),
        Case(conv, "random", "journal", 1000),
        Case(dedisp, "random", "journal", 200),
        Case(conv, "random", "sqlite", 200),
        Case(conv, "brute-force", "memory", 1000, 100),
        Case(conv, "brute-force", "memory", 4000, 100),
        Case(conv, "brute-force", "journal", 1000, 100),
        Case(conv, "brute-force", "journal", 4000, 100),
    ]


def table(rows: list[Row]) -> str:
    """Markdown; "× optuna" is ms/proposal over the bare loop's, "+ms" their difference."""
    lines = [
        "| kernel | sampler | storage | trials | loop | evaluations | proposals | wall s "
        "| ms/evaluation | ms/proposal | × optuna | +ms/proposal |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    bare: dict[Case, Row] = {r.case: r for r in rows if r.loop == "optuna"}
    for r in rows:
        c = r.case
        base = bare.get(c)
        ratio = extra = "-"
        if base is not None and base.proposals and r.proposals:
            ratio = f"{r.ms_per_proposal / base.ms_per_proposal:.2f}"
            extra = f"{r.ms_per_proposal - base.ms_per_proposal:+.2f}"
        size = str(c.budget) if c.sampler == "random" else f"{c.budget} + {c.proposals}"
        lines.append(
            f"| {c.kernel} | {c.sampler} | {c.storage} | {size} | {r.loop} "
            f"| {r.evaluations} | {r.proposals} | {r.wall_s:.2f} | {r.ms_per_evaluation:.2f} "
            f"| {r.ms_per_proposal:.2f} | {ratio} | {extra} |"
        )
    return "\n".join(lines)


#: what the runner's direct callees are, for the profile's attribution
LABELS: dict[tuple[str, str], str] = {
    ("optuna/study/study.py", "ask"): "Optuna Study.ask (new trial, sampler, param writes)",
    ("optuna/study/study.py", "tell"): "Optuna Study.tell (state + value write)",
    ("optuna/trial/_trial.py", "set_user_attr"): "Optuna Trial.set_user_attr (Result fields)",
    ("optuna/study/study.py", "direction"): "Optuna Study.direction (a storage read)",
    ("surrotune/space.py", "is_feasible"): "SearchSpace.is_feasible",
    ("surrotune/space.py", "violated"): "SearchSpace.violated (again, for the message)",
    ("surrotune/space.py", "key"): "SearchSpace.key",
    ("surrotune/runner.py", "_status"): "runner._status (exhaustion check: all trials, per batch)",
    ("replay.py", "evaluate"): "ReplayBackend.evaluate",
}


def profile(case: Case, kernel: Kernel, work: Workdir) -> str:
    """Run ``case`` under cProfile; split ``Runner.run`` into the runner's direct callees.

    Every function outside runner.py that a runner.py function calls is charged the cumulative
    time of those calls (they do not nest in one another, so the parts add up); the runner's own
    lines are the self time of the runner.py functions.
    """
    space = kernel.space()
    study = new_study(case, kernel, space, work)
    runner = Runner(
        study=study, space=space, backend=ReplayBackend(kernel.dataset), trials=case.budget
    )
    profiler = cProfile.Profile()
    profiler.enable()
    summary = runner.run()
    profiler.disable()
    raw = pstats.Stats(profiler).stats  # type: ignore[attr-defined]

    def in_runner(key: tuple[str, int, str]) -> bool:
        """The runner's own functions, _status counted as a callee (it has its own row)."""
        return key[0].endswith("surrotune/runner.py") and key[2] != "_status"

    total = next(v[3] for k, v in raw.items() if in_runner(k) and k[2] == "run")
    parts: dict[str, list[float]] = {}
    own = 0.0
    for key, (_, _, tottime, _, callers) in raw.items():
        if in_runner(key):
            own += tottime
            continue
        from_runner = [v for c, v in callers.items() if in_runner(c)]
        if not from_runner:
            continue
        label = next(
            (text for (f, n), text in LABELS.items() if key[0].endswith(f) and key[2] == n),
            f"{Path(key[0]).name}:{key[2]}",
        )
        part = parts.setdefault(label, [0, 0.0])
        part[0] += sum(v[1] for v in from_runner)
        part[1] += sum(v[3] for v in from_runner)
    parts["surrotune runner's own lines"] = [0, own]
    proposals = len(study.get_trials(deepcopy=False))
    lines = [
        f"cProfile, {case.kernel} / {case.sampler} / {case.storage} / {case.budget}: "
        f"{summary.evaluations} evaluations, {proposals} proposals, {total:.2f} s in Runner.run "
        "(the profiler slows Python code down, so read the shares)",
        "",
        "| part | calls | s | % | ms/proposal |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, (calls, seconds) in sorted(parts.items(), key=lambda kv: -kv[1][1]):
        if seconds < 0.002 * total:
            continue
        lines.append(
            f"| {label} | {calls or '-'} | {seconds:.3f} | {100 * seconds / total:.1f} "
            f"| {1e3 * seconds / proposals:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (well under a minute)")
    parser.add_argument("--no-attrs", action="store_true", help="skip the optuna+attrs loops")
    parser.add_argument(
        "--profile", action="store_true", help="also profile the random sampler's loop"
    )
    parser.add_argument("--dir", help="where the SQLite and journal files go (default: $TMPDIR)")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    cores = os.cpu_count() or 1
    load_before = os.getloadavg()
    work = Workdir(args.dir)
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(
        f"machine: {cores} cores, {platform.platform()}, python {platform.python_version()}, "
        f"optuna {optuna.__version__}"
    )
    print(f"load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}")
    print(f"datasets: {DATASETS}/<kernel>/{DEVICE}.json.gz + spaces/<kernel>.json restrictions")
    print(f"storage files in: {work.path} (removed at the end)")
    print()
    started = time.perf_counter()
    kernels = {name: Kernel.load(name) for name in KERNELS}
    rows: list[Row] = []
    try:
        for case in cases(args.quick):
            kernel = kernels[case.kernel]
            row = run_surrotune(case, kernel, work)
            rows.append(row)
            rows.append(run_bare(case, kernel, work, row.proposals, with_attrs=False))
            if not args.no_attrs and case.sampler == "random" and case.budget <= ATTRS_MAX:
                rows.append(run_bare(case, kernel, work, row.proposals, with_attrs=True))
            print(f"  {time.perf_counter() - started:5.0f} s  {case}", file=sys.stderr)
        print(table(rows))
        if args.profile:
            size = 100 if args.quick else 300
            for storage in ("memory", "journal"):
                print()
                case = Case(KERNELS[0], "random", storage, size)
                print(profile(case, kernels[case.kernel], work))
    finally:
        work.close()
    load_after = os.getloadavg()
    print()
    print(
        f"total {time.perf_counter() - started:.0f} s; load average after: "
        f"{', '.join(f'{x:.2f}' for x in load_after)}"
    )
    peak = max(load_before[0], load_after[0])
    if peak > 0.5 * cores:
        print(
            f"note: the 1-minute load reached {peak:.2f} on {cores} cores: other processes "
            "shared the CPU, so the times are noisy; compare the rows of one case (measured "
            "back to back) rather than absolute numbers"
        )


if __name__ == "__main__":
    main()
