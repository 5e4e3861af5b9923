"""compute-sanitizer before the winner is reported: the parser on captured-format output, the
policy with a fake sanitizer, the plumbing with a fake compute-sanitizer executable (needs nvcc),
and the real tool on deliberately broken kernels (``gpu``).

The broken kernels are tests/fixtures/broken/broken.cu: MODE = "oob_by_one" writes one element
past the end of its output (invisible to verification, found by memcheck), MODE = "race" reads a
shared-memory slot of another warp without a barrier (correct output, found by racecheck).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import stat
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import optuna
import pytest

from surrotune.analysis.export import study_results
from surrotune.backends.cuda import CudaBackend
from surrotune.backends.replay import ReplayBackend, load_dataset
from surrotune.backends.sanitize import (
    CudaSanitizer,
    SanitizeJob,
    SanitizeOutcome,
    SanitizeResult,
    Sanitizes,
    find_compute_sanitizer,
    format_sanitize,
    main,
    parse_sanitizer_output,
    sanitize_trials,
)
from surrotune.experiment import Experiment, load_experiment
from surrotune.finish import MISSING_SANITIZER, FinishSettings, finish_run, report_dir_for
from surrotune.result import ParamValue, Status
from surrotune.runner import read_study
from surrotune.session import format_study
from surrotune.storage import open_storage
from surrotune.verdicts import SANITIZER_PREFIX, demoted_trials, ranked_ok_trials

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
SAMPLES = FIXTURES / "sanitizer"
BROKEN = FIXTURES / "broken" / "broken.toml"


def sample(name: str) -> str:
    return (SAMPLES / f"{name}.txt").read_text()


# --------------------------------------------------------------------------- the parser


def test_memcheck_out_of_bounds_write() -> None:
    report = parse_sanitizer_output(sample("memcheck_oob"), "memcheck")
    assert report.errors == 2 and report.complete and report.found
    assert len(report.findings) == 2  # the write, then the API call that saw the failed launch
    write, api = report.findings
    assert write[0] == "Invalid __global__ write of size 4 bytes"
    assert "by thread (35,0,0) in block (7812,0,0)" in write
    assert any("0 bytes after the nearest allocation" in line for line in write)
    assert api[0].startswith("Program hit CUDA_ERROR_LAUNCH_FAILED")
    assert report.kernel_findings == (write,)
    summary = report.summary()
    assert summary.splitlines()[0] == "memcheck: 2 errors"
    assert "Invalid __global__ write of size 4 bytes" in summary
    assert "surrotune sanitize target" not in summary  # the target's own lines are not findings


def test_memcheck_clean_and_truncated() -> None:
    clean = parse_sanitizer_output(sample("memcheck_clean"), "memcheck")
    assert clean.errors == 0 and clean.complete and not clean.found and clean.findings == ()
    truncated = parse_sanitizer_output(sample("memcheck_truncated"), "memcheck")
    assert truncated.errors is None and not truncated.complete and not truncated.found
    assert truncated.findings[0][0] == "Invalid __global__ write of size 4 bytes"
    assert "did not finish" in truncated.summary()


def test_memcheck_counts_past_the_print_limit() -> None:
    report = parse_sanitizer_output(sample("memcheck_many"), "memcheck")
    assert report.errors == 4096  # the first summary line, not the "not displayed" one
    assert len(report.findings) == 2 and report.found


def test_failed_api_calls_alone_are_not_a_kernel_finding() -> None:
    report = parse_sanitizer_output(sample("memcheck_api_only"), "memcheck")
    assert report.errors == 1 and report.findings and not report.kernel_findings
    assert not report.found


def test_racecheck_race_warning_and_clean() -> None:
    race = parse_sanitizer_output(sample("racecheck_race"), "racecheck")
    assert race.errors == 1 and race.warnings == 0 and race.found
    assert race.findings == (
        (
            "Error: Race reported between Write access at broken+0x1a0",
            "and Read access at broken+0x1d0 [1920 hazards]",
        ),
    )
    assert race.summary().splitlines()[0] == "racecheck: 1 error"
    warning = parse_sanitizer_output(sample("racecheck_warning"), "racecheck")
    assert warning.errors == 0 and warning.warnings == 1 and not warning.found
    assert warning.summary().splitlines()[0] == "racecheck: 0 errors, 1 warning"
    clean = parse_sanitizer_output(sample("racecheck_clean"), "racecheck")
    assert clean.errors == 0 and clean.complete and not clean.found
    # where racecheck also prints an ERROR SUMMARY counting its warnings, its own count rules
    both = sample("racecheck_warning") + "========= ERROR SUMMARY: 1 error\n"
    assert not parse_sanitizer_output(both, "racecheck").found


def test_verdict_round_trips_through_the_study_attribute() -> None:
    result = SanitizeResult(
        SanitizeOutcome.FINDING, Status.CORRECTNESS, "racecheck", "racecheck: 1 error", ("r.txt",)
    )
    assert SanitizeResult.from_attrs(result.to_attrs()) == result
    clean = SanitizeResult(SanitizeOutcome.CLEAN, reports=("a.txt", "b.txt"))
    assert SanitizeResult.from_attrs(clean.to_attrs()) == clean


# --------------------------------------------------------------------------- the policy


def make_study(values: Mapping[int, float], *, storage: str | None = None) -> optuna.Study:
    """One ok trial per x (value = time), plus a failed one and a duplicate of the best."""
    study = optuna.create_study(storage=storage, study_name="s", direction="minimize")
    distributions = {"x": optuna.distributions.CategoricalDistribution(list(range(10)))}
    for x, value in values.items():
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": x},
                distributions=distributions,
                value=value,
                user_attrs={"status": "ok", "config_key": str(x), "objective": value},
            )
        )
    study.add_trial(
        optuna.trial.create_trial(
            params={"x": 9},
            distributions=distributions,
            state=optuna.trial.TrialState.FAIL,
            user_attrs={"status": "resource", "config_key": "9"},
        )
    )
    best = min(values, key=values.__getitem__)
    study.add_trial(
        optuna.trial.create_trial(
            params={"x": best},
            distributions=distributions,
            value=values[best],
            user_attrs={"status": "ok", "config_key": str(best), "duplicate_of": 0},
        )
    )
    return study


class FakeSanitizer:
    """Answers from a table by x; clean for the others. Records what it was asked."""

    def __init__(self, answers: Mapping[int, SanitizeResult] | None = None) -> None:
        self.answers = dict(answers or {})
        self.asked: list[tuple[int, str]] = []

    def sanitize(self, config: Mapping[str, ParamValue], label: str) -> SanitizeResult:
        x = int(config["x"])
        self.asked.append((x, label))
        return self.answers.get(x, SanitizeResult(SanitizeOutcome.CLEAN, reports=(f"{x}.txt",)))


RACE = SanitizeResult(
    SanitizeOutcome.FINDING, Status.CORRECTNESS, "racecheck", "racecheck: 1 error\nError: Race"
)
OOB = SanitizeResult(
    SanitizeOutcome.FINDING, Status.RUNTIME, "memcheck", "memcheck: 1 error\nInvalid write"
)
UNSURE = SanitizeResult(SanitizeOutcome.INCONCLUSIVE, summary="racecheck: did not finish")


class Space:
    """The little a read_study needs from a search space."""

    names = ("x",)

    @staticmethod
    def key(config: Mapping[str, ParamValue]) -> str:
        return str(config["x"])


def test_fake_satisfies_the_protocol() -> None:
    assert isinstance(FakeSanitizer(), Sanitizes)


def test_best_demotes_the_winner_and_checks_the_next() -> None:
    study = make_study({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0})
    fake = FakeSanitizer({0: RACE, 1: OOB})
    records = sanitize_trials(study, fake, "best")
    assert [x for x, _ in fake.asked] == [0, 1, 2]  # the duplicate of 0 is not asked again
    assert fake.asked[0][1] == "s-trial0"
    assert [(r.number, r.result.outcome) for r in records] == [
        (0, SanitizeOutcome.FINDING),
        (1, SanitizeOutcome.FINDING),
        (2, SanitizeOutcome.CLEAN),
    ]
    assert demoted_trials(study) == {0: Status.CORRECTNESS, 1: Status.RUNTIME}
    # the demotion is what surrotune's own best selection sees ...
    state = read_study(study, Space())
    assert state.best is not None and state.best.number == 2
    assert state.counts[Status.OK] == 2 and state.counts[Status.CORRECTNESS] == 1
    assert state.counts[Status.RUNTIME] == 1
    assert [t.number for t in ranked_ok_trials(study)] == [2, 3]
    # ... while Optuna's trial stays COMPLETE with its value: it cannot change
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE
    assert study.best_trial.number == 0
    lines = format_sanitize(records, "best")
    assert lines[0] == "compute-sanitizer on the best configuration: 1 clean, 2 demoted"
    assert "trial 0: demoted to correctness" in lines[1] and "Error: Race" in lines[1]
    assert lines[-1] == "  trial 2: clean"


def test_stored_verdicts_are_reused_and_inconclusive_ones_are_not() -> None:
    study = make_study({0: 1.0, 1: 2.0})
    first = FakeSanitizer({0: RACE})
    sanitize_trials(study, first, "best")
    assert [x for x, _ in first.asked] == [0, 1]
    again = FakeSanitizer({1: UNSURE})
    records = sanitize_trials(study, again, "best")
    assert again.asked == []  # 0 is demoted (no candidate any more) and 1 has its clean verdict
    assert [(r.number, r.stored) for r in records] == [(1, True)]
    assert "verdict of an earlier run" in format_sanitize(records, "best")[1]

    fresh = make_study({0: 1.0, 1: 2.0})
    unsure = FakeSanitizer({0: UNSURE})
    records = sanitize_trials(fresh, unsure, "best")
    assert [x for x, _ in unsure.asked] == [0]  # the winner stands, unconfirmed: no next
    assert not any(k.startswith(SANITIZER_PREFIX) for k in fresh.user_attrs)  # not stored
    assert demoted_trials(fresh) == {}
    assert "trial 0: inconclusive, left as it is: racecheck: did not finish" in "\n".join(
        format_sanitize(records, "best")
    )
    sanitize_trials(fresh, unsure, "best")
    assert [x for x, _ in unsure.asked] == [0, 0]  # tried again next time


def test_all_checks_every_ok_configuration_and_none_checks_nothing() -> None:
    study = make_study({0: 1.0, 1: 2.0, 2: 3.0})
    fake = FakeSanitizer({1: OOB})
    assert sanitize_trials(study, fake, "none") == [] and fake.asked == []
    records = sanitize_trials(study, fake, "all")
    assert [x for x, _ in fake.asked] == [0, 1, 2]
    assert [r.result.outcome for r in records] == [
        SanitizeOutcome.CLEAN,
        SanitizeOutcome.FINDING,
        SanitizeOutcome.CLEAN,
    ]
    assert demoted_trials(study) == {1: Status.RUNTIME}
    assert format_sanitize(records, "all")[0] == (
        "compute-sanitizer on every ok configuration: 2 clean, 1 demoted"
    )
    with pytest.raises(ValueError, match="best, all, none"):
        sanitize_trials(study, fake, "some")


def test_a_template_broken_everywhere_stops_after_max_findings() -> None:
    study = make_study({x: float(x + 1) for x in range(6)})
    fake = FakeSanitizer({x: RACE for x in range(6)})
    records = sanitize_trials(study, fake, "best", max_findings=3)
    assert len(records) == 3 and len(fake.asked) == 3
    assert "stopped after 3 findings" in format_sanitize(records, "best", max_findings=3)[-1]


def test_show_and_export_see_the_demotion(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    study = make_study({0: 1.0, 1: 2.0}, storage=f"sqlite:///{db}")
    sanitize_trials(study, FakeSanitizer({0: RACE}), "best")
    shown = format_study(str(db), "s")
    assert "correctness 1" in shown and "ok 1" in shown
    first_row = shown.split("rank", 1)[1].splitlines()[1].split()
    assert first_row[1] == "1"  # trial 1 ranks first; trial 0 is no longer ok
    exported = {r.config["x"]: r for r in study_results(study)}
    assert exported[0].status is Status.CORRECTNESS and exported[0].objective is None
    assert "Error: Race" in exported[0].error
    assert exported[1].status is Status.OK


def test_trials_page_lists_every_verdict_attribute() -> None:
    from surrotune.verdicts import VERDICT_ATTRS

    page = (REPO / "docs" / "trials.md").read_text()
    section = page.split("## Verdicts after the search", 1)[1]
    missing = [name for name in VERDICT_ATTRS if f"| `{name}` |" not in section]
    assert not missing, f"docs/trials.md lacks rows for {missing}"


# --------------------------------------------------------------------------- the end of a run


def test_report_dir_is_beside_a_file_storage(tmp_path: Path) -> None:
    assert report_dir_for(str(tmp_path / "runs.db"), "s") == tmp_path / "runs-sanitizer"
    assert report_dir_for(f"journal:///{tmp_path}/j.log", "s") == tmp_path / "j-sanitizer"
    assert report_dir_for("postgresql://u@h/db", "s").name == "surrotune-sanitizer"


def test_missing_compute_sanitizer_is_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("surrotune.finish.find_compute_sanitizer", lambda: None)
    experiment = load_experiment(BROKEN)
    study = make_study({0: 1.0, 1: 2.0})
    backend = CudaBackend(experiment)  # starts no worker until asked to measure
    lines = finish_run(
        study, backend, FinishSettings(remeasure_top=0), report_dir=tmp_path / "reports"
    )
    assert lines == [MISSING_SANITIZER]
    assert "--sanitize none" in MISSING_SANITIZER
    none = finish_run(
        study,
        backend,
        FinishSettings(sanitize="none", remeasure_top=0),
        report_dir=tmp_path / "reports",
    )
    assert none == []


def test_replay_has_nothing_to_sanitize(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from test_runner import write_kt_cache

    dataset = load_dataset(write_kt_cache(tmp_path / "tiny.json"))
    lines = finish_run(
        make_study({0: 1.0, 1: 2.0}),
        ReplayBackend(dataset),
        FinishSettings(sanitize="all", remeasure_top=0),
        report_dir=tmp_path,
    )
    assert lines == []


def test_a_run_reports_the_next_best_when_the_winner_is_demoted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole session on the replay backend, with a sanitizer that finds a race in the best
    recorded configuration: the summary names the next best, and ``show`` agrees."""
    sys.path.insert(0, str(REPO / "tests"))
    from test_runner import write_kt_cache

    from surrotune import session

    class RaceInTheOptimum:
        def __init__(self) -> None:
            self.asked: list[dict[str, ParamValue]] = []

        def sanitize(self, config: Mapping[str, ParamValue], label: str) -> SanitizeResult:
            self.asked.append(dict(config))
            if config == {"bx": 64, "by": 4, "u": 1}:
                return RACE
            return SanitizeResult(SanitizeOutcome.CLEAN)

    fake = RaceInTheOptimum()
    monkeypatch.setattr("surrotune.finish.sanitizer_for", lambda *args: (fake, ""))
    cache = write_kt_cache(tmp_path / "tiny.json")
    db = tmp_path / "runs.db"
    tuning = session.prepare(
        None,
        {"dataset": cache, "sampler": "brute-force", "trials": 32, "url": str(db), "study": "t"},
    )
    summary = tuning.run(progress=False)
    assert fake.asked[0] == {"bx": 64, "by": 4, "u": 1}
    assert summary.best is not None and summary.best.params != {"bx": 64, "by": 4, "u": 1}
    assert summary.best.params == fake.asked[-1]
    assert summary.counts[Status.CORRECTNESS] == 1
    text = session.format_summary(tuning, summary)
    assert "compute-sanitizer on the best configuration: 1 clean, 1 demoted" in text
    assert f"Best configuration (trial {summary.best.number})" in text
    assert "Re-measured the top 5 configurations" in text  # replayed repeats, after sanitizing
    assert "correctness 1" in format_study(str(db), "t")


