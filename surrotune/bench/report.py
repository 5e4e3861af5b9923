"""The benchmark's report: a markdown table per dataset, raw runs, and convergence plots.

Per dataset and sampler, over the seeds:

- the fraction of the optimum after 25, 50, 100 and 200 evaluations (those within the budget, and
  the budget itself): the *median* over seeds; a run that ended early keeps its last value;
- the evaluations needed to reach 95 %, 98 % and 100 % of the optimum: the *median* over seeds,
  a run that never got there counting as infinite, so the cell reads ``>budget`` when half of the
  seeds or more did not get there; for 98 % (the goal's target) with a distribution-free 95 %
  confidence interval of that median in brackets (:func:`surrotune.bench.metrics.median_interval`),
  because twenty heavy-tailed counts place a median less exactly than its one number suggests;
- the methodology score P (:func:`surrotune.bench.metrics.methodology_score`): the *mean* over
  seeds and the standard deviation over seeds;
- random search's exact expectation as its own row: its expected fraction at each checkpoint; the
  exact *median* evaluations it needs to reach each target (``>budget`` beyond the budget), to
  set beside the samplers' medians, with the exact mean ``(N + 1) / (K + 1)`` in parentheses; and
  a score of 0 by definition.

Runs that ended before the budget are counted in the ``runs`` column by reason (``DNF``: the time
limit; ``stalled``: the runner gave up on a sampler that kept proposing configurations already
measured or outside the constraints; ``ended early``: a Kernel Tuner strategy stopped by itself)
and enter the statistics with what they evaluated, their last best value held to the budget;
runs that raised are left out and counted apart.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from surrotune.bench import metrics
from surrotune.bench.harness import BenchDataset, BenchResult, RunRecord

__all__ = [
    "CHECKPOINTS",
    "INTERVAL_TARGET",
    "RANDOM_EXPECTATION",
    "TARGETS",
    "Row",
    "checkpoints",
    "format_markdown",
    "interval_text",
    "load_runs",
    "median_to_reach",
    "plot_convergence",
    "summarise",
    "write_report",
]

CHECKPOINTS = (25, 50, 100, 200)
TARGETS = (0.95, 0.98, 1.0)
#: the target whose median gets a confidence interval in the table
INTERVAL_TARGET = 0.98
RANDOM_EXPECTATION = "random (exact expectation)"


@dataclass(frozen=True)
class Row:
    """One line of a dataset's table."""

    dataset: str
    sampler: str
    runs: int
    short: dict[str, int]  # why runs ended before the budget -> how many ("DNF", "stalled" ...)
    errors: int
    fractions: dict[int, float]
    to_reach: dict[float, float | None]
    score: float | None
    score_sd: float | None
    wall_s: float | None
    expected_to_reach: dict[float, float] | None = None  # only on the random-expectation row
    #: target -> the 95 % interval of the median (None: unbounded within the budget); a target
    #: is missing where too few runs give one
    reach_interval: dict[float, tuple[float | None, float | None]] | None = None


def checkpoints(budget: int) -> list[int]:
    """The checkpoints within the budget, and the budget itself."""
    points = [c for c in CHECKPOINTS if c <= budget]
    return points if budget in points else [*points, budget]


def interval_text(interval: tuple[float | None, float | None] | None, budget: int) -> str:
    """`` [low, high]`` for an interval of evaluation counts (an unbounded end as
    ``>budget``), or "" where there is none: the one spelling of the tables' intervals."""
    if interval is None:
        return ""
    low, high = (f"{v:g}" if v is not None else f">{budget}" for v in interval)
    return f" [{low}, {high}]"


def median_to_reach(counts: Sequence[int | None]) -> float | None:
    """Median with 'never' as infinity; None when half or more of the runs never got there."""
    never = sum(c is None for c in counts)
    if not counts or 2 * never >= len(counts):
        return None
    return float(np.median([math.inf if c is None else c for c in counts]))


def summarise(result: BenchResult) -> list[Row]:
    """The rows of every dataset's table: each sampler in order, then random's expectation."""
    rows: list[Row] = []
    points = checkpoints(result.budget)
    for data in result.datasets:
        for sampler in result.samplers:
            runs = [r for r in result.records if r.dataset == data.name and r.sampler == sampler]
            rows.append(_row(data, sampler, runs, result.budget, points))
        rows.append(_random_row(data, result.budget, points))
    return rows


