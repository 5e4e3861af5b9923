"""Shared fixtures: paths to the repository, the shipped experiments and the shared datasets."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
TEMPLATES = REPO / "templates"
KT_DATASETS = REPO.parent / "shared" / "datasets" / "kernel_tuner"


def _has_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu` tests loudly where no GPU is present, and `nvcc` tests where nvcc is missing."""
    gpu = _has_gpu()
    nvcc = shutil.which("nvcc") is not None
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(pytest.mark.skip(reason="NO GPU: this test needs CuPy and a CUDA GPU"))
        if "nvcc" in item.keywords and not nvcc:
            item.add_marker(pytest.mark.skip(reason="NO NVCC: this test needs the CUDA compiler"))


@pytest.fixture
def kt_datasets() -> Path:
    if not KT_DATASETS.is_dir():
        pytest.skip(f"shared Kernel Tuner datasets not found at {KT_DATASETS}")
    return KT_DATASETS
