"""Exporting a stored study as a surrotune recording, and replaying the export (the round trip)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from surrotune import session
from surrotune.analysis.export import ExportError, export_recording, study_results
from surrotune.backends.replay import Dataset, load_dataset
from surrotune.cli import main
from surrotune.errors import SurrotuneError
from surrotune.result import Status
from surrotune.sampling import distributions
from surrotune.space import SearchSpace

sys.path.insert(0, str(Path(__file__).parents[1]))
from test_runner import write_kt_cache

optuna.logging.set_verbosity(optuna.logging.WARNING)

PARAMETERS = {"bx": [8, 16, 32, 64], "by": [1, 2, 4, 16], "u": [0, 1]}
#: cuts (8, 16, 0) and (8, 16, 1) from the tiny cache: 30 feasible configurations remain, with
#: ok, compile and resource among them
CONSTRAINT = "bx + by != 24"
FEASIBLE = 30
BEST = {"bx": 64, "by": 4, "u": 1}  # the tiny cache's optimum, 1.0 ms

EXPERIMENT = f"""\
constraints = ["{CONSTRAINT}"]

[sizes]
N = 1024

[parameters]
bx = [8, 16, 32, 64]
by = [1, 2, 4, 16]
u = [0, 1]

[search]
sampler = "brute-force"
trials = 40
seed = 1
batch_size = 4

[evaluation]
backend = "replay"
dataset = "tiny.json"

[storage]
study = "brute"
"""


def run_cli(*args: str) -> int:
    return main(["run", *args, "--no-progress"])


class Work:
    """One tiny cache, one experiment over it, and two studies of it in one SQLite file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache = write_kt_cache(root / "tiny.json")
        self.experiment = root / "tiny.toml"
        self.experiment.write_text(EXPERIMENT)
        self.db = root / "runs.db"
        self.url = f"sqlite:///{self.db}"
        self.space = SearchSpace(PARAMETERS, [CONSTRAINT], {"N": 1024})
        self.recorded = load_dataset(self.cache)

    def study(self, name: str) -> optuna.Study:
        return optuna.load_study(study_name=name, storage=self.url)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Work:
    w = Work(tmp_path_factory.mktemp("export"))
    # brute force: every feasible configuration once
    assert run_cli(str(w.experiment), "--storage", str(w.db)) == 0
    # random: proposes from the whole product, so constraint breakers and repeats appear
    random = ["--study", "random", "--sampler", "random", "--seed", "0", "--trials", "16"]
    assert run_cli(str(w.experiment), "--storage", str(w.db), *random) == 0
    _add_cut_short_trials(w)
    return w


def _unmeasured(study: optuna.Study, space: SearchSpace) -> list[dict[str, Any]]:
    held = {space.key(t.params) for t in study.trials if t.params}
    frame = space.enumerate().to_dict("records")
    return [dict(r) for r in frame if space.key(r) not in held]


def _add_cut_short_trials(w: Work) -> None:
    """In study "random": one trial interrupted after its attributes were written (a second
    Ctrl-C between ``set_user_attr`` and ``tell``) and one still RUNNING, on two configurations
    nothing else measured."""
    study = optuna.load_study(
        study_name="random", storage=w.url, sampler=optuna.samplers.RandomSampler(seed=0)
    )
    interrupted, running = _unmeasured(study, w.space)[:2]
    for config, cut in ((interrupted, True), (running, False)):
        study.enqueue_trial(config)
        trial = study.ask(distributions(w.space))
        assert trial.params == config
        trial.set_user_attr("status", "ok")
        trial.set_user_attr("objective", 0.001)
        trial.set_user_attr("times_ms", [0.001])
        trial.set_user_attr("config_key", w.space.key(config))
        if cut:
            trial.set_user_attr("interrupted", True)
            study.tell(trial, state=TrialState.FAIL)


@pytest.fixture(scope="module")
def brute_export(work: Work) -> tuple[int, Dataset]:
    path = work.root / "brute.json.gz"
    count = export_recording(work.study("brute"), path)
    return count, load_dataset(path)