def _row(
    data: BenchDataset, sampler: str, runs: list[RunRecord], budget: int, points: list[int]
) -> Row:
    good = [r for r in runs if r.stop_reason != "error"]
    errors = len(runs) - len(good)
    if not good:
        return Row(data.name, sampler, len(runs), {}, errors, {}, {}, None, None, None)
    curves = np.array(
        [metrics.fraction_curve(r.values, data.optimum, data.direction, budget) for r in good]
    )
    fractions = {p: float(np.median(curves[:, p - 1])) for p in points}
    counts = {
        t: [metrics.evaluations_to_reach(r.values, data.optimum, data.direction, t) for r in good]
        for t in TARGETS
    }
    to_reach = {t: median_to_reach(c) for t, c in counts.items()}
    intervals = {t: metrics.median_interval(c) for t, c in counts.items()}
    baseline = metrics.random_expected_best(data.feasible, data.direction, budget)
    scores = [
        metrics.methodology_score(
            r.values, data.feasible, data.direction, budget, baseline=baseline
        )
        for r in good
    ]
    return Row(
        dataset=data.name,
        sampler=sampler,
        runs=len(runs),
        short=_short_runs(good),
        errors=errors,
        fractions=fractions,
        to_reach=to_reach,
        score=float(np.mean(scores)),
        score_sd=statistics.stdev(scores) if len(scores) > 1 else 0.0,
        wall_s=float(np.mean([r.wall_s for r in good])),
        reach_interval={t: i for t, i in intervals.items() if i is not None},
    )


#: why a run ended before its budget, as the runs column says it
_SHORT = {"timeout": "DNF", "stalled": "stalled", "strategy ended": "ended early"}


def _short_runs(runs: Sequence[RunRecord]) -> dict[str, int]:
    """Runs that ended before the budget, by reason; a space run out of is not short."""
    counts: dict[str, int] = {}
    for r in runs:
        if r.evaluations < r.budget and r.stop_reason != "exhausted":
            why = _SHORT.get(r.stop_reason, r.stop_reason)
            counts[why] = counts.get(why, 0) + 1
    return counts


def _random_row(data: BenchDataset, budget: int, points: list[int]) -> Row:
    expected = metrics.random_expected_fraction(data.feasible, data.direction, budget)
    means = {
        t: metrics.random_expected_evaluations_to_reach(data.feasible, data.direction, t)
        for t in TARGETS
    }
    medians = {
        t: metrics.random_median_evaluations_to_reach(data.feasible, data.direction, t)
        for t in TARGETS
    }
    return Row(
        dataset=data.name,
        sampler=RANDOM_EXPECTATION,
        runs=0,
        short={},
        errors=0,
        fractions={p: float(expected[p - 1]) for p in points},
        to_reach={t: (float(m) if m <= budget else None) for t, m in medians.items()},
        score=0.0,
        score_sd=None,
        wall_s=None,
        expected_to_reach=means,
    )


# ---------------------------------------------------------------------------- markdown


def _reach_cell(row: Row, target: float, budget: int) -> str:
    value = row.to_reach.get(target)
    if row.expected_to_reach is not None:
        mean = row.expected_to_reach[target]
        shown = f"{value:g}" if value is not None else f">{budget}"
        return f"{shown} (mean {mean:,.1f})"
    shown = (f">{budget}" if row.fractions else "-") if value is None else f"{value:g}"
    if target == INTERVAL_TARGET:
        shown += interval_text((row.reach_interval or {}).get(target), budget)
    return shown


def _runs_cell(row: Row) -> str:
    if row.sampler == RANDOM_EXPECTATION:
        return "exact"
    extra = []
    extra += [f"{count} {why}" for why, count in row.short.items()]
    if row.errors:
        extra.append(f"{row.errors} errors")
    return f"{row.runs}" + (f" ({', '.join(extra)})" if extra else "")


