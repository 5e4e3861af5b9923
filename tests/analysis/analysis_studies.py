"""Studies for the analysis tests, made once per session by the replay backend (the fixtures
that build them are in conftest.py; the test modules import these names from here).

- ``conv``: the convolution kernel of the shared Kernel Tuner recordings on two GPUs, in one
  SQLite file: ``W7800``, all 127 configurations of a sub-space of large tiles (its compile
  failures are the shared-memory footprint region), and ``A100``, the first 50 of them in the
  brute-force order (so some of W7800's configurations were never measured on the A100).
- ``gemm``: the quickstart (surrogate sampler, the H200 GEMM recording with registers, shared
  memory and repeated timings), 60 evaluations, its top 5 re-measured at the end.
- ``tiny``: the 32-configuration cache of tests/test_runner.py, brute force; cheap to copy and
  to replay, for the round trips and the sanitizer demotion.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import optuna

from surrotune.cli import main

sys.path.insert(0, str(Path(__file__).parents[1]))
from test_runner import write_kt_cache

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = REPO / "experiments"
KT_DATASETS = REPO.parent / "shared" / "datasets" / "kernel_tuner"  # as tests/conftest.py

optuna.logging.set_verbosity(optuna.logging.WARNING)

#: the convolution sub-space: large tiles, so that W7800's shared-memory failures are frequent
CONV_EXPERIMENT = """\
constraints = [
    "block_size_x * block_size_y <= 1024",
    "use_shmem == 0 or (block_size_x*tile_size_x + 14) * (block_size_y*tile_size_y + 14) < 12288",
]

[parameters]
block_size_x = [128, 192, 256]
block_size_y = [1, 2, 4]
tile_size_x = [2, 3, 4]
tile_size_y = [2, 3, 4]
read_only = [1]
use_padding = [0]
use_shmem = [0, 1]
use_cmem = [1]
filter_height = [15]
filter_width = [15]

[search]
sampler = "brute-force"
trials = 127
batch_size = 16

[evaluation]
backend = "replay"
dataset = "{dataset}"

[storage]
study = "conv"
"""
CONV_CONFIGS = 127
A100_TRIALS = 50
GEMM_TRIALS = 60

TINY_EXPERIMENT = """\
[parameters]
bx = [8, 16, 32, 64]
by = [1, 2, 4, 16]
u = [0, 1]

[search]
sampler = "brute-force"
trials = 32
batch_size = 8

[evaluation]
backend = "replay"
dataset = "tiny.json"

[storage]
study = "tiny"
"""
#: the tiny cache's optimum (1.0 ms) and the runner-up (1.25 ms)
TINY_BEST = {"bx": 64, "by": 4, "u": 1}


def run_cli(*args: str) -> int:
    return main(["run", *args, "--no-progress"])


@dataclass(frozen=True)
class Storages:
    root: Path
    conv: Path  # W7800 and A100
    gemm: Path  # quickstart
    tiny: Path  # tiny (brute force) and allfail (only failures)
    tiny_cache: Path


def build_conv(root: Path) -> Path:
    db = root / "conv.db"
    for gpu, trials in (("W7800", CONV_CONFIGS), ("A100", A100_TRIALS)):
        experiment = root / f"conv_{gpu}.toml"
        dataset = KT_DATASETS / "convolution_milo" / f"{gpu}.json.gz"
        experiment.write_text(CONV_EXPERIMENT.format(dataset=dataset))
        options = ["--study", gpu, "--trials", str(trials), "--remeasure", "0"]
        assert run_cli(str(experiment), "--storage", str(db), *options) == 0
    return db


def build_tiny(root: Path) -> tuple[Path, Path]:
    cache = write_kt_cache(root / "tiny.json")
    experiment = root / "tiny.toml"
    experiment.write_text(TINY_EXPERIMENT)
    db = root / "tiny.db"
    assert run_cli(str(experiment), "--storage", str(db)) == 0
    doc = json.loads(cache.read_text())
    for entry in doc["cache"].values():  # every configuration fails: no winner
        entry["time"] = "RuntimeFailedConfig"
        entry.pop("times", None)
    failing = root / "allfail.json"
    failing.write_text(json.dumps(doc))
    allfail = ["--dataset", str(failing), "--study", "allfail", "--sampler", "random"]
    assert run_cli(*allfail, "--trials", "6", "--seed", "1", "--storage", str(db)) == 0
    return db, cache