# --------------------------------------------------------------------------- the plumbing

FAKE_SANITIZER = """#!/usr/bin/env bash
# A stand-in for compute-sanitizer: logs its arguments, keeps the job file, prints a canned
# report chosen by $FAKE_SANITIZER_PLAN ("memcheck=oob racecheck=clean", or "hang").
echo "$@" >> "$FAKE_SANITIZER_LOG"
tool="$2"
job="${@: -1}"
cp "$job" "$FAKE_SANITIZER_LOG.job"
if [ "$FAKE_SANITIZER_PLAN" = hang ]; then sleep 60; exit 0; fi
for entry in $FAKE_SANITIZER_PLAN; do
  if [ "${entry%%=*}" = "$tool" ]; then
    cat "$FAKE_SANITIZER_SAMPLES/${tool}_${entry#*=}.txt"
    case "${entry#*=}" in clean) exit 0 ;; *) exit 86 ;; esac
  fi
done
exit 3
"""


@pytest.fixture
def fake_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    script = tmp_path / "bin" / "compute-sanitizer"
    script.parent.mkdir()
    script.write_text(FAKE_SANITIZER)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_SANITIZER_LOG", str(log))
    monkeypatch.setenv("FAKE_SANITIZER_SAMPLES", str(SAMPLES))
    yield str(script), log


