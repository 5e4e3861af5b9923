"""The ``surrotune`` command: parse arguments, call the library, print.

Exit codes: 0 success, 2 bad input (experiment file, dataset, storage, arguments), 130 when a run
was interrupted (its finished trials are stored; the same command resumes it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna

from surrotune import bench, models, session, workers
from surrotune.analysis import commands as analysis_commands
from surrotune.backends.sanitize import MODES
from surrotune.counters.policy import CountersMode
from surrotune.errors import SurrotuneError
from surrotune.experiment import SAMPLERS, load_experiment, parse_duration
from surrotune.finish import FinishSettings
from surrotune.storage import storage_url

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
    _add_size_argument(run)
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument(
        "--warm-start", action="append", default=[], type=Path, metavar="BUNDLE",
        help="start from a model saved on another GPU (repeat for several; docs/transfer.md)",
    )  # fmt: skip
    run.add_argument(
        "--save-model", metavar="PATH|none", default="auto",
        help="where to save the study's model bundle at the end (default: beside the storage)",
    )  # fmt: skip
    _add_worker_arguments(run)
    run.add_argument(
        "--sanitize", choices=MODES, default="best",
        help="compute-sanitizer memcheck and racecheck before reporting: on the best "
        "configuration (and the next while one is found wrong), on every ok one, or none "
        "(default: best; cuda backend only)",
    )  # fmt: skip
    run.add_argument(
        "--remeasure", type=int, default=5, metavar="K",
        help="measure the top K configurations again, interleaved, and say whether the winner "
        "held (default: 5; 0: off)",
    )  # fmt: skip
    run.add_argument(
        "--remeasure-rounds", type=int, default=10, metavar="R",
        help="interleaved rounds of the re-measurement (default: 10)",
    )  # fmt: skip
    run.add_argument(
        "--counters", choices=[m.value for m in CountersMode],
        help="Nsight Compute counters at the end of the run: on the best configurations, the "
        "performance failures, every measured one, or none (default: the experiment's "
        "[evaluation] counters; cuda backend only; docs/counters.md)",
    )  # fmt: skip
    run.add_argument(
        "--counters-budget", type=float, metavar="SHARE",
        help="share of the run's wall time that profiling may take (default: the experiment's "
        "[evaluation] counters_budget, 0.1)",
    )  # fmt: skip

    worker = commands.add_parser(
        "worker", help="join a study that surrotune run started (another GPU or host)"
    )
    worker.add_argument("experiment", nargs="?", type=Path, help="experiment file (.toml)")
    worker.add_argument(
        "--storage", help="the study's storage: postgresql://, redis:// or a journal file (.log)"
    )
    worker.add_argument("--study", help="study name (default: the experiment's)")
    worker.add_argument("--dataset", type=Path, help="recording to replay (.json/.json.gz)")
    worker.add_argument("--backend", choices=("cuda", "replay"), help="evaluation backend")
    worker.add_argument("--sampler", choices=SAMPLERS, help="search strategy of this worker")
    worker.add_argument("--seed", type=int, help="sampler seed (default: none, fresh each time)")
    worker.add_argument("--batch-size", type=int, help="configurations evaluated together")
    _add_size_argument(worker)
    worker.add_argument("--timeout", type=_duration, help="wall-clock limit of this worker")
    worker.add_argument("--no-progress", action="store_true", help="no progress bar")
    worker.add_argument(
        "--warm-start", action="append", default=[], type=Path, metavar="BUNDLE",
        help="start this worker's sampler from a model saved on another GPU (docs/transfer.md)",
    )  # fmt: skip
    worker.add_argument(
        "--device-label", default="",
        help="this worker's device in the study's records (default: CUDA_VISIBLE_DEVICES)",
    )  # fmt: skip
    _add_worker_arguments(worker)

    show = commands.add_parser("show", help="print the best configurations of a stored study")
    show.add_argument("storage", help="Optuna storage URL or path")
    show.add_argument("--study", help="study name (needed when the storage holds several)")
    show.add_argument("--top", type=int, default=10, help="how many configurations")

    counters = commands.add_parser(
        "counters",
        help="profile every ok configuration of a recording with Nsight Compute (on a GPU) and "
        "write the recording with its counters",
    )  # fmt: skip
    counters.add_argument("experiment", type=Path, help="the recording's experiment file")
    counters.add_argument("--dataset", type=Path, required=True, help="the recording")
    counters.add_argument(
        "-o", "--output", type=Path, required=True,
        help="the recording with counters (read first: an earlier call's work is kept)",
    )  # fmt: skip
    counters.add_argument("--batch-size", type=int, default=64, help="configurations per ncu run")
    counters.add_argument("--limit", type=int, help="profile at most this many now")
    _add_size_argument(counters)

    bench_parser = commands.add_parser(
        "bench", help="compare samplers on recorded datasets (replay, many seeds)"
    )
    bench.add_arguments(bench_parser)
    models.add_arguments(
        commands.add_parser("model", help="save a study's models as a bundle, or show one")
    )

    analysis_commands.add_commands(commands)  # analyze, export, best
    return parser


def _add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    several = parser.add_mutually_exclusive_group()
    several.add_argument(
        "--gpus", metavar="all|0,1,...",
        help="one worker process per GPU, all on one study (cuda backend)",
    )  # fmt: skip
    several.add_argument(
        "--workers", type=int, metavar="N",
        help="N worker processes on one study (replay backend: what --gpus does, without GPUs)",
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "worker":
            return _worker(args)
        if args.command in analysis_commands.COMMANDS:
            return analysis_commands.run(args)
        if args.command == "bench":
            return bench.run(args)
        if args.command == "model":
            return models.run(args)
        if args.command == "counters":
            return _counters(args)
        return _show(args)
    except SurrotuneError as exc:
        print(f"surrotune: error: {exc}", file=sys.stderr)
        return 2


def _add_size_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--size", action="append", default=[], type=_size, metavar="NAME=VALUE",
        help="replace one of the experiment file's [sizes] (repeat for several): the same "
        "kernel at another problem size",
    )  # fmt: skip


def _size(text: str) -> tuple[str, int | float]:
    """``M=4096`` → ("M", 4096): a problem size given on the command line."""
    name, sep, value = text.partition("=")
    try:
        number: int | float = int(value) if value.strip().lstrip("-").isdigit() else float(value)
    except ValueError:
        number = float("nan")
    if not sep or not name.strip() or number != number:
        raise argparse.ArgumentTypeError(f"expected NAME=NUMBER (e.g. M=4096), got {text!r}")
    return name.strip(), number


def _run(args: argparse.Namespace) -> int:
    if args.experiment is None and args.dataset is None:
        raise session.SetupError(
            "give an experiment file, or --dataset FILE to replay a recording"
        )
    if args.trials is not None and args.trials < 1:
        raise session.SetupError(f"--trials must be at least 1, got {args.trials}")
    overrides = _overrides(args)
    if args.trials is not None:
        overrides["trials"] = args.trials
    if args.counters is not None:
        overrides["counters"] = args.counters
    if args.counters_budget is not None:
        if not 0.0 < args.counters_budget <= 1.0:
            raise session.SetupError(
                f"--counters-budget must be a share of the run's time in (0, 1], got "
                f"{args.counters_budget}"
            )
        overrides["counters_budget"] = args.counters_budget
    if args.remeasure == 1 or args.remeasure < 0 or args.remeasure_rounds < 1:
        raise session.SetupError(
            "--remeasure must be 0 (off) or at least 2, and --remeasure-rounds at least 1; got "
            f"{args.remeasure} and {args.remeasure_rounds}"
        )
    finish = FinishSettings(
        sanitize=args.sanitize,
        remeasure_top=args.remeasure,
        remeasure_rounds=args.remeasure_rounds,
    )
    devices = _devices(args)
    if devices is not None:
        overrides["url"] = _shared_storage(args, len(devices))
    save_model = None if args.save_model == "none" else args.save_model
    tuning = session.prepare(
        args.experiment, overrides, warm_start=args.warm_start, save_model=save_model
    )
    tuning.finish = finish
    if devices is not None:
        _check_backend(args, tuning.experiment.evaluation.backend)
        print(tuning.describe())
        return workers.launch(tuning, devices, progress=not args.no_progress)
    print(tuning.describe())
    summary = tuning.run(progress=not args.no_progress)
    print(session.format_summary(tuning, summary))
    return 130 if summary.interrupted else 0


def _devices(args: argparse.Namespace) -> list[str | None] | None:
    """One entry per worker process (a CUDA_VISIBLE_DEVICES value, None for replay), or None
    for one worker in this process."""
    if args.gpus is not None:
        return list(workers.gpu_devices(args.gpus))
    if args.workers is not None:
        if args.workers < 1:
            raise session.SetupError(f"--workers must be at least 1, got {args.workers}")
        return [None] * args.workers
    return None


def _check_backend(args: argparse.Namespace, backend: str) -> None:
    if args.gpus is not None and backend != "cuda":
        raise session.SetupError(
            f"--gpus runs the cuda backend, this run the {backend} backend; --workers N runs "
            "N replay workers"
        )
    if args.workers is not None and backend != "replay":
        raise session.SetupError(
            "--workers N runs replay workers; on GPUs, --gpus all or --gpus 0,1 runs one "
            "worker per GPU"
        )


def _shared_storage(args: argparse.Namespace, count: int) -> str:
    """The storage ``count`` workers share: what was asked for, except that the default SQLite
    file becomes a journal file beside it (workers.shared_storage_url says why)."""
    if args.storage is not None:
        return workers.shared_storage_url(storage_url(args.storage), "", count)
    if args.experiment is None:
        default = f"sqlite:///{Path.cwd() / 'surrotune.db'}"
        return workers.shared_storage_url(default, default, count)
    experiment = load_experiment(args.experiment)
    default = f"sqlite:///{experiment.path.with_suffix('.db')}"
    return workers.shared_storage_url(storage_url(experiment.storage.url), default, count)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The experiment settings that ``run`` and ``worker`` options override, where given."""
    given = {
        "timeout_s": args.timeout,
        "sampler": args.sampler,
        "seed": args.seed,
        "batch_size": args.batch_size,
        "backend": args.backend,
        "dataset": args.dataset.resolve() if args.dataset else None,
        "url": args.storage,
        "study": args.study,
        "sizes": dict(args.size) if args.size else None,
    }
    return {k: v for k, v in given.items() if v is not None}


