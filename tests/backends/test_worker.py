"""The worker process containment, driven by fake targets: no GPU, no CuPy.

Every way a kernel can end a worker (an answer, a Python exception, a crash, a hang, a sticky
error that retires the process) is played here by a plain function, so the parent-side logic
that turns them into outcomes and replaces dead workers runs on CI.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from surrotune.backends.worker import (
    DEVICE_PROPERTIES,
    LaunchJob,
    LaunchReply,
    Outcome,
    Retire,
    WorkerHandle,
    WorkerStartError,
    check_inputs,
    create_inputs,
    device_properties,
)
from surrotune.experiment import Experiment, ExperimentError, load_experiment
from surrotune.result import Status

# --------------------------------------------------------------------------- fake targets
# Module-level, because the spawn context pickles a target by reference.


def scripted(init: Any) -> tuple[Any, Callable[[Any], Any]]:
    """Says hello with ``init``; each job is a (command, argument) pair."""

    def handle(job: tuple[str, Any]) -> Any:
        command, argument = job
        if command == "echo":
            return argument
        if command == "pid":
            return os.getpid()
        if command == "exit":
            os._exit(argument)
        if command == "signal":
            os.kill(os.getpid(), argument)
            time.sleep(60)
        if command == "hang":
            time.sleep(argument)
            return "woke up"
        if command == "raise":
            raise ValueError(argument)
        if command == "retire":
            return Retire(argument)
        raise AssertionError(f"unknown command {command!r}")

    return ("hello", init), handle


def setup_raises(init: Any) -> tuple[Any, Callable[[Any], Any]]:
    raise RuntimeError("no GPU in this fake")


def setup_exits(init: Any) -> tuple[Any, Callable[[Any], Any]]:
    os._exit(7)


def setup_hangs(init: Any) -> tuple[Any, Callable[[Any], Any]]:
    time.sleep(60)
    raise AssertionError("unreachable")


@pytest.fixture
def handle() -> Iterator[WorkerHandle]:
    worker = WorkerHandle(scripted, 42, start_timeout_s=60.0, name="fake-worker")
    yield worker
    worker.close()


# --------------------------------------------------------------------------- answers


def test_reply_and_hello(handle: WorkerHandle) -> None:
    assert not handle.alive  # lazy: nothing runs before it is needed
    assert handle.hello == ("hello", 42)
    reply = handle.request(("echo", {"x": [1, 2]}), timeout_s=30)
    assert reply.outcome is Outcome.REPLY
    assert reply.value == {"x": [1, 2]}
    assert not reply.retired
    assert handle.alive


def test_requests_reuse_one_process(handle: WorkerHandle) -> None:
    first = handle.request(("pid", None), timeout_s=30).value
    second = handle.request(("pid", None), timeout_s=30).value
    assert first == second == handle.pid
    assert first != os.getpid()
    assert handle.starts == 1


def test_submit_then_receive(handle: WorkerHandle) -> None:
    handle.submit(("echo", "later"))
    with pytest.raises(RuntimeError, match="already pending"):
        handle.submit(("echo", "again"))
    assert handle.receive(timeout_s=30).value == "later"
    with pytest.raises(RuntimeError, match="no job is pending"):
        handle.receive(timeout_s=1)


# --------------------------------------------------------------------------- failures


def test_exception_is_reported_and_the_process_lives_on(handle: WorkerHandle) -> None:
    pid = handle.request(("pid", None), timeout_s=30).value
    reply = handle.request(("raise", "boom"), timeout_s=30)
    assert reply.outcome is Outcome.ERROR
    assert "ValueError: boom" in reply.message
    assert handle.request(("pid", None), timeout_s=30).value == pid
    assert handle.starts == 1


def test_death_reports_the_exit_code_and_a_fresh_worker_follows(handle: WorkerHandle) -> None:
    pid = handle.request(("pid", None), timeout_s=30).value
    reply = handle.request(("exit", 3), timeout_s=30)
    assert reply.outcome is Outcome.DIED
    assert reply.exit_code == 3
    assert reply.message == "worker process died (exit code 3)"
    assert not handle.alive
    after = handle.request(("pid", None), timeout_s=30)
    assert after.outcome is Outcome.REPLY
    assert after.value != pid
    assert handle.starts == 2


def test_death_by_signal_names_the_signal(handle: WorkerHandle) -> None:
    reply = handle.request(("signal", signal.SIGSEGV), timeout_s=30)
    assert reply.outcome is Outcome.DIED
    assert reply.exit_code == -signal.SIGSEGV
    assert "SIGSEGV" in reply.message
    assert handle.request(("echo", "still here"), timeout_s=30).value == "still here"


def test_hang_times_out_kills_and_restarts(handle: WorkerHandle) -> None:
    pid = handle.request(("pid", None), timeout_s=30).value
    reply = handle.request(("hang", 60), timeout_s=0.5)
    assert reply.outcome is Outcome.TIMEOUT
    assert "0.5 s" in reply.message and "killed" in reply.message
    assert not handle.alive
    with pytest.raises(ProcessLookupError):  # really gone, not merely forgotten
        os.kill(pid, 0)
    after = handle.request(("pid", None), timeout_s=30)
    assert after.outcome is Outcome.REPLY and after.value != pid


def test_retire_answers_then_the_next_job_gets_a_new_process(handle: WorkerHandle) -> None:
    pid = handle.request(("pid", None), timeout_s=30).value
    reply = handle.request(("retire", "sticky error"), timeout_s=30)
    assert reply.outcome is Outcome.REPLY
    assert reply.value == "sticky error"
    assert reply.retired
    assert reply.exit_code == 0
    assert handle.request(("pid", None), timeout_s=30).value != pid
    assert handle.starts == 2


# --------------------------------------------------------------------------- lifecycle


def test_restart_replaces_the_process(handle: WorkerHandle) -> None:
    pid = handle.request(("pid", None), timeout_s=30).value
    handle.restart()
    assert handle.alive and handle.pid != pid
    assert handle.request(("echo", 1), timeout_s=30).value == 1


def test_close_stops_the_process_and_is_idempotent(handle: WorkerHandle) -> None:
    handle.start()
    assert handle.alive
    handle.close()
    assert not handle.alive and handle.pid is None
    handle.close()
    # a closed handle starts again on demand
    assert handle.request(("echo", "again"), timeout_s=30).value == "again"


def test_close_kills_a_busy_worker(handle: WorkerHandle) -> None:
    handle.submit(("hang", 60))
    pid = handle.pid
    assert pid is not None
    handle.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_setup_exception_is_a_start_error() -> None:
    with (
        WorkerHandle(setup_raises, name="fake") as worker,
        pytest.raises(WorkerStartError, match="no GPU in this fake"),
    ):
        worker.start()


def test_setup_death_is_a_start_error() -> None:
    with (
        WorkerHandle(setup_exits, name="fake") as worker,
        pytest.raises(WorkerStartError, match=r"exit code 7"),
    ):
        worker.request(("echo", 1), timeout_s=30)


def test_slow_setup_is_a_start_error() -> None:
    with WorkerHandle(setup_hangs, start_timeout_s=0.5, name="fake") as worker:
        with pytest.raises(WorkerStartError, match=r"did not get ready within 0\.5 s"):
            worker.start()
        assert not worker.alive


# --------------------------------------------------------------------------- the CUDA job loop
# _CudaState.run against an imitation of the few CuPy calls it makes, with a clock that each
# launch advances by a scripted duration: rounds, stop reasons, the L2 flush and its place
# outside the timed events, the clocks, and the shared-memory opt-in are checked on the CPU.


class _FakeError(Exception):
    pass


class _DeviceArray(np.ndarray):
    def get(self) -> np.ndarray:
        return np.array(self)


class _Gpu:
    """A stream: launches advance ``now`` by the next duration; everything is logged in order."""

    def __init__(self, durations: Iterator[float]) -> None:
        self.durations = durations
        self.now = 0.0
        self.log: list[str] = []
        self.memsets: list[int] = []
        self.attributes: dict[int, int] = {}

    def memset(self, pointer: int, value: int, size: int, stream: int) -> None:
        self.log.append("flush")
        self.memsets.append(size)

    def set_attribute(self, pointer: int, attribute: int, value: int) -> None:
        self.attributes[attribute] = value


class _Event:
    def __init__(self, gpu: _Gpu) -> None:
        self.gpu = gpu
        self.at = math.nan

    def record(self) -> None:
        self.gpu.log.append("event")
        self.at = self.gpu.now

    def synchronize(self) -> None:
        pass


class _Function:
    ptr = 77

    def __init__(self, gpu: _Gpu) -> None:
        self.gpu = gpu

    def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int = 0) -> None:
        self.gpu.log.append("launch")
        self.gpu.now += next(self.gpu.durations)
        x, y = args
        y[:] = x


def _fake_cupy(gpu: _Gpu) -> Any:
    class Module:
        def load(self, cubin: bytes) -> None:
            pass

        def get_function(self, name: str) -> _Function:
            return _Function(gpu)

    class Device:
        def synchronize(self) -> None:
            pass

    cuda = SimpleNamespace(
        Event=lambda: _Event(gpu),
        get_elapsed_time=lambda start, end: end.at - start.at,
        get_current_stream=lambda: SimpleNamespace(ptr=0),
        Device=Device,
        function=SimpleNamespace(Module=Module),
        runtime=SimpleNamespace(CUDARuntimeError=_FakeError, memsetAsync=gpu.memset),
        driver=SimpleNamespace(
            CUDADriverError=_FakeError,
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8,
            funcSetAttribute=gpu.set_attribute,
        ),
    )
    buffers = SimpleNamespace(data=SimpleNamespace(ptr=1))
    return SimpleNamespace(
        cuda=cuda,
        uint8=np.uint8,
        empty=lambda size, dtype: SimpleNamespace(data=buffers.data, nbytes=size),
    )


class _Clocks:
    source, note = "fake", ""

    def __init__(self, gpu: _Gpu) -> None:
        self.gpu = gpu
        self.started_at: list[int] = []

    def start(self) -> Any:
        self.started_at.append(len(self.gpu.log))
        reading = {"sm_clock_mhz": 1980.0, "memory_clock_mhz": 2619.0}
        return SimpleNamespace(result=lambda: reading)


def _state(gpu: _Gpu, *, working_set: int = 2**20, l2: int | None = 50 * 2**20) -> Any:
    from surrotune.backends.worker import _CudaState

    x = np.arange(1, 9, dtype=np.float32).view(_DeviceArray)
    y = np.zeros(8, np.float32).view(_DeviceArray)
    return _CudaState(
        cupy=_fake_cupy(gpu),
        args=(x, y),
        poisoned={"y": y},
        expected={"y": np.array(x)},
        rtol=1e-6,
        working_set_bytes=working_set,
        l2_bytes=l2,
        clocks=_Clocks(gpu),
    )


def _job(**fields: Any) -> LaunchJob:
    defaults: dict[str, Any] = {
        "cubin": b"\x7fELF",
        "kernel_name": "copy",
        "grid": (1, 1, 1),
        "block": (8, 1, 1),
        "dynamic_shared_bytes": 0,
        "warmup": 2,
        "repeats": 5,
    }
    return LaunchJob(**{**defaults, **fields})


def _noisy(sd: float, seed: int = 0) -> Iterator[float]:
    rng = np.random.default_rng(seed)
    while True:
        yield float(rng.lognormal(0.0, sd))


def test_a_plain_job_times_exactly_repeats() -> None:
    """A LaunchJob with only the fields it always had is timed as before: repeats launches,
    no flush, whatever the L2."""
    gpu = _Gpu(_noisy(0.3))
    reply = _state(gpu).run(_job())
    assert isinstance(reply, LaunchReply) and reply.status is Status.OK, reply.error
    assert len(reply.times_ms) == 5 and reply.timing_stop == "repeats"
    assert reply.timing_precision is None  # 5 times give no 95 % interval
    assert gpu.log.count("launch") == 1 + 2 + 5 and gpu.memsets == []
    assert reply.l2_flush is False
    assert reply.clocks == {"sm_clock_mhz": 1980.0, "memory_clock_mhz": 2619.0}


def test_adaptive_job_stops_at_the_target_precision() -> None:
    gpu = _Gpu(_noisy(0.001))
    reply = _state(gpu).run(_job(repeats=10, max_repeats=500, max_measure_s=60.0))
    assert reply.timing_stop == "precision" and len(reply.times_ms) == 10
    assert reply.timing_precision is not None and reply.timing_precision <= 0.01


def test_adaptive_job_keeps_every_time_until_the_cap() -> None:
    gpu = _Gpu(_noisy(0.5))
    reply = _state(gpu).run(_job(repeats=10, max_repeats=40, max_measure_s=60.0))
    assert reply.timing_stop == "max_repeats" and len(reply.times_ms) == 40
    assert reply.timing_precision is not None and reply.timing_precision > 0.01
    assert gpu.log.count("launch") == 1 + 2 + 40  # every timed launch is kept
    assert len(set(reply.times_ms)) == 40


def test_adaptive_job_stops_at_the_time_cap() -> None:
    def slow() -> Iterator[float]:
        for duration in _noisy(0.5):
            time.sleep(0.002)
            yield duration

    gpu = _Gpu(slow())
    reply = _state(gpu).run(_job(repeats=10, max_repeats=10_000, max_measure_s=0.05))
    assert reply.timing_stop == "max_measure_time"
    assert 10 <= len(reply.times_ms) < 60


def test_the_l2_is_flushed_outside_the_timed_events() -> None:
    gpu = _Gpu(_noisy(0.01))
    reply = _state(gpu, working_set=2**20, l2=50 * 2**20).run(_job(l2_flush="auto"))
    assert reply.l2_flush is True
    assert gpu.memsets == [100 * 2**20] * 5  # twice the L2, once per timed launch
    timed = gpu.log[gpu.log.index("flush") :]
    assert timed == ["flush", "event", "launch", "event"] * 5
    assert "flush" not in gpu.log[: gpu.log.index("flush")]  # not before checked or warm-up


def test_no_flush_for_a_working_set_larger_than_the_l2() -> None:
    gpu = _Gpu(_noisy(0.01))
    reply = _state(gpu, working_set=2**30, l2=50 * 2**20).run(_job(l2_flush="auto"))
    assert reply.l2_flush is False and gpu.memsets == []
    always = _Gpu(_noisy(0.01))
    assert _state(always, l2=None).run(_job(l2_flush="always")).l2_flush is True
    assert always.memsets == [256 * 2**20] * 5  # unknown L2 size: a generous buffer


def test_clocks_are_read_while_the_first_round_runs() -> None:
    gpu = _Gpu(_noisy(0.5))
    state = _state(gpu)
    state.run(_job(repeats=10, max_repeats=40, max_measure_s=60.0))
    # once, right after the first round was queued (checked + 2 warm-up + 10 timed launches)
    first_round_end = 3 + 10 * 3
    assert state.clocks.started_at == [first_round_end]


def test_shared_memory_opt_in_counts_the_static_part() -> None:
    gpu = _Gpu(_noisy(0.01))
    state = _state(gpu)
    state.run(_job(dynamic_shared_bytes=16384, static_shared_bytes=40960))
    assert gpu.attributes == {8: 16384}  # 56 KB in all: over the 48 KB default
    plain = _Gpu(_noisy(0.01))
    _state(plain).run(_job(dynamic_shared_bytes=16384))
    assert plain.attributes == {}


def test_launch_job_policy() -> None:
    assert _job().policy.max_repeats == 5 and not _job().policy.adaptive
    policy = _job(repeats=10, max_repeats=200, target_precision=0.02, max_measure_s=3.0).policy
    assert policy.adaptive and policy.target_precision == 0.02 and policy.max_seconds == 3.0


# --------------------------------------------------------------------------- inputs and device


def _experiment(tmp_path: Path, fill: str, output_fill: str = "output") -> Experiment:
    (tmp_path / "k.cu").write_text("// ${B}\n")
    (tmp_path / "ref.py").write_text("def f(x, y):\n    return {'y': x}\n")
    (tmp_path / "e.toml").write_text(
        '[kernel]\ntemplate = "k.cu"\nname = "k"\n[sizes]\nN = 8\n'
        f'[[arguments]]\nname = "x"\ndtype = "float32"\nshape = ["N"]\nfill = "{fill}"\n'
        f'[[arguments]]\nname = "y"\ndtype = "float32"\nshape = ["N"]\nfill = "{output_fill}"\n'
        "output = true\n"
        '[[arguments]]\nname = "n"\ndtype = "int32"\nvalue = "0"\n'
        '[launch]\ngrid = [1]\nblock = ["B"]\n[parameters]\nB = [32]\n'
        '[reference]\nfunction = "ref.py:f"\n'
    )
    return load_experiment(tmp_path / "e.toml")


def test_all_zero_inputs_are_refused(tmp_path: Path) -> None:
    experiment = _experiment(tmp_path, fill="zeros")
    values = create_inputs(experiment.arguments, experiment.sizes, seed=0)
    with pytest.raises(ExperimentError) as info:
        check_inputs(experiment, values)
    assert info.value.key == "arguments[0].fill" and info.value.file == str(experiment.path)
    assert "'x' is all zeros" in info.value.message and '"random"' in info.value.message


def test_filled_inputs_pass(tmp_path: Path) -> None:
    # a zero scalar and a zero-filled output are fine: outputs are poisoned before each check
    for fill in ("random", "randint", "ones"):
        experiment = _experiment(tmp_path, fill=fill, output_fill="zeros")
        check_inputs(experiment, create_inputs(experiment.arguments, experiment.sizes, seed=1))


def test_device_properties_fill_gaps_from_attributes() -> None:
    """An older CuPy omits fields the occupancy calculator needs; they come from
    cudaDeviceGetAttribute, and the PCI bus id addresses NVML."""
    asked: list[int] = []

    def attribute(number: int, device: int) -> int:
        asked.append(number)
        return {106: 32, 111: 1024, 13: 1980000, 36: 2619000}.get(number, -1)

    fields = {
        "name": b"NVIDIA H200",
        "major": 9,
        "minor": 0,
        "maxThreadsDim": (1024, 1024, 64),
        "l2CacheSize": 62914560,
    }
    runtime = SimpleNamespace(
        getDeviceProperties=lambda device: fields,
        deviceGetAttribute=attribute,
        runtimeGetVersion=lambda: 13000,
        driverGetVersion=lambda: 13000,
        deviceGetPCIBusId=lambda device: "0000:19:00.0",
    )
    props = device_properties(SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)), 0)
    assert props["maxBlocksPerMultiProcessor"] == 32 and props["reservedSharedMemPerBlock"] == 1024
    assert props["l2CacheSize"] == 62914560 and 38 not in asked  # present: not asked again
    assert props["pciBusId"] == "0000:19:00.0" and props["arch"] == "sm_90"
    assert set(DEVICE_PROPERTIES) <= set(props)


# --------------------------------------------------------------------------- through the backend

BACKEND_EXPERIMENT = """\
[kernel]
template = "copy.cu"
name = "copy"

