"""``surrotune model save/show`` and ``surrotune run --warm-start``, end to end on replay."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from surrotune.cli import main
from surrotune.surrogate.bundle import default_bundle_path, load_bundle

sys.path.insert(0, str(Path(__file__).parent))
from test_runner import write_kt_cache


def _run(cache: Path, db: Path, *extra: str) -> int:
    return main(["run", "--dataset", str(cache), "--trials", "12", "--sampler", "surrogate",
                 "--seed", "0", "--storage", str(db), "--study", "t", "--no-progress",
                 "--remeasure", "0", *extra])  # fmt: skip


def test_a_run_saves_its_model_and_the_next_run_starts_from_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = write_kt_cache(tmp_path / "tiny.json")
    db = tmp_path / "runs.db"
    assert _run(cache, db) == 0
    saved = default_bundle_path(str(db), "t")
    assert saved == tmp_path / "runs-t.model.json.gz" and saved.is_file()
    out = capsys.readouterr().out
    assert f"Model saved to {saved}" in out
    bundle = load_bundle(saved)
    assert bundle.encoding.names == ("bx", "by", "u") and bundle.source["study"] == "t"
    assert bundle.device["name"] == "Test GPU" and bundle.problem_size == [1024]
    assert "replayed recording" in bundle.kernel["note"]

    assert main(["model", "show", str(saved)]) == 0
    shown = capsys.readouterr().out
    assert "Test GPU" in shown and "bx: 8, 16, 32, 64" in shown

    again = tmp_path / "again.db"
    assert _run(cache, again, "--warm-start", str(saved), "--save-model", "none") == 0
    out = capsys.readouterr().out
    assert f"warm start from {saved}" in out and "Warm start: final weights" in out
    assert "  design: " in out and "chosen by the sources" in out  # how the design went
    assert not default_bundle_path(str(again), "t").exists()


def test_model_save_writes_plain_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = write_kt_cache(tmp_path / "tiny.json")
    db = tmp_path / "runs.db"
    assert _run(cache, db, "--save-model", "none") == 0
    target = tmp_path / "models" / "tiny.json"
    assert main(["model", "save", str(db), "--study", "t", "-o", str(target)]) == 0
    assert json.loads(target.read_text())["format"] == "surrotune-model"
    assert "wrote" in capsys.readouterr().out


def test_a_bundle_of_other_parameters_is_refused_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = write_kt_cache(tmp_path / "tiny.json")
    db = tmp_path / "runs.db"
    assert _run(cache, db) == 0
    other = json.loads(cache.read_text())
    other["tune_params"] = {"bx": [8, 16, 32, 64], "block_y": [1, 2, 4, 16], "u": [0, 1]}
    other["tune_params_keys"] = ["bx", "block_y", "u"]
    other["cache"] = {k: {("block_y" if n == "by" else n): v for n, v in e.items()}
                      for k, e in other["cache"].items()}  # fmt: skip
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps(other))
    capsys.readouterr()
    bundle = str(default_bundle_path(str(db), "t"))
    code = main(["run", "--dataset", str(renamed), "--storage", str(tmp_path / "o.db"),
                 "--warm-start", bundle, "--no-progress"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "by" in err and "block_y" in err and "other parameters" in err
    assert main(["model", "show", str(tmp_path / "absent.json")]) == 2


def test_two_sources_warm_start_one_run_and_both_are_weighed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--warm-start A --warm-start B``: both bundles load and are weighed against the new
    GPU's own model, and the end of the run prints each weight (which source chooses the design
    is tested in tests/surrogate/test_transfer.py)."""
    cache = write_kt_cache(tmp_path / "tiny.json")
    bundles = []
    for seed in (0, 1):
        db = tmp_path / f"source{seed}.db"
        assert main(["run", "--dataset", str(cache), "--trials", "12", "--sampler", "surrogate",
                     "--seed", str(seed), "--storage", str(db), "--study", f"s{seed}",
                     "--no-progress", "--remeasure", "0"]) == 0  # fmt: skip
        bundles.append(default_bundle_path(str(db), f"s{seed}"))
    capsys.readouterr()
    target = tmp_path / "target.db"
    extra = ["--warm-start", str(bundles[0]), "--warm-start", str(bundles[1])]
    assert _run(cache, target, *extra, "--save-model", "none") == 0
    out = capsys.readouterr().out
    assert all(f"warm start from {b} (Test GPU, 12 measurements)" in out for b in bundles)
    weights_line = next(line for line in out.splitlines() if "final weights" in line)
    weights = dict(
        part.rsplit(" ", 1)
        for part in weights_line.split("final weights ")[1].split(" (")[0].split(", ")
    )
    assert set(weights) == {bundles[0].name, bundles[1].name, "target"}
    assert abs(sum(float(w) for w in weights.values()) - 1.0) < 0.02
