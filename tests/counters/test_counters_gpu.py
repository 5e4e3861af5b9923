"""Counters read on the GPU agree with a direct ncu call (``gpu``).

The profiler runs one ncu process over a batch of two GEMM configurations; the same two
launches are then profiled one ncu process each, with ncu's raw page (the other CSV layout), and
the counters of both must agree: exactly for what the code and the launch fix (registers, local
traffic, shared-memory wavefronts), within measurement spread for rates and throughputs.
"""

from __future__ import annotations

import math
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from surrotune.result import ParamValue

REPO = Path(__file__).resolve().parents[2]

#: two ok configurations of experiments/gemm.toml: a fast one and a slow, spilling-free one
CONFIGS: list[dict[str, ParamValue]] = [
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 16, "TM": 8, "TN": 8, "VEC": 4, "PAD": 0,
     "UNROLL": 0, "DOUBLE_BUFFER": 1},
    {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 8, "TM": 2, "TN": 2, "VEC": 1, "PAD": 1,
     "UNROLL": 0, "DOUBLE_BUFFER": 0},
]  # fmt: skip

#: counters fixed by the code and the launch: equal in both calls
EXACT = ("registers", "local_bytes")
#: counts of work: equal to a thousandth (measured on the H200: shared-memory wavefronts of the
#: fast configuration differed by 61 in 60.8 million between two ncu runs)
COUNTS = ("shared_requests",)
#: counters that depend on the run (clocks, caches, L2 replacement): equal within this relative
#: spread (DRAM bytes of the fast configuration differed by 0.2 % between two ncu runs)
RATES = ("achieved_occupancy", "dram_throughput", "sm_throughput", "memory_throughput",
         "l2_hit_rate", "duration_ns", "dram_bytes")  # fmt: skip


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from surrotune.backends.cuda import CudaBackend
    from surrotune.counters.ncu import find_ncu
    from surrotune.experiment import load_experiment

    if find_ncu() is None:
        pytest.skip("NO NCU: install Nsight Compute (ncu) to read counters")
    cache = tmp_path_factory.mktemp("cache")
    with CudaBackend(load_experiment(REPO / "experiments" / "gemm.toml"), cache_dir=cache) as b:
        yield b


def direct_ncu(backend: object, config: dict[str, ParamValue], scratch: Path) -> dict[str, float]:
    """The counters of one configuration from its own ncu process, raw page."""
    from surrotune.backends.sanitize import rebuild_launch
    from surrotune.counters.metrics import COUNTERS, counters_from_metrics, ncu_metrics
    from surrotune.counters.ncu import find_ncu, parse_ncu_csv

    jobs = scratch / "job.pickle"
    jobs.write_bytes(pickle.dumps([rebuild_launch(backend, config)]))  # type: ignore[arg-type]
    command = [
        str(find_ncu()), "--csv", "--page", "raw", "--print-units", "base",
        "--profile-from-start", "off", "--metrics", ",".join(ncu_metrics(COUNTERS)),
        sys.executable, "-m", "surrotune.counters.target", str(jobs),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    (scratch / "direct.out").write_text(done.stdout + done.stderr)
    launches = parse_ncu_csv(done.stdout)
    assert len(launches) == 1, done.stdout[-2000:] + done.stderr[-2000:]
    return counters_from_metrics(launches[0].metrics)


@pytest.mark.gpu
def test_gpu_counters_agree_with_a_direct_ncu_call(backend: object, tmp_path: Path) -> None:
    from surrotune.counters.profiler import NcuProfiler

    profiler = NcuProfiler(backend, report_dir=tmp_path / "reports")  # type: ignore[arg-type]
    batch = profiler.profile(CONFIGS)
    assert not profiler.disabled, profiler.disabled
    assert batch.error == "" and batch.profiled == 2, batch.error
    assert batch.seconds_per_config is not None and batch.seconds_per_config > 0
    for config, counters in zip(CONFIGS, batch.counters, strict=True):
        assert counters is not None
        scratch = tmp_path / f"direct-{CONFIGS.index(config)}"
        scratch.mkdir()
        direct = direct_ncu(backend, config, scratch)
        for name in EXACT:
            assert name in counters and name in direct, (name, sorted(counters))
            assert counters[name] == direct[name], (name, counters[name], direct[name])
        for name in COUNTS:
            assert name in counters and name in direct, (name, sorted(counters))
            assert math.isclose(counters[name], direct[name], rel_tol=1e-3), (
                name, counters[name], direct[name],
            )  # fmt: skip
        for name in RATES:
            assert name in counters and name in direct, (name, sorted(counters))
            assert math.isclose(counters[name], direct[name], rel_tol=0.15, abs_tol=2.0), (
                name, counters[name], direct[name],
            )  # fmt: skip
        assert 0 < counters["achieved_occupancy"] <= 100
        assert counters["registers"] > 0
    fast, slow = batch.counters
    assert fast is not None and slow is not None
    assert fast["duration_ns"] < slow["duration_ns"]  # the fast configuration is faster
    # the slow one's 32x32 tiles reread each input element far more often: several times the
    # shared-memory wavefronts per output for the same product
    assert slow["shared_requests"] > 2 * fast["shared_requests"]
    shutil.rmtree(tmp_path / "reports", ignore_errors=True)
