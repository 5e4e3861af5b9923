"""The ``surrotune`` command: parse arguments, call the library, print.

Exit codes: 0 success, 2 bad input (experiment file, dataset, storage, arguments), 130 when a run
was interrupted (its finished trials are stored; the same command resumes it).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import optuna

from surrotune import bench, session
from surrotune.errors import SurrotuneError
from surrotune.experiment import SAMPLERS, parse_duration

__all__ = ["main"]


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="surrotune",
        description="GPU kernel auto-tuning with a sampler that learns from every trial.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="tune a kernel (or replay a recorded dataset)")
    run.add_argument("experiment", nargs="?", type=Path, help="experiment file (.toml)")
    run.add_argument("--trials", type=int, help="total evaluations the study should hold")
    run.add_argument("--timeout", type=_duration, help="wall-clock limit, e.g. 90s, 30m, 2h")
    run.add_argument("--sampler", choices=SAMPLERS, help="search strategy")
    run.add_argument("--seed", type=int, help="sampler seed")
    run.add_argument("--storage", help="Optuna storage URL or path (.db SQLite, .log journal)")
    run.add_argument("--study", help="study name")
    run.add_argument("--backend", choices=("cuda", "replay"), help="evaluation backend")
    run.add_argument("--dataset", type=Path, help="recording to replay (.json/.json.gz)")
    run.add_argument("--batch-size", type=int, help="configurations evaluated together")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")

    show = commands.add_parser("show", help="print the best configurations of a stored study")
    show.add_argument("storage", help="Optuna storage URL or path")
    show.add_argument("--study", help="study name (needed when the storage holds several)")
    show.add_argument("--top", type=int, default=10, help="how many configurations")

    bench_parser = commands.add_parser(
        "bench", help="compare samplers on recorded datasets (replay, many seeds)"
    )
    bench.add_arguments(bench_parser)

    export = commands.add_parser("export", help="write a stored study as a replayable recording")
    export.add_argument("storage", help="Optuna storage URL or path")
    export.add_argument("--study", help="study name (needed when the storage holds several)")
    export.add_argument(
        "--format", choices=("recording",), default="recording",
        help="recording: surrotune's own format, replayable with --dataset",
    )  # fmt: skip
    export.add_argument("-o", "--output", type=Path, required=True, help="file (.json[.gz])")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "export":
            return _export(args)
        if args.command == "bench":
            return bench.run(args)
        return _show(args)
    except SurrotuneError as exc:
        print(f"surrotune: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.experiment is None and args.dataset is None:
        raise session.SetupError(
            "give an experiment file, or --dataset FILE to replay a recording"
        )
    if args.trials is not None and args.trials < 1:
        raise session.SetupError(f"--trials must be at least 1, got {args.trials}")
    overrides = {
        "trials": args.trials,
        "timeout_s": args.timeout,
        "sampler": args.sampler,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "backend": args.backend,
        "dataset": args.dataset.resolve() if args.dataset else None,
        "url": args.storage,
        "study": args.study,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    tuning = session.prepare(args.experiment, overrides)
    print(tuning.describe())
    summary = tuning.run(progress=not args.no_progress)
    print(session.format_summary(tuning, summary))
    return 130 if summary.interrupted else 0


def _export(args: argparse.Namespace) -> int:
    from surrotune.analysis.export import export_recording

    study = session.load_study(args.storage, args.study)
    count = export_recording(study, args.output)
    print(f"wrote {count} configurations of study '{study.study_name}' to {args.output}")
    return 0


def _show(args: argparse.Namespace) -> int:
    print(session.format_study(args.storage, args.study, top=args.top))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
