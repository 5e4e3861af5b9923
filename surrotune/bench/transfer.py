"""``surrotune bench --warm-start SOURCE TARGET``: what a model saved on one GPU saves on the next.

For each pair of recordings of one kernel (the source GPU's, the target GPU's), the same loop a
user runs (:func:`surrotune.bench.harness.run_one`) replays the target with:

- ``cold``: the surrogate sampler from scratch (what the target costs without a model);
- ``warm``: the surrogate sampler warm-started from the source's model bundle;
- ``enqueue``: the simple baseline any Optuna user can write: ``study.enqueue_trial`` of the
  source's best measured configurations (the bundle's top ``k``), then the surrogate sampler
  (``enqueue-tpe``: then Optuna's default TPE, for the plain-Optuna user).

The source's bundle is, by default, what a user would have after tuning the source GPU: the
models of a ``surrotune run`` of ``--source-budget`` evaluations (the surrogate sampler, seed 0)
on the source recording, fitted on that run's measurements. ``--source-model full`` fits them on
the whole recording instead (every configuration measured: an upper bound on what a model of the
source can carry over). The bundles are written to ``OUTPUT/models/`` and reused by ``--resume``.

The report gives, per pair, the median evaluations to 95 % and 98 % of the target's optimum for
each method, the ratio of cold to warm at 98 % and the issue's goals, then the usual per-dataset
tables (:mod:`surrotune.bench.report`) of the targets.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from surrotune.bench import metrics, report
from surrotune.bench.harness import (
    BenchDataset,
    BenchError,
    BenchResult,
    RunRecord,
    RunSpec,
    SamplerSpec,
    dataset_name,
    prepare_dataset,
    record_runs,
    resumed_runs,
)

__all__ = [
    "COLD",
    "METHODS",
    "Pair",
    "build_source_bundle",
    "by_source_run",
    "fit_source_bundles",
    "format_transfer",
    "method_spec",
    "run_transfer_bench",
]

#: the columns of the comparison, in report order
METHODS = ("cold", "warm", "enqueue", "enqueue-tpe")
COLD = "surrogate (cold)"


@dataclass(frozen=True)
class Pair:
    """One transfer: the source recording's model warm-starts the target's search."""

    source: str
    target: str

    @property
    def source_name(self) -> str:
        return dataset_name(Path(self.source))

    @property
    def target_name(self) -> str:
        return dataset_name(Path(self.target))

    def label(self, method: str) -> str:
        stem = self.source_name.split("/")[-1]
        return {
            "cold": COLD,
            "warm": f"warm from {stem}",
            "enqueue": f"enqueue top of {stem} + surrogate",
            "enqueue-tpe": f"enqueue top of {stem} + tpe",
        }[method]


def build_source_bundle(
    path: str | Path,
    out: Path,
    *,
    budget: int | None,
    seed: int = 0,
    launch_features: bool = False,
) -> Path:
    """The source's bundle, written to ``out``: fitted on a surrogate run of ``budget``
    evaluations on the recording (None: on the whole recording); with ``launch_features``, the
    source run and its models use the launch geometry."""
    from surrotune.surrogate.bundle import bundle_from_dataset, fit_bundle

    if budget is None:
        bundle = bundle_from_dataset(path, seed=seed, launch_features=launch_features)
    else:
        import optuna

        from surrotune.analysis.export import study_results
        from surrotune.backends.replay import ReplayBackend
        from surrotune.bench.harness import _quiet_optuna, with_launch_shape
        from surrotune.runner import Runner
        from surrotune.sampling import make_sampler
        from surrotune.surrogate.bundle import describe_device

        _quiet_optuna()
        dataset, space, _, _ = prepare_dataset(path)
        sampler = make_sampler("surrogate", space, seed=seed)
        sampler.launch_features = launch_features  # type: ignore[attr-defined]
        study = optuna.create_study(
            storage=optuna.storages.InMemoryStorage(),
            sampler=with_launch_shape(sampler, dataset),
            direction=dataset.direction,
        )
        Runner(study=study, space=space, backend=ReplayBackend(dataset), trials=budget,
               batch_size=1).run()  # fmt: skip
        meta = dict(dataset.metadata)
        bundle = fit_bundle(
            study_results(study),
            parameters={n: list(space.values[n]) for n in space.names},
            direction=dataset.direction,
            objective=dataset.objective,
            device=describe_device(meta.get("device"), {"name": dataset.device_name}),
            kernel=meta.get("kernel") or {"name": dataset.kernel_name, "template_sha256": None,
                                          "note": "replayed recording without a template"},
            problem_size=dataset.problem_size,
            source={"dataset": str(path), "run": f"surrogate, seed {seed}, {budget} evaluations"},
            seed=seed,
            launch_shape=sampler.launch_shape,  # None unless launch_features: with_launch_shape
        )  # fmt: skip
    return bundle.save(out)


def run_transfer_bench(
    pairs: Sequence[tuple[str | Path, str | Path]],
    budget: int,
    seeds: int | Sequence[int],
    out_dir: str | Path,
    *,
    methods: Sequence[str] = METHODS,
    source_budget: int | None = 200,
    source_runs: int = 1,
    enqueue_top: int = 10,
    transfer_mode: str = "prior",
    jobs: int = 1,
    time_limit_s: float = 600.0,
    command: str | None = None,
    log: Callable[[str], None] | None = None,
    plots: bool = True,
    resume: bool = False,
    launch_features: bool = False,
) -> tuple[str, list[RunRecord]]:
    """Run every pair's methods over the seeds; write ``runs.jsonl``, ``transfer.md`` (and the
    plots) into ``out_dir``; return the markdown and the records. ``source_runs``: how many
    source runs (seeds 0, 1, ...) give a bundle each; the target's seed ``s`` starts from the
    bundle of source run ``s mod source_runs``, so that the medians measure the method over
    source runs rather than one run's luck (which ten configurations one 200-evaluation run
    measured best moved the results more than any warm-start option, docs/BENCHMARKS.md).
    ``launch_features``: the source runs, their bundles and every surrogate run use the launch
    geometry (:mod:`surrotune.surrogate.geometry`)."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise BenchError(f"--methods: unknown {unknown}; known: {', '.join(METHODS)}")
    if not pairs:
        raise BenchError("--warm-start needs at least one SOURCE TARGET pair")
    if source_runs < 1:
        raise BenchError(f"--source-runs: expected a positive number of runs, got {source_runs}")
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    chosen = [Pair(str(s), str(t)) for s, t in pairs]
    for pair in chosen:
        for path in (pair.source, pair.target):
            if not Path(path).is_file():
                raise BenchError(f"--warm-start: file not found: {path}")
    start = time.monotonic()
    out = Path(out_dir)
    bundles = fit_source_bundles(
        [p.source for p in chosen], out, source_budget, jobs=jobs,
        launch_features=launch_features, resume=resume, log=say, runs=source_runs,
    )  # fmt: skip
    tasks = _tasks(chosen, bundles, methods, seed_list, budget, time_limit_s, transfer_mode,
                   enqueue_top, launch_features)  # fmt: skip
    records, todo = resumed_runs(out, tasks, resume)

    def progress(record: RunRecord) -> str:
        return (f"[{len(records)}/{len(tasks)}] {record.sampler} on {record.dataset} seed "
                f"{record.seed}: {record.evaluations} evaluations, {record.wall_s:.1f} s"
                + (f" [{record.note}]" if record.note else ""))  # fmt: skip

    interrupted = record_runs(out, records, todo, jobs, say, progress)
    summaries = {p.target: prepare_dataset(p.target)[3] for p in chosen}
    text = format_transfer(
        chosen, records, summaries, methods, budget, seed_list,
        source_budget=source_budget, enqueue_top=enqueue_top, command=command,
        wall_s=time.monotonic() - start, interrupted=interrupted, source_runs=source_runs,
    )  # fmt: skip
    details = []
    for target in dict.fromkeys(p.target for p in chosen):
        labels = list(dict.fromkeys(
            p.label(m) for p in chosen if p.target == target for m in methods
        ))  # fmt: skip
        result = BenchResult(
            datasets=[summaries[target]], samplers=labels,
            records=[r for r in records if r.dataset == summaries[target].name],
            budget=budget, seeds=seed_list, settings={"jobs": jobs, "time_limit_s": time_limit_s},
        )  # fmt: skip
        detail = report.format_markdown(result).split("\n## ", 1)[-1]
        details.append("## " + detail)
        if plots:
            name = f"convergence_{report._slug(summaries[target].name)}.png"
            report.plot_convergence(result, summaries[target], out / name)
            details.append(f"![{summaries[target].name}]({name})\n")
    (out / "transfer.md").write_text(text + "\n\n" + "\n".join(details))
    return text, records


