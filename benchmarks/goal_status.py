"""Issue 3's goal, dataset by dataset, from kept runs: ours against the best peer, with intervals.

    python3 benchmarks/goal_status.py RUNS.jsonl[.gz]... --datasets FILE... --ours LABEL \
        [--peers "random,tpe,tpe-multivariate,tpe-independent,optuna-gp,kt:*"] [--seeds 0-19] \
        [--issue-best NAME=EVALS...]

The goal (median evaluations to 98 % of the optimum at most half the best peer's, at most 10
where the best peer needs 20 or fewer; a methodology score above every peer's) compares two
medians of twenty heavy-tailed counts. Beside each median this prints its distribution-free
95 % interval (`surrotune.bench.metrics.median_interval`), and says whether the intervals
decide the comparison: "met" or "missed" by the medians, as the issue counts, and "clearly"
where our whole interval lies on that side of the bound (the bound taken from the best peer's
median), "within noise" where it straddles it. The best peer is the one with the fewest median
evaluations; the score is compared with every peer's mean score. ``--issue-best`` adds the
issue's own best-peer medians (its table: 10 seeds, another machine): the stricter bound
applies. Runs come from any mix of `surrotune bench` and `benchmarks/sampler_variants.py` files
(the last record of a (sampler, dataset, seed) wins). A median reads as the bench table's
(`surrotune.bench.report.median_to_reach`): beyond the budget once half the seeds or more never
got there.
"""

from __future__ import annotations

import argparse
import fnmatch
import statistics
from collections import defaultdict
from pathlib import Path

from compare_runs import parse_seeds, read_runs

from surrotune.bench import metrics, report
from surrotune.bench.harness import prepare_dataset
from surrotune.bench.report import interval_text

TARGET = 0.98


def goal_bound(best_peer: float) -> float:
    """The most evaluations the goal allows, given the best peer's median."""
    return 10.0 if best_peer <= 20 else best_peer / 2


def verdict(ours: float, interval: tuple[float | None, float | None] | None, bound: float) -> str:
    """"met"/"missed" by the median, "clearly" where the whole interval agrees."""
    met = ours <= bound
    if interval is None:
        return "met" if met else "missed"
    low, high = interval
    if met and high is not None and high <= bound:
        return "met clearly"
    if not met and low is not None and low > bound:
        return "missed clearly"
    return ("met" if met else "missed") + ", within noise"


def _cell(median: float, interval: tuple[float | None, float | None] | None, budget: int) -> str:
    shown = f">{budget}" if median > budget else f"{median:g}"
    return shown + interval_text(interval, budget)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--ours", required=True)
    parser.add_argument(
        "--peers", default="random,tpe,tpe-multivariate,tpe-independent,optuna-gp,kt:*"
    )
    parser.add_argument("--seeds", default="0-19")
    parser.add_argument("--issue-best", nargs="*", default=[], metavar="NAME=EVALS")
    args = parser.parse_args(argv)
    issue_best = {k: float(v) for k, _, v in (item.partition("=") for item in args.issue_best)}
    seeds = parse_seeds(args.seeds)
    patterns = [p for p in args.peers.split(",") if p]
    info = {}
    for path in args.datasets:
        bench = prepare_dataset(path)[3]
        info[bench.name] = bench
    counts: dict[tuple[str, str], dict[int, int | None]] = defaultdict(dict)
    scores: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    budgets: dict[str, int] = {}
    for path in args.runs:
        for run in read_runs(path):
            bench = info.get(run.dataset)
            if bench is None or run.seed not in seeds or run.stop_reason == "error":
                continue
            is_peer = any(fnmatch.fnmatchcase(run.sampler, p) for p in patterns)
            if run.sampler != args.ours and not is_peer:
                continue
            budgets[run.dataset] = run.budget
            counts[run.dataset, run.sampler][run.seed] = metrics.evaluations_to_reach(
                run.values, bench.optimum, bench.direction, TARGET
            )
            scores[run.dataset, run.sampler][run.seed] = metrics.methodology_score(
                run.values, bench.feasible, bench.direction, run.budget
            )
    print(f"| dataset | {args.ours}: to 98 % [95 % interval] | best peer | its median "
          "[interval] | goal | verdict | score: ours, best peer's |")  # fmt: skip
    print("|---|---:|---|---:|---:|---|---|")
    for name in info:
        budget = budgets.get(name, 200)

        def median(sampler: str, name: str = name, budget: int = budget) -> float:
            """The bench table's median (beyond the budget once half the seeds never got
            there), as a number to compare: budget + 1 for beyond."""
            found = report.median_to_reach(list(counts[name, sampler].values()))
            return float(budget + 1) if found is None else found

        peers = sorted(s for d, s in counts if d == name and s != args.ours)
        if (name, args.ours) not in counts or not peers:
            print(f"| {name} | missing runs | | | | | |")
            continue
        best = min(peers, key=median)
        ours_interval = metrics.median_interval(list(counts[name, args.ours].values()))
        peer_interval = metrics.median_interval(list(counts[name, best].values()))
        bound = goal_bound(median(best))
        label = best
        if name in issue_best and goal_bound(issue_best[name]) < bound:
            label = f"{best} (the issue's: {issue_best[name]:g})"
            bound = goal_bound(issue_best[name])
        our_score = statistics.mean(scores[name, args.ours].values())
        best_score_peer = max(peers, key=lambda s: statistics.mean(scores[name, s].values()))
        peer_score = statistics.mean(scores[name, best_score_peer].values())
        print(
            f"| {name} | {_cell(median(args.ours), ours_interval, budget)} | {label} | "
            f"{_cell(median(best), peer_interval, budget)} | ≤ {bound:g} | "
            f"{verdict(median(args.ours), ours_interval, bound)} | {our_score:.2f}, "
            f"{peer_score:.2f} ({best_score_peer}){' above' if our_score > peer_score else ''} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
