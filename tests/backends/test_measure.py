"""Timing statistics, the measurement policy from [evaluation], the L2 decision and the clock
readers: everything about "measurement you can trust" that runs without a GPU."""

from __future__ import annotations

import math
import os
import stat
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from scipy import stats

from surrotune.backends.clocks import (
    NoClocks,
    NvmlClocks,
    SmiClocks,
    open_clock_reader,
    parse_smi_line,
)
from surrotune.backends.measure import (
    STOP_REASONS,
    MeasurePolicy,
    choose_l2_flush,
    median_interval,
    median_rank_interval,
    min_samples,
    next_round,
    relative_precision,
)
from surrotune.experiment import EvaluationSettings, ExperimentError, load_experiment

# --------------------------------------------------------------------------- the median's interval


def test_too_few_times_have_no_interval() -> None:
    assert [median_rank_interval(n) for n in range(6)] == [None] * 6
    assert min_samples(0.95) == 6
    assert min_samples(0.99) == 8  # 2 / 2**8 < 0.01 < 2 / 2**7
    assert median_interval([1.0, 2.0, 3.0]) is None
    assert relative_precision([1.0, 2.0, 3.0]) is None


def test_known_ranks() -> None:
    # n = 6: [x(1), x(6)] covers with 1 - 2/64 = 96.9 %
    assert median_rank_interval(6) == (0, 5)
    # n = 10: P(B <= 1) = 11/1024 <= 2.5 % < P(B <= 2) = 56/1024, so j = 2: [x(2), x(9)]
    assert median_rank_interval(10) == (1, 8)
    # n = 20: P(B <= 5) = 2.07 % <= 2.5 % < P(B <= 6) = 5.77 %: [x(6), x(15)]
    assert median_rank_interval(20) == (5, 14)


