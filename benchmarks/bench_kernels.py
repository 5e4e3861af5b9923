"""Each kernel template, tuned, against the library call it competes with and the roofline.

Run on a GPU machine (CuPy; PyTorch for convolution, layer norm and softmax), from the repository
root:

    python3 benchmarks/bench_kernels.py --trials 100 --out kernels.json
        [--kernels reduction,transpose,convolution,layernorm,softmax,gemm] [--repeats 50]
        [--from-recordings]

For each kernel: ``surrotune run experiments/<kernel>.toml`` tunes it (the user's command, the
surrogate sampler, ``--trials`` evaluations, a fresh SQLite storage, sanitizer off); the best
configuration is then measured again through the ``cuda`` backend (``--repeats`` timed launches,
median) and, in this process, on inputs built the same way (same shapes, same seed), the library
call is timed with CUDA events, one pair of events per launch, the L2 cache flushed before each
launch when the experiment's working set fits in it (as the backend does). With
``--from-recordings`` nothing is tuned: each kernel's configuration is the optimum of its shipped
brute-force recording (``experiments/datasets/<kernel>_h200.json.gz``), the best the template can
do, measured again in this run beside the library. The library's output is
checked against the experiment's float64 reference with the experiment's tolerance, so that the
two compute the same thing.

Libraries: GEMM ``cupy.matmul`` (cuBLAS SGEMM, TF32 off), reduction ``cupy.sum`` (CUB),
convolution ``torch.nn.functional.conv2d`` (cuDNN, TF32 off, ``cudnn.benchmark`` on so that cuDNN
picks its fastest algorithm), layer norm ``torch.nn.functional.layer_norm``, softmax
``torch.softmax``, transpose a device-to-device copy of the same bytes (``cudaMemcpy``) — the
floor for any out-of-place transpose.

Rooflines, measured in the same run: the device-to-device copy bandwidth (1 GiB copied, read and
write counted) for the memory-bound kernels, their ``[objective] bytes`` over it; cuBLAS's SGEMM
rate at 8192³ (the attainable fp32 rate) for GEMM and convolution, their ``flops`` over it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
KERNELS = ("reduction", "transpose", "convolution", "layernorm", "softmax", "gemm")
MEMORY_BOUND = {"reduction", "transpose", "layernorm", "softmax"}
COPY_BYTES = 1 << 30


def tune(kernel: str, trials: int, timeout: str, workdir: Path) -> tuple[Path, float]:
    """``surrotune run`` on the kernel's experiment; the storage and the wall time."""
    storage = workdir / f"{kernel}.db"
    command = [
        sys.executable, "-m", "surrotune", "run", str(REPO / "experiments" / f"{kernel}.toml"),
        "--trials", str(trials), "--timeout", timeout, "--storage", str(storage),
        "--sanitize", "none", "--no-progress",
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", flush=True)
    if done.returncode != 0:
        raise RuntimeError(f"surrotune run {kernel} exited {done.returncode}")
    return storage, wall


def best_configuration(storage: Path, study: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The best ok trial's parameters and its user attributes (Optuna, read-only)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    loaded = optuna.load_study(study_name=study, storage=f"sqlite:///{storage}")
    ok = [
        t
        for t in loaded.get_trials(deepcopy=False)
        if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs.get("status") == "ok"
    ]
    if not ok:
        raise RuntimeError(f"no ok trial in {storage}")
    sign = 1 if loaded.direction == optuna.study.StudyDirection.MINIMIZE else -1
    best = min(ok, key=lambda t: sign * float(t.value))
    statuses: dict[str, int] = {}
    for t in loaded.get_trials(deepcopy=False):
        status = t.user_attrs.get("status", t.state.name.lower())
        statuses[status] = statuses.get(status, 0) + 1
    return dict(best.params), {"trials": len(loaded.trials), "statuses": statuses}


def recorded_optimum(kernel: str) -> dict[str, Any]:
    """The optimum of the kernel's shipped brute-force recording at its default size."""
    from surrotune.backends.replay import load_dataset

    recording = load_dataset(REPO / "experiments" / "datasets" / f"{kernel}_h200.json.gz")
    return dict(recording.optimum.config)


def remeasure(experiment: Any, config: Mapping[str, Any], repeats: int) -> float:
    """The configuration's median time through the cuda backend, ms."""
    from surrotune.backends.cuda import CudaBackend

    evaluation = replace(experiment.evaluation, repeats=repeats, max_repeats=None, warmup=5)
    with CudaBackend(replace(experiment, evaluation=evaluation), compiler="nvcc") as backend:
        (result,) = backend.evaluate([dict(config)])
    if result.time_ms is None:
        raise RuntimeError(f"the best configuration did not measure again: {result.error}")
    return float(result.time_ms)


def time_launches(launch: Callable[[], Any], repeats: int, flush_bytes: int) -> float:
    """Median time of ``launch`` over ``repeats`` launches, ms, one event pair each; the L2 is
    overwritten before each launch when ``flush_bytes`` > 0."""
    import cupy as cp

    scratch = cp.empty(flush_bytes, dtype=cp.uint8) if flush_bytes else None
    for _ in range(5):
        launch()
    times = []
    for _ in range(repeats):
        if scratch is not None:
            scratch.fill(1)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def library_call(kernel: str, device: Mapping[str, Any]) -> tuple[str, Callable[[], Any]]:
    """The library's name and a closure computing the kernel's output from its inputs."""
    import cupy as cp

    if kernel == "gemm":
        return "cuBLAS SGEMM (cupy.matmul)", lambda: cp.matmul(device["A"], device["B"])
    if kernel == "reduction":
        return "CUB sum (cupy.sum)", lambda: device["x"].sum()
    if kernel == "transpose":
        src, dst = device["A"], cp.empty_like(device["A"])
        return "device-to-device copy", lambda: dst.data.copy_from_device(src.data, src.nbytes)
    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    t = {name: torch.as_tensor(value, device="cuda") for name, value in device.items()
         if isinstance(value, cp.ndarray)}  # fmt: skip
    if kernel == "convolution":
        image, weights = t["input"][None, None], t["filter"][None, None]
        return "cuDNN conv2d (PyTorch)", lambda: torch.nn.functional.conv2d(image, weights)[0, 0]
    if kernel == "layernorm":
        x, gamma, beta = t["x"], t["gamma"], t["beta"]
        shape = (x.shape[-1],)
        return "PyTorch layer_norm", lambda: torch.nn.functional.layer_norm(
            x, shape, gamma, beta, 1e-5
        )
    if kernel == "softmax":
        return "PyTorch softmax", lambda: torch.softmax(t["x"], dim=-1)
    raise ValueError(kernel)


def check_library(kernel: str, output: Any, expected: Mapping[str, Any]) -> float:
    """The library output's relative L2 error against the reference's output."""
    import cupy as cp

    from surrotune.backends.worker import relative_l2_error

    if kernel == "transpose":  # the copy is the floor, not a transpose: nothing to compare
        return float("nan")
    reference = next(iter(expected.values()))
    if not isinstance(output, cp.ndarray):  # a torch tensor
        output = cp.asarray(output)
    return relative_l2_error(cp.asnumpy(output).reshape(np.shape(reference)), reference)


def copy_bandwidth(repeats: int) -> float:
    """Device-to-device copy bandwidth, GB/s (bytes read + bytes written)."""
    import cupy as cp

    src = cp.ones(COPY_BYTES // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    ms = time_launches(lambda: dst.data.copy_from_device(src.data, src.nbytes), repeats, 0)
    return 2 * COPY_BYTES / (ms * 1e-3) / 1e9


def sgemm_rate(repeats: int) -> float:
    """cuBLAS's SGEMM rate at 8192^3, GFLOP/s."""
    import cupy as cp

    n = 8192
    rng = np.random.default_rng(1)
    a = cp.asarray(rng.uniform(-1, 1, (n, n)).astype(np.float32))
    b = cp.asarray(rng.uniform(-1, 1, (n, n)).astype(np.float32))
    ms = time_launches(lambda: cp.matmul(a, b), max(5, repeats // 5), 0)
    return 2 * n**3 / (ms * 1e-3) / 1e9


def measure_kernel(kernel: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import cupy as cp

    from surrotune.backends.worker import compute_expected, create_inputs
    from surrotune.experiment import load_experiment

    experiment = load_experiment(REPO / "experiments" / f"{kernel}.toml")
    if args.from_recordings:
        config, summary, tune_s = recorded_optimum(kernel), {"source": "recording"}, 0.0
    else:
        storage, tune_s = tune(kernel, args.trials, args.tune_timeout, workdir)
        study = experiment.storage.study if experiment.storage else kernel
        config, summary = best_configuration(storage, study)
    ours_ms = remeasure(experiment, config, args.repeats)

    host = create_inputs(experiment.arguments, experiment.sizes, experiment.evaluation.seed)
    expected = compute_expected(experiment, host)
    device = {k: cp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in host.items()}
    working_set = sum(v.nbytes for v in device.values() if isinstance(v, cp.ndarray))
    l2 = cp.cuda.runtime.getDeviceProperties(0)["l2CacheSize"]
    flush = 2 * l2 if working_set <= l2 else 0
    library, call = library_call(kernel, device)
    library_error = check_library(kernel, call(), expected)
    library_ms = time_launches(call, args.repeats, flush)

    env = dict(experiment.sizes)
    objective = experiment.objective
    flops = objective.flops.evaluate(env) if objective.flops is not None else None
    moved = objective.bytes.evaluate(env) if objective.bytes is not None else None
    row: dict[str, Any] = {
        "kernel": kernel, "config": config, "tune_wall_s": round(tune_s, 1), **summary,
        "time_ms": ours_ms, "library": library, "library_ms": library_ms,
        "library_error": library_error, "library_over_ours": library_ms / ours_ms,
        "flops": flops, "bytes": moved, "l2_flushed": bool(flush),
    }  # fmt: skip
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default=",".join(KERNELS))
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--tune-timeout", default="2m", help="per kernel (default 2m)")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--from-recordings", action="store_true",
                        help="measure each recording's optimum instead of tuning")  # fmt: skip
    args = parser.parse_args()
    import cupy as cp

    workdir = Path(tempfile.mkdtemp(prefix="surrotune-bench-kernels-"))
    props = cp.cuda.runtime.getDeviceProperties(0)
    bandwidth = copy_bandwidth(args.repeats)
    peak = sgemm_rate(args.repeats)
    print(f"# {props['name'].decode()} on {platform.node()}: copy {bandwidth:.0f} GB/s, "
          f"SGEMM 8192^3 {peak:.0f} GFLOP/s", flush=True)  # fmt: skip
    rows = []
    for kernel in [k.strip() for k in args.kernels.split(",") if k.strip()]:
        try:
            row = measure_kernel(kernel, args, workdir)
        except Exception as exc:  # one kernel's failure must not lose the others
            row = {"kernel": kernel, "error": f"{type(exc).__name__}: {exc}"}
            print(f"{kernel}: {row['error']}", flush=True)
        else:
            if kernel in MEMORY_BOUND and row["bytes"]:
                floor_ms = row["bytes"] / (bandwidth * 1e9) * 1e3
            else:
                floor_ms = row["flops"] / (peak * 1e9) * 1e3
            row["roofline"] = "copy bandwidth" if kernel in MEMORY_BOUND else "SGEMM rate"
            row["fraction_of_roofline"] = floor_ms / row["time_ms"]
            print(json.dumps(row), flush=True)
        rows.append(row)
        if args.out is not None:
            document = {
                "device": props["name"].decode(), "copy_GBps": bandwidth, "sgemm_GFLOPs": peak,
                "trials": args.trials, "repeats": args.repeats, "python": sys.version.split()[0],
                "cpus": len(os.sched_getaffinity(0)), "kernels": rows,
            }  # fmt: skip
            args.out.write_text(json.dumps(document, indent=2, default=str))
    print()
    print("| kernel | best configuration | time ms | fraction of roofline | library | library ms "
          "| library / ours |")  # fmt: skip
    print("|---|---|---:|---:|---|---:|---:|")
    for row in rows:
        if "error" in row:
            print(f"| {row['kernel']} | {row['error']} | | | | | |")
            continue
        config = " ".join(f"{k}={v}" for k, v in row["config"].items())
        print(f"| {row['kernel']} | {config} | {row['time_ms']:.4f} | "
              f"{row['fraction_of_roofline']:.2f} ({row['roofline']}) | {row['library']} | "
              f"{row['library_ms']:.4f} | {row['library_over_ours']:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