def fit_source_bundles(
    sources: Sequence[str],
    out: Path,
    source_budget: int | None,
    *,
    jobs: int = 1,
    launch_features: bool = False,
    resume: bool = False,
    log: Callable[[str], None] | None = None,
    runs: int = 1,
) -> dict[str, list[Path]]:
    """The bundles of each source recording, one per source run (seeds ``0 .. runs - 1``),
    under ``out/models/`` (``NAME.run200.json.gz`` for the 200-evaluation run of seed 0,
    ``NAME.run200.seed3.json.gz`` for seed 3, ``NAME.full.json.gz`` for the whole recording):
    fitted here, or with ``resume`` kept where they are already there."""
    (out / "models").mkdir(parents=True, exist_ok=True)
    bundles: dict[str, list[Path]] = {}
    to_fit: list[tuple[str, Path, int]] = []
    for source in dict.fromkeys(sources):
        name = dataset_name(Path(source)).replace("/", "_")
        what = "full" if source_budget is None else f"run{source_budget}"
        what += ".geometry" if launch_features else ""
        bundles[source] = []
        for seed in range(runs):
            path = out / "models" / f"{name}.{what}{f'.seed{seed}' if seed else ''}.json.gz"
            if not (resume and path.is_file()):
                if log is not None:
                    log(f"surrotune bench: fitting the model of {source} ({what}, seed {seed})")
                to_fit.append((source, path, seed))
            bundles[source].append(path)
    _fit_sources(to_fit, source_budget, jobs, launch_features)
    return bundles


