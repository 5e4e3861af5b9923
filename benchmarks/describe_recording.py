"""Describe a surrotune recording the way docs/datasets.md does: size, failures by Status,
optimum, how far the median configuration is from it, noise, recorded cost, counters.

    python3 benchmarks/describe_recording.py experiments/datasets/reduction_h200.json.gz

Every number in docs/datasets.md comes from this script (or from the run that made the file).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from surrotune.backends.replay import Dataset, load_dataset
from surrotune.experiment import load_experiment


def _rate(dataset: Dataset, time_ms: float, config: dict) -> str:
    """The objective's rate (GB/s or GFLOP/s) from the recording's experiment, where known."""
    experiment = dataset.metadata.get("experiment")
    if not experiment:
        return ""
    path = (dataset.path.parent / experiment).resolve()
    if not path.is_file():
        return ""
    spec = load_experiment(path).objective
    rates = spec.rates(time_ms, {**dict(dataset.problem_size or {}), **config})
    return ", ".join(f"{value:,.1f} {unit}" for unit, value in rates.items())


def _kind(message: str) -> str:
    """A failure message with its numbers blanked: messages of one cause count together."""
    message = re.sub(r"0x[0-9a-fA-F]+|\d+", "N", message)
    return re.sub(r"\s+", " ", message).strip()[:100]


def describe(path: Path) -> str:
    dataset = load_dataset(path)
    results = list(dataset.results.values())
    ok = [r for r in results if r.ok]
    statuses = Counter(r.status.value for r in results)
    lines = [f"## `{path.name}`", "", "| | |", "|---|---|"]
    device = dataset.metadata.get("device") or {}
    arch = f"sm_{device.get('major', '?')}{device.get('minor', '?')}"
    lines.append(
        f"| device | {dataset.device_name} ({arch}, {device.get('multiProcessorCount')} SMs) |"
    )
    lines.append(f"| problem size | {dataset.problem_size} |")
    lines.append(f"| configurations | {len(results):,} ({len(dataset.constraints)} constraints) |")
    lines.append(f"| ok | {len(ok):,} |")
    for status, count in sorted(statuses.items()):
        if status == "ok":
            continue
        messages = Counter(
            _kind((r.error or "").splitlines()[0]) for r in results if r.status.value == status
        )
        top = "; ".join(f"{n}: {m!r}" for m, n in messages.most_common(2))
        lines.append(f"| {status} | {count:,} ({top}) |")
    if ok:
        values = np.array([r.objective for r in ok], dtype=float)
        best = (
            min(ok, key=lambda r: r.objective)
            if dataset.direction == "minimize"
            else max(ok, key=lambda r: r.objective)
        )
        config = " ".join(f"{k}={v}" for k, v in best.config.items())
        rate = _rate(dataset, float(best.objective), dict(best.config))
        lines.append(f"| optimum | {best.objective:.4f} ms ({rate}): {config} |")
        ratio = (
            values / best.objective if dataset.direction == "minimize" else best.objective / values
        )
        p10, p50, p90 = np.percentile(values, [10, 50, 90])
        lines.append(
            f"| median ok configuration | {p50:.4f} ms, {np.median(ratio):.2f}× the optimum "
            f"(10th percentile {p10:.4f} ms, 90th {p90:.4f} ms, worst {values.max():.4f} ms) |"
        )
        near = int(np.sum(1.0 / ratio >= 0.95))
        lines.append(f"| within 95 % of the optimum | {near} configuration(s) |")
        cvs = [np.std(r.times_ms) / np.mean(r.times_ms) for r in ok if len(r.times_ms) > 1]
        repeats = [len(r.times_ms) for r in ok]
        if cvs:
            lines.append(
                f"| noise | coefficient of variation of the repeats: median "
                f"{100 * np.median(cvs):.2f} %, 95th percentile "
                f"{100 * np.percentile(cvs, 95):.2f} %"
                f"; repeats per configuration {min(repeats)}–{max(repeats)} (median "
                f"{int(np.median(repeats))}) |"
            )
    compile_ms = [r.compile_time_ms for r in results if r.compile_time_ms]
    bench_ms = [r.benchmark_time_ms for r in results if r.benchmark_time_ms]
    if compile_ms:
        lines.append(
            f"| recorded cost | compile {sum(compile_ms) / 1e3:,.0f} s in all (median "
            f"{np.median(compile_ms) / 1e3:.2f} s a configuration, many in parallel), measurement "
            f"{sum(bench_ms) / 1e3:,.0f} s |"
        )
    with_counters = sum(1 for r in ok if r.counters)
    lines.append(f"| counters | {with_counters:,} of {len(ok):,} ok configurations |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recordings", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for path in args.recordings:
        print(describe(path))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
