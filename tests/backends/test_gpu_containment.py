"""Containment through a whole tuning run: a kernel that faults costs one trial, a kernel that
never ends is killed by the watchdog, and the run goes on with a fresh worker.

The experiment is tests/fixtures/broken/broken.toml, a vector add whose MODE parameter selects a
way to fail (an out-of-bounds write through a wild pointer, a misaligned store, ``__trap()``, an
endless loop, a wrong result). The same run is played twice:

* on CI (needs nvcc, no GPU): the real Runner and CudaBackend compile every configuration, and a
  fake worker reads the mode from the cubin (broken.cu embeds it as a string) and fails the way
  a GPU worker can fail: a sticky error that retires it, a segfault, an abrupt exit, a hang;
* on the GPU (``gpu``): the same run with the real worker, where the driver's messages must
  reach the trials.

tests/backends/test_worker.py covers the worker handle itself (every way a child can end);
test_cuda.py the backend's stages. This file is about the run as a user sees it.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from surrotune.backends import cuda
from surrotune.backends.cuda import CudaBackend
from surrotune.backends.worker import (
    LaunchJob,
    LaunchReply,
    Retire,
    WorkerHandle,
    cuda_error_name,
)
from surrotune.experiment import Experiment, load_experiment
from surrotune.result import ParamValue, Status
from surrotune.runner import Runner, read_study
from surrotune.space import SearchSpace
from surrotune.storage import open_storage

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda import H200

BROKEN = Path(__file__).resolve().parents[1] / "fixtures" / "broken" / "broken.toml"

#: the run: each broken configuration is followed by a good one, which must measure on a fresh
#: worker; the block sizes keep every configuration distinct
RUN: list[dict[str, ParamValue]] = [
    {"BLOCK": 64, "MODE": "ok"},
    {"BLOCK": 64, "MODE": "oob_write"},
    {"BLOCK": 128, "MODE": "ok"},
    {"BLOCK": 64, "MODE": "misaligned"},
    {"BLOCK": 256, "MODE": "ok"},
    {"BLOCK": 64, "MODE": "trap"},
    {"BLOCK": 512, "MODE": "ok"},
    {"BLOCK": 64, "MODE": "endless"},
    {"BLOCK": 1024, "MODE": "ok"},
    {"BLOCK": 64, "MODE": "wrong"},
    {"BLOCK": 128, "MODE": "race"},  # wrong in a way only compute-sanitizer sees (ok here)
    {"BLOCK": 128, "MODE": "oob_by_one"},  # likewise
]

_TAG = re.compile(rb"surrotune-mode=(\w+);")


# --------------------------------------------------------------------------- the fake worker
# Module-level, because the spawn context pickles a worker target by reference.


def tagged_worker(init: Any) -> tuple[dict[str, Any], Callable[[LaunchJob], Any]]:
    """Answers like an H200 worker, failing as the mode in the cubin says."""

    def handle(job: LaunchJob) -> Any:
        match = _TAG.search(job.cubin)
        assert match is not None, "broken.cu embeds its mode in the cubin"
        mode = match[1].decode()
        if mode == "oob_write":  # the real worker's answer to a sticky error: reply, then exit
            return Retire(
                LaunchReply(
                    Status.RUNTIME,
                    error="running: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was "
                    "encountered",
                )
            )
        if mode == "misaligned":  # the driver takes the process down
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(60)
        if mode == "trap":  # the process ends without a word
            os._exit(3)
        if mode == "endless":
            time.sleep(3600)
        if mode == "wrong":
            return LaunchReply(
                Status.CORRECTNESS,
                verification_error=2.0,
                error="output 'c': relative L2 error 2 exceeds rtol 1e-06",
            )
        times = tuple(1.0 + 0.01 * i for i in range(job.repeats))
        return LaunchReply(Status.OK, times_ms=times, verification_error=0.0)

    return dict(H200), handle


def run_broken(
    tmp_path: Path, experiment: Experiment, backend: CudaBackend
) -> tuple[optuna.Study, SearchSpace]:
    """The whole Runner over RUN, in batches of 4, on a SQLite study."""
    space = SearchSpace(experiment.parameters, experiment.constraints, experiment.sizes)
    study = optuna.create_study(
        storage=open_storage(str(tmp_path / "broken.db")),
        study_name="broken",
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    for config in RUN:
        study.enqueue_trial(config)
    summary = Runner(
        study=study, space=space, backend=backend, trials=len(RUN), batch_size=4
    ).run()
    assert summary.evaluations == len(RUN) and not summary.interrupted
    return study, space


def by_config(study: optuna.Study) -> dict[tuple[int, str], dict[str, Any]]:
    return {
        (int(t.params["BLOCK"]), str(t.params["MODE"])): dict(t.user_attrs, _state=t.state)
        for t in study.trials
    }


def check_good_ones(trials: dict[tuple[int, str], dict[str, Any]]) -> None:
    """Every good configuration, each measured right after a broken one, measured ok."""
    for config in RUN:
        if config["MODE"] in ("ok", "race", "oob_by_one"):
            attrs = trials[(int(config["BLOCK"]), str(config["MODE"]))]
            assert attrs["status"] == "ok", (config, attrs.get("error"))
            assert attrs["_state"] == optuna.trial.TrialState.COMPLETE
            assert attrs["times_ms"] and attrs["objective"] > 0


# --------------------------------------------------------------------------- on CI


@pytest.fixture
def fake_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CudaBackend]:
    monkeypatch.setattr(cuda, "WATCHDOG_MARGIN_S", 1.0)  # the hang is found in seconds
    experiment = load_experiment(BROKEN).with_overrides(kernel_timeout_s=0.2)
    handles: list[WorkerHandle] = []

    def factory(experiment: Experiment, device_id: int) -> WorkerHandle:
        handle = WorkerHandle(tagged_worker, None, start_timeout_s=60.0, name="fake-h200")
        handles.append(handle)
        return handle

    with CudaBackend(experiment, cache_dir=tmp_path / "cache", worker_factory=factory) as backend:
        backend.handles = handles  # type: ignore[attr-defined]
        yield backend


@pytest.mark.nvcc
def test_a_run_survives_crashing_and_hanging_workers(
    tmp_path: Path, fake_backend: CudaBackend
) -> None:
    started = time.monotonic()
    study, space = run_broken(tmp_path, fake_backend.experiment, fake_backend)
    assert time.monotonic() - started < 300
    trials = by_config(study)

    retired = trials[(64, "oob_write")]
    assert retired["status"] == "runtime" and "CUDA_ERROR_ILLEGAL_ADDRESS" in retired["error"]
    crashed = trials[(64, "misaligned")]
    assert crashed["status"] == "runtime"
    assert crashed["error"] == "worker process died (exit code -11, killed by SIGSEGV)"
    exited = trials[(64, "trap")]
    assert exited["status"] == "runtime" and exited["error"] == "worker process died (exit code 3)"
    hung = trials[(64, "endless")]
    assert hung["status"] == "timeout" and "the kernel did not finish" in hung["error"]
    assert "the worker process was killed" in hung["error"]
    wrong = trials[(64, "wrong")]
    assert wrong["status"] == "correctness" and wrong["verification_error"] == 2.0
    for attrs in (retired, crashed, exited, hung, wrong):
        assert attrs["_state"] == optuna.trial.TrialState.FAIL
        assert attrs["registers"] > 0  # compiled, so what is known is kept
    check_good_ones(trials)

    (handle,) = fake_backend.handles  # type: ignore[attr-defined]
    assert handle.starts == 5  # the first, then one after each of the four ways to die
    state = read_study(study, space)
    assert state.counts[Status.RUNTIME] == 3 and state.counts[Status.TIMEOUT] == 1
    assert state.counts[Status.OK] == 7 and state.counts[Status.CORRECTNESS] == 1


# --------------------------------------------------------------------------- on the GPU


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_broken_kernels_cost_one_trial_each(tmp_path: Path) -> None:
    experiment = load_experiment(BROKEN).with_overrides(kernel_timeout_s=1.0)
    with CudaBackend(experiment, cache_dir=tmp_path / "cache") as backend:
        study, space = run_broken(tmp_path, experiment, backend)
    trials = by_config(study)

    for mode, expected in (
        ("oob_write", {"ILLEGAL_ADDRESS"}),
        ("misaligned", {"MISALIGNED_ADDRESS"}),
        # __trap() is reported as a launch failure or an illegal instruction, by driver version
        ("trap", {"LAUNCH_FAILED", "ILLEGAL_INSTRUCTION", "ASSERT"}),
    ):
        attrs = trials[(64, mode)]
        assert attrs["status"] == "runtime", (mode, attrs.get("error"))
        assert cuda_error_name(attrs["error"]) in expected, (mode, attrs["error"])
    hung = trials[(64, "endless")]
    assert hung["status"] == "timeout", hung.get("error")
    assert "did not finish" in hung["error"]
    assert trials[(64, "wrong")]["status"] == "correctness"
    check_good_ones(trials)
    state = read_study(study, space)
    assert state.best is not None and state.best.user_attrs["status"] == "ok"


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_whole_command_sanitizes_and_remeasures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``surrotune run`` end to end on the GPU over a space of correct kernels, kernels that
    trap, and kernels only compute-sanitizer finds wrong: the traps cost a trial each, the
    sanitizer demotes every race and overflow, the reported best is a correct kernel, and the
    top configurations are measured again."""
    from surrotune.backends.sanitize import find_compute_sanitizer
    from surrotune.cli import main
    from surrotune.session import format_study
    from surrotune.verdicts import REMEASURE_ATTR, demoted_trials

    if find_compute_sanitizer() is None:
        pytest.skip("NO COMPUTE-SANITIZER: install the CUDA toolkit's compute-sanitizer")
    text = BROKEN.read_text()
    text = text.replace("BLOCK = [64, 128, 256, 512, 1024]", "BLOCK = [128, 256]")
    text = re.sub(r"^MODE = .*$", 'MODE = ["ok", "trap", "oob_by_one", "race"]', text, flags=re.M)
    for name in ("broken.cu", "reference.py"):
        (tmp_path / name).write_text((BROKEN.parent / name).read_text())
    (tmp_path / "small.toml").write_text(text)
    db = tmp_path / "small.db"
    code = main(
        ["run", str(tmp_path / "small.toml"), "--sampler", "brute-force", "--trials", "8",
         "--storage", str(db), "--study", "small", "--no-progress", "--sanitize", "all",
         "--remeasure", "2", "--remeasure-rounds", "3"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "compute-sanitizer on every ok configuration: 2 clean, 4 demoted" in out, out
    assert "MODE=ok" in out.split("Best configuration", 1)[1].splitlines()[0]
    assert "Re-measured the top 2 configurations (interleaved, 3 rounds" in out
    assert "Evaluations: 8 (8 in this run): ok 2, runtime 4, correctness 2" in out, out
    study = optuna.load_study(study_name="small", storage=f"sqlite:///{db}")
    modes = {t.number: t.params["MODE"] for t in study.trials}
    demoted = demoted_trials(study)
    assert sorted(modes[n] for n in demoted) == ["oob_by_one", "oob_by_one", "race", "race"]
    assert all(
        status is (Status.CORRECTNESS if modes[n] == "race" else Status.RUNTIME)
        for n, status in demoted.items()
    )
    assert study.user_attrs[REMEASURE_ATTR]["verdict"] is not None
    assert (db.parent / "small-sanitizer").is_dir()
    assert "correctness 2" in format_study(str(db), "small")
