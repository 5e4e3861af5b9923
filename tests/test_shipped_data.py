"""What ships in the repository: the H200 recording, the quickstart, the README's commands."""

from __future__ import annotations

import collections
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from surrotune.backends.replay import Dataset, load_dataset
from surrotune.experiment import load_experiment
from surrotune.result import Status
from surrotune.space import SearchSpace

REPO = Path(__file__).resolve().parents[1]
RECORDING = REPO / "experiments" / "datasets" / "gemm_h200.json.gz"
GEMM = REPO / "experiments" / "gemm.toml"
QUICKSTART = REPO / "experiments" / "quickstart.toml"
README = REPO / "README.md"
CI = REPO / ".ci" / "run"

#: counted in the recording: every feasible configuration of gemm.toml, measured once on an H200
RESULTS = 5952
STATUS_COUNTS = {Status.OK: 3620, Status.RESOURCE: 2332}
REPEATS = 7  # the recording was made with gemm.toml's [evaluation] repeats = 7 of that day


@pytest.fixture(scope="module")
def recording() -> Dataset:
    return load_dataset(RECORDING)


@pytest.fixture(scope="module")
def gemm_space() -> SearchSpace:
    exp = load_experiment(GEMM)
    return SearchSpace(exp.parameters, exp.constraints, exp.sizes)


# ------------------------------------------------------------------- the H200 recording


def test_recording_loads_as_a_surrotune_recording(recording: Dataset) -> None:
    assert recording.format == "surrotune"
    assert len(recording.results) == RESULTS
    assert recording.kernel_name == "gemm"
    assert recording.objective == "time" and recording.direction == "minimize"
    assert recording.problem_size == {"M": 2048, "N": 2048, "K": 2048}


def test_recording_statuses_are_ok_and_resource(recording: Dataset) -> None:
    counts = collections.Counter(r.status for r in recording.results.values())
    assert dict(counts) == STATUS_COUNTS
    for result in recording.results.values():
        if result.ok:
            assert result.error == ""
        else:
            assert result.objective is None and result.error  # the compiler's or check's text


def test_recording_parameters_and_constraints_are_gemm_toml_s(recording: Dataset) -> None:
    exp = load_experiment(GEMM)
    assert recording.parameters == {name: list(v) for name, v in exp.parameters.items()}
    assert list(recording.parameters) == list(exp.parameters)
    assert recording.constraints == exp.constraints
    assert recording.problem_size == dict(exp.sizes)


def test_every_recorded_configuration_satisfies_gemm_toml(
    recording: Dataset, gemm_space: SearchSpace
) -> None:
    configs = pd.DataFrame([dict(r.config) for r in recording.results.values()])
    assert list(configs.columns) == list(gemm_space.names)
    assert gemm_space.feasible_mask(configs).all()
    # and it is the whole feasible space: every feasible configuration is recorded, once
    feasible = {gemm_space.key(row) for row in gemm_space.enumerate().to_dict("records")}
    recorded = {gemm_space.key(r.config) for r in recording.results.values()}
    assert len(feasible) == RESULTS
    assert recorded == feasible
    assert set(recording.results) == recorded


def test_ok_results_carry_their_timings(recording: Dataset) -> None:
    ok = [r for r in recording.results.values() if r.ok]
    assert len(ok) == STATUS_COUNTS[Status.OK]
    for result in ok:
        assert len(result.times_ms) == REPEATS
        assert all(t > 0 for t in result.times_ms)
        assert result.objective == result.time_ms == statistics.median(result.times_ms)
        assert result.compile_time_ms is not None and result.compile_time_ms > 0
        assert result.benchmark_time_ms is not None and result.benchmark_time_ms > 0
        assert result.registers is not None and result.registers > 0
        block = (result.config["BLOCK_M"] // result.config["TM"]) * (
            result.config["BLOCK_N"] // result.config["TN"]
        )
        assert result.threads_per_block == block  # gemm.toml's launch.block
        assert result.verification_error is not None and result.verification_error <= 1e-5
    best = recording.optimum
    assert best.ok and best.objective == min(r.objective for r in ok if r.objective is not None)


def test_recording_names_an_h200(recording: Dataset) -> None:
    device = recording.metadata["device"]
    assert "H200" in recording.device_name
    assert device["name"] == recording.device_name
    assert (device.get("major"), device.get("minor")) == (9, 0)  # Hopper, sm_90