def test_ranks_equal_the_exact_binomial_rule() -> None:
    """j is the largest rank with binom.cdf(j - 1, n, 1/2) <= (1 - confidence) / 2."""
    for confidence in (0.9, 0.95, 0.99):
        tail = (1 - confidence) / 2
        for n in range(1, 400):
            cdf = stats.binom.cdf(np.arange(n // 2 + 1), n, 0.5)  # P(B <= j - 1) at index j - 1
            ranks = np.flatnonzero(cdf <= tail) + 1
            expected = None if not ranks.size else (int(ranks[-1]) - 1, n - int(ranks[-1]))
            assert median_rank_interval(n, confidence) == expected, (n, confidence)
    assert median_rank_interval(100_000) is not None  # large n stays fast and finite


def test_coverage_is_at_least_95_percent_on_skewed_times() -> None:
    """Distribution-free: on log-normal times (a long right tail, like kernel times) the
    interval holds the true median at least 95 % of the time."""
    rng = np.random.default_rng(3)
    true_median = 1.0  # of exp(N(0, 0.5))
    for n in (6, 11, 30):
        hits = 0
        for _ in range(3000):
            interval = median_interval(list(rng.lognormal(0.0, 0.5, n)))
            assert interval is not None
            hits += interval[0] <= true_median <= interval[1]
        assert hits / 3000 >= 0.95 - 0.01, n  # 0.01: Monte Carlo error at 3000 draws


def test_relative_precision_of_a_known_sample() -> None:
    times = [10.0, 9.5, 10.1, 9.9, 10.2, 9.8, 10.5, 11.0, 9.0, 10.0]
    # sorted: 9.0 9.5 9.8 9.9 10.0 10.0 10.1 10.2 10.5 11.0; ranks (1, 8): 9.5 and 10.5
    assert median_interval(times) == (9.5, 10.5)
    assert relative_precision(times) == pytest.approx(0.05)
    lopsided = [10.0] * 5 + [10.0, 10.1, 10.2, 10.3, 12.0]  # median 10.0, hi x(9) = 10.3
    assert relative_precision(lopsided) == pytest.approx(0.03)


def test_relative_precision_edge_cases() -> None:
    assert relative_precision([0.004] * 8) == 0.0  # coarse timers repeat values exactly
    assert relative_precision([0.0] * 5 + [1.0] * 3) == math.inf  # median 0 with a width


def test_precision_improves_as_one_over_sqrt_n() -> None:
    rng = np.random.default_rng(0)
    widths = {}
    for n in (25, 100, 400, 1600):
        widths[n] = statistics.median(
            relative_precision(list(1.0 + 0.01 * rng.standard_normal(n))) or 0.0
            for _ in range(200)
        )
    for small, large in ((25, 100), (100, 400), (400, 1600)):
        assert widths[small] / widths[large] == pytest.approx(2.0, rel=0.25)
    # normal noise with sd 1 %: half-width about 1.96 * 1.2533 * 1 % / sqrt(n)
    assert widths[400] == pytest.approx(1.96 * 1.2533 * 0.01 / 20, rel=0.2)


# --------------------------------------------------------------------------- the policy


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="at least min_repeats"):
        MeasurePolicy(min_repeats=10, max_repeats=5)
    with pytest.raises(ValueError, match="target_precision"):
        MeasurePolicy(target_precision=0.0)
    with pytest.raises(ValueError, match="min_repeats"):
        MeasurePolicy(min_repeats=0)
    with pytest.raises(ValueError, match="max_seconds"):
        MeasurePolicy(max_seconds=0)
    with pytest.raises(ValueError, match="confidence"):
        MeasurePolicy(confidence=1.0)
    assert not MeasurePolicy.fixed(2, 7).adaptive
    assert MeasurePolicy().adaptive


def test_fixed_policy_times_exactly_repeats() -> None:
    policy = MeasurePolicy.fixed(warmup=2, repeats=7)
    assert next_round(policy, [], 0.0).count == 7
    assert next_round(policy, [1.0] * 3, 0.0).count == 4
    done = next_round(policy, [1.0, 1.1, 0.9, 1.0, 1.2, 1.0, 1.0], 5.0)
    assert done.count == 0 and done.reason == "repeats" and done.precision is not None
    assert set(STOP_REASONS) == {"repeats", "precision", "max_repeats", "max_measure_time"}


def test_adaptive_rounds() -> None:
    policy = MeasurePolicy(min_repeats=10, max_repeats=100, target_precision=0.01, max_seconds=1)
    assert next_round(policy, [], 0.0).count == 10  # the first round is min_repeats
    steady = [1.0, 1.001, 0.999] * 4
    assert next_round(policy, steady, 0.01).reason == "precision"
    noisy = list(np.random.default_rng(1).lognormal(0, 0.05, 10))  # ~5 % precision at n = 10
    step = next_round(policy, noisy, 0.01)
    assert step.reason == "" and step.precision is not None and step.precision > 0.01
    assert step.count == 10  # at most doubling, although ~25x more would be needed
    very_noisy = list(np.random.default_rng(2).lognormal(0, 0.5, 100))
    assert next_round(policy, very_noisy, 0.1).reason == "max_repeats"
    assert next_round(policy, noisy, 1.0).reason == "max_measure_time"
    # sized to the time left, at least one launch
    assert next_round(policy, noisy, 0.5).count == 10  # 0.5 s left at 0.05 s per launch
    assert next_round(policy, noisy, 0.8).count == 2  # 0.2 s left at 0.08 s per launch
    assert next_round(policy, noisy, 0.95).count == 1  # 0.05 s left at 0.095 s per launch


def test_round_asks_for_what_the_target_needs() -> None:
    policy = MeasurePolicy(min_repeats=10, max_repeats=1000, target_precision=0.01, max_seconds=60)
    times = [1.0 + 0.0025 * k for k in range(-10, 10)]  # ranks (5, 14): 0.9875 and 1.01
    step = next_round(policy, times, 0.0)
    precision = step.precision
    assert precision == pytest.approx(0.01125 / 0.99875)
    assert step.count == math.ceil(20 * (precision / 0.01) ** 2 * 1.2) - 20
    # below the fewest times an interval needs, a round tops them up (and at least doubles)
    small = MeasurePolicy(min_repeats=2, max_repeats=50)
    assert next_round(small, [1.0, 1.1], 0.0).count == 4  # to the 6 an interval needs


def simulate(policy: MeasurePolicy, noise: float, seconds_per_launch: float) -> tuple[int, str]:
    """Times drawn from a log-normal kernel, wall time counted per launch."""
    rng = np.random.default_rng(7)
    times: list[float] = []
    while True:
        step = next_round(policy, times, len(times) * seconds_per_launch)
        if step.count == 0:
            return len(times), step.reason
        times.extend(rng.lognormal(0.0, noise, step.count))


def test_simulated_kernels_stop_for_the_right_reason() -> None:
    policy = MeasurePolicy(min_repeats=10, max_repeats=200, target_precision=0.01, max_seconds=1)
    quiet = simulate(policy, noise=0.002, seconds_per_launch=1e-4)
    assert quiet == (10, "precision")  # the first round is enough
    moderate_n, moderate_reason = simulate(policy, noise=0.03, seconds_per_launch=1e-4)
    assert moderate_reason == "precision" and 20 <= moderate_n <= 200
    assert simulate(policy, noise=0.5, seconds_per_launch=1e-4) == (200, "max_repeats")
    slow_n, slow_reason = simulate(policy, noise=0.5, seconds_per_launch=0.05)
    assert slow_reason == "max_measure_time" and slow_n <= 1 / 0.05 + 1


def test_watchdog_covers_the_worst_case() -> None:
    assert MeasurePolicy.fixed(1, 3).watchdog_s(2.0) == 2.0 * (1 + 1 + 3)
    adaptive = MeasurePolicy(warmup=3, min_repeats=10, max_repeats=200, max_seconds=1.0)
    # checked + warm-up + first round + one launch past the cap, and the cap itself
    assert adaptive.watchdog_s(10.0) == 10.0 * (1 + 3 + 10 + 1) + 1.0


# --------------------------------------------------------------------------- the L2


def test_l2_flush_choice() -> None:
    l2 = 50 * 2**20
    assert choose_l2_flush("auto", 10 * 2**20, l2)
    assert choose_l2_flush("auto", l2, l2)
    assert not choose_l2_flush("auto", l2 + 1, l2)
    assert not choose_l2_flush("auto", 1, None)  # unknown L2: nothing to decide from
    assert choose_l2_flush("always", 10 * l2, l2) and choose_l2_flush("always", 1, None)
    assert not choose_l2_flush("never", 1, l2)
    with pytest.raises(ValueError, match="auto, always, never"):
        choose_l2_flush("sometimes", 1, l2)


# --------------------------------------------------------------------------- [evaluation] keys


def write(tmp_path: Path, evaluation: str) -> Path:
    (tmp_path / "k.cu").write_text("// ${B}\n")
    (tmp_path / "ref.py").write_text("def f(x, y):\n    return {'y': x}\n")
    path = tmp_path / "e.toml"
    path.write_text(
        '[kernel]\ntemplate = "k.cu"\nname = "k"\n[sizes]\nN = 8\n'
        '[[arguments]]\nname = "x"\ndtype = "float32"\nshape = ["N"]\n'
        '[[arguments]]\nname = "y"\ndtype = "float32"\nshape = ["N"]\noutput = true\n'
        '[launch]\ngrid = [1]\nblock = ["B"]\n[parameters]\nB = [32]\n'
        '[reference]\nfunction = "ref.py:f"\n'
        f"[evaluation]\n{evaluation}\n"
    )
    return path


def test_default_evaluation_is_adaptive(tmp_path: Path) -> None:
    evaluation = load_experiment(write(tmp_path, "")).evaluation
    assert (evaluation.repeats, evaluation.max_repeats) == (10, 200)
    assert evaluation.target_precision == 0.01 and evaluation.max_measure_s == 1.0
    assert evaluation.l2_flush == "auto"
    policy = MeasurePolicy.from_settings(evaluation)
    assert policy == MeasurePolicy(warmup=3, min_repeats=10, max_repeats=200)
    assert MeasurePolicy.from_settings(EvaluationSettings()) == policy  # the same defaults


def test_repeats_alone_keeps_its_meaning(tmp_path: Path) -> None:
    """A file written before adaptive timing times exactly ``repeats`` launches."""
    evaluation = load_experiment(write(tmp_path, "warmup = 2\nrepeats = 7")).evaluation
    assert evaluation.repeats == 7 and evaluation.max_repeats is None
    policy = MeasurePolicy.from_settings(evaluation)
    assert policy == MeasurePolicy.fixed(2, 7) and not policy.adaptive
    # a command-line override of repeats stays a fixed count
    overridden = load_experiment(write(tmp_path, "repeats = 7")).with_overrides(repeats=50)
    assert MeasurePolicy.from_settings(overridden.evaluation) == MeasurePolicy.fixed(3, 50)


def test_adaptive_keys(tmp_path: Path) -> None:
    text = (
        'min_repeats = 20\nmax_repeats = 500\ntarget_precision = 0.005\nmax_measure_time = "3s"\n'
        'l2_flush = "never"'
    )
    evaluation = load_experiment(write(tmp_path, text)).evaluation
    policy = MeasurePolicy.from_settings(evaluation)
    assert policy == MeasurePolicy(
        warmup=3, min_repeats=20, max_repeats=500, target_precision=0.005, max_seconds=3.0
    )
    assert evaluation.l2_flush == "never"
    only_min = load_experiment(write(tmp_path, "min_repeats = 300")).evaluation
    assert (only_min.repeats, only_min.max_repeats) == (300, 300)


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("repeats = 5\nmax_repeats = 50", "evaluation.max_repeats", "not both"),
        ("repeats = 5\nmin_repeats = 5", "evaluation.min_repeats", "not both"),
        ("min_repeats = 50\nmax_repeats = 10", "evaluation.max_repeats", ">= min_repeats (50)"),
        ("min_repeats = 0", "evaluation.min_repeats", ">= 1"),
        ("target_precision = 1.5", "evaluation.target_precision", "between 0 and 1"),
        ("target_precision = '1%'", "evaluation.target_precision", "between 0 and 1"),
        ("max_measure_time = 'soon'", "evaluation.max_measure_time", "duration"),
        ("max_measure_time = 0", "evaluation.max_measure_time", "positive"),
        ("l2_flush = 'yes'", "evaluation.l2_flush", "auto, always, never"),
    ],
)
def test_bad_evaluation_keys(tmp_path: Path, text: str, key: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ExperimentError) as info:
        load_experiment(path)
    assert info.value.file == str(path) and info.value.key == key
    assert expected in info.value.message