def _worker(args: argparse.Namespace) -> int:
    """``surrotune worker``: join a running (or finished) study until its budget is spent."""
    if args.experiment is None and args.dataset is None:
        raise session.SetupError(
            "give the study's experiment file, or --dataset FILE for a replayed recording"
        )
    overrides = _overrides(args)
    # no --seed: a fresh one, not the file's, which every worker on every host would share
    overrides["seed"] = args.seed
    devices = _devices(args)
    url = args.storage
    if url is None:
        url = (
            load_experiment(args.experiment).storage.url
            if args.experiment is not None
            else f"sqlite:///{Path.cwd() / 'surrotune.db'}"
        )
    # a study that several processes share is never SQLite (refused before a file is made)
    workers.shared_storage_url(storage_url(url), "", 2)
    tuning = session.prepare(args.experiment, overrides, join=True, warm_start=args.warm_start)
    # the study's own run sanitizes and re-measures its winners, once, not every worker
    tuning.finish = FinishSettings(sanitize="none", remeasure_top=0)
    if devices is not None:
        _check_backend(args, tuning.experiment.evaluation.backend)
        print(tuning.describe())
        return workers.launch(tuning, devices, progress=not args.no_progress)
    tuning.worker_label = args.device_label or _visible_label()
    print(tuning.describe())
    summary = tuning.run(progress=not args.no_progress)
    print(session.format_summary(tuning, summary))
    return 130 if summary.interrupted else 0


