"""Benchmark: the SurrogateSampler's time per suggestion as the study grows to thousands of trials.

Why: issue 3 asks for a median time per suggestion of at most 50 ms at 500 finished trials and
200 ms at 5,000, on 2 CPU cores. The sampler refits its models on a schedule (when the
observations grew by ``refit_growth``) and otherwise only reads the study and scores cached
predictions, so the cost of one suggestion is either "cheap" (reading the trials, one argmax over
the candidates) or "refit" (K boosted models and the classifier). Users see the median and the
tail; both are printed.

The loop is the one users run (:class:`surrotune.runner.Runner` over a replayed recording,
in-memory storage, batch size 1), with ``SurrogateSampler.sample_relative`` wrapped to time each
suggestion. Windows of suggestions around each reported study size give the median, the 90th
percentile and the largest value, and the share of suggestions that refitted.

    python benchmarks/bench_sampler_overhead.py [--dataset FILE] [--trials 5000] \
        [--sizes 500,5000] [--options "uncertainty='ensemble',explore_share=0.1"]

(with surrotune installed, or ``PYTHONPATH=.`` from the repository). The load average is printed:
on a busy machine the numbers are upper bounds.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import optuna

from surrotune.backends.replay import ReplayBackend
from surrotune.bench.harness import parse_options, prepare_dataset
from surrotune.runner import Runner
from surrotune.surrogate.sampler import SurrogateSampler

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATASET = ROOT / "experiments" / "datasets" / "gemm_h200.json.gz"


class TimedSampler(SurrogateSampler):
    """SurrogateSampler that records how long each ``sample_relative`` took and whether the
    models were refitted for it (the fit object changed)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.timings: list[tuple[int, float, bool]] = []  # (finished trials, seconds, refit)

    def sample_relative(self, study, trial, search_space):  # type: ignore[no-untyped-def]
        before = self._fit
        finished = trial.number  # batch size 1: every earlier trial is finished
        start = time.perf_counter()
        params = super().sample_relative(study, trial, search_space)
        self.timings.append((finished, time.perf_counter() - start, self._fit is not before))
        return params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=str(DEFAULT_DATASET))
    parser.add_argument("--trials", type=int, default=5000)
    parser.add_argument("--sizes", default="500,1000,2000,5000")
    parser.add_argument("--window", type=int, default=100, help="suggestions per reported size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--options", default="", help="sampler attributes as NAME=VALUE,... (Python literals)"
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    dataset, space, _, summary = prepare_dataset(args.dataset)
    sampler = TimedSampler(space=space, seed=args.seed)
    _, options = parse_options(f"options:{args.options}")
    for name, value in options:
        if not hasattr(sampler, name):
            parser.error(f"--options: SurrogateSampler has no option {name!r}")
        setattr(sampler, name, value)
    study = optuna.create_study(sampler=sampler, direction=dataset.direction)
    print(
        f"# {summary.name}: {len(dataset.results):,} configurations, {args.trials:,} trials; "
        f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
        f"options {dict(options) or 'default'}"
    )
    start = time.monotonic()
    Runner(
        study=study, space=space, backend=ReplayBackend(dataset), trials=args.trials,
        batch_size=1,
    ).run()  # fmt: skip
    wall = time.monotonic() - start
    timings = np.array([(n, s, r) for n, s, r in sampler.timings], dtype=np.float64)
    print(f"# wall {wall:.0f} s; load {os.getloadavg()[0]:.2f}\n")
    print("| finished trials | suggestions | median ms | p90 ms | max ms | refits |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        half = args.window // 2
        near = timings[(timings[:, 0] >= size - half) & (timings[:, 0] < size + half)]
        if len(near) == 0:
            continue
        ms = near[:, 1] * 1e3
        print(
            f"| {size:,} | {len(near)} | {np.median(ms):.1f} | {np.percentile(ms, 90):.1f} | "
            f"{ms.max():.0f} | {int(near[:, 2].sum())} |"
        )
    refit = timings[timings[:, 2] == 1]
    print(
        f"\nall {len(timings):,} suggestions: median {np.median(timings[:, 1]) * 1e3:.1f} ms; "
        f"{len(refit)} refits, the largest {refit[:, 1].max() * 1e3:.0f} ms"
        if len(refit)
        else ""
    )


if __name__ == "__main__":
    main()