# --------------------------------------------------------------------------- clocks


def test_parse_smi_line() -> None:
    assert parse_smi_line("1980, 2619, 35, 121.53\n") == {
        "sm_clock_mhz": 1980.0,
        "memory_clock_mhz": 2619.0,
        "gpu_temperature_c": 35.0,
        "gpu_power_w": 121.53,
    }
    assert parse_smi_line("1410, 1593, 40, [N/A]") == {
        "sm_clock_mhz": 1410.0,
        "memory_clock_mhz": 1593.0,
        "gpu_temperature_c": 40.0,
    }
    assert parse_smi_line("") == {}


def fake_smi(directory: Path, line: str, exit_code: int = 0) -> Path:
    """An nvidia-smi that checks its query and prints ``line``."""
    script = directory / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw*) ;; '
        "*) exit 9 ;; esac\n"
        f"echo '{line}'\nexit {exit_code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError


def test_nvidia_smi_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi(tmp_path, "1980, 2619, 35, 121.5")
    without_pynvml(monkeypatch)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    reader = open_clock_reader("0000:19:00.0", 0)
    assert isinstance(reader, SmiClocks) and reader.source == "nvidia-smi"
    assert "pynvml is not installed" in reader.note
    assert "--id=0000:19:00.0" in reader.command
    pending = reader.start()  # runs while the caller times kernels
    assert pending.result()["sm_clock_mhz"] == 1980.0


