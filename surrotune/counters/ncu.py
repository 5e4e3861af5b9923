"""Nsight Compute (``ncu``) as a subprocess: find it, run it over a batch, read its CSV.

One ncu process profiles a whole batch of configurations: it runs a small target process
(:mod:`surrotune.counters.target`) that launches each configuration's kernel once, in order, and
ncu replays each launch as often as the metric set needs. Starting ncu costs seconds; a batch
pays that once.

The CSV is ncu's details page (``--csv``, one row per launch and metric: ``"ID"``, ``"Kernel
Name"``, ``"Metric Name"``, ``"Metric Unit"``, ``"Metric Value"``, ...) or its raw page (``--page
raw``: one row per launch, a column per metric, units on the second row); :func:`parse_ncu_csv`
reads both, with base units (``--print-units base``) and with or without thousands separators.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import importlib.util
import io
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from surrotune.backends.compile import run_process_group

__all__ = [
    "LaunchMetrics",
    "NcuUnavailable",
    "find_ncu",
    "ncu_command",
    "ncu_failure",
    "parse_ncu_csv",
]

#: what ncu prints when it cannot read the counters, and what that means for the user
_FAILURES = (
    (
        re.compile(r"ERR_NVGPUCTRPERM"),
        "this user may not read the GPU's performance counters (ERR_NVGPUCTRPERM): run as root "
        "or load the driver with NVreg_RestrictProfilingToAdminUsers=0",
    ),
    (re.compile(r"Failed to find metric (\S+)"), "ncu does not know the metric {0} on this GPU"),
    (
        re.compile(r"(?:Unsupported|not supported).*(?:GPU|device|architecture)", re.I),
        "ncu does not support this GPU",
    ),
    (re.compile(r"No kernels were profiled"), "ncu profiled no kernel"),
)


class NcuUnavailable(RuntimeError):
    """ncu is missing or cannot read counters here; the message says why, once, for the user."""


@dataclass
class LaunchMetrics:
    """One profiled kernel launch: ncu's launch ID, kernel name, geometry and metric values
    (None where ncu printed n/a), in the units printed."""

    launch_id: int
    kernel_name: str
    block: str = ""
    grid: str = ""
    metrics: dict[str, float | None] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)


def find_ncu() -> str | None:
    """The ncu executable: on PATH, in the CUDA toolkit, or in the ``nvidia-nsight-compute``
    layout of a Python environment; None when there is none."""
    found = shutil.which("ncu")
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for root in roots:
        if root:
            for pattern in ("bin/ncu", "nsight-compute*/ncu"):
                for candidate in sorted(glob.glob(os.path.join(root, pattern))):
                    if os.access(candidate, os.X_OK):
                        return candidate
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec("nvidia")
        for location in (spec.submodule_search_locations or []) if spec else []:
            for candidate in sorted(glob.glob(os.path.join(location, "*", "bin", "ncu"))):
                if os.access(candidate, os.X_OK):
                    return candidate
    return None


def _number(text: str) -> float | None:
    """A metric value: ``1,234.5`` and ``1234.5`` alike; None for n/a, empty or text."""
    cleaned = text.strip().replace(",", "")
    if not cleaned or cleaned.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(cleaned)
    except ValueError:
        return None


def _header_index(lines: list[str]) -> int:
    for i, line in enumerate(lines):
        if line.startswith('"ID"'):
            return i
    raise ValueError('no ncu CSV header (a line starting with "ID") in the output')


def parse_ncu_csv(text: str) -> list[LaunchMetrics]:
    """Every launch in ncu's CSV output, in launch order; lines before the header (``==PROF==``
    messages, the target's own output) are skipped.

    Raises:
        ValueError: the text holds no ncu CSV table.
    """
    lines = text.splitlines()
    start = _header_index(lines)
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], [r for r in rows[1:] if r]
    launches: dict[int, LaunchMetrics] = {}

    def launch_of(row: dict[str, str]) -> LaunchMetrics | None:
        ident = _number(row.get("ID", ""))
        if ident is None:
            return None
        key = int(ident)
        if key not in launches:
            launches[key] = LaunchMetrics(
                key,
                row.get("Kernel Name", ""),
                row.get("Block Size", ""),
                row.get("Grid Size", ""),
            )
        return launches[key]

    if "Metric Name" in header:  # the details page: one row per launch and metric
        for values in body:
            row = dict(zip(header, values, strict=False))
            launch = launch_of(row)
            if launch is None:
                continue
            name = row.get("Metric Name", "")
            launch.metrics[name] = _number(row.get("Metric Value", ""))
            launch.units[name] = row.get("Metric Unit", "")
        return [launches[k] for k in sorted(launches)]
    units: dict[str, str] = {}
    for values in body:  # the raw page: a column per metric, units on the first body row
        row = dict(zip(header, values, strict=False))
        if not row.get("ID", "").strip():
            units = row
            continue
        launch = launch_of(row)
        if launch is None:
            continue
        for name in header:
            if "__" in name:  # metric names have a double underscore, the fixed columns none
                launch.metrics[name] = _number(row.get(name, ""))
                launch.units[name] = units.get(name, "")
    return [launches[k] for k in sorted(launches)]


def ncu_failure(output: str) -> str | None:
    """Why ncu could not profile, from its messages; None when it says nothing of the kind."""
    for pattern, message in _FAILURES:
        match = pattern.search(output)
        if match:
            return message.format(*match.groups())
    return None


def ncu_command(
    executable: str, metrics: Sequence[str], csv_path: Path, target: Sequence[str]
) -> list[str]:
    """ncu over ``target``: the metrics as CSV in base units to ``csv_path`` (the target's own
    output stays apart), every child process followed, and only what runs between the target's
    ``cudaProfilerStart`` and ``cudaProfilerStop`` profiled."""
    return [
        executable,
        "--csv",
        "--print-units",
        "base",
        "--log-file",
        str(csv_path),
        "--target-processes",
        "all",
        "--profile-from-start",
        "off",
        "--metrics",
        ",".join(metrics),
        *target,
    ]


def run_ncu(
    executable: str,
    metrics: Sequence[str],
    job_path: Path,
    csv_path: Path,
    *,
    timeout_s: float,
) -> tuple[int | None, str, str]:
    """Run ncu over ``python -m surrotune.counters.target JOB``; exit code (None on timeout),
    ncu's and the target's output, and the CSV text ("" when ncu wrote none)."""
    target = [sys.executable, "-m", "surrotune.counters.target", str(job_path)]
    code, output = run_process_group(ncu_command(executable, metrics, csv_path, target), timeout_s)
    text = csv_path.read_text(errors="replace") if csv_path.exists() else ""
    return code, output, text