def measured_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The trials that measured a configuration: finished, with a status, not answered from the
    study, not interrupted, not a constraint breaker."""
    return [
        t for t in study.get_trials(deepcopy=False)
        if t.state.is_finished() and "status" in t.user_attrs
        and "duplicate_of" not in t.user_attrs and not t.user_attrs.get("interrupted")
        and t.user_attrs["status"] != Status.CONSTRAINT.value
    ]  # fmt: skip


def assert_result_matches_trial(dataset: Dataset, trial: FrozenTrial) -> None:
    result = dataset.lookup(trial.params)
    assert result is not None, trial.params
    attrs = trial.user_attrs
    assert dict(result.config) == trial.params
    assert result.status.value == attrs["status"]
    if trial.state == TrialState.COMPLETE:
        assert result.ok and result.objective == trial.value == attrs["objective"]
    else:
        assert trial.state == TrialState.FAIL and result.objective is None
    assert list(result.times_ms) == attrs.get("times_ms", [])
    assert result.time_ms == attrs.get("time_ms")
    assert result.compile_time_ms == attrs.get("compile_time_ms")
    assert result.benchmark_time_ms == attrs.get("benchmark_time_ms")
    assert result.error == attrs.get("error", "")


# ------------------------------------------------------------------- a brute-force study


def test_export_holds_every_measured_configuration_once(
    work: Work, brute_export: tuple[int, Dataset]
) -> None:
    count, dataset = brute_export
    trials = measured_trials(work.study("brute"))
    assert count == len(dataset.results) == len(trials) == FEASIBLE
    assert set(dataset.results) == {t.user_attrs["config_key"] for t in trials}
    assert set(dataset.results) == {
        work.space.key(r) for r in work.space.enumerate().to_dict("records")
    }
    assert dataset.format == "surrotune"


def test_export_results_equal_the_study_and_the_recording(
    work: Work, brute_export: tuple[int, Dataset]
) -> None:
    _, dataset = brute_export
    for trial in measured_trials(work.study("brute")):
        assert_result_matches_trial(dataset, trial)
        original = work.recorded.lookup(trial.params)
        exported = dataset.lookup(trial.params)
        assert original is not None and exported is not None
        assert (exported.status, exported.objective) == (original.status, original.objective)
        assert exported.times_ms == original.times_ms
    statuses = {r.status for r in dataset.results.values()}
    assert statuses == {Status.OK, Status.COMPILE, Status.RESOURCE}


def test_export_keeps_parameters_constraints_sizes_direction_and_device(
    brute_export: tuple[int, Dataset],
) -> None:
    _, dataset = brute_export
    assert dataset.parameters == PARAMETERS
    assert list(dataset.parameters) == list(PARAMETERS)
    assert dataset.constraints == (CONSTRAINT,)
    assert dataset.problem_size == {"N": 1024}
    assert dataset.direction == "minimize"
    assert dataset.objective == "time"
    assert dataset.device_name == "Test GPU"
    assert dataset.metadata["device"]["name"] == "Test GPU"
    assert dataset.metadata["study"] == "brute"
    assert dataset.metadata["backend"] == "replay"
    assert dataset.optimum.config == BEST and dataset.optimum.objective == 1.0


def test_study_results_are_the_export_in_trial_order(
    work: Work, brute_export: tuple[int, Dataset]
) -> None:
    study = work.study("brute")
    results = study_results(study)
    trials = measured_trials(study)
    assert [dict(r.config) for r in results] == [t.params for t in trials]
    _, dataset = brute_export
    assert [dataset.lookup(r.config) for r in results] == results


def test_replaying_the_export_finds_the_same_best_configuration(
    work: Work, brute_export: tuple[int, Dataset], capsys: pytest.CaptureFixture[str]
) -> None:
    _, dataset = brute_export
    original = work.study("brute")
    capsys.readouterr()
    code = run_cli(
        "--dataset", str(dataset.path), "--sampler", "brute-force", "--trials", "40",
        "--storage", str(work.root / "replay.db"), "--study", "again",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"{FEASIBLE} feasible configurations" in out  # the exported constraint applies
    assert "bx=64 by=4 u=1" in out and "reached 100.0 %" in out
    replayed = optuna.load_study(
        study_name="again", storage=f"sqlite:///{work.root / 'replay.db'}"
    )
    assert replayed.best_params == original.best_params == BEST
    assert replayed.best_value == original.best_value
    # and every configuration replays to what the original study measured
    first = {t.user_attrs["config_key"]: t for t in measured_trials(original)}
    again = measured_trials(replayed)
    assert len(again) == FEASIBLE
    for trial in again:
        source = first[trial.user_attrs["config_key"]]
        assert (trial.state, trial.value) == (source.state, source.value)
        assert trial.user_attrs["status"] == source.user_attrs["status"]
        assert trial.user_attrs.get("times_ms") == source.user_attrs.get("times_ms")


def test_replaying_an_export_whose_constraint_uses_a_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_kt_cache(tmp_path / "tiny.json")
    experiment = tmp_path / "sized.toml"
    experiment.write_text(EXPERIMENT.replace(CONSTRAINT, "bx * by <= N // 2"))
    db = tmp_path / "s.db"
    assert run_cli(str(experiment), "--storage", str(db)) == 0
    export = tmp_path / "sized.json.gz"
    count = export_recording(
        optuna.load_study(study_name="brute", storage=f"sqlite:///{db}"), export
    )
    assert count == 30  # bx * by = 1024 (two configurations) breaks bx * by <= 512
    capsys.readouterr()
    code = run_cli("--dataset", str(export), "--sampler", "brute-force", "--storage", str(db),
                   "--study", "replayed", "--trials", "40")  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "bx=64 by=4 u=1" in captured.out


# ------------------------------------------------------------------- what an export leaves out


def test_random_study_holds_what_the_export_must_leave_out(work: Work) -> None:
    """The precondition of the next test: the study really has each kind of trial."""
    attrs = [t.user_attrs for t in work.study("random").trials]
    assert sum("duplicate_of" in a for a in attrs) >= 2
    assert sum(a.get("status") == "constraint" for a in attrs) >= 2
    assert sum(bool(a.get("interrupted")) for a in attrs) == 1
    assert [t.state for t in work.study("random").trials].count(TrialState.RUNNING) == 1


def test_export_leaves_out_duplicates_constraints_and_cut_short_trials(work: Work) -> None:
    study = work.study("random")
    path = work.root / "random.json.gz"
    count = export_recording(study, path)
    dataset = load_dataset(path)
    trials = study.trials
    measured = measured_trials(study)
    assert count == len(dataset.results) == len(measured) == 16  # the --trials budget
    assert set(dataset.results) == {t.user_attrs["config_key"] for t in measured}
    for trial in measured:
        assert_result_matches_trial(dataset, trial)
    # a duplicate is answered from the trial it points at: same configuration, exported once
    for trial in trials:
        if "duplicate_of" in trial.user_attrs:
            source = trials[trial.user_attrs["duplicate_of"]]
            assert source.params == trial.params and source in measured
    # constraint breakers, the interrupted trial and the running one are not in it
    left_out = [
        t for t in trials
        if t.user_attrs.get("status") == "constraint" or t.user_attrs.get("interrupted")
        or t.state == TrialState.RUNNING
    ]  # fmt: skip
    assert len(left_out) >= 4
    for trial in left_out:
        assert dataset.lookup(trial.params) is None, trial
    # the recorded optimum is the study's best (the fake 0.001 ms trials are not in it)
    assert dataset.optimum.objective == study.best_value


# ------------------------------------------------------------------- studies that cannot export


def test_study_not_made_by_surrotune_is_an_export_error(tmp_path: Path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'f.db'}", study_name="foreign")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    with pytest.raises(ExportError, match="'foreign' was not written by surrotune"):
        export_recording(study, tmp_path / "f.json.gz")
    assert not (tmp_path / "f.json.gz").exists()


def test_study_with_nothing_measured_is_an_export_error(work: Work, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    tuning = session.prepare(work.experiment, {"url": url, "study": "empty"})
    tuning.backend.close()
    assert "surrotune" in tuning.study.user_attrs
    with pytest.raises(ExportError, match="holds no measured configuration"):
        export_recording(tuning.study, tmp_path / "e.json.gz")
    # a constraint breaker alone is not a measurement either
    tuning.study.add_trial(
        optuna.trial.create_trial(
            params={"bx": 8, "by": 16, "u": 0},
            distributions=distributions(work.space),
            state=TrialState.FAIL,
            user_attrs={"status": "constraint", "config_key": "8,16,0"},
        )
    )
    with pytest.raises(ExportError, match="holds no measured configuration"):
        export_recording(tuning.study, tmp_path / "e.json.gz")
    assert study_results(tuning.study) == []


def test_export_error_is_a_surrotune_and_value_error() -> None:
    assert issubclass(ExportError, SurrotuneError)
    assert issubclass(ExportError, ValueError)
