"""``surrotune bench`` end to end on the tiny cache of tests/test_runner.py (fast)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from surrotune.backends.replay import load_dataset
from surrotune.bench import add_arguments, metrics, run
from surrotune.bench.harness import (
    BenchError,
    RunSpec,
    SamplerSpec,
    parse_options,
    parse_samplers,
    prepare_dataset,
    run_bench,
    run_one,
)
from surrotune.bench.report import RANDOM_EXPECTATION, load_runs, summarise


def _runner_tests() -> ModuleType:
    """tests/test_runner.py, for its ``write_kt_cache`` (tests/ is not a package)."""
    path = Path(__file__).resolve().parents[1] / "test_runner.py"
    spec = importlib.util.spec_from_file_location("_bench_runner_tests", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


write_kt_cache = _runner_tests().write_kt_cache


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    folder = tmp_path / "tinybench"
    folder.mkdir()
    return write_kt_cache(folder / "GPU.json")


def _check_against_recording(path: Path, values: list[float | None], statuses: list[str]) -> None:
    recorded = {r.objective if r.ok else None for r in load_dataset(path).results.values()} | {
        None
    }
    assert all(v in recorded for v in values)
    assert [v is None for v in values] == [s != "ok" for s in statuses]


def test_random_and_brute_force_end_to_end(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    lines: list[str] = []
    result = run_bench([tiny], "random,brute-force", 10, 2, out, jobs=2, log=lines.append)
    assert (out / "bench.md").is_file() and (out / "runs.jsonl").is_file()
    assert (out / "convergence_tinybench_GPU.png").stat().st_size > 1000
    assert len(lines) == 4 and all("tinybench/GPU" in line for line in lines)

    records = load_runs(out / "runs.jsonl")
    assert sorted((r.sampler, r.seed) for r in records) == sorted(
        (r.sampler, r.seed) for r in result.records
    )
    data = result.datasets[0]
    assert data.name == "tinybench/GPU" and len(data.feasible) == 32 and data.failures == 6
    assert data.optimum == 1.0 and data.direction == "minimize"
    for record in records:
        assert record.finished and record.stop_reason == "budget" and record.evaluations == 10
        _check_against_recording(tiny, record.values, record.statuses)

    rows = {row.sampler: row for row in summarise(result)}
    assert set(rows) == {"random", "brute-force", RANDOM_EXPECTATION}
    for name in ("random", "brute-force"):
        runs = [r for r in records if r.sampler == name]
        curves = [metrics.fraction_curve(r.values, 1.0, "minimize", 10) for r in runs]
        assert rows[name].fractions[10] == pytest.approx(np.median([c[-1] for c in curves]))
        scores = [metrics.methodology_score(r.values, data.feasible, "minimize", 10) for r in runs]
        assert rows[name].score == pytest.approx(np.mean(scores))
    expected = metrics.random_expected_fraction(data.feasible, "minimize", 10)
    assert rows[RANDOM_EXPECTATION].fractions[10] == pytest.approx(expected[-1])
    assert rows[RANDOM_EXPECTATION].score == 0.0
    text = (out / "bench.md").read_text()
    assert "| random |" in text and "| brute-force |" in text and RANDOM_EXPECTATION in text
    # two seeds are too few for a 95 % interval of the median: the cells carry none
    table = [line for line in text.splitlines() if line.startswith("| random")]
    assert rows["random"].reach_interval == {} and table and "[" not in table[0]
    assert "![tinybench/GPU](convergence_tinybench_GPU.png)" in text


def test_brute_force_over_the_whole_space_reaches_the_optimum(tiny: Path, tmp_path: Path) -> None:
    # a budget beyond the 32 configurations: brute force runs out of configurations first
    result = run_bench([tiny], ["brute-force"], 40, [0, 1], tmp_path / "out", jobs=1, plots=False)
    rows = {row.sampler: row for row in summarise(result)}
    assert rows["brute-force"].fractions[40] == 1.0
    assert rows["brute-force"].to_reach[1.0] is not None
    for record in result.records:
        assert record.evaluations == 32 and record.stop_reason == "exhausted"
        assert sum(v is None for v in record.values) == 6  # every failure cost one evaluation
        assert metrics.fraction_curve(record.values, 1.0, "minimize")[-1] == 1.0
    # random search's expectation after the whole space is the optimum, and its E[T] exact
    expected = rows[RANDOM_EXPECTATION]
    assert expected.fractions[40] == pytest.approx(1.0)
    assert expected.expected_to_reach is not None
    assert expected.expected_to_reach[1.0] == pytest.approx(33 / 2)
    assert expected.to_reach[1.0] == 16  # the exact median: P(T <= n) = n / 32


def test_the_98_percent_cell_carries_the_interval_of_its_median(
    tiny: Path, tmp_path: Path
) -> None:
    result = run_bench([tiny], ["random"], 12, 8, tmp_path / "out", jobs=2, plots=False)
    row = next(r for r in summarise(result) if r.sampler == "random")
    counts = [
        metrics.evaluations_to_reach(r.values, 1.0, "minimize", 0.98) for r in result.records
    ]
    interval = metrics.median_interval(counts)
    assert interval is not None and row.reach_interval[0.98] == interval
    low, high = (f"{v:g}" if v is not None else ">12" for v in interval)
    median = ">12" if row.to_reach[0.98] is None else f"{row.to_reach[0.98]:g}"
    assert f"| {median} [{low}, {high}] |" in (tmp_path / "out" / "bench.md").read_text()


def test_known_constraints_come_from_the_spaces_file_and_cost_nothing(
    tiny: Path, tmp_path: Path
) -> None:
    spaces = tiny.parent.parent / "spaces"
    spaces.mkdir()
    (spaces / "tinybench.json").write_text(
        json.dumps({"ConfigurationSpace": {"Conditions": [{"Expression": "bx >= 16"}]}})
    )
    _dataset, _space, restrictions, summary = prepare_dataset(tiny)
    assert restrictions == ["bx >= 16"] and summary.constraints_from == "spaces/tinybench.json"
    assert len(summary.feasible) == 24 and summary.failures == 2
    record = run_one(RunSpec(str(tiny), SamplerSpec("random", "random"), 3, 20, 60.0))
    assert record.evaluations == 20 and record.proposals > 20  # random proposed bx = 8 too
    assert record.finished


def test_a_run_past_its_time_limit_is_kept_and_marked(tiny: Path) -> None:
    record = run_one(RunSpec(str(tiny), SamplerSpec("random", "random"), 0, 10, 0.0))
    assert not record.finished and record.stop_reason == "timeout"
    assert "did not finish" in record.note


def test_samplers_are_checked_before_anything_runs(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="unknown sampler 'tpee'"):
        run_bench([tiny], "random,tpee", 5, 1, tmp_path / "out")
    with pytest.raises(BenchError, match="unknown"):
        parse_samplers("random", ablate=["everything"])
    with pytest.raises(BenchError, match="file not found"):
        run_bench([tmp_path / "missing.json"], "random", 5, 1, tmp_path / "out")
    specs = parse_samplers("random,random,tpe", ablate=["classifier"])
    assert [s.label for s in specs] == ["random", "tpe", "surrogate-no-classifier"]
    assert specs[-1].options == (("ablate", ("classifier",)),)
    everything = [s.label for s in parse_samplers("random,kt:all")]
    assert everything[:3] == ["random", "kt:genetic_algorithm", "kt:dual_annealing"]
    assert len(everything) == 9


def test_cli_surface(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--datasets", str(tiny), "--samplers", "random", "--budget", "5", "--seeds", "1",
         "-o", str(tmp_path / "out"), "--jobs", "1", "--no-plots"]
    )  # fmt: skip
    assert run(args) == 0
    printed = capsys.readouterr().out
    assert "## tinybench/GPU" in printed and "| random | 1 |" in printed
    assert not list((tmp_path / "out").glob("*.png"))


@pytest.mark.skipif(
    importlib.util.find_spec("kernel_tuner") is None, reason="Kernel Tuner is not installed"
)
def test_kernel_tuner_strategies_in_simulation_mode(tiny: Path, tmp_path: Path) -> None:
    # diff_evo and bayes_opt draw from SciPy's Latin hypercube, which the adapter seeds
    strategies = "kt:greedy_ils,kt:genetic_algorithm,kt:diff_evo,kt:bayes_opt"
    result = run_bench([tiny], strategies, 10, [0, 0], tmp_path / "out", jobs=1, plots=False)
    assert not result.notes
    by_sampler: dict[str, list[list[float | None]]] = {}
    for record in result.records:
        assert record.stop_reason in ("budget", "strategy ended"), record.note
        assert 0 < record.evaluations <= 10
        _check_against_recording(tiny, record.values, record.statuses)
        by_sampler.setdefault(record.sampler, []).append(record.values)
    for runs in by_sampler.values():
        assert runs[0] == runs[1]  # the same seed gives the same run
    with pytest.raises(BenchError, match="has no strategy 'nonsense'"):
        run_bench([tiny], "kt:nonsense", 5, 1, tmp_path / "out2")


def test_resume_keeps_matching_runs_and_runs_only_the_rest(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = run_bench([tiny], "random", 5, 2, out, jobs=1, plots=False)
    assert len(first.records) == 2
    lines = (out / "runs.jsonl").read_text().splitlines()
    # a broken run is run again; the other is kept as it was
    broken = json.loads(lines[1])
    broken["stop_reason"] = "error"
    (out / "runs.jsonl").write_text(lines[0] + "\n" + json.dumps(broken) + "\n")
    said: list[str] = []
    second = run_bench(
        [tiny], "random,tpe", 5, 2, out, jobs=1, plots=False, resume=True, log=said.append
    )
    assert len(second.records) == 4
    assert said[0] == "surrotune bench: resuming: 1 runs kept, 3 to run"
    # progress counts the kept runs too, out of every run of the benchmark
    assert [line.split("]")[0] for line in said[1:4]] == ["[2/4", "[3/4", "[4/4"]
    assert second.records[0].to_json() == first.records[0].to_json()
    assert [(r.sampler, r.seed) for r in second.records] == [
        ("random", 0),
        ("random", 1),
        ("tpe", 0),
        ("tpe", 1),
    ]
    assert all(r.stop_reason != "error" for r in second.records)
    assert len((out / "runs.jsonl").read_text().splitlines()) == 4
    # another budget is another question: nothing is kept
    third = run_bench([tiny], "random", 4, 1, out, jobs=1, plots=False, resume=True)
    assert [r.budget for r in third.records] == [4]


def test_variant_options_split_outside_brackets_and_quotes() -> None:
    label, pairs = parse_options(
        "nocal:feasibility_params={'calibration': 'none', 'min_child_weight': 0.1},"
        "gate_threshold=0.3,note='a,b',shape=(1, 2)"
    )
    assert label == "nocal"
    assert pairs == (
        ("feasibility_params", {"calibration": "none", "min_child_weight": 0.1}),
        ("gate_threshold", 0.3), ("note", "a,b"), ("shape", (1, 2)),
    )  # fmt: skip
    assert parse_options("default") == ("default", ())
    with pytest.raises(ValueError):
        parse_options("bad:x=not_a_literal")


def test_seed_spec_chooses_the_sampler_each_seed_runs(tiny: Path, tmp_path: Path) -> None:
    """A warm start from source run ``seed mod N`` runs a different spec per seed under one
    label; ``seed_spec`` is that mapping, and the records keep the label."""
    asked: list[tuple[str, int]] = []

    def per_seed(spec: SamplerSpec, seed: int) -> SamplerSpec:
        asked.append((spec.label, seed))
        return spec if seed == 0 else SamplerSpec("brute-force", spec.label)

    mixed = run_bench(
        [tiny], "random", 6, [0, 1], tmp_path / "mixed", jobs=1, plots=False, seed_spec=per_seed
    )
    plain = run_bench([tiny], "random,brute-force", 6, [0, 1], tmp_path / "plain", plots=False)
    assert sorted(asked) == [("random", 0), ("random", 1)]
    assert [(r.sampler, r.seed) for r in mixed.records] == [("random", 0), ("random", 1)]
    by_run = {(r.sampler, r.seed): r.values for r in plain.records}
    assert by_run[("random", 1)] != by_run[("brute-force", 1)]
    assert mixed.records[0].values == by_run[("random", 0)]
    assert mixed.records[1].values == by_run[("brute-force", 1)]


def test_a_resumed_benchmark_killed_at_once_keeps_every_kept_record(tmp_path: Path) -> None:
    """The kept records are written before the first new run ends; a process killed then
    (``os._exit``: no buffers flushed, as with SIGKILL) must still leave all of them."""
    import subprocess
    import sys

    out = tmp_path / "out"
    out.mkdir()
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from surrotune.bench import harness\n"
        "records = [harness.RunRecord(dataset='d', sampler='s', seed=k, budget=200,\n"
        "           values=[1.0] * 200, statuses=['ok'] * 200, finished=True,\n"
        "           stop_reason='budget', wall_s=1.0) for k in range(40)]\n"
        "harness._execute = lambda *args: os._exit(3)\n"
        "harness.record_runs(Path(sys.argv[1]), records, [None], 1, print, str)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    lines = (out / "runs.jsonl").read_text().splitlines()
    assert [json.loads(line)["seed"] for line in lines] == list(range(40))
    assert [p.name for p in out.iterdir()] == ["runs.jsonl"]  # no staging file left behind


def _benchmark_module(name: str) -> ModuleType:
    """A script under benchmarks/ loaded as a module, with its own folder importable while it
    loads (goal_status.py imports compare_runs from there)."""
    folder = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def _goal_status() -> ModuleType:
    """benchmarks/goal_status.py."""
    return _benchmark_module("goal_status")


def test_goal_bound_and_verdict_by_hand() -> None:
    goal = _goal_status()
    assert goal.goal_bound(20) == 10 and goal.goal_bound(21) == 10.5
    assert goal.goal_bound(159) == 79.5
    assert goal.verdict(8, (5.0, 9.0), 10) == "met clearly"
    assert goal.verdict(8, (5.0, 12.0), 10) == "met, within noise"
    assert goal.verdict(8, (5.0, None), 10) == "met, within noise"  # unbounded above
    assert goal.verdict(15, (11.0, 20.0), 10) == "missed clearly"
    assert goal.verdict(15, (9.0, 20.0), 10) == "missed, within noise"
    assert goal.verdict(15, None, 10) == "missed"  # too few seeds for an interval


def test_goal_status_compares_ours_with_the_best_peer(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Random search as "ours" against brute force (in the table's order) as the only peer, on 8
    seeds: the medians and intervals are the metrics' own, the bound half the peer's or 10."""
    out = tmp_path / "out"
    result = run_bench([tiny], ["random", "brute-force"], 30, 8, out, jobs=2, plots=False)
    goal = _goal_status()
    assert goal.main([str(out / "runs.jsonl"), "--datasets", str(tiny), "--ours", "random",
                      "--peers", "brute-force", "--seeds", "0-7"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[2].startswith("| tinybench/GPU |")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    data = result.datasets[0]

    def counts(sampler: str) -> list[int | None]:
        return [
            metrics.evaluations_to_reach(r.values, data.optimum, data.direction, 0.98)
            for r in result.records
            if r.sampler == sampler
        ]

    ours, peer = counts("random"), counts("brute-force")
    assert None not in peer  # brute force over 32 configurations always gets there in 30
    interval = metrics.median_interval(ours)
    assert interval is not None  # 8 seeds: [x_(1), x_(8)]
    low, high = (">30" if v is None else f"{v:g}" for v in interval)
    median = np.median([31 if c is None else c for c in ours])
    assert cells[1] == f"{'>30' if median > 30 else f'{median:g}'} [{low}, {high}]"
    assert cells[2] == "brute-force"
    assert cells[4] == f"≤ {goal.goal_bound(float(np.median(peer))):g}"
    assert cells[5].startswith("met" if median <= goal.goal_bound(np.median(peer)) else "missed")


def test_model_quality_metrics_by_hand(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/model_quality.py on the 32-configuration cache: the fractions of the optimum
    are the recording's (1 at bx=64, by=4, u=1; 0 where a configuration failed); with all but
    five configurations in training the top 5 is those five, so ``top5`` is their best
    fraction; scores are seeded; the table has a row per variant."""
    quality = _benchmark_module("model_quality")
    table = quality.recording_table(tiny)
    times = {(r.config["bx"], r.config["by"], r.config["u"]): r.objective
             for r in load_dataset(tiny).results.values() if r.ok}  # fmt: skip
    assert len(table["values"]) == 32 and table["fraction"].max() == 1.0
    assert (table["fraction"] == 0).sum() == 32 - len(times)
    assert sorted(np.round(table["fraction"][table["fraction"] > 0], 9)) == sorted(
        np.round(1.0 / np.array(list(times.values())), 9)
    )
    top5, top20, rho = quality.score_once(table, 27, 0, {"n_models": 3})
    rng = np.random.default_rng(27_000)
    unseen = np.setdiff1d(np.arange(32), rng.choice(32, size=27, replace=False))
    assert top5 == table["fraction"][unseen].max()
    assert top20 == pytest.approx(table["fraction"][unseen].mean())
    assert -1.0 <= rho <= 1.0
    assert quality.score_once(table, 12, 1, {"gp": False}) == quality.score_once(
        table, 12, 1, {"gp": False}
    )
    args = ["--datasets", str(tiny), "--variant", "default", "--variant", "nogp:gp=False",
            "--sizes", "12", "--reps", "2"]  # fmt: skip
    assert quality.main(args) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [row.split("|")[2].strip() for row in rows] == ["default", "nogp"]


def test_optimum_rank_by_hand(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/optimum_rank.py on the 32-configuration cache: a training set is drawn from
    the configurations below 98 % of the optimum only, so with all of them in training the
    unseen ones are the top ones and the first is at rank 0; more than there are is no
    training set; a rank is a position among the unseen; the table's random-order column is
    (unseen + 1) / (k + 1) - 1."""
    ranks = _benchmark_module("optimum_rank")
    table = ranks.recording_table(tiny)
    fraction = table["fraction"]
    below, k = int((fraction < ranks.TOP).sum()), int((fraction >= ranks.TOP).sum())
    assert k >= 1 and below + k == 32
    assert ranks.top_rank(table, below, 0) == 0
    assert ranks.top_rank(table, below + 1, 0) is None
    for rep in range(3):
        rank = ranks.top_rank(table, 12, rep)
        assert rank is not None and 0 <= rank <= 32 - 12 - k
        assert rank == ranks.top_rank(table, 12, rep)  # seeded
    assert ranks.main(["--datasets", str(tiny), "--sizes", f"12,{below + 1}", "--reps", "2"]) == 0
    row = capsys.readouterr().out.splitlines()[2].split("|")
    assert row[2].strip() == f"32 ({k})"
    assert row[3].strip().endswith(f", {(32 - 12 + 1) / (k + 1) - 1:.0f}")
    assert row[4].strip() == "–"


def test_compare_runs_paired_report_by_hand() -> None:
    """``--paired``'s lines on a hand-made table: B needs fewer evaluations on seeds 0 and 1,
    as many on 2, more on 3; the Wilcoxon p is scipy's on the three non-zero differences;
    the score difference is the mean over the common seeds only (seed 4 ran for A alone)."""
    from scipy.stats import wilcoxon

    compare = _benchmark_module("compare_runs")
    table = {
        ("d", "A"): {0: (10, True), 1: (20, True), 2: (5, True), 3: (7, True), 4: (1, True)},
        ("d", "B"): {0: (4, True), 1: (11, False), 2: (5, True), 3: (9, True)},
    }
    scores = {("d", "A"): {0: 0.5, 1: 0.4, 2: 0.9, 3: 0.6, 4: 1.0},
              ("d", "B"): {0: 0.7, 1: 0.6, 2: 0.9, 3: 0.4}}  # fmt: skip
    lines = compare.paired_lines(table, scores, "A", "B")
    row = lines[2].split()
    assert row[:5] == ["d", "4", "2", "1", "1"]
    assert float(row[5]) == pytest.approx(wilcoxon([-6, -9, 0, 2]).pvalue, abs=5e-4)
    assert float(row[6]) == pytest.approx((0.2 + 0.2 + 0.0 - 0.2) / 4, abs=5e-4)
    assert lines[-1] == "score difference over 1 datasets: mean +0.050, B higher on 1"
