"""Benchmark: how kernel compilation scales with the number of compile processes.

Why: the pipeline benchmark (bench_pipeline.py) found surrotune's parallel compile on the H200
host taking about 3.5x longer per kernel than one compile at a time, which caps the pipeline's
throughput well below "cores x sequential". This script isolates compilation: the same GEMM
configurations are compiled, without a cache, by the NVRTC process pool with 1, 2, 4, ... workers
(and by nvcc with as many threads), and it reports wall time, kernels per second, the mean time
of one compile as the compiler measured it, and the speed-up over one worker. When the mean time
of one compile grows with the workers, the cores are not independent (shared caches, SMT
siblings, memory growing under the VM) and more workers stop paying.

    python benchmarks/bench_compile_scaling.py [--configs 64] [--workers 1,2,4,8,16] [--nvcc]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from surrotune.backends.compile import CompiledKernel, CompileRequest, make_compiler, usable_cpus
from surrotune.experiment import load_experiment
from surrotune.space import SearchSpace
from surrotune.template import Template

REPO = Path(__file__).resolve().parent.parent


def requests_for(experiment_path: Path, count: int, seed: int, arch: str) -> list[CompileRequest]:
    """``count`` feasible configurations of the experiment, rendered as compile requests."""
    experiment = load_experiment(experiment_path)
    assert experiment.kernel is not None
    space = SearchSpace(experiment.parameters, experiment.constraints, experiment.sizes)
    import numpy as np

    frame = space.sample(count, np.random.default_rng(seed))
    template = Template.from_file(experiment.kernel.template)
    return [
        CompileRequest(
            source=template.render({**experiment.sizes, **config}),
            kernel_name=experiment.kernel.name,
            arch=arch,
            options=experiment.kernel.options,
        )
        for config in frame.to_dict("records")
    ]


def run(compiler_name: str, requests: list[CompileRequest], workers: int) -> dict[str, float]:
    compiler = make_compiler(compiler_name, cache_dir=None, workers=workers)
    try:
        start = time.perf_counter()
        futures = [compiler.submit(r) for r in requests]
        outcomes = [f.result() for f in futures]
        wall = time.perf_counter() - start
    finally:
        compiler.close()
    times = [o.compile_time_ms / 1e3 for o in outcomes]
    ok = sum(isinstance(o, CompiledKernel) for o in outcomes)
    return {"wall": wall, "per_s": len(requests) / wall, "mean": statistics.mean(times), "ok": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", type=Path, default=REPO / "experiments" / "gemm.toml")
    parser.add_argument("--configs", type=int, default=64)
    parser.add_argument("--workers", default=None, help="comma-separated (default 1,2,4,..,cores)")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--nvcc", action="store_true", help="also nvcc, one thread per worker")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cores = usable_cpus()
    if args.workers:
        counts = [int(w) for w in args.workers.split(",")]
    else:
        counts = [w for w in (1, 2, 4, 8, 16, 32, 64) if w < cores] + [cores]
    # distinct sources per run so that no run profits from another's work
    print(f"# {platform.node()}: {cores} usable CPUs of {os.cpu_count()}; {args.configs} "
          f"GEMM configurations per run, no cache")  # fmt: skip
    print("| compiler | workers | wall s | kernels/s | mean s per compile | speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in ["nvrtc"] + (["nvcc"] if args.nvcc else []):
        base = None
        for n, workers in enumerate(counts):
            requests = requests_for(args.experiment, args.configs, args.seed + n, args.arch)
            result = run(name, requests, workers)
            base = base or result["per_s"]
            print(
                f"| {name} | {workers} | {result['wall']:.1f} | {result['per_s']:.2f} | "
                f"{result['mean']:.2f} | {result['per_s'] / base:.1f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
