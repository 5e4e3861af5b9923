"""Session fixtures: the studies of analysis_studies.py, built once, and reports of them."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from analysis_studies import (
    EXPERIMENTS,
    GEMM_TRIALS,
    KT_DATASETS,
    Storages,
    build_conv,
    build_tiny,
    run_cli,
)

from surrotune.cli import main


@pytest.fixture(scope="session")
def storages(tmp_path_factory: pytest.TempPathFactory) -> Storages:
    if not KT_DATASETS.is_dir():
        pytest.skip(f"shared Kernel Tuner datasets not found at {KT_DATASETS}")
    root = tmp_path_factory.mktemp("analysis")
    gemm = root / "gemm.db"
    quickstart = EXPERIMENTS / "quickstart.toml"
    assert run_cli(str(quickstart), "--trials", str(GEMM_TRIALS), "--storage", str(gemm)) == 0
    tiny, cache = build_tiny(root)
    return Storages(root, build_conv(root), gemm, tiny, cache)


@pytest.fixture(scope="session")
def conv_report(storages: Storages, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``surrotune analyze`` of both convolution studies, W7800 first."""
    out = tmp_path_factory.mktemp("conv_report")
    code = main(["analyze", str(storages.conv), "--study", "W7800", "--study", "A100",
                 "-o", str(out), "--top", "5"])  # fmt: skip
    assert code == 0
    return out


@pytest.fixture
def tiny_copy(storages: Storages, tmp_path: Path) -> Path:
    """A copy of the tiny storage that a test may change (the sanitizer demotion)."""
    copy = tmp_path / "tiny.db"
    shutil.copy(storages.tiny, copy)
    return copy
