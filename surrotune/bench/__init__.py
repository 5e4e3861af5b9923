"""``surrotune bench``: search quality of samplers and Kernel Tuner strategies on recorded data.

The command replays brute-forced datasets through each sampler over many seeds and reports, per
dataset and sampler, the fraction of the optimum reached after 25/50/100/200 evaluations, the
evaluations needed to reach 95/98/100 % of it and the methodology score of Willemsen et al. (FGCS
2024) against the exact expectation of random search. The parts:

- :mod:`surrotune.bench.metrics`: pure functions over evaluation sequences;
- :mod:`surrotune.bench.harness`: the runs (:func:`run_bench`), in worker processes;
- :mod:`surrotune.bench.kernel_tuner`: Kernel Tuner's strategies in its simulation mode;
- :mod:`surrotune.bench.report`: tables, ``runs.jsonl`` and convergence plots;
- :mod:`surrotune.bench.transfer`: ``--warm-start SOURCE TARGET``, warm start against cold start
  and the enqueue baseline on pairs of recordings.

The CLI wires :func:`add_arguments` and :func:`run` in as the ``bench`` subcommand.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from surrotune.bench.harness import ABLATIONS, BenchError, BenchResult, run_bench

__all__ = ["ABLATIONS", "BenchError", "BenchResult", "add_arguments", "main", "run", "run_bench"]

_DEFAULT_SAMPLERS = "random,tpe"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    from surrotune.experiment import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` subcommand's options, on a parser the CLI made."""
    parser.add_argument(
        "--datasets", nargs="+", type=Path, metavar="FILE",
        help="recordings to replay (Kernel Tuner caches, T4 files, surrotune recordings)",
    )  # fmt: skip
    parser.add_argument(
        "--warm-start", nargs=2, action="append", type=Path, metavar=("SOURCE", "TARGET"),
        help="instead of --datasets: a pair of recordings of one kernel; the source's model "
        "warm-starts the target, against a cold start and the enqueue baseline (repeat for "
        "several pairs; docs/transfer.md)",
    )  # fmt: skip
    parser.add_argument(
        "--source-budget", default="200", metavar="N|full",
        help="with --warm-start: the source model is fitted on a surrogate run of N evaluations "
        "on the source recording, or on the full recording (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--source-runs", type=_positive, default=1, metavar="N",
        help="with --warm-start: fit N source models on N source runs (seeds 0 to N-1); the "
        "target's seed s starts from run s mod N, so the medians cover several source runs "
        "(default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--methods", default="cold,warm,enqueue,enqueue-tpe",
        help="with --warm-start: which of cold, warm, enqueue, enqueue-tpe (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--enqueue-top", type=_positive, default=10,
        help="with --warm-start: the enqueue baseline's number of source configurations",
    )  # fmt: skip
    parser.add_argument(
        "--transfer-mode", choices=("prior", "stack", "residual", "feature"), default="prior",
        help="with --warm-start: how the source model enters the target's (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--launch-features", action="store_true",
        help="with --warm-start: the source runs, their models and every surrogate run learn "
        "the launch geometry (blocks, waves) of recordings whose experiment file is at hand",
    )  # fmt: skip
    parser.add_argument(
        "--samplers", default=_DEFAULT_SAMPLERS,
        help="comma-separated: random, tpe, tpe-multivariate, tpe-independent, gp, surrogate, "
        "brute-force, kt:<strategy> "
        "(e.g. kt:genetic_algorithm; kt:all for the eight compared in issue 3); "
        "default %(default)s",
    )  # fmt: skip
    parser.add_argument("--budget", type=_positive, default=200, help="evaluations per run")
    parser.add_argument("--seeds", type=_positive, default=20, help="runs per sampler (0..N-1)")
    parser.add_argument(
        "-o", "--output", type=Path, default=Path("bench-results"),
        help="directory for bench.md, runs.jsonl and the plots (default %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--jobs", type=_positive, default=None,
        help="worker processes (default: the number of CPU cores)",
    )  # fmt: skip
    parser.add_argument(
        "--run-timeout", type=_seconds, default=600.0, metavar="DURATION",
        help="wall-clock limit of one run, e.g. 90s, 10m (default 10m)",
    )  # fmt: skip
    parser.add_argument(
        "--batch-size", type=_positive, default=1,
        help="configurations asked and evaluated together by the runner (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--ablate", default="",
        help=f"surrogate parts to switch off, each run as a variant: {', '.join(ABLATIONS)}",
    )  # fmt: skip
    parser.add_argument("--no-plots", action="store_true", help="skip the convergence plots")
    parser.add_argument(
        "--resume", action="store_true",
        help="keep the runs already in OUTPUT/runs.jsonl that this command would repeat (same "
        "sampler, dataset, seed and budget) and run only the others",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run the benchmark the arguments describe; print the table. 0, or 130 if interrupted.

    Raises BenchError (a SurrotuneError) for bad input; the CLI prints it and exits 2.
    """
    if args.warm_start:
        return _run_transfer(args)
    if not args.datasets:
        raise BenchError("give --datasets FILE ... (or --warm-start SOURCE TARGET)")
    ablate = [a.strip() for a in (args.ablate or "").split(",") if a.strip()]
    result = run_bench(
        [str(p) for p in args.datasets],
        args.samplers,
        args.budget,
        args.seeds,
        args.output,
        jobs=args.jobs,
        time_limit_s=args.run_timeout,
        batch_size=args.batch_size,
        ablate=ablate,
        command=_command_line(),
        plots=not args.no_plots,
        resume=args.resume,
    )
    print(result.markdown.rstrip())
    print(f"\nwrote {args.output / 'bench.md'}, {args.output / 'runs.jsonl'}")
    return 130 if result.interrupted else 0


def _run_transfer(args: argparse.Namespace) -> int:
    from surrotune.bench.transfer import run_transfer_bench

    if args.source_budget == "full":
        source_budget = None
    else:
        try:
            source_budget = _positive(args.source_budget)
        except argparse.ArgumentTypeError as exc:
            raise BenchError(f"--source-budget: {exc} (or 'full')") from None
    text, _ = run_transfer_bench(
        [(s, t) for s, t in args.warm_start],
        args.budget,
        args.seeds,
        args.output,
        methods=[m.strip() for m in args.methods.split(",") if m.strip()],
        source_budget=source_budget,
        source_runs=args.source_runs,
        enqueue_top=args.enqueue_top,
        transfer_mode=args.transfer_mode,
        jobs=args.jobs or 1,
        time_limit_s=args.run_timeout,
        command=_command_line(),
        plots=not args.no_plots,
        resume=args.resume,
        launch_features=args.launch_features,
    )
    print(text)
    print(f"\nwrote {args.output / 'transfer.md'}, {args.output / 'runs.jsonl'}")
    return 0


def _command_line() -> str:
    """The command as typed, for the report (``surrotune bench ...`` or via :func:`main`)."""
    args = sys.argv[1:]
    if args[:1] == ["bench"]:
        args = args[1:]
    return "surrotune bench " + shlex.join(args)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m surrotune.bench ...``: the subcommand on its own, until the CLI wires it in."""
    import warnings

    import optuna

    from surrotune.errors import SurrotuneError

    parser = argparse.ArgumentParser(prog="surrotune bench", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        return run(args)
    except SurrotuneError as exc:
        print(f"surrotune: error: {exc}", file=sys.stderr)
        return 2