def broken_on_sm90() -> Experiment:
    """The broken-kernel experiment with a fixed arch, so that no worker is needed for it."""
    experiment = load_experiment(BROKEN)
    assert experiment.kernel is not None
    return dataclasses.replace(
        experiment, kernel=dataclasses.replace(experiment.kernel, arch="sm_90")
    )


def test_find_compute_sanitizer_on_path_and_in_cuda_home(
    tmp_path: Path, fake_tool: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    script, _ = fake_tool
    monkeypatch.setenv("PATH", f"{Path(script).parent}{os.pathsep}{os.environ['PATH']}")
    assert find_compute_sanitizer() == script
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("CUDA_HOME", str(Path(script).parent.parent))
    assert find_compute_sanitizer() == script


@pytest.mark.nvcc
def test_cuda_sanitizer_runs_each_tool_and_saves_the_reports(
    tmp_path: Path, fake_tool: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    script, log = fake_tool
    backend = CudaBackend(broken_on_sm90(), cache_dir=tmp_path / "cache")
    sanitizer = CudaSanitizer(backend, tmp_path / "reports", executable=script, timeout_s=60)
    config: dict[str, ParamValue] = {"BLOCK": 256, "MODE": "race"}

    monkeypatch.setenv("FAKE_SANITIZER_PLAN", "memcheck=clean racecheck=race")
    result = sanitizer.sanitize(config, "s-trial4")
    assert result.outcome is SanitizeOutcome.FINDING
    assert result.status is Status.CORRECTNESS and result.tool == "racecheck"
    assert result.summary.startswith("racecheck: 1 error\nError: Race reported between Write")
    names = [Path(r).name for r in result.reports]
    assert names == ["s-trial4-memcheck.txt", "s-trial4-racecheck.txt"]
    report = Path(result.reports[1]).read_text()
    assert report.startswith("# compute-sanitizer --tool racecheck on BLOCK=256 MODE=race\n")
    assert "RACECHECK SUMMARY: 1 hazard displayed" in report
    calls = log.read_text().splitlines()
    assert len(calls) == 2
    memcheck = calls[0].split()
    assert memcheck[:6] == ["--tool", "memcheck", "--error-exitcode", "86", "--print-limit", "20"]
    assert memcheck[6:9] == [sys.executable, "-m", "surrotune.backends.sanitize"]
    job = pickle.loads(Path(f"{log}.job").read_bytes())
    assert isinstance(job, SanitizeJob)
    assert job.kernel_name == "broken" and job.cubin.startswith(b"\x7fELF")
    assert b"surrotune-mode=race;" in job.cubin
    assert job.grid == (3907, 1, 1) and job.block == (256, 1, 1)  # cdiv(1000003, 256)

    log.unlink()
    monkeypatch.setenv("FAKE_SANITIZER_PLAN", "memcheck=oob racecheck=clean")
    result = sanitizer.sanitize({"BLOCK": 128, "MODE": "oob_by_one"}, "s-trial5")
    assert result.outcome is SanitizeOutcome.FINDING and result.status is Status.RUNTIME
    assert result.tool == "memcheck" and len(result.reports) == 1
    assert len(log.read_text().splitlines()) == 1  # the first finding ends the check

    monkeypatch.setenv("FAKE_SANITIZER_PLAN", "memcheck=clean racecheck=clean")
    result = sanitizer.sanitize({"BLOCK": 128, "MODE": "ok"}, "s-trial6")
    assert result.outcome is SanitizeOutcome.CLEAN and len(result.reports) == 2

    monkeypatch.setenv("FAKE_SANITIZER_PLAN", "memcheck=api_only")
    result = sanitizer.sanitize({"BLOCK": 128, "MODE": "ok"}, "s-trial7")
    assert result.outcome is SanitizeOutcome.INCONCLUSIVE
    assert "only failed CUDA API calls" in result.summary

    monkeypatch.setenv("FAKE_SANITIZER_PLAN", "memcheck=truncated")
    result = sanitizer.sanitize({"BLOCK": 128, "MODE": "ok"}, "s-trial8")
    assert result.outcome is SanitizeOutcome.INCONCLUSIVE and "exit code 86" in result.summary


@pytest.mark.nvcc
def test_a_sanitizer_that_hangs_is_killed_and_inconclusive(
    tmp_path: Path, fake_tool: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    script, log = fake_tool
    monkeypatch.setenv("FAKE_SANITIZER_PLAN", "hang")
    backend = CudaBackend(broken_on_sm90(), cache_dir=tmp_path / "cache")
    sanitizer = CudaSanitizer(backend, tmp_path / "reports", executable=script, timeout_s=1.0)
    result = sanitizer.sanitize({"BLOCK": 128, "MODE": "ok"}, "s-trial1")
    assert result.outcome is SanitizeOutcome.INCONCLUSIVE
    assert result.summary == "memcheck: did not finish within 1 s"
    assert len(log.read_text().splitlines()) == 1  # racecheck was not started


def test_the_target_entry_point_refuses_bad_arguments(tmp_path: Path) -> None:
    assert main([]) == 2
    other = tmp_path / "other.pickle"
    other.write_bytes(pickle.dumps({"not": "a job"}))
    assert main([str(other)]) == 2


def test_unknown_tool_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown sanitizer tool"):
        CudaSanitizer(CudaBackend(broken_on_sm90()), Path("."), executable="x", tools=["initx"])


# --------------------------------------------------------------------------- on the GPU


@pytest.fixture
def gpu_sanitizer(tmp_path: Path) -> Iterator[CudaSanitizer]:
    executable = find_compute_sanitizer()
    if executable is None:
        pytest.skip("NO COMPUTE-SANITIZER: install the CUDA toolkit's compute-sanitizer")
    with CudaBackend(load_experiment(BROKEN), cache_dir=tmp_path / "cache") as backend:
        yield CudaSanitizer(backend, tmp_path / "reports", executable=executable, timeout_s=300)


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_memcheck_finds_the_write_past_the_end(gpu_sanitizer: CudaSanitizer) -> None:
    result = gpu_sanitizer.sanitize({"BLOCK": 256, "MODE": "oob_by_one"}, "gpu-oob")
    assert result.outcome is SanitizeOutcome.FINDING, result.summary
    assert result.status is Status.RUNTIME and result.tool == "memcheck"
    assert "Invalid __global__ write of size 4 bytes" in result.summary
    assert Path(result.reports[0]).is_file()


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_racecheck_finds_the_shared_memory_race(gpu_sanitizer: CudaSanitizer) -> None:
    result = gpu_sanitizer.sanitize({"BLOCK": 256, "MODE": "race"}, "gpu-race")
    assert result.outcome is SanitizeOutcome.FINDING, result.summary
    assert result.status is Status.CORRECTNESS and result.tool == "racecheck"
    assert "race" in result.summary.lower()


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_correct_kernel_is_clean(gpu_sanitizer: CudaSanitizer) -> None:
    result = gpu_sanitizer.sanitize({"BLOCK": 256, "MODE": "ok"}, "gpu-ok")
    assert result.outcome is SanitizeOutcome.CLEAN, result.summary
    assert len(result.reports) == 2
    assert "ERROR SUMMARY: 0 errors" in Path(result.reports[0]).read_text()


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_clean_gemm_configuration_passes(tmp_path: Path) -> None:
    executable = find_compute_sanitizer()
    if executable is None:
        pytest.skip("NO COMPUTE-SANITIZER: install the CUDA toolkit's compute-sanitizer")
    text = (REPO / "experiments" / "gemm.toml").read_text()
    for size in ("M", "N", "K"):  # small: racecheck instruments every shared access
        text = text.replace(f"{size} = 2048", f"{size} = 256")
    text = text.replace('"../templates/gemm.cu"', f'"{REPO / "templates" / "gemm.cu"}"')
    shutil.copy(REPO / "experiments" / "gemm_reference.py", tmp_path)
    (tmp_path / "gemm.toml").write_text(text)
    experiment = load_experiment(tmp_path / "gemm.toml")
    assert experiment.sizes["M"] == 256
    config: dict[str, ParamValue] = {
        "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 16, "TM": 4, "TN": 4, "VEC": 4, "PAD": 0,
        "UNROLL": 0, "DOUBLE_BUFFER": 1,
    }  # fmt: skip
    with CudaBackend(experiment, cache_dir=tmp_path / "cache") as backend:
        (measured,) = backend.evaluate([config])
        assert measured.status is Status.OK, measured.error
        sanitizer = CudaSanitizer(backend, tmp_path / "reports", executable=executable)
        result = sanitizer.sanitize(config, "gemm")
    assert result.outcome is SanitizeOutcome.CLEAN, result.summary


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gpu_policy_demotes_the_racy_configuration(tmp_path: Path) -> None:
    """A study measured on the GPU, then ``--sanitize all``: the race and the silent overflow,
    both ``ok`` in the search, end demoted; the correct kernel stays ``ok``."""
    executable = find_compute_sanitizer()
    if executable is None:
        pytest.skip("NO COMPUTE-SANITIZER: install the CUDA toolkit's compute-sanitizer")
    from surrotune.runner import Runner
    from surrotune.space import SearchSpace

    experiment = load_experiment(BROKEN)
    space = SearchSpace(experiment.parameters, experiment.constraints, experiment.sizes)
    study = optuna.create_study(storage=open_storage(str(tmp_path / "gpu.db")), study_name="g")
    configs = [
        {"BLOCK": 256, "MODE": "race"},
        {"BLOCK": 256, "MODE": "oob_by_one"},
        {"BLOCK": 256, "MODE": "ok"},
    ]
    for config in configs:
        study.enqueue_trial(config)
    with CudaBackend(experiment, cache_dir=tmp_path / "cache") as backend:
        Runner(study=study, space=space, backend=backend, trials=3, batch_size=3).run()
        assert [t.user_attrs["status"] for t in study.trials] == ["ok", "ok", "ok"]
        sanitizer = CudaSanitizer(backend, tmp_path / "reports", executable=executable)
        sanitize_trials(study, sanitizer, "all")
    assert demoted_trials(study) == {0: Status.CORRECTNESS, 1: Status.RUNTIME}
    best = read_study(study, space).best
    assert best is not None and best.params == {"BLOCK": 256, "MODE": "ok"}
