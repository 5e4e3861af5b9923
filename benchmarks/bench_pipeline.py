"""Benchmark: configurations per second of surrotune's pipeline, a plain sequential loop and
Kernel Tuner, on the same configurations of the GEMM space, in one run on one GPU.

Why: compiling a configuration costs ten times what measuring it does, so a tuner that compiles
and measures one configuration after the other leaves the GPU idle most of the time and the CPU
cores but one idle all of the time. surrotune compiles with NVRTC in a process per CPU core and
measures each configuration as soon as its compile is done, while the next batch compiles. This
script measures what that buys, as ratios in one run:

``surrotune``
    :class:`surrotune.runner.Runner` over :class:`surrotune.backends.cuda.CudaBackend` with
    ``compiler = "nvrtc"``, the configurations enqueued in order, ``--batch-size`` (default two
    per CPU core), an empty compile cache. The worker process is started (CuPy, inputs, the
    reference) before the clock starts, as the other two get the reference precomputed.
``sequential``
    the plain loop: for each configuration, compile with NVRTC in this process (the same
    binding, options and cubin as surrotune's), load the cubin with CuPy, poison the output,
    launch once and verify, time the launches with CUDA events, next.
``kernel_tuner``
    Kernel Tuner's ``tune_kernel`` live with ``lang="CUPY"`` (NVRTC through CuPy) and
    ``strategy="brute_force"``, over the same list: a tunable ``config`` (the index into the
    list) and ``block_size_x`` restricted to that configuration's block, the template rendered
    for the configuration by a code generator, no ``#define`` s, the same verification function.

All three verify once against the same float64 reference with the same relative L2 error and
time 7 launches, without warm-up or L2 flush. Every method gets a fresh CuPy kernel cache and
surrotune's disk cache is per method; NVRTC's own cache (CUDA 12.9+, in the driver's compute
cache) is switched off with ``CUDA_CACHE_DISABLE=1``, or every method after the first would find
the successful compiles there.
Printed as a table (method, configurations, wall s, configurations/s, ratio to sequential);
``--out`` writes it as JSON with the statuses of each method and how often they disagree.

    python3 benchmarks/bench_pipeline.py --out bench_pipeline.json [--configs 120] [--seed 0]
        [--methods surrotune,sequential,kernel_tuner] [--batch-size B] [--limit N] [--dry-run]

A GEMM configuration takes about a second to compile with NVRTC on one core (0.4 to 3.5 s on an
H200 host, by the recorded nvcc times scaled by NVRTC's share), so the two one-at-a-time methods
need about a second a configuration each: the default 120 keeps the whole run near 4 minutes.

``--dry-run`` needs no GPU: it samples the configurations, checks that Kernel Tuner's grid and
block equal surrotune's launch geometry for each, and compiles ``--limit`` of them (default 4)
with NVRTC through the sequential loop's path.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from surrotune.backends.compile import CompileError, CompileRequest, usable_cpus
from surrotune.backends.cuda import WorkerFactory, launch_geometry
from surrotune.backends.nvrtc import NvrtcLibrary, find_nvrtc
from surrotune.backends.worker import (
    classify_cuda_error,
    compute_expected,
    create_inputs,
    relative_l2_error,
)
from surrotune.experiment import Experiment, load_experiment
from surrotune.result import ParamValue, Status
from surrotune.space import SearchSpace
from surrotune.template import Template

REPO = Path(__file__).resolve().parents[1]

#: evaluation settings all three methods share: one verifying launch, then 7 timed ones
MEASURE = {"warmup": 0, "repeats": 7, "max_repeats": None, "l2_flush": "never"}
#: NVRTC options Kernel Tuner's CuPy backend needs for the template (C++17 for ``if constexpr``,
#: device-by-default for its constexpr helpers), as surrotune's NVRTC path adds them
KT_OPTIONS = ("-std=c++17", "--device-as-default-execution-space")


@dataclass
class MethodRun:
    """What one method did with the configurations."""

    method: str
    wall_s: float
    statuses: dict[str, str] = field(default_factory=dict)  # config key -> status
    times_ms: dict[str, float] = field(default_factory=dict)  # config key -> median, when ok
    compile_s: float = 0.0  # summed compile time of the configurations (not wall time)
    error: str = ""
    device: dict[str, Any] = field(default_factory=dict)  # the GPU, as the worker saw it
    settings: dict[str, Any] = field(default_factory=dict)  # batch size, batches asked ahead
    compile_ms: list[float] = field(default_factory=list)  # each compile's time, in trial order

    @property
    def configs(self) -> int:
        return len(self.statuses)

    @property
    def configs_per_s(self) -> float:
        return self.configs / self.wall_s if self.wall_s > 0 else math.nan


# --------------------------------------------------------------------------- the configurations


def benchmark_experiment(path: Path) -> Experiment:
    """The experiment with the shared measuring settings (those this version knows)."""
    experiment = load_experiment(path)
    known = {f.name for f in dataclasses.fields(experiment.evaluation)}
    return experiment.with_overrides(**{k: v for k, v in MEASURE.items() if k in known})


def sample_configs(experiment: Experiment, count: int, seed: int) -> list[dict[str, ParamValue]]:
    """``count`` feasible configurations drawn without replacement, in a seeded order."""
    space = SearchSpace(experiment.parameters, experiment.constraints, experiment.sizes)
    frame = space.enumerate()
    order = np.random.default_rng(seed).permutation(len(frame))[: min(count, len(frame))]
    return [
        {name: _python(value) for name, value in record.items()}
        for record in frame.iloc[order].to_dict("records")
    ]


def _python(value: Any) -> ParamValue:
    return value.item() if isinstance(value, np.generic) else value  # type: ignore[no-any-return]


def config_key(config: Mapping[str, ParamValue]) -> str:
    return ",".join(f"{name}={value}" for name, value in config.items())


# --------------------------------------------------------------------------- Kernel Tuner's view


@dataclass(frozen=True)
class KernelTunerProblem:
    """The arguments of ``tune_kernel`` that describe the list of configurations."""

    tune_params: dict[str, list[int]]
    restriction: Callable[[Mapping[str, Any]], bool]
    problem_size: tuple[int, ...]
    grid_div_x: Callable[[Mapping[str, Any]], int]
    grid_div_y: Callable[[Mapping[str, Any]], int]
    source: Callable[[Mapping[str, Any]], str]


def kernel_tuner_problem(
    experiment: Experiment, template: Template, configs: Sequence[Mapping[str, ParamValue]]
) -> KernelTunerProblem:
    """Kernel Tuner tunes the list itself: ``config`` indexes it, ``block_size_x`` must equal
    that configuration's block (Kernel Tuner reads the block from a parameter), the grid divides
    ``(N, M)`` by the configuration's ``BLOCK_N`` and ``BLOCK_M``, and the source is the template
    rendered for the configuration, byte for byte what surrotune compiles."""
    assert experiment.launch is not None
    sizes = dict(experiment.sizes)
    threads = [launch_geometry(experiment.launch, {**sizes, **c}).threads for c in configs]

    def restriction(p: Mapping[str, Any]) -> bool:
        return bool(threads[p["config"]] == p["block_size_x"])

    def source(p: Mapping[str, Any]) -> str:
        return template.render({**sizes, **configs[p["config"]]})

    return KernelTunerProblem(
        tune_params={"block_size_x": sorted(set(threads)), "config": list(range(len(configs)))},
        restriction=restriction,
        problem_size=(int(sizes["N"]), int(sizes["M"])),
        grid_div_x=lambda p: int(configs[p["config"]]["BLOCK_N"]),
        grid_div_y=lambda p: int(configs[p["config"]]["BLOCK_M"]),
        source=source,
    )


def check_kernel_tuner_geometry(
    experiment: Experiment,
    configs: Sequence[Mapping[str, ParamValue]],
    problem: KernelTunerProblem,
) -> list[str]:
    """Configurations whose Kernel Tuner grid or block differs from surrotune's launch (empty
    when the two launch the same kernels), with the restriction admitting exactly the list."""
    assert experiment.launch is not None
    wrong: list[str] = []
    admitted = [
        (block, index)
        for block in problem.tune_params["block_size_x"]
        for index in problem.tune_params["config"]
        if problem.restriction({"block_size_x": block, "config": index})
    ]
    if sorted(index for _, index in admitted) != list(range(len(configs))):
        wrong.append("the restriction does not admit each configuration exactly once")
    for block, index in admitted:
        params = {"block_size_x": block, "config": index}
        ours = launch_geometry(experiment.launch, {**experiment.sizes, **configs[index]})
        grid = (
            -(-problem.problem_size[0] // problem.grid_div_x(params)),
            -(-problem.problem_size[1] // problem.grid_div_y(params)),
            1,
        )
        if grid != ours.grid or (block, 1, 1) != ours.block:
            wrong.append(f"{config_key(configs[index])}: {grid}/{block} vs {ours}")
    return wrong


# --------------------------------------------------------------------------- the methods


def run_surrotune(
    experiment: Experiment,
    configs: Sequence[Mapping[str, ParamValue]],
    *,
    batch_size: int,
    cache_dir: Path,
    worker_factory: WorkerFactory | None = None,
    ask_ahead: int | None = None,
    name: str = "surrotune",
) -> MethodRun:
    """The Runner over the cuda backend with NVRTC, the configurations enqueued in order
    (``worker_factory``: a fake GPU worker, for tests); ``ask_ahead`` batches asked ahead (None:
    what ``surrotune run`` asks, :func:`surrotune.runner.batches_ahead`)."""
    import optuna

    from surrotune.backends.cuda import CudaBackend, cuda_worker_handle
    from surrotune.runner import Runner, batches_ahead

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = SearchSpace(experiment.parameters, experiment.constraints, experiment.sizes)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for config in configs:
        study.enqueue_trial(dict(config), skip_if_exists=False)
    with CudaBackend(
        experiment,
        cache_dir=cache_dir,
        compiler="nvrtc",
        worker_factory=worker_factory or cuda_worker_handle,
    ) as backend:
        device = backend.device()  # the worker is ready (CuPy, inputs, reference): clock starts
        ahead = batches_ahead(backend, batch_size) if ask_ahead is None else ask_ahead
        started = time.perf_counter()
        summary = Runner(
            study=study, space=space, backend=backend, trials=len(configs),
            batch_size=batch_size, ask_ahead=ahead,
        ).run()  # fmt: skip
        wall = time.perf_counter() - started
    run = MethodRun(name, wall, device=device)
    run.settings = {"batch_size": batch_size, "ask_ahead": ahead}
    for trial in study.get_trials(deepcopy=False):
        if "status" in trial.user_attrs and "duplicate_of" not in trial.user_attrs:
            key = config_key(trial.params)
            run.statuses[key] = trial.user_attrs["status"]
            if trial.user_attrs.get("time_ms") is not None:
                run.times_ms[key] = float(trial.user_attrs["time_ms"])
            run.compile_s += (trial.user_attrs.get("compile_time_ms") or 0.0) / 1e3
            run.compile_ms.append(round(trial.user_attrs.get("compile_time_ms") or 0.0, 1))
    if summary.evaluations != len(configs):
        run.error = f"stopped after {summary.evaluations} evaluations: {summary.stop_reason}"
    return run


def run_sequential(
    experiment: Experiment,
    template: Template,
    configs: Sequence[Mapping[str, ParamValue]],
    *,
    inputs: Mapping[str, Any],
    expected: Mapping[str, np.ndarray],
    arch: str,
    library: str,
) -> MethodRun:
    """Compile one configuration with NVRTC, load it, verify it once, time 7 launches; next."""
    import cupy

    kernel, launch, reference = experiment.kernel, experiment.launch, experiment.reference
    assert kernel is not None and launch is not None and reference is not None
    evaluation = experiment.evaluation
    started = time.perf_counter()
    nvrtc = NvrtcLibrary(library)
    device = {n: cupy.asarray(v) if isinstance(v, np.ndarray) else v for n, v in inputs.items()}
    args = tuple(device[arg.name] for arg in experiment.arguments)
    outputs = {name: device[name] for name in expected}
    cuda_errors = (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError)
    run = MethodRun("sequential", 0.0)
    for config in configs:
        env = {**experiment.sizes, **config}
        request = CompileRequest(template.render(env), kernel.name, arch, kernel.options)
        compile_started = time.perf_counter()
        outcome, _ = nvrtc.compile(request)
        run.compile_s += time.perf_counter() - compile_started
        if isinstance(outcome, CompileError):
            status = Status.RESOURCE if outcome.is_resource else Status.COMPILE
            run.statuses[config_key(config)] = status.value
            continue
        geometry = launch_geometry(launch, env)
        try:
            module = cupy.cuda.function.Module()
            module.load(outcome.cubin)
            function = module.get_function(outcome.kernel_name)
            for array in outputs.values():
                array.fill(math.nan)
            function(geometry.grid, geometry.block, args, shared_mem=geometry.dynamic_shared_bytes)
            cupy.cuda.Device().synchronize()
            errors = [relative_l2_error(outputs[n].get(), e) for n, e in expected.items()]
            if not max(errors) <= reference.rtol:
                run.statuses[config_key(config)] = Status.CORRECTNESS.value
                continue
            events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(evaluation.repeats)]
            for start, end in events:
                start.record()
                function(
                    geometry.grid, geometry.block, args, shared_mem=geometry.dynamic_shared_bytes
                )
                end.record()
            events[-1][1].synchronize()
            times = [cupy.cuda.get_elapsed_time(start, end) for start, end in events]
            run.times_ms[config_key(config)] = statistics.median(times)
            run.statuses[config_key(config)] = Status.OK.value
        except cuda_errors as exc:
            status = classify_cuda_error(str(exc))
            run.statuses[config_key(config)] = status.value
            if status is Status.RUNTIME:  # the context is gone: this loop cannot go on
                run.error = f"stopped at a sticky CUDA error: {exc}"
                break
    run.wall_s = time.perf_counter() - started
    return run


def run_kernel_tuner(
    experiment: Experiment,
    template: Template,
    configs: Sequence[Mapping[str, ParamValue]],
    *,
    inputs: Mapping[str, Any],
    expected: Mapping[str, np.ndarray],
) -> MethodRun:
    """Kernel Tuner 1.5 live: brute force over the list, NVRTC through CuPy, 7 iterations."""
    from kernel_tuner import tune_kernel
    from kernel_tuner.util import CompilationFailedConfig, ErrorConfig, RuntimeFailedConfig

    kernel, reference = experiment.kernel, experiment.reference
    assert kernel is not None and reference is not None
    problem = kernel_tuner_problem(experiment, template, configs)
    names = [arg.name for arg in experiment.arguments]
    arguments = [
        np.full_like(inputs[n], np.nan) if n in expected else inputs[n] for n in names
    ]  # an output starts as NaN: what the kernel does not write fails verification
    answer = [expected.get(n) for n in names]
    positions = {n: i for i, n in enumerate(names) if n in expected}
    rtol = reference.rtol

    def verify(answer: Sequence[Any], result: Sequence[Any], atol: Any = None) -> bool:
        return all(relative_l2_error(result[i], answer[i]) <= rtol for i in positions.values())

    started = time.perf_counter()
    run = MethodRun("kernel_tuner", 0.0)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results, _env = tune_kernel(
                kernel.name,
                problem.source,
                problem.problem_size,
                arguments,
                problem.tune_params,
                restrictions=problem.restriction,
                grid_div_x=problem.grid_div_x,
                grid_div_y=problem.grid_div_y,
                answer=answer,
                verify=verify,
                lang="CUPY",
                compiler_options=list(KT_OPTIONS),
                defines={},
                iterations=experiment.evaluation.repeats,
                strategy="brute_force",
                quiet=True,
                verbose=False,
            )
    except Exception as exc:  # one method failing must not lose the others' numbers
        run.wall_s = time.perf_counter() - started
        run.error = f"{type(exc).__name__}: {exc}"
        return run
    run.wall_s = time.perf_counter() - started
    for entry in results:
        error = entry.get("__error__")
        if isinstance(error, CompilationFailedConfig):
            status = Status.COMPILE
        elif isinstance(error, RuntimeFailedConfig):
            status = Status.RESOURCE
        elif isinstance(error, ErrorConfig):
            status = Status.RUNTIME
        else:
            status = Status.OK
            run.times_ms[config_key(configs[entry["config"]])] = float(entry["time"])
        run.statuses[config_key(configs[entry["config"]])] = status.value
        run.compile_s += (entry.get("compile_time") or 0.0) / 1e3
    return run


# --------------------------------------------------------------------------- reporting


def summarize(runs: Sequence[MethodRun]) -> list[dict[str, Any]]:
    """One row per method, with the ratio to the sequential loop's configurations per second
    and how many configurations it judged differently (ok or not) from surrotune."""
    rates = {run.method: run.configs_per_s for run in runs}
    baseline = rates.get("sequential", math.nan)
    reference = next((run for run in runs if run.method.startswith("surrotune")), None)
    rows = []
    for run in runs:
        disagree = time_ratio = None
        if reference is not None:
            common = set(run.statuses) & set(reference.statuses)
            disagree = sum(
                (run.statuses[k] == "ok") != (reference.statuses[k] == "ok") for k in common
            )
            timed = set(run.times_ms) & set(reference.times_ms)
            if timed:  # the same kernels should time the same, whoever launches them
                time_ratio = round(
                    statistics.median(run.times_ms[k] / reference.times_ms[k] for k in timed), 4
                )
        rows.append(
            {
                "method": run.method,
                "configs": run.configs,
                "wall_s": round(run.wall_s, 3),
                "configs_per_s": round(run.configs_per_s, 3),
                "ratio_to_sequential": round(run.configs_per_s / baseline, 3)
                if baseline and math.isfinite(baseline)
                else None,
                "compile_s_summed": round(run.compile_s, 3),
                "statuses": dict(Counter(run.statuses.values())),
                "ok_disagreements_with_surrotune": disagree,
                "median_kernel_time_ratio_to_surrotune": time_ratio,
                "settings": run.settings,
                "compile_ms_in_order": run.compile_ms,
                "error": run.error,
            }
        )
    return rows


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "| method | configs | wall s | configs/s | x sequential | statuses |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = row["ratio_to_sequential"]
        statuses = " ".join(f"{k}={v}" for k, v in sorted(row["statuses"].items()))
        lines.append(
            f"| {row['method']} | {row['configs']} | {row['wall_s']:.1f} | "
            f"{row['configs_per_s']:.2f} | {'-' if ratio is None else f'{ratio:.2f}'} | "
            f"{statuses}{' (' + row['error'] + ')' if row['error'] else ''} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def dry_run(
    experiment: Experiment, configs: Sequence[Mapping[str, ParamValue]], limit: int
) -> int:
    """Check everything that needs no GPU; returns the exit code."""
    assert experiment.kernel is not None
    template = Template.from_file(experiment.kernel.template)
    problem = kernel_tuner_problem(experiment, template, configs)
    wrong = check_kernel_tuner_geometry(experiment, configs, problem)
    print(f"{len(configs)} configurations; Kernel Tuner's launches differ for {len(wrong)}")
    for line in wrong[:10]:
        print("  " + line)
    nvrtc = NvrtcLibrary(find_nvrtc())
    for config in configs[:limit]:
        request = CompileRequest(
            template.render({**experiment.sizes, **config}),
            experiment.kernel.name,
            experiment.kernel.arch or "sm_90",
            experiment.kernel.options,
        )
        outcome, _ = nvrtc.compile(request)
        text = (
            f"error: {outcome.message.splitlines()[0]}"
            if isinstance(outcome, CompileError)
            else f"{outcome.resources.registers} registers"
        )
        print(f"  {config_key(config)}: {outcome.compile_time_ms:.0f} ms, {text}")
    return 1 if wrong else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", type=Path, default=REPO / "experiments" / "gemm.toml")
    parser.add_argument("--configs", type=int, default=120, help="configurations (default 120)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default="surrotune,sequential,kernel_tuner")
    parser.add_argument("--batch-size", type=int, default=2 * usable_cpus())
    parser.add_argument(
        "--ask-ahead", type=int, default=None, help="batches asked ahead (default: as run does)"
    )
    parser.add_argument(
        "--variants", default="", help="more surrotune runs, as BATCHxAHEAD,... (e.g. 16x3)"
    )
    parser.add_argument(
        "--kt-configs", type=int, default=None, help="Kernel Tuner on the first N only"
    )
    parser.add_argument("--limit", type=int, default=None, help="measure only the first N")
    parser.add_argument(
        "--dry-run", action="store_true", help="no GPU: check them all, compile --limit (4)"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args(argv)

    experiment = benchmark_experiment(args.experiment)
    configs = sample_configs(experiment, args.configs, args.seed)
    if args.dry_run:  # every configuration is checked; --limit of them compiled
        return dry_run(experiment, configs, 4 if args.limit is None else args.limit)
    if args.limit is not None:
        configs = configs[: args.limit]

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(methods) - {"surrotune", "sequential", "kernel_tuner"}
    if unknown:
        parser.error(f"unknown method(s): {', '.join(sorted(unknown))}")
    workdir = Path(tempfile.mkdtemp(prefix="surrotune-bench-pipeline-"))
    os.environ["CUPY_CACHE_DIR"] = str(workdir / "cupy")  # fresh, before CuPy is imported
    # NVRTC >= 12.9 keeps its own cache in the driver's compute cache (~/.nv/ComputeCache) when
    # a driver is present: the second method to compile a configuration would get it in ~25 ms.
    # Off before NVRTC or CUDA is loaded here or in any child, so that every method compiles.
    os.environ["CUDA_CACHE_DISABLE"] = "1"
    assert experiment.kernel is not None
    template = Template.from_file(experiment.kernel.template)
    print(f"{len(configs)} configurations of {experiment.path.name} (seed {args.seed}); "
          f"{usable_cpus()} CPU cores; batch size {args.batch_size}", flush=True)  # fmt: skip

    runs: list[MethodRun] = []
    device: dict[str, Any] = {}

    def record(run: MethodRun) -> None:
        """Keep the run and rewrite --out, so that a run cut short keeps what it measured."""
        runs.append(run)
        print(f"{run.method}: {run.configs} in {run.wall_s:.1f} s {run.error}", flush=True)
        if args.out is not None:
            document = {
                "benchmark": "pipeline",
                "experiment": str(experiment.path),
                "configs": len(configs),
                "seed": args.seed,
                "cpu_count": usable_cpus(),
                "batch_size": args.batch_size,
                "measure": MEASURE,
                "device": {k: device.get(k) for k in ("name", "arch", "driver_version")},
                "nvrtc": NvrtcLibrary(find_nvrtc()).version_text,
                "python": sys.version.split()[0],
                "methods": summarize(runs),
            }
            args.out.write_text(json.dumps(document, indent=2))

    if "surrotune" in methods:
        settings = [(args.batch_size, args.ask_ahead, "surrotune")]
        for variant in (v.strip() for v in args.variants.split(",") if v.strip()):
            batch, _, ahead = variant.partition("x")
            settings.append((int(batch), int(ahead), f"surrotune b{batch} a{ahead}"))
        for i, (batch_size, ahead, name) in enumerate(settings):
            run = run_surrotune(
                experiment, configs, batch_size=batch_size, ask_ahead=ahead, name=name,
                cache_dir=workdir / f"kernels-{i}",
            )  # fmt: skip
            device = run.device
            record(run)
    if {"sequential", "kernel_tuner"} & set(methods):
        import cupy

        from surrotune.backends.worker import device_properties

        device = device_properties(cupy, 0)
        inputs = create_inputs(experiment.arguments, experiment.sizes, experiment.evaluation.seed)
        expected = compute_expected(experiment, inputs)
        arch = experiment.kernel.arch or device["arch"]
        if "sequential" in methods:
            record(
                run_sequential(
                    experiment,
                    template,
                    configs,
                    inputs=inputs,
                    expected=expected,
                    arch=arch,
                    library=find_nvrtc(),
                )
            )
        if "kernel_tuner" in methods:
            subset = configs[: args.kt_configs] if args.kt_configs else configs
            record(
                run_kernel_tuner(experiment, template, subset, inputs=inputs, expected=expected)
            )

    print()
    print(format_table(summarize(runs)))
    if args.out is not None:
        print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
