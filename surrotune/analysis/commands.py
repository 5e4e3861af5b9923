"""The command line of the offline analysis: ``surrotune analyze``, ``export`` and ``best``.

:mod:`surrotune.cli` stays thin: it calls :func:`add_commands` to declare these subcommands and
:func:`run` to carry one out. Everything here reads a storage and writes files; nothing needs a
GPU, the kernel template or the experiment file. Errors are :class:`surrotune.errors.
SurrotuneError`\\ s, which the CLI prints on one line with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["COMMANDS", "add_commands", "run"]

#: the subcommands this module declares
COMMANDS = ("analyze", "export", "best")


def add_commands(commands: Any) -> None:
    """Declare ``analyze``, ``export`` and ``best`` on the CLI's subparsers object."""
    from surrotune.analysis.best import BEST_FORMATS
    from surrotune.analysis.export import FORMATS

    analyze = commands.add_parser(
        "analyze", help="write a report (Markdown, HTML, PNG plots) on stored studies"
    )
    analyze.add_argument(
        "storage", nargs="+",
        help="Optuna storage URL or path (.db SQLite, .log journal); several to compare them",
    )  # fmt: skip
    analyze.add_argument(
        "--study", action="append", metavar="NAME",
        help="a study to analyse (repeat for several; default: every study of the storage)",
    )  # fmt: skip
    analyze.add_argument(
        "-o", "--output", type=Path,
        help="report directory (default: <storage name>_report in the current directory)",
    )  # fmt: skip
    analyze.add_argument(
        "--top", type=int, default=10, help="configurations in the top tables (default: 10)"
    )
    analyze.add_argument("--seed", type=int, default=0, help="seed of the importance models")

    export = commands.add_parser(
        "export",
        help="write a stored study as a recording, Kernel Tuner cache, T4, CSV or Parquet",
    )
    export.add_argument("storage", help="Optuna storage URL or path")
    export.add_argument("--study", help="study name (needed when the storage holds several)")
    export.add_argument(
        "--format", choices=FORMATS,
        help="recording: surrotune's own (replayable with --dataset); kernel-tuner: a Kernel "
        "Tuner cache file; t4: T4 results JSON; csv, parquet: every trial with every field "
        "(default: from the file name: .csv, .parquet, else recording)",
    )  # fmt: skip
    export.add_argument("-o", "--output", type=Path, required=True, help="file to write")

    best = commands.add_parser("best", help="print or write the best configuration of a study")
    best.add_argument("storage", help="Optuna storage URL or path")
    best.add_argument("--study", help="study name (needed when the storage holds several)")
    best.add_argument(
        "--format", choices=BEST_FORMATS, default="json",
        help="json, or header: a C header of #define lines (default: json)",
    )  # fmt: skip
    best.add_argument(
        "--prefix", default="", help="prefix of every macro name in the header, e.g. GEMM_"
    )
    best.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")


def run(args: argparse.Namespace) -> int:
    """Carry out one of :data:`COMMANDS`; returns the exit code."""
    if args.command == "analyze":
        return _analyze(args)
    if args.command == "export":
        return _export(args)
    return _best(args)


def _default_report_dir(storage: str) -> Path:
    name = Path(storage.split("://", 1)[-1]).name
    stem = name.split(".")[0] if name else ""
    return Path.cwd() / f"{stem or 'surrotune'}_report"


def _analyze(args: argparse.Namespace) -> int:
    from surrotune.analysis.report import write_report
    from surrotune.analysis.trials import AnalysisError, open_studies, read_study_trials

    if args.top < 1:
        raise AnalysisError(f"--top must be at least 1, got {args.top}")
    wanted = list(dict.fromkeys(args.study or []))
    studies, held = [], []
    for storage in args.storage:
        opened = open_studies(storage)  # every study it holds; a missing storage is an error
        held += [s.study_name for s in opened]
        studies += [
            read_study_trials(s, storage) for s in opened if not wanted or s.study_name in wanted
        ]
    missing = [n for n in wanted if n not in held]
    if missing:
        raise AnalysisError(
            f"no study {', '.join(map(repr, missing))} in {', '.join(args.storage)}; "
            f"found: {', '.join(held)}"
        )
    if wanted:  # the first named study is the one the others are compared with
        studies.sort(key=lambda s: wanted.index(s.name))
    output = args.output or _default_report_dir(args.storage[0])
    report = write_report(
        studies, output, top=args.top, seed=args.seed,
        log=lambda line: print(f"surrotune: {line}", file=sys.stderr),
    )  # fmt: skip
    for line in report.lines:
        print(line)
    print(f"wrote {report.markdown} and {report.html} ({len(report.figures)} figures)")
    return 0


def _export(args: argparse.Namespace) -> int:
    from surrotune.analysis.export import export_study, infer_format
    from surrotune.analysis.trials import open_study

    study = open_study(args.storage, args.study)
    fmt = args.format or infer_format(args.output)
    count = export_study(study, args.output, fmt)
    what = "trials" if fmt in ("csv", "parquet") else "configurations"
    print(f"wrote {count} {what} of study '{study.study_name}' to {args.output} ({fmt})")
    return 0


def _best(args: argparse.Namespace) -> int:
    from surrotune.analysis.best import best_configuration, format_best
    from surrotune.analysis.trials import open_study

    study = open_study(args.storage, args.study)
    text = format_best(best_configuration(study, args.storage), args.format, prefix=args.prefix)
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
        print(f"wrote the best configuration of study '{study.study_name}' to {args.output}")
    return 0
