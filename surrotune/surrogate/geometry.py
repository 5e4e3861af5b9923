"""Launch-geometry features: how many blocks a configuration launches at the problem size, and
how they fill the GPU's SMs.

The parameters alone say nothing of the problem size, so a model learned at one size ranks the
configurations of another as if nothing had changed. What does change is the launch: on the
H200, the fastest GEMM at 2048³ (128 × 256 tiles) and at 1024³ (64 × 128 tiles) both launch 128
blocks, one wave on 132 SMs (``experiments/datasets/gemm_h200.json.gz``,
``gemm_1024_h200.json.gz``). With the experiment's ``[launch]`` expressions evaluated at the
sizes, the models see blocks, threads per block, waves and the last wave's fill, and what they
learned carries over: a warm start evaluates the source's expressions at the *target's* sizes
and SM count (docs/transfer.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from surrotune.expressions import Expression, ExpressionError

__all__ = ["LaunchShape", "launch_shape_of_experiment", "launch_shape_of_recording"]


@dataclass(frozen=True)
class LaunchShape:
    """The ``[launch]`` grid and block expressions (their texts), the sizes they are evaluated
    at, and the GPU's SM count (None where unknown: then no wave columns)."""

    grid: tuple[str, ...]
    block: tuple[str, ...]
    sizes: Mapping[str, float] = field(default_factory=dict)
    sm_count: int | None = None

    @property
    def n_columns(self) -> int:
        return 4 if self.sm_count else 2

    def at(self, sizes: Mapping[str, float], sm_count: int | None) -> LaunchShape:
        """The same expressions at other sizes, on another GPU (a warm start's target). The
        columns stay those the models were trained on: without an SM count, none is added."""
        return replace(
            self,
            sizes=dict(sizes),
            sm_count=(sm_count or self.sm_count) if self.sm_count else None,
        )

    def columns(self, frame: pd.DataFrame) -> np.ndarray:
        """``(n, n_columns)``: log2 of the blocks and of the threads per block, and with an SM
        count, log2 of the waves (blocks per SM) and the wave efficiency, blocks over the SM
        slots of the waves they take (1 when the last wave is full)."""
        blocks = self._product(self.grid, frame)
        threads = self._product(self.block, frame)
        out = [np.log2(blocks), np.log2(threads)]
        if self.sm_count:
            waves = blocks / self.sm_count
            out += [np.log2(waves), waves / np.ceil(waves)]
        return np.stack(out, axis=1)

    def _product(self, texts: Sequence[str], frame: pd.DataFrame) -> np.ndarray:
        env: dict[str, Any] = dict(self.sizes)
        for name in frame.columns:
            column = frame[name].to_numpy()
            if column.dtype != object:
                env[name] = column
        total = np.ones(len(frame), dtype=np.float64)
        for text in texts:
            try:
                value = Expression.parse(text).evaluate(env)
            except (ExpressionError, ArithmeticError, TypeError, ValueError):
                return np.ones(len(frame), dtype=np.float64)  # not computable: a constant
            total = total * np.asarray(value, dtype=np.float64)
        return np.maximum(total, 1.0)

    def to_json(self) -> dict[str, Any]:
        return {"grid": list(self.grid), "block": list(self.block), "sizes": dict(self.sizes),
                "sm_count": self.sm_count}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> LaunchShape | None:
        if not data:
            return None
        sm = data.get("sm_count")
        return cls(
            grid=tuple(str(t) for t in data["grid"]),
            block=tuple(str(t) for t in data["block"]),
            sizes={str(k): v for k, v in dict(data.get("sizes") or {}).items()},
            sm_count=int(sm) if sm else None,
        )


def launch_shape_of_experiment(
    experiment: Any, device: Mapping[str, Any] | None
) -> LaunchShape | None:
    """The launch shape of an experiment at its sizes on ``device`` (a descriptor with
    ``multiProcessorCount`` or ``sm_count``); None when it has no ``[launch]`` table."""
    launch = getattr(experiment, "launch", None)
    if launch is None:
        return None
    device = device or {}
    sm = device.get("multiProcessorCount") or device.get("sm_count")
    return LaunchShape(
        grid=tuple(e.text for e in launch.grid),
        block=tuple(e.text for e in launch.block),
        sizes=dict(experiment.sizes),
        sm_count=int(sm) if sm and not (isinstance(sm, float) and math.isnan(sm)) else None,
    )


def launch_shape_of_recording(dataset: Any) -> LaunchShape | None:
    """The launch shape of a surrotune recording: its experiment file (named in its metadata,
    relative to the recording) at the recorded sizes, on the recorded device. None where the
    recording names none (a Kernel Tuner cache), or the file is gone or no longer fits."""
    from surrotune.experiment import ExperimentError, load_experiment

    meta = dict(getattr(dataset, "metadata", None) or {})
    relative = meta.get("experiment")
    path = getattr(dataset, "path", None)
    if not relative or path is None:
        return None
    sizes = dataset.problem_size if isinstance(dataset.problem_size, Mapping) else None
    try:
        experiment = load_experiment((Path(path).parent / str(relative)).resolve(), sizes=sizes)
    except (ExperimentError, OSError):
        return None
    device = meta.get("device")
    return launch_shape_of_experiment(experiment, device if isinstance(device, Mapping) else None)