def test_no_clock_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_pynvml(monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    reader = open_clock_reader(None, 0)
    assert isinstance(reader, NoClocks) and reader.source == "none"
    assert "nvidia-smi is not on PATH" in reader.note
    assert reader.start().result() == {}
    fake_smi(tmp_path, "garbage", exit_code=1)
    broken = open_clock_reader(None, 3)
    assert isinstance(broken, NoClocks) and "--id=3 gave no clocks" in broken.note


def test_nvml_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def by_bus(bus: str) -> str:
        calls.append(bus)
        return "handle"

    def power(handle: str) -> int:
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")  # left out, not fatal

    fake = SimpleNamespace(
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByPciBusId=by_bus,
        nvmlDeviceGetClockInfo=lambda handle, kind: {1: 1755, 2: 2619}[kind],
        nvmlDeviceGetTemperature=lambda handle, kind: 41,
        nvmlDeviceGetPowerUsage=power,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    reader = open_clock_reader("0000:19:00.0", 0)
    assert isinstance(reader, NvmlClocks) and reader.source == "pynvml" and reader.note == ""
    assert calls == ["0000:19:00.0"]
    assert reader.start().result() == {
        "sm_clock_mhz": 1755.0,
        "memory_clock_mhz": 2619.0,
        "gpu_temperature_c": 41.0,
    }


def test_nvml_failure_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=fail))
    fake_smi(tmp_path, "1980, 2619, 35, 121.5")
    monkeypatch.setenv("PATH", str(tmp_path))
    reader: Any = open_clock_reader(None, 0)
    assert reader.source == "nvidia-smi" and "DRIVER_NOT_LOADED" in reader.note