def _fit_sources(
    to_fit: Sequence[tuple[str, Path, int]], budget: int | None, jobs: int, launch_features: bool
) -> None:
    """Fit the source bundles in spawned processes, ``jobs`` at a time, never in this one:
    XGBoost's OpenMP threads started here would hang any child this process forks later (the
    runs' workers come from a fork server for the same reason: ``harness._execute``)."""
    if not to_fit:
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    workers = max(1, min(jobs, len(to_fit)))
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(build_source_bundle, source, path, budget=budget, seed=seed,
                               launch_features=launch_features)
                   for source, path, seed in to_fit]  # fmt: skip
        for future in futures:
            future.result()


def method_spec(
    method: str,
    label: str,
    bundle: str,
    *,
    mode: str = "prior",
    top: int = 10,
    launch_features: bool = False,
) -> SamplerSpec:
    """The sampler of one of :data:`METHODS` against the source ``bundle``: the cold start,
    the warm start (``mode``: how the prior enters), or the ``top`` source configurations
    enqueued before the surrogate sampler (``enqueue``) or TPE (``enqueue-tpe``)."""
    geometry: tuple[tuple[str, Any], ...] = (
        (("attrs", (("launch_features", True),)),) if launch_features else ()
    )
    if method == "cold":
        return SamplerSpec("surrogate", label, geometry)
    if method == "warm":
        options: tuple[tuple[str, Any], ...] = (("warm_start", (bundle,)),)
        if mode != "prior":
            options += (("transfer_mode", mode),)
        return SamplerSpec("surrogate", label, options + geometry)
    if method == "enqueue-tpe":
        return SamplerSpec("tpe", label, (("enqueue", (bundle, top)),))
    return SamplerSpec("surrogate", label, (("enqueue", (bundle, top)), *geometry))


