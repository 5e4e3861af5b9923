"""The compile/measure pipeline of the cuda backend, with a fake GPU worker.

``prepare`` starts a batch's compiles and returns at once; ``evaluate`` measures each
configuration as soon as its own compile is done and returns the Results in input order; the
runner prepares batch k+1 before evaluating batch k. The worker is a fake that numbers the jobs
it receives (so the measuring order is visible in ``benchmark_time_ms``); the compiles are real
(NVRTC and nvcc, each skipped where missing) except in the ordering test, whose compiler
finishes in an order the test chooses.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import optuna
import pytest

from surrotune.backends.base import Backend, Prepares
from surrotune.backends.compile import (
    CompiledKernel,
    CompileError,
    CompileRequest,
    KernelCompiler,
    KernelResources,
)
from surrotune.backends.cuda import CudaBackend
from surrotune.backends.nvrtc import NvrtcNotFound, find_nvrtc
from surrotune.backends.worker import LaunchJob, LaunchReply, WorkerHandle
from surrotune.experiment import Experiment
from surrotune.result import Status
from surrotune.runner import Runner
from surrotune.sampling import make_sampler
from surrotune.space import SearchSpace
from tests.backends.test_cuda import H200, config, write_vadd

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _has_nvrtc() -> bool:
    try:
        find_nvrtc()
    except NvrtcNotFound:
        return False
    return True


COMPILERS = [
    pytest.param(
        "nvrtc",
        marks=pytest.mark.skipif(
            not _has_nvrtc(), reason="NO NVRTC: pip install nvidia-cuda-nvrtc"
        ),
    ),
    pytest.param("nvcc", marks=pytest.mark.nvcc),
]


def numbering_gpu(init: Any) -> tuple[dict[str, Any], Callable[[LaunchJob], LaunchReply]]:
    """A worker that answers OK to everything and numbers the jobs in the order it gets them."""
    count = 0

    def handle(job: LaunchJob) -> LaunchReply:
        nonlocal count
        count += 1
        return LaunchReply(Status.OK, times_ms=(1.0,) * job.repeats, benchmark_time_ms=count)

    return dict(H200), handle


def numbering_factory(experiment: Experiment, device_id: int) -> WorkerHandle:
    return WorkerHandle(numbering_gpu, None, start_timeout_s=60.0, name="numbering-gpu")


class CountingCompiler:
    """Wraps a real compiler and counts what is submitted to it."""

    def __init__(self, inner: KernelCompiler) -> None:
        self.inner = inner
        self.name = inner.name
        self.submitted: list[CompileRequest] = []

    @property
    def version(self) -> str:
        return self.inner.version

    def submit(self, request: CompileRequest) -> Future[CompiledKernel | CompileError]:
        self.submitted.append(request)
        return self.inner.submit(request)

    def close(self) -> None:
        self.inner.close()


class ScriptedCompiler:
    """Finishes compiles in the order of ``finish_order`` (indices of submission), 50 ms apart,
    each a fake cubin; ``fail`` holds the indices that fail to compile instead."""

    name = "scripted"
    version = "scripted 1"

    def __init__(self, finish_order: list[int], fail: frozenset[int] = frozenset()) -> None:
        self.finish_order = finish_order
        self.fail = fail
        self.futures: list[Future[CompiledKernel | CompileError]] = []
        self._thread: threading.Thread | None = None

    def submit(self, request: CompileRequest) -> Future[CompiledKernel | CompileError]:
        future: Future[CompiledKernel | CompileError] = Future()
        self.futures.append(future)
        if len(self.futures) == len(self.finish_order):
            self._thread = threading.Thread(target=self._finish, daemon=True)
            self._thread.start()
        return future

    def _finish(self) -> None:
        resources = KernelResources(32, 0, 0, 0, 0, 0, 0)
        for index in self.finish_order:
            time.sleep(0.05)
            if index in self.fail:
                self.futures[index].set_result(CompileError("scripted failure"))
            else:
                kernel = CompiledKernel(b"\x7fELF", "vadd", resources, float(index + 1), "")
                self.futures[index].set_result(kernel)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join()


@pytest.fixture
def vadd(tmp_path: Path) -> Experiment:
    return write_vadd(tmp_path)


@pytest.fixture
def numbered(vadd: Experiment) -> Iterator[CudaBackend]:
    with CudaBackend(vadd, worker_factory=numbering_factory, compiler="nvcc") as backend:
        yield backend


def test_the_backend_prepares(numbered: CudaBackend) -> None:
    assert isinstance(numbered, Backend) and isinstance(numbered, Prepares)
    assert isinstance(numbered.compiler, KernelCompiler)


def test_each_configuration_is_measured_as_soon_as_its_compile_is_done(
    numbered: CudaBackend,
) -> None:
    configs = [config(block=b) for b in (64, 128, 256, 512)]
    numbered.compiler = ScriptedCompiler(finish_order=[3, 1, 2, 0], fail=frozenset({2}))
    results = numbered.evaluate(configs)
    assert [r.config for r in results] == configs  # in input order
    assert [r.status for r in results] == [Status.OK, Status.OK, Status.COMPILE, Status.OK]
    # measured in the order the compiles finished: 3 first, then 1, then (2 failed) 0
    assert [results[i].benchmark_time_ms for i in (3, 1, 0)] == [1, 2, 3]
    assert results[2].error == "scripted failure" and results[2].benchmark_time_ms is None


@pytest.mark.parametrize("compiler", COMPILERS)
def test_prepared_compiles_are_what_evaluate_measures(vadd: Experiment, compiler: str) -> None:
    configs = [config(block=128), config(block=128, mode=9), config(block=2048), config(64)]
    with CudaBackend(vadd, worker_factory=numbering_factory, compiler=compiler) as backend:
        counting = CountingCompiler(backend.compiler)
        backend.compiler = counting
        assert counting.name == compiler
        backend.prepare(configs)
        backend.prepare(configs[:2])  # preparing again starts nothing new
        assert len(counting.submitted) == 4
        results = backend.evaluate(configs)
        assert len(counting.submitted) == 4  # evaluate took the compiles prepare had started
        assert [r.status for r in results] == [
            Status.OK,
            Status.COMPILE,
            Status.RESOURCE,  # 2048 threads: refused before launching
            Status.OK,
        ]
        assert "MODE 9 does not compile" in results[1].error
        assert results[0].registers is not None and results[0].compile_time_ms
        backend.evaluate(configs[:1])  # nothing prepared: compiled (from the cache) on demand
        assert len(counting.submitted) == 5


@pytest.mark.skipif(not _has_nvrtc(), reason="NO NVRTC: pip install nvidia-cuda-nvrtc")
def test_a_compile_past_its_deadline_is_a_timeout_trial(vadd: Experiment) -> None:
    with CudaBackend(vadd, worker_factory=numbering_factory, compiler="nvrtc") as backend:
        backend.compiler.timeout_s = 0.001  # type: ignore[attr-defined]
        (late,) = backend.evaluate([config(block=256)])
        assert late.status is Status.TIMEOUT and "did not finish" in late.error
        backend.compiler.timeout_s = 120.0  # type: ignore[attr-defined]
        (ok,) = backend.evaluate([config(block=256)])
        assert ok.status is Status.OK


@pytest.mark.parametrize("compiler", COMPILERS)
def test_the_runner_pipelines_the_cuda_backend(
    vadd: Experiment, tmp_path: Path, compiler: str
) -> None:
    space = SearchSpace(vadd.parameters, ["BLOCK >= 128", "SMEM_KB <= 100"])  # 30 configurations
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'db.sqlite'}",
        sampler=make_sampler("brute-force", space, seed=0),
    )
    with CudaBackend(
        vadd, worker_factory=numbering_factory, compiler=compiler, cache_dir=tmp_path / "cache"
    ) as backend:
        counting = CountingCompiler(backend.compiler)
        backend.compiler = counting
        summary = Runner(study=study, space=space, backend=backend, trials=10, batch_size=4).run()
    assert summary.evaluations == 10 and summary.stop_reason == "budget"
    trials = study.get_trials()
    assert len(trials) == 10 and not [t for t in trials if t.user_attrs.get("interrupted")]
    statuses = {t.user_attrs["status"] for t in trials}
    assert statuses <= {"ok", "compile", "resource"}
    for trial in trials:
        expected = "compile" if trial.params["MODE"] == 9 else "ok"
        if trial.params["BLOCK"] == 2048 and expected == "ok":
            expected = "resource"
        assert trial.user_attrs["status"] == expected, trial.params
    # every configuration compiled once, all of them through prepare (nothing was left over)
    assert len(counting.submitted) == len({r.source for r in counting.submitted}) == 10
    numbers = sorted(t.user_attrs["benchmark_time_ms"] for t in trials if "benchmark_time_ms"
                     in t.user_attrs)  # fmt: skip
    assert numbers == list(range(1, len(numbers) + 1))  # one worker measured them one by one


def test_a_compiler_that_cannot_run_is_raised_not_recorded(vadd: Experiment) -> None:
    """A missing nvcc is no configuration's fault: evaluate raises instead of failing trials."""
    with (
        CudaBackend(
            vadd, worker_factory=numbering_factory, compiler="nvcc", nvcc="/no/such/nvcc"
        ) as backend,
        pytest.raises(FileNotFoundError, match="/no/such/nvcc"),
    ):
        backend.evaluate([config(block=128)])


