"""The tuned GEMM against cuBLAS (``cupy.matmul``) and the measured fp32 peak, in one run.

Run on a GPU machine, from the repository root:

    python benchmarks/bench_gemm_cublas.py --recording experiments/datasets/gemm_h200.json.gz

It takes the best configurations of the recording, measures them again through the ``cuda``
backend (compile, verify against NumPy, time with CUDA events) and, in the same process and on
inputs of the same shape, times ``cupy.matmul`` at the experiment's size and at 8192³ (the
largest rate cuBLAS reaches: the measured single-precision peak). Tuned and cuBLAS are measured
twice, interleaved, so that a drift of the clocks shows. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np

from surrotune.backends.cuda import CudaBackend
from surrotune.backends.replay import load_dataset
from surrotune.experiment import load_experiment


def time_cublas(n_m: int, n_n: int, n_k: int, repeats: int) -> float:
    """Median time of cupy.matmul on random float32 inputs, ms (each launch its own events)."""
    import cupy as cp

    rng = np.random.default_rng(1)
    a = cp.asarray(rng.uniform(-1, 1, (n_m, n_k)).astype(np.float32))
    b = cp.asarray(rng.uniform(-1, 1, (n_k, n_n)).astype(np.float32))
    for _ in range(5):
        cp.matmul(a, b)
    times = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        cp.matmul(a, b)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", type=Path, default=Path("experiments/gemm.toml"))
    parser.add_argument("--recording", type=Path, required=True)
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()

    experiment = load_experiment(args.experiment)
    experiment = replace(
        experiment, evaluation=replace(experiment.evaluation, repeats=args.repeats, warmup=5)
    )
    dataset = load_dataset(args.recording)
    ok = sorted((r for r in dataset.results.values() if r.ok), key=lambda r: r.objective or 0.0)
    configs = [dict(r.config) for r in ok[: args.top]]
    sizes = experiment.sizes
    m, n, k = int(sizes["M"]), int(sizes["N"]), int(sizes["K"])
    flops = 2.0 * m * n * k

    rows = []
    with CudaBackend(experiment) as backend:
        for round_ in (1, 2):
            results = backend.evaluate(configs)
            cublas_ms = time_cublas(m, n, k, args.repeats)
            for config, result in zip(configs, results, strict=True):
                rows.append((round_, config, result, cublas_ms))
        device = backend.device()
    peak_ms = time_cublas(8192, 8192, 8192, 10)
    peak = 2.0 * 8192**3 / (peak_ms * 1e-3) / 1e9

    print(f"device: {device.get('name')}; size {m}x{n}x{k}; fp32 peak measured as cuBLAS "
          f"8192^3: {peak:,.0f} GFLOP/s ({peak_ms:.3f} ms)\n")  # fmt: skip
    print("| round | configuration | status | tuned ms | tuned GFLOP/s | cuBLAS ms | "
          "tuned / cuBLAS speed | tuned / peak |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for round_, config, result, cublas_ms in rows:
        text = " ".join(f"{k}={v}" for k, v in config.items())
        if result.ok and result.time_ms:
            rate = flops / (result.time_ms * 1e-3) / 1e9
            speed = cublas_ms / result.time_ms
            print(f"| {round_} | {text} | ok | {result.time_ms:.4f} | {rate:,.0f} | "
                  f"{cublas_ms:.4f} | {speed:.3f} | {rate / peak:.3f} |")  # fmt: skip
        else:
            print(f"| {round_} | {text} | {result.status} | - | - | {cublas_ms:.4f} | - | - |")


if __name__ == "__main__":
    main()
