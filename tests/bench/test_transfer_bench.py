"""`surrotune bench --warm-start` with several source runs: each target seed starts from the
bundle of source run ``seed mod N``, so the medians cover source runs instead of one run's luck."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from surrotune.bench import add_arguments, metrics
from surrotune.bench.harness import BenchError, RunSpec, prepare_dataset
from surrotune.bench.transfer import Pair, _tasks, build_source_bundle, run_transfer_bench
from surrotune.surrogate.bundle import load_bundle


def _bundle_of(task: RunSpec) -> str:
    """The bundle path a task's sampler starts from (warm start or enqueue baseline)."""
    options = dict(task.sampler.options)
    if "warm_start" in options:
        return options["warm_start"][0]
    return options["enqueue"][0]


def test_each_target_seed_gets_the_bundle_of_its_source_run() -> None:
    pair = Pair("source.json.gz", "target.json.gz")
    paths = [Path("run0.json.gz"), Path("run1.json.gz"), Path("run2.json.gz")]
    tasks = _tasks([pair], {pair.source: paths}, ["cold", "warm", "enqueue"], range(5), 20, 60.0,
                   "prior", 10)  # fmt: skip
    by_label: dict[str, list[RunSpec]] = {}
    for task in tasks:
        by_label.setdefault(task.sampler.label, []).append(task)
    assert len(tasks) == 15 and len(by_label) == 3
    warm = by_label[pair.label("warm")]
    enqueue = by_label[pair.label("enqueue")]
    expected = ["run0.json.gz", "run1.json.gz", "run2.json.gz", "run0.json.gz", "run1.json.gz"]
    assert [t.seed for t in warm] == [0, 1, 2, 3, 4]
    assert [_bundle_of(t) for t in warm] == expected
    assert [_bundle_of(t) for t in enqueue] == expected
    cold = by_label[pair.label("cold")]
    assert all("warm_start" not in dict(t.sampler.options) for t in cold)
    # one bundle: every seed shares it, as before
    single = _tasks([pair], {pair.source: paths[:1]}, ["warm"], range(3), 20, 60.0, "prior", 10)
    assert {_bundle_of(t) for t in single} == {"run0.json.gz"}


def test_two_source_runs_give_two_bundles_and_the_report_says_so(
    kt_datasets: Path, tmp_path: Path
) -> None:
    source = kt_datasets / "dedispersion_milo" / "A100.json.gz"
    target = kt_datasets / "dedispersion_milo" / "A4000.json.gz"
    summary = prepare_dataset(target)[3]
    text, records = run_transfer_bench(
        [(source, target)], 12, 2, tmp_path, methods=["warm", "enqueue"], source_budget=15,
        source_runs=2, plots=False, log=lambda line: None,
    )  # fmt: skip
    models = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert models == ["dedispersion_milo_A100.run15.json.gz",
                      "dedispersion_milo_A100.run15.seed1.json.gz"]  # fmt: skip
    runs = [load_bundle(tmp_path / "models" / name).source["run"] for name in models]
    assert runs == ["surrogate, seed 0, 15 evaluations", "surrogate, seed 1, 15 evaluations"]
    assert "fitted on 2 15-evaluation surrogate runs (seeds 0 to 1)" in text
    # per source run: seed 0 from run 0, seed 1 from run 1, each method on its own row
    pair = Pair(str(source), str(target))
    by_run = text.split("Evaluations to 98 % by source run")[1]
    rows = [row.split(" | ") for row in by_run.splitlines()
            if row.startswith("| dedispersion_milo/A100 → A4000 | ")]  # fmt: skip
    assert [row[1] for row in rows] == ["warm", "enqueue"]
    for row, method in zip(rows, ["warm", "enqueue"], strict=True):
        for k in (0, 1):
            (record,) = [r for r in records if r.sampler == pair.label(method) and r.seed == k]
            count = metrics.evaluations_to_reach(
                record.values, summary.optimum, summary.direction, 0.98
            )
            assert row[2 + k].strip(" |") == (">12" if count is None else f"{count:g}")
    assert sorted((r.sampler, r.seed) for r in records) == sorted(
        (label, seed) for label in {r.sampler for r in records} for seed in (0, 1)
    )
    assert all(len(r.values) == 12 for r in records)
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 4 and all(json.loads(line)["seed"] in (0, 1) for line in lines)