def _cxx_vadd(experiment: Experiment) -> Experiment:
    """The vector add without ``extern "C"``: NVRTC finds it by its lowered (mangled) name."""
    assert experiment.kernel is not None
    path = experiment.kernel.template
    path.write_text(path.read_text().replace('extern "C" __global__', "__global__"))
    return experiment


@pytest.mark.skipif(not _has_nvrtc(), reason="NO NVRTC: pip install nvidia-cuda-nvrtc")
def test_a_cxx_kernel_needs_no_extern_c_with_nvrtc(vadd: Experiment) -> None:
    experiment = _cxx_vadd(vadd)
    with CudaBackend(experiment, worker_factory=numbering_factory, compiler="nvrtc") as backend:
        (result,) = backend.evaluate([config(block=128)])
    assert result.status is Status.OK and result.registers


@pytest.mark.gpu
@pytest.mark.skipif(not _has_nvrtc(), reason="NO NVRTC: pip install nvidia-cuda-nvrtc")
def test_gpu_pipeline_with_nvrtc(vadd: Experiment) -> None:
    """On the GPU: prepared NVRTC cubins load and verify, C++ names included."""
    configs = [config(block=128), config(block=256, smem_kb=100), config(block=64, mode=1)]
    with CudaBackend(vadd, compiler="nvrtc") as backend:
        backend.prepare(configs)
        results = backend.evaluate(configs)
    assert [r.status for r in results] == [Status.OK, Status.OK, Status.CORRECTNESS]
    with CudaBackend(_cxx_vadd(vadd), compiler="nvrtc") as backend:
        (result,) = backend.evaluate([config(block=128)])
    assert result.status is Status.OK, result.error