def _tasks(
    pairs: Sequence[Pair],
    bundles: dict[str, list[Path]],
    methods: Sequence[str],
    seeds: Sequence[int],
    budget: int,
    time_limit_s: float,
    mode: str,
    top: int,
    launch_features: bool = False,
) -> list[RunSpec]:
    """Every run: per pair, method and seed, the target's seed ``s`` against the source's
    bundle ``s mod len(bundles[source])``."""
    tasks: dict[tuple[str, str], list[RunSpec]] = {}
    for pair in pairs:
        paths = bundles[pair.source]
        for method in methods:
            label = pair.label(method)
            specs = [
                method_spec(method, label, str(paths[seed % len(paths)]), mode=mode, top=top,
                            launch_features=launch_features)
                for seed in seeds
            ]  # fmt: skip
            tasks[(pair.target, label)] = [
                RunSpec(pair.target, spec, seed, budget, time_limit_s, 1)
                for spec, seed in zip(specs, seeds, strict=True)
            ]
    return [task for runs in tasks.values() for task in runs]


def _counts_to(
    records: Sequence[RunRecord], data: BenchDataset, target: float
) -> list[int | None]:
    return [metrics.evaluations_to_reach(r.values, data.optimum, data.direction, target)
            for r in records if r.stop_reason != "error"]  # fmt: skip


def _median_to(records: Sequence[RunRecord], data: BenchDataset, target: float) -> float | None:
    return report.median_to_reach(_counts_to(records, data, target))


def _cell(value: float | None, budget: int) -> str:
    return f">{budget}" if value is None else f"{value:g}"