def _visible_label() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f"GPU {visible}" if visible else ""


def _counters(args: argparse.Namespace) -> int:
    """``surrotune counters``: a recording's counters, read on this GPU (docs/counters.md)."""
    from surrotune.backends.cuda import CudaBackend
    from surrotune.backends.replay import DatasetError, load_dataset
    from surrotune.counters.profiler import NcuProfiler
    from surrotune.counters.record import check_device, check_pairing, profile_recording

    if args.batch_size < 1:
        raise session.SetupError(f"--batch-size must be at least 1, got {args.batch_size}")
    experiment = load_experiment(args.experiment, sizes=dict(args.size))
    try:
        dataset = load_dataset(args.dataset)
    except DatasetError as exc:
        raise session.SetupError(str(exc)) from None
    check_pairing(experiment, dataset)
    if importlib.util.find_spec("cupy") is None:
        raise session.SetupError(
            f"{args.experiment}: surrotune counters profiles on a GPU: it needs CuPy and an "
            "NVIDIA GPU (pip install 'surrotune[cuda]') and Nsight Compute (ncu)"
        )
    with CudaBackend(experiment) as backend:
        check_device(dataset, str(backend.device()["name"]))
        profiler = NcuProfiler(backend, report_dir=args.output.parent / "ncu-reports")
        summary = profile_recording(
            args.dataset, args.output, profiler, batch_size=args.batch_size, limit=args.limit,
            log=lambda line: print(line, flush=True),
        )  # fmt: skip
    print(summary.line())
    return 0


def _show(args: argparse.Namespace) -> int:
    print(session.format_study(args.storage, args.study, top=args.top))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