def format_markdown(result: BenchResult, rows: Sequence[Row] | None = None) -> str:
    """The report as markdown: settings, one table per dataset, notes."""
    rows = list(rows) if rows is not None else summarise(result)
    points = checkpoints(result.budget)
    settings = result.settings
    lines = ["# surrotune bench", ""]
    if settings.get("command"):
        lines += [f"`{settings['command']}`", ""]
    lines += [
        f"Budget {result.budget} evaluations, {len(result.seeds)} seeds "
        f"({result.seeds[0]}..{result.seeds[-1]}), batch size {settings.get('batch_size', 1)}, "
        f"{settings.get('jobs', 1)} worker processes, run limit "
        f"{settings.get('time_limit_s', 0):g} s; wall time {_duration(result.wall_s)}"
        + (" (interrupted)" if result.interrupted else "")
        + ".",
        "",
        "Fractions of the optimum: median over seeds. Evaluations to a target: median over seeds "
        f"('>{result.budget}' when half the seeds or more never got there); to 98 %, with a "
        "distribution-free 95 % confidence interval of the median in brackets (order "
        "statistics; none under 6 seeds). Score: the "
        "methodology score P of Willemsen et al. (FGCS 2024) over evaluations 1..budget against "
        "the exact expectation of random search without replacement, mean ± standard deviation "
        "over seeds (0 = random search, 1 = the optimum from the first evaluation). A failure "
        "costs one evaluation; a configuration outside the known constraints or already "
        "measured costs none.",
        "",
    ]
    for data in result.datasets:
        direction = "smaller is better" if data.direction == "minimize" else "larger is better"
        lines += [
            f"## {data.name}",
            "",
            f"{len(data.feasible):,} feasible configurations ({data.failures:,} fail), optimum "
            f"{data.optimum:.6g} ({direction}); known constraints from {data.constraints_from}.",
            "",
        ]
        header = (
            ["sampler", "runs"]
            + [f"@{p}" for p in points]
            + [f"to {round(100 * t)} %" for t in TARGETS]
            + ["score", "s/run"]
        )
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|---|---|" + "---:|" * (len(header) - 2))
        for row in (r for r in rows if r.dataset == data.name):
            cells = [row.sampler, _runs_cell(row)]
            cells += [f"{100 * row.fractions[p]:.1f} %" if row.fractions else "-" for p in points]
            cells += [_reach_cell(row, t, result.budget) for t in TARGETS]
            if row.score is None:
                cells.append("-")
            elif row.score_sd is None:
                cells.append(f"{row.score:.2f}")
            else:
                cells.append(f"{row.score:.2f} ± {row.score_sd:.2f}")
            cells.append("-" if row.wall_s is None else f"{row.wall_s:.1f}")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    notes = list(result.notes)
    for record in result.records:
        if record.stop_reason == "error":
            notes.append(f"{record.sampler} on {record.dataset} seed {record.seed}: {record.note}")
    unfinished = [r for r in result.records if r.note and r.stop_reason != "error"]
    if unfinished:
        by_kind: dict[tuple[str, str], list[str]] = {}
        for r in unfinished:
            by_kind.setdefault((r.sampler, r.dataset), []).append(f"seed {r.seed}: {r.note}")
        for (sampler, name), items in by_kind.items():
            shown = "; ".join(items[:3]) + (
                f"; and {len(items) - 3} more" if len(items) > 3 else ""
            )
            notes.append(f"{sampler} on {name}: {shown}")
    if notes:
        lines += ["Notes:", ""] + [f"- {note}" for note in notes] + [""]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


# ---------------------------------------------------------------------------- files


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _curves(result: BenchResult, data: BenchDataset, sampler: str) -> np.ndarray | None:
    """Fraction-of-optimum curves (seeds x budget) of a sampler's runs that did not raise."""
    runs = [
        r
        for r in result.records
        if r.dataset == data.name and r.sampler == sampler and r.stop_reason != "error"
    ]
    if not runs:
        return None
    return np.array(
        [
            metrics.fraction_curve(r.values, data.optimum, data.direction, result.budget)
            for r in runs
        ]
    )


def plot_convergence(result: BenchResult, data: BenchDataset, path: Path) -> None:
    """Median fraction of the optimum per evaluation, per sampler, and random's expectation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budget = result.budget
    x = np.arange(1, budget + 1)
    styles = ("-", "--", "-.", ":")  # ten colours per style: samplers stay distinguishable
    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        lowest = 1.0
        for i, sampler in enumerate(result.samplers):
            curves = _curves(result, data, sampler)
            if curves is None:
                continue
            median = np.median(curves, axis=0)
            lowest = min(lowest, float(median[min(budget, 10) - 1]))
            style = styles[(i // 10) % len(styles)]
            ax.plot(x, median, style, label=sampler, linewidth=1.5)
        expected = metrics.random_expected_fraction(data.feasible, data.direction, budget)
        lowest = min(lowest, float(expected[0]))
        ax.plot(x, expected, "k--", label="random search (exact expectation)", linewidth=1.2)
        ax.set_xlabel("evaluations")
        ax.set_ylabel("fraction of the optimum (median over seeds)")
        ax.set_title(f"{data.name}: {len(result.seeds)} seeds, budget {budget}")
        ax.set_xlim(1, budget)
        # zoom in where every curve starts high (flat spaces): the differences are at the top
        ax.set_ylim(max(0.0, np.floor(20 * lowest) / 20 - 0.05), 1.005)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def write_report(result: BenchResult, out_dir: str | Path, *, plots: bool = True) -> str:
    """Write ``bench.md`` (and the plots) into ``out_dir``; return the markdown.

    ``runs.jsonl`` is written by the harness as the runs finish, so that an interrupted benchmark
    keeps every finished run.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = format_markdown(result)
    images = []
    if plots:
        for data in result.datasets:
            name = f"convergence_{_slug(data.name)}.png"
            plot_convergence(result, data, out / name)
            images.append(f"![{data.name}]({name})")
    body = text + ("\n" + "\n\n".join(images) + "\n" if images else "")
    (out / "bench.md").write_text(body)
    return text


def load_runs(path: str | Path) -> list[RunRecord]:
    """The records of a ``runs.jsonl``, to report again without running again."""
    lines = Path(path).read_text().splitlines()
    return [RunRecord.from_json(line) for line in lines if line.strip()]