def format_transfer(
    pairs: Sequence[Pair],
    records: Sequence[RunRecord],
    summaries: dict[str, BenchDataset],
    methods: Sequence[str],
    budget: int,
    seeds: Sequence[int],
    *,
    source_budget: int | None,
    enqueue_top: int,
    command: str | None,
    wall_s: float,
    interrupted: bool = False,
    source_runs: int = 1,
) -> str:
    """The summary table: per pair and method, median evaluations to 95 % and 98 %."""
    lines = ["# surrotune bench --warm-start", ""]
    if command:
        lines += [f"`{command}`", ""]
    if source_budget is None:
        model = "fitted on the whole source recording"
        model += f" ({source_runs} model seeds)" if source_runs > 1 else ""
    elif source_runs == 1:
        model = f"fitted on a {source_budget}-evaluation surrogate run (seed 0) on the source"
    else:
        model = (
            f"fitted on {source_runs} {source_budget}-evaluation surrogate runs (seeds 0 to "
            f"{source_runs - 1}) on the source, the target's seed s starting from run s mod "
            f"{source_runs}"
        )
    lines += [
        f"Budget {budget} evaluations, {len(seeds)} seeds, batch size 1; the source model is "
        f"{model}; the enqueue baseline enqueues the source's {enqueue_top} best measured "
        f"configurations. Wall time {wall_s / 60:.1f} min"
        + (" (interrupted)." if interrupted else "."),
        "",
        "Evaluations to 95 % / 98 % of the target's optimum, median over seeds ('>budget': half "
        "the seeds or more never got there), the 98 % median with its distribution-free 95 % "
        "interval in brackets (none under 6 seeds). Ratio: cold ÷ warm at 98 % (the goal: at "
        "least 2), with a 95 % bootstrap interval (2,000 resamples of each side's seeds). "
        "Misleading: the source ranks the target's configurations no better than chance "
        "(Spearman ρ of the two recordings below 0.2).",
        "",
    ]
    header = ["source → target", "ρ"] + [m for m in methods] + ["ratio at 98 %"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|---|---:|" + "---:|" * (len(header) - 2))
    for pair in pairs:
        data = summaries[pair.target]
        cells = [f"{pair.source_name} → {pair.target_name.split('/')[-1]}",
                 f"{_rank_correlation(pair):.2f}"]  # fmt: skip
        reach: dict[str, tuple[float | None, float | None]] = {}
        counts: dict[str, list[int | None]] = {}  # method -> its runs' evaluations to 98 %
        for method in methods:
            runs = [r for r in records
                    if r.dataset == data.name and r.sampler == pair.label(method)]  # fmt: skip
            if not runs:
                cells.append("-")
                continue
            counts[method] = _counts_to(runs, data, 0.98)
            reach[method] = (_median_to(runs, data, 0.95), report.median_to_reach(counts[method]))
            a, b = reach[method]
            interval = report.interval_text(metrics.median_interval(counts[method]), budget)
            cells.append(f"{_cell(a, budget)} / {_cell(b, budget)}{interval}")
        cold, warm = reach.get("cold", (None, None))[1], reach.get("warm", (None, None))[1]
        cold_v = budget + 1 if cold is None else cold
        warm_v = budget + 1 if warm is None else warm
        ratio = cold_v / warm_v if "cold" in reach and "warm" in reach else None
        spread = ""
        if ratio is not None:
            interval = metrics.median_ratio_interval(
                counts["cold"], counts["warm"], never=budget + 1
            )
            spread = "" if interval is None else f" [{interval[0]:.2f}, {interval[1]:.2f}]"
        cells.append(
            "-"
            if ratio is None
            else f"{ratio:.2f}{spread}" + ("" if cold is not None else " (cold >budget)")
        )
        lines.append("| " + " | ".join(cells) + " |")
    if source_runs > 1:
        rows = [((f"{p.source_name} → {p.target_name.split('/')[-1]}", m), p.label(m),
                 summaries[p.target]) for p in pairs for m in methods]  # fmt: skip
        header = ("source → target", "method")
        lines += ["", *by_source_run(rows, records, header, budget, source_runs)]
    return "\n".join(lines)


def by_source_run(
    rows: Sequence[tuple[tuple[str, ...], str, BenchDataset]],
    records: Sequence[RunRecord],
    header: Sequence[str],
    budget: int,
    source_runs: int,
) -> list[str]:
    """Evaluations to 98 % per source run, as markdown lines: for each row ``(cells, sampler
    label, target)``, the median over the target seeds that start from each run (seed s from
    run s mod N). One source run decides more than most options do (a pair can need 2
    evaluations from one run and 178 from another), and the median over all seeds hides
    which."""
    lines = [
        f"Evaluations to 98 % by source run (median of the seeds s with s mod {source_runs} = "
        f"run; '>{budget}': half of them or more never got there):",
        "",
        "| " + " | ".join([*header, *(f"run {k}" for k in range(source_runs))]) + " |",
        "|" + "---|" * len(header) + "---:|" * source_runs,
    ]
    for cells, label, data in rows:
        runs = [r for r in records if r.dataset == data.name and r.sampler == label]
        if not runs:
            continue
        counts = []
        for k in range(source_runs):
            mine = [r for r in runs if r.seed % source_runs == k]
            counts.append(_cell(_median_to(mine, data, 0.98), budget) if mine else "-")
        lines.append("| " + " | ".join([*cells, *counts]) + " |")
    return lines


def _rank_correlation(pair: Pair) -> float:
    """Spearman ρ of the objective between the two recordings over their common ok
    configurations: how much the source *can* tell about the target."""
    from scipy.stats import spearmanr

    from surrotune.backends.replay import load_dataset

    a, b = load_dataset(pair.source), load_dataset(pair.target)
    common = [(r.objective, b.results[k].objective) for k, r in a.results.items()
              if r.ok and k in b.results and b.results[k].ok]  # fmt: skip
    if len(common) < 3:
        return float("nan")
    x, y = zip(*common, strict=True)
    return float(spearmanr(x, y).statistic)