def test_source_runs_must_be_positive() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--warm-start", "a", "b", "--source-runs", "0"])
    assert info.value.code == 2
    args = parser.parse_args(["--warm-start", "a", "b", "--source-runs", "3"])
    assert args.source_runs == 3
    with pytest.raises(BenchError, match="--source-runs"):
        run_transfer_bench([("a", "b")], 10, 1, "out", source_runs=0)


def test_warm_started_runs_in_parallel_workers_finish(kt_datasets: Path, tmp_path: Path) -> None:
    """Checking a warm-started spec loads its bundle in the parent, which starts XGBoost's
    OpenMP threads; workers forked after that hung in their first XGBoost call (without
    OMP_NUM_THREADS=1). The workers come from a fork server, so the runs finish."""
    source = kt_datasets / "dedispersion_milo" / "A100.json.gz"
    target = kt_datasets / "dedispersion_milo" / "MI250X.json.gz"
    bundle = tmp_path / "source.json.gz"
    build_source_bundle(source, bundle, budget=15)
    script = (
        "import sys\n"
        "from surrotune.bench.harness import run_bench\n"
        "from surrotune.bench.transfer import method_spec\n"
        "spec = method_spec('warm', 'warm', sys.argv[1])\n"
        "result = run_bench([sys.argv[2]], [spec], 6, 2, sys.argv[3], jobs=2, plots=False,\n"
        "                   log=lambda line: None)\n"
        "print(sorted((r.seed, len(r.values)) for r in result.records))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(bundle), str(target), str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[(0, 6), (1, 6)]"


def test_warm_design_variants_reports_each_column_by_source_run(
    kt_datasets: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """benchmarks/warm_design_variants.py with two source runs: by-source-run.md gives each
    variant's evaluations to 98 % for the seeds of each run (the source bundles placed where
    the script keeps them, from 15-evaluation runs, so that it fits none)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "warm_design_variants.py"
    spec = importlib.util.spec_from_file_location("warm_design_variants", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    source = kt_datasets / "dedispersion_milo" / "A100.json.gz"
    target = kt_datasets / "dedispersion_milo" / "A4000.json.gz"
    models = tmp_path / "models"
    models.mkdir()
    for seed, name in enumerate(["run200", "run200.seed1"]):
        bundle = models / f"dedispersion_milo_A100.{name}.json.gz"
        build_source_bundle(str(source), bundle, budget=15, seed=seed)
    argv = [str(source), str(target), "--variant", "warm",
            "--variant", "whole:design_stop_ratio=None", "--source-runs", "2", "--seeds", "4",
            "--budget", "12", "--jobs", "1", "-o", str(tmp_path)]  # fmt: skip
    assert script.main(argv) == 0
    text = (tmp_path / "by-source-run.md").read_text()
    assert text.strip() in capsys.readouterr().out
    rows = {row.split(" | ")[0].strip("| "): row.split(" | ")[1:] for row in text.splitlines()
            if row.startswith("| warm |") or row.startswith("| whole |")}  # fmt: skip
    assert set(rows) == {"warm", "whole"}
    summary = prepare_dataset(target)[3]
    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    for label, cells in rows.items():
        for k in (0, 1):
            mine = [r for r in records if r["sampler"] == label and r["seed"] % 2 == k]
            counts = [
                metrics.evaluations_to_reach(r["values"], summary.optimum, summary.direction, 0.98)
                for r in mine
            ]
            assert len(counts) == 2
            never = sum(c is None for c in counts)
            expected = ">12" if 2 * never >= 2 else f"{float(np.median(counts)):g}"
            assert cells[k].strip(" |") == expected


def test_warm_design_variants_runs_a_cold_start_with_other_sampler_attributes(
    kt_datasets: Path, tmp_path: Path
) -> None:
    """``--cold-variant coldmes:sampler.acquisition='mes'`` adds a cold-start column whose
    sampler has that attribute (its runs are the plain cold start's where the acquisition does
    not matter yet, and under its own label); a WarmStart option is refused for a baseline."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "warm_design_variants.py"
    spec = importlib.util.spec_from_file_location("warm_design_variants", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    made = script.parse_variant("coldmes:sampler.acquisition='mes'", "b.json", "cold")
    assert made.label == "coldmes" and made.name == "surrogate"
    assert dict(made.options)["attrs"] == (("acquisition", "mes"),)
    with pytest.raises(SystemExit, match=r"only sampler\.NAME options"):
        script.parse_variant("e:n_design=3", "b.json", "enqueue")
    source = kt_datasets / "dedispersion_milo" / "A100.json.gz"
    target = kt_datasets / "dedispersion_milo" / "A4000.json.gz"
    models = tmp_path / "models"
    models.mkdir()
    build_source_bundle(str(source), models / "dedispersion_milo_A100.run200.json.gz", budget=15)
    argv = [str(source), str(target), "--baselines", "--cold-variant",
            "coldmes:sampler.acquisition='mes'", "--seeds", "2", "--budget", "14", "--jobs", "1",
            "-o", str(tmp_path)]  # fmt: skip
    assert script.main(argv) == 0
    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    by_label = {(r["sampler"], r["seed"]): r for r in records}
    assert {label for label, _ in by_label} == {"cold", "enqueue", "coldmes"}
    for seed in (0, 1):  # the space-filling design comes before any acquisition is read
        cold, mes = by_label[("cold", seed)], by_label[("coldmes", seed)]
        assert cold["values"][:10] == mes["values"][:10]
        assert len(mes["values"]) == 14


def test_the_transfer_table_gives_the_98_percent_median_its_interval() -> None:
    """Six runs reaching 98 % after 1..5 evaluations and one never (budget 8): the interval is
    the extremes, [x_(1), x_(6)], the last unbounded within the budget."""
    from types import SimpleNamespace

    from surrotune.bench.harness import RunRecord
    from surrotune.bench.report import interval_text
    from surrotune.bench.transfer import _counts_to, _median_to

    def record(seed: int, reached_at: int | None) -> RunRecord:
        values = [2.0] * 8 if reached_at is None else [2.0] * (reached_at - 1) + [1.0] * (
            9 - reached_at
        )
        return RunRecord(
            dataset="t", sampler="warm", seed=seed, budget=8, values=values,
            statuses=["ok"] * 8, finished=True, stop_reason="budget", wall_s=0.0,
        )  # fmt: skip

    data = SimpleNamespace(optimum=1.0, direction="minimize")
    runs = [record(k, at) for k, at in enumerate([3, 1, None, 5, 2, 4])]
    assert _median_to(runs, data, 0.98) == 3.5

    def interval_cell(runs: list[RunRecord]) -> str:
        return interval_text(metrics.median_interval(_counts_to(runs, data, 0.98)), 8)

    assert interval_cell(runs) == " [1, >8]"
    assert interval_cell(runs[:5]) == ""  # five runs: no 95 % interval


def test_the_transfer_table_gives_the_ratio_its_bootstrap_interval(kt_datasets: Path) -> None:
    """Eight cold runs reaching 98 % at 40 and eight warm runs at 10 (budget 50): ratio 4, and
    an interval of [4, 4] since every resample is the same; the 98 % cells carry [40, 40] and
    [10, 10]."""
    from surrotune.bench.harness import RunRecord
    from surrotune.bench.transfer import format_transfer

    source = kt_datasets / "dedispersion_milo" / "A100.json.gz"
    target = kt_datasets / "dedispersion_milo" / "A4000.json.gz"
    summary = prepare_dataset(target)[3]
    pair = Pair(str(source), str(target))
    worse = summary.optimum * 2 if summary.direction == "minimize" else summary.optimum / 2

    def record(method: str, seed: int, reached_at: int) -> RunRecord:
        values = [worse] * (reached_at - 1) + [summary.optimum] * (51 - reached_at)
        return RunRecord(
            dataset=summary.name, sampler=pair.label(method), seed=seed, budget=50,
            values=values, statuses=["ok"] * 50, finished=True, stop_reason="budget", wall_s=0.0,
        )  # fmt: skip

    records = [record("cold", k, 40) for k in range(8)] + [record("warm", k, 10) for k in range(8)]
    text = format_transfer(
        [pair], records, {str(target): summary}, ["cold", "warm"], 50, list(range(8)),
        source_budget=200, enqueue_top=10, command=None, wall_s=0.0,
    )  # fmt: skip
    row = next(line for line in text.splitlines() if line.startswith("| dedispersion_milo/A100"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:] == ["40 / 40 [40, 40]", "10 / 10 [10, 10]", "4.00 [4.00, 4.00]"]
