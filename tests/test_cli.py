"""The command line, end to end on the replay backend, as a user runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from surrotune.cli import main
from surrotune.storage import open_storage

sys.path.insert(0, str(Path(__file__).parent))
from test_runner import write_kt_cache

REPO = Path(__file__).resolve().parents[1]


def surrotune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "surrotune", *args], cwd=cwd, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


def test_run_dataset_then_resume_then_show(tmp_path: Path) -> None:
    cache = write_kt_cache(tmp_path / "tiny.json")
    db = tmp_path / "runs.db"
    first = surrotune(
        "run", "--dataset", str(cache), "--trials", "10", "--sampler", "random", "--seed", "2",
        "--storage", str(db), "--study", "t", "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert (
        "Best configuration" in first.stdout and "Evaluations: 10 (10 in this run)" in first.stdout
    )
    assert str(db) in first.stdout
    again = surrotune(
        "run", "--dataset", str(cache), "--trials", "16", "--sampler", "random", "--seed", "3",
        "--storage", str(db), "--study", "t", "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "Evaluations: 16 (6 in this run)" in again.stdout
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{db}")
    measured = [
        t.user_attrs["config_key"] for t in study.trials
        if t.user_attrs.get("status") not in (None, "constraint")
        and "duplicate_of" not in t.user_attrs
    ]  # fmt: skip
    assert len(measured) == len(set(measured)) == 16
    shown = surrotune("show", str(db), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "study 't'" in shown.stdout and "rank" in shown.stdout
    best = min(t.value for t in study.trials if t.value is not None)
    first_row = shown.stdout.split("rank", 1)[1].splitlines()[1].split()
    assert float(first_row[2]) == pytest.approx(best)


def test_progress_bar_shows_best_and_failures(tmp_path: Path) -> None:
    cache = write_kt_cache(tmp_path / "tiny.json")
    done = surrotune(
        "run", "--dataset", str(cache), "--trials", "32", "--sampler", "brute-force",
        "--storage", str(tmp_path / "p.db"), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    final = done.stderr.replace("\r", "\n").strip().splitlines()[-1]
    assert "32/32" in final and "best=1" in final
    assert "resource=2" in final and "compile=" in final, last


def test_bad_experiment_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[search]\ntrials = "many"\n[evaluation]\nbackend = "replay"\ndataset = "x.json"\n'
    )
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "evaluation.dataset" in err
    assert list(tmp_path.glob("*.db")) == []


def test_unreadable_dataset_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.json"
    junk.write_text("not json at all")
    assert main(["run", "--dataset", str(junk), "--storage", str(tmp_path / "j.db")]) == 2
    assert str(junk) in capsys.readouterr().err
    assert main(["run", "--dataset", str(tmp_path / "absent.json")]) == 2


def test_study_for_other_parameters_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kt_datasets: Path
) -> None:
    cache = write_kt_cache(tmp_path / "tiny.json")
    db = str(tmp_path / "x.db")
    args = ["--storage", db, "--study", "same", "--trials", "3", "--no-progress"]
    assert main(["run", "--dataset", str(cache), *args]) == 0
    other = kt_datasets / "convolution_milo" / "A100.json.gz"
    assert main(["run", "--dataset", str(other), *args]) == 2
    err = capsys.readouterr().err
    assert "other parameters" in err and "bx=" in err


def test_show_needs_study_name_when_ambiguous(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = write_kt_cache(tmp_path / "tiny.json")
    db = str(tmp_path / "two.db")
    for name in ("a", "b"):
        assert main(["run", "--dataset", str(cache), "--storage", db, "--study", name,
                     "--trials", "2", "--no-progress"]) == 0  # fmt: skip
    assert main(["show", db]) == 2
    assert "--study" in capsys.readouterr().err
    assert main(["show", db, "--study", "b"]) == 0
    assert main(["show", str(tmp_path / "none.db")]) == 2


def test_ctrl_c_in_a_real_process_keeps_trials_and_resumes(
    tmp_path: Path, kt_datasets: Path
) -> None:
    """SIGINT to a running `surrotune run`: exit 130, trials kept, the same command resumes."""
    dataset = kt_datasets / "dedispersion_milo" / "A100.json.gz"
    db = tmp_path / "big.db"
    args = [sys.executable, "-m", "surrotune", "run", "--dataset", str(dataset),
            "--trials", "5000",
            "--sampler", "random", "--storage", str(db), "--study", "s", "--batch-size", "2",
            "--no-progress"]  # fmt: skip
    open_storage(str(db))  # the schema exists before the test starts polling the file
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until some trials are stored
        time.sleep(1.0)
        if db.exists():
            try:
                if len(optuna.load_study(study_name="s", storage=f"sqlite:///{db}").trials) > 10:
                    break
            except Exception:
                continue
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted; run the same command again" in out
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{db}")
    stored = [t for t in study.trials if "status" in t.user_attrs]
    assert stored and all(t.state.is_finished() for t in study.trials)
    n_before = sum(
        1
        for t in stored
        if t.user_attrs["status"] != "constraint" and "duplicate_of" not in t.user_attrs
    )
    resume = [
        *args[: args.index("--trials") + 1],
        str(n_before + 4),
        *args[args.index("--trials") + 2 :],
    ]
    done = subprocess.run(resume, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"Evaluations: {n_before + 4} (4 in this run)" in done.stdout
    _ = os.environ


def test_size_option_changes_the_problem_and_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gemm = REPO / "experiments" / "gemm.toml"
    recording = REPO / "experiments" / "datasets" / "gemm_1024_h200.json.gz"
    storage = tmp_path / "s.db"
    common = ["--backend", "replay", "--storage", str(storage), "--no-progress", "--trials", "3"]
    sizes = ["--size", "M=1024", "--size", "N=1024", "--size", "K=1024"]
    assert main(["run", str(gemm), *sizes, "--dataset", str(recording), *common]) == 0
    assert "the recording's optimum is 0.071744" in capsys.readouterr().out
    # the 2048 recording at 1024: its times are not this size's
    other = REPO / "experiments" / "datasets" / "gemm_h200.json.gz"
    assert main(["run", str(gemm), *sizes, "--dataset", str(other), *common]) == 2
    assert "M = 1024 (recorded: 2048)" in capsys.readouterr().err
    assert main(["run", str(gemm), "--size", "Q=3", *common]) == 2
    err = capsys.readouterr().err
    assert "sizes.Q" in err and "its sizes: M, N, K" in err
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(gemm), "--size", "M=big"])
    assert exit_.value.code == 2
    assert "expected NAME=NUMBER" in capsys.readouterr().err
    assert main(["run", "--dataset", str(recording), "--size", "M=2", *common[2:]]) == 2
    assert "give the experiment file" in capsys.readouterr().err
