"""``surrotune model``: save a stored study's models as a bundle, and show a bundle.

``surrotune model save STORAGE [--study NAME] -o models/NAME.json[.gz]`` fits the surrogate
models on every measurement of the study and writes them with what they were learned on
(:mod:`surrotune.surrogate.bundle`); given a recording (``.json``/``.json.gz``: a Kernel Tuner
cache, a T4 file, a surrotune recording) instead of a storage, on every configuration it holds.
``surrotune model show FILE`` prints a bundle. The CLI wires
:func:`add_arguments` and :func:`run` in as the ``model`` subcommand, as it does for ``bench``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``model`` subcommand's actions and options, on a parser the CLI made."""
    actions = parser.add_subparsers(dest="model_command", required=True)
    save = actions.add_parser(
        "save", help="fit the models on a stored study and save them as one bundle"
    )
    save.add_argument(
        "storage", help="Optuna storage URL or path, or a recording (.json, .json.gz)"
    )
    save.add_argument("--study", help="study name (needed when the storage holds several)")
    save.add_argument(
        "-o", "--output", type=Path, required=True,
        help="the bundle: models/NAME.json (plain JSON) or models/NAME.json.gz (gzipped)",
    )  # fmt: skip
    save.add_argument("--seed", type=int, default=0, help="seed of the models (default 0)")
    show = actions.add_parser("show", help="print what a model bundle holds")
    show.add_argument("file", type=Path, help="a bundle (.json or .json.gz)")


def run(args: argparse.Namespace) -> int:
    """Save or show a bundle; raises a SurrotuneError (the CLI prints it, exit 2) on bad input."""
    from surrotune.surrogate.bundle import bundle_from_study, format_bundle, load_bundle

    if args.model_command == "show":
        print(format_bundle(load_bundle(args.file)))
        return 0
    if args.storage.endswith((".json", ".json.gz")) and "://" not in args.storage:
        from surrotune.surrogate.bundle import bundle_from_dataset

        bundle = bundle_from_dataset(args.storage, seed=args.seed)
    else:
        from surrotune.session import load_study

        bundle = bundle_from_study(load_study(args.storage, args.study), seed=args.seed)
    path = bundle.save(args.output)
    bundle.path = str(path)
    print(format_bundle(bundle))
    print(f"\nwrote {path}; warm-start another GPU with: surrotune run EXPERIMENT --warm-start "
          f"{path}")  # fmt: skip
    return 0