# ------------------------------------------------------------------- every shipped recording

#: every shipped brute-force recording and the experiment (and sizes) it was recorded from
SHIPPED = sorted((REPO / "experiments" / "datasets").glob("*_h200.json.gz"))
#: the same experiments recorded again on an H100, for transfer to another GPU
SHIPPED_H100 = sorted((REPO / "experiments" / "datasets").glob("*_h100.json.gz"))


def _experiment_of(path: Path) -> Path:
    """``gemm_1024_h200.json.gz`` -> ``experiments/gemm.toml``: the kernel is the first word."""
    return REPO / "experiments" / f"{path.name.split('_')[0]}.toml"


def test_every_template_with_a_recording_is_shipped() -> None:
    kernels = {p.name.split("_")[0] for p in SHIPPED}
    assert {"gemm", "reduction", "transpose", "layernorm", "softmax", "convolution"} <= kernels
    # every kernel also at a second problem size, for the transfer studies
    second = {"gemm_1024", "convolution_2048", "transpose_2048", "reduction_4m", "softmax_1024",
              "layernorm_1024"}  # fmt: skip
    assert {f"{name}_h200.json.gz" for name in second} <= {p.name for p in SHIPPED}


def test_every_h100_recording_has_its_h200_counterpart() -> None:
    names = {p.name.replace("_h100.", "_h200.") for p in SHIPPED_H100}
    assert len(SHIPPED_H100) >= 6 and names <= {p.name for p in SHIPPED}


@pytest.mark.parametrize("path", SHIPPED + SHIPPED_H100, ids=lambda p: p.name)
def test_a_recording_is_its_experiment_s_whole_feasible_space(path: Path) -> None:
    """A recording is a brute force: every feasible configuration of its experiment once, each
    ok one verified and timed, each failure with a Status and the message that says why."""
    recording = load_dataset(path)
    exp = load_experiment(_experiment_of(path))
    assert recording.parameters == {name: list(v) for name, v in exp.parameters.items()}
    assert recording.constraints == exp.constraints
    gpu = "H100" if path.name.endswith("_h100.json.gz") else "H200"
    assert gpu in recording.device_name
    assert exp.reference is not None
    space = SearchSpace(exp.parameters, exp.constraints, recording.problem_size)
    feasible = {space.key(row) for row in space.enumerate().to_dict("records")}
    assert {space.key(r.config) for r in recording.results.values()} == feasible
    for result in recording.results.values():
        if result.ok:
            assert result.times_ms and result.objective == statistics.median(result.times_ms)
            error = result.verification_error  # checked against the experiment's reference
            assert error is not None and error <= exp.reference.rtol
            assert result.compile_time_ms is not None and result.compile_time_ms > 0
        else:
            assert result.status is not Status.OK and result.objective is None and result.error
    assert recording.optimum.ok


# ------------------------------------------------------------------- the quickstart


def test_quickstart_runs_end_to_end(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    done = subprocess.run(
        [sys.executable, "-m", "surrotune", "run", "experiments/quickstart.toml",
         "--trials", "20", "--storage", str(db), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Best configuration" in done.stdout
    assert "reached" in done.stdout  # the share of the recording's optimum
    assert "Evaluations: 20 (20 in this run)" in done.stdout
    assert f"{RESULTS:,} feasible configurations" in done.stdout
    assert db.is_file() and str(db) in done.stdout


# ------------------------------------------------------------------- the README


def _first_shell_block(text: str) -> str:
    fence = re.compile(r"^```[ \t]*(\w*)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
    for match in fence.finditer(text):
        if match.group(1).lower() in ("sh", "bash", "shell", "console", "zsh"):
            return match.group(2)
    raise AssertionError("README.md has no fenced shell block (```sh, ```bash, ```console)")


def _ci_test_command() -> str:
    commands = [
        line.strip() for line in CI.read_text().splitlines()
        if line.strip().startswith("python3 -m pytest")
    ]  # fmt: skip
    assert len(commands) == 1, f"{CI} should run one pytest command, found {commands}"
    return commands[0]


def test_readme_first_shell_block_has_the_quickstart_and_the_test_command() -> None:
    assert README.is_file(), "README.md is missing"
    block = _first_shell_block(README.read_text())
    assert "surrotune run experiments/quickstart.toml" in block
    ci = _ci_test_command()
    assert ci in block, f"README.md's first shell block should give the test command CI runs: {ci}"