[sizes]
N = 4096

[[arguments]]
name = "x"
dtype = "float32"
shape = ["N"]

[[arguments]]
name = "y"
dtype = "float32"
shape = ["N"]
output = true

[launch]
grid = ["cdiv(N, BLOCK)"]
block = ["BLOCK"]
shared_memory = "SMEM"

[parameters]
BLOCK = [128, 256]
SMEM = [0, 16384]

[reference]
function = "ref.py:copy"

[evaluation]
warmup = 1
min_repeats = 12
max_repeats = 300
target_precision = 0.02
max_measure_time = "2s"
l2_flush = "always"
kernel_timeout = 2
"""

COPY = """\
extern "C" __global__ void copy(const float* x, float* y) {
    __shared__ float tile[10240];  // 40 KB static
    extern __shared__ float extra[];
    int i = blockIdx.x * ${BLOCK} + threadIdx.x;
    tile[threadIdx.x] = x[i];
    __syncthreads();
    y[i] = tile[threadIdx.x] + (${SMEM} > 0 ? extra[0] * 0.0f : 0.0f);
}
"""


def echo_gpu(init: Any) -> tuple[dict[str, Any], Callable[[LaunchJob], LaunchReply]]:
    """A worker that checks the job carries the experiment's timing settings and answers with
    the timing fields a real one fills in."""

    def handle(job: LaunchJob) -> LaunchReply:
        assert (job.repeats, job.max_repeats, job.warmup) == (12, 300, 1), job
        assert (job.target_precision, job.max_measure_s, job.l2_flush) == (0.02, 2.0, "always")
        assert job.static_shared_bytes == 40960, job.static_shared_bytes
        return LaunchReply(
            Status.OK,
            times_ms=tuple(1.0 + 0.001 * i for i in range(12)),
            verification_error=0.0,
            timing_precision=0.004,
            timing_stop="precision",
            l2_flush=True,
            clocks={"sm_clock_mhz": 1980.0, "gpu_power_w": 250.0, "unknown": 1.0},
        )

    return dict(H200_PROPS), handle


H200_PROPS: dict[str, Any] = {
    "name": "NVIDIA H200", "major": 9, "minor": 0, "arch": "sm_90",
    "multiProcessorCount": 132, "maxThreadsPerBlock": 1024, "maxThreadsDim": [1024, 1024, 64],
    "maxGridSize": [2147483647, 65535, 65535], "sharedMemPerBlock": 49152,
    "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472,
    "reservedSharedMemPerBlock": 1024, "regsPerBlock": 65536, "regsPerMultiprocessor": 65536,
    "maxThreadsPerMultiProcessor": 2048, "maxBlocksPerMultiProcessor": 32,
    "l2CacheSize": 62914560, "warpSize": 32, "device_id": 0,
}  # fmt: skip


@pytest.mark.nvcc
def test_backend_records_occupancy_and_timing(tmp_path: Path) -> None:
    from surrotune.backends.cuda import CudaBackend

    (tmp_path / "copy.cu").write_text(COPY)
    (tmp_path / "ref.py").write_text("def copy(x, y):\n    return {'y': x}\n")
    (tmp_path / "e.toml").write_text(BACKEND_EXPERIMENT)
    experiment = load_experiment(tmp_path / "e.toml")

    def factory(experiment: Experiment, device_id: int) -> WorkerHandle:
        return WorkerHandle(echo_gpu, None, start_timeout_s=60.0, name="echo-gpu")

    with CudaBackend(experiment, worker_factory=factory, compiler="nvcc") as backend:
        small, large = backend.evaluate([{"BLOCK": 128, "SMEM": 0}, {"BLOCK": 256, "SMEM": 16384}])
        # checked + warm-up + first round + one launch past the cap, the cap, the margin
        assert backend.watchdog_s == pytest.approx(2 * (1 + 1 + 12 + 1) + 2 + 10)
    for result in (small, large):
        assert result.status is Status.OK, result.error
        assert result.timing_precision == 0.004 and result.timing_stop == "precision"
        assert result.l2_flush is True
        assert result.sm_clock_mhz == 1980.0 and result.gpu_power_w == 250.0
        assert result.memory_clock_mhz is None
        assert len(result.times_ms) == 12
    # 40 KB static + 1 KB reserve: 5 blocks of 128 threads in 228 KB; with 16 KB more, 4
    assert small.active_blocks_per_sm == 5 and small.occupancy_limiter == "shared"
    assert small.occupancy == pytest.approx(5 * 4 / 64)
    assert large.active_blocks_per_sm == 4 and large.occupancy == pytest.approx(4 * 8 / 64)
    attrs = small.to_user_attrs()
    assert attrs["occupancy_limiter"] == "shared" and attrs["timing_stop"] == "precision"
