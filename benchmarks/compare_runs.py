"""Per-seed evaluations to a fraction of the optimum, for runs kept by `surrotune bench`.

    python3 benchmarks/compare_runs.py RUNS.jsonl[.gz]... --datasets FILE... [--seeds 0-9] \
        [--target 0.98] [--samplers a,b]

Screening a sampler option at 10 seeds against the default's 20-seed runs in docs/bench/ needs
the same seeds side by side: this prints, per dataset and sampler, the evaluations to the target
on each seed (201 where a run never got there: budget + 1), their median with its
distribution-free 95 % interval (`surrotune.bench.metrics.median_interval`; ">" where it is
unbounded within the budget, "-" under 6 seeds) and how many seeds got there, and the mean
methodology score of those seeds' runs, from any mix of runs files (the default's kept runs, a
variant's new ones).

``--paired A,B`` adds, per dataset, the seeds both samplers ran side by side: on how many B
needs fewer evaluations than A, as many, more; the Wilcoxon signed-rank test's two-sided p of
those differences (``scipy.stats.wilcoxon``, zero differences dropped); and the mean of B's
score minus A's over the same seeds. The same seed starts both from the same design, so the
pairs see a change that two medians of heavy-tailed counts hide; a last line pools every
dataset's score differences (their mean, and on how many datasets B's is higher).
"""

from __future__ import annotations

import argparse
import gzip
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from surrotune.bench import metrics
from surrotune.bench.harness import RunRecord, prepare_dataset


def read_runs(path: Path) -> list[RunRecord]:
    """The records of a ``runs.jsonl`` (gzipped or not), as `surrotune bench` reads them."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return [RunRecord.from_json(line) for line in handle if line.strip()]


def parse_seeds(text: str) -> set[int]:
    seeds: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds.update(range(int(low), int(high or low) + 1))
    return seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--seeds", default="0-19")
    parser.add_argument("--target", type=float, default=0.98)
    parser.add_argument("--samplers", default="")
    parser.add_argument("--paired", default="", metavar="A,B")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    wanted = set(filter(None, args.samplers.split(",")))
    info = {}
    for path in args.datasets:
        bench = prepare_dataset(path)[3]
        info[bench.name] = bench
    table: dict[tuple[str, str], dict[int, tuple[int, bool]]] = defaultdict(dict)
    scores: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    baselines: dict[tuple[str, int], np.ndarray] = {}  # random search's curve, per budget
    for path in args.runs:
        for run in read_runs(path):
            bench = info.get(run.dataset)
            if bench is None or run.seed not in seeds or run.stop_reason == "error":
                continue  # an errored run is left out, as bench.md leaves it out
            if wanted and run.sampler not in wanted:
                continue
            reached = metrics.evaluations_to_reach(
                run.values, bench.optimum, bench.direction, args.target
            )
            table[run.dataset, run.sampler][run.seed] = (
                (reached, True) if reached is not None else (run.budget + 1, False)
            )
            if (run.dataset, run.budget) not in baselines:
                baselines[run.dataset, run.budget] = metrics.random_expected_best(
                    bench.feasible, bench.direction, run.budget
                )
            baseline = baselines[run.dataset, run.budget]
            scores[run.dataset, run.sampler][run.seed] = metrics.methodology_score(
                run.values, bench.feasible, bench.direction, run.budget, baseline=baseline
            )
    print(f"evaluations to {args.target:.0%} of the optimum, seeds {args.seeds}")
    print(f"{'dataset':28} {'sampler':28} {'median':>7} {'95 % interval':>13} {'hit':>6} "
          f"{'score':>6}  per seed")  # fmt: skip
    for (dataset, sampler), runs in sorted(table.items()):
        values = [runs[s][0] for s in sorted(runs)]
        hit = sum(runs[s][1] for s in runs)
        score = statistics.mean(scores[dataset, sampler].values())
        interval = metrics.median_interval([runs[s][0] if runs[s][1] else None for s in runs])
        shown = "-" if interval is None else "[{}, {}]".format(
            *(f"{v:g}" if v is not None else ">" for v in interval)
        )
        print(f"{dataset:28} {sampler:28} {statistics.median(values):7.1f} {shown:>13} "
              f"{hit:3}/{len(values):<2} {score:6.2f}  {' '.join(map(str, values))}")  # fmt: skip
    if args.paired:
        first, second = args.paired.split(",")
        print("\n".join(paired_lines(table, scores, first, second)))
    return 0


def paired_lines(
    table: dict[tuple[str, str], dict[int, tuple[int, bool]]],
    scores: dict[tuple[str, str], dict[int, float]],
    first: str,
    second: str,
) -> list[str]:
    """The ``--paired`` report: per dataset, ``second`` against ``first`` on their common
    seeds (fewer / same / more evaluations, Wilcoxon p, mean score difference), then the
    score differences pooled over the datasets."""
    from scipy.stats import wilcoxon

    lines = [f"\npaired, {second} against {first} on the seeds both ran",
             f"{'dataset':28} {'seeds':>5} {'fewer':>5} {'same':>5} {'more':>5} "
             f"{'wilcoxon p':>10} {'score diff':>10}"]  # fmt: skip
    diffs: list[float] = []
    for dataset in sorted({d for d, _ in table}):
        a, b = table.get((dataset, first)), table.get((dataset, second))
        if not a or not b:
            continue
        common = sorted(set(a) & set(b))
        delta = np.array([b[s][0] - a[s][0] for s in common], dtype=float)
        p = wilcoxon(delta).pvalue if np.count_nonzero(delta) else 1.0
        score = float(np.mean([scores[dataset, second][s] - scores[dataset, first][s]
                               for s in common]))  # fmt: skip
        diffs.append(score)
        lines.append(f"{dataset:28} {len(common):5} {int((delta < 0).sum()):5} "
                     f"{int((delta == 0).sum()):5} {int((delta > 0).sum()):5} {p:10.3f} "
                     f"{score:+10.3f}")  # fmt: skip
    if diffs:
        higher = sum(d > 0 for d in diffs)
        lines.append(f"score difference over {len(diffs)} datasets: mean {np.mean(diffs):+.3f}, "
                     f"{second} higher on {higher}")  # fmt: skip
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
