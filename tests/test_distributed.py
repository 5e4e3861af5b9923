"""Several workers on one study: budget claims, heartbeats, stale trials, ``--gpus``/``--workers``
and ``surrotune worker``, against the real servers (PostgreSQL at 127.0.0.1:5432 and Redis at
127.0.0.1:6379, which .ci/run starts) and a journal file.

The end-to-end tests run worker processes on the replay backend: exactly the budget is measured,
no configuration twice, and a worker killed with SIGKILL while it holds a RUNNING trial loses
nothing: a survivor fails that trial (``interrupted``, ``stale_worker``) and measures its
configuration again, once.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from surrotune import session
from surrotune.cli import main
from surrotune.experiment import ExperimentError, load_experiment
from surrotune.heartbeat import OWNER_ATTR, RECORD_PREFIX, fail_stale_trials, worker_records
from surrotune.runner import StudyState, is_measurement, read_study
from surrotune.storage import StorageError, coordination_for, open_storage
from surrotune.workers import Coordinator, WorkerError, gpu_devices, shared_storage_url

sys.path.insert(0, str(Path(__file__).parent))
from test_runner import write_kt_cache
from test_storage import PG_PSYCOPG2, _postgres_unreachable

optuna.logging.set_verbosity(optuna.logging.WARNING)

SLOW_WORKER = Path(__file__).parent / "_slow_worker.py"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379


# ------------------------------------------------------------------- servers and fixtures


@pytest.fixture
def pg_url() -> Iterator[tuple[str, str]]:
    """(URL, fresh study name) on the PostgreSQL server; the study is deleted afterwards."""
    reason = _postgres_unreachable()
    if reason is not None:
        pytest.skip(reason)
    name = f"surrotune-dist-{uuid.uuid4().hex[:12]}"
    yield PG_PSYCOPG2, name
    with contextlib.suppress(KeyError):
        optuna.delete_study(study_name=name, storage=PG_PSYCOPG2)


@pytest.fixture
def redis_url() -> Iterator[tuple[str, str]]:
    """(URL with a journal prefix of its own, study name); the journal's keys are deleted
    afterwards, and nothing else in the server is touched."""
    try:
        import redis
    except ImportError:
        pytest.skip("the redis package is not installed (pip install -e '.[test]')")
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        pytest.skip(f"Redis at {REDIS_HOST}:{REDIS_PORT} is not reachable: {exc}")
    prefix = f"surrotune-test-{uuid.uuid4().hex[:12]}"
    yield f"redis://{REDIS_HOST}:{REDIS_PORT}/0?prefix={prefix}", "shared"
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def journal_url(tmp_path: Path) -> tuple[str, str]:
    return str(tmp_path / "shared.log"), "shared"


STORAGES = ["pg_url", "journal_url", "redis_url"]


def write_experiment(
    tmp_path: Path,
    url: str | None,
    study: str,
    *,
    trials: int,
    sampler: str = "brute-force",
    interval: float = 0.3,
    grace: float = 1.5,
    constraints: str = "",
    name: str | None = None,
) -> Path:
    """A replay experiment on the tiny recording (``name``.toml, default the study's name),
    with quick heartbeats for the tests."""
    cache = write_kt_cache(tmp_path / "tiny.json")
    lines = [f"constraints = [{constraints}]"] if constraints else []
    lines += ["[search]", f'sampler = "{sampler}"', f"trials = {trials}", "batch_size = 2"]
    lines += ["[evaluation]", 'backend = "replay"', f'dataset = "{cache}"']
    lines += ["[storage]", f'study = "{study}"'] + ([f'url = "{url}"'] if url else [])
    lines += [f"heartbeat_interval = {interval}", f"grace_period = {grace}"]
    if constraints:  # constraints name parameters: the recording's, declared
        lines += ["[parameters]", "bx = [8, 16, 32, 64]", "by = [1, 2, 4, 16]", "u = [0, 1]"]
    path = tmp_path / f"{name or study}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def load(url: str, study: str) -> optuna.Study:
    return optuna.load_study(study_name=study, storage=open_storage(url))


def measured_keys(study: optuna.Study) -> list[str]:
    return [t.user_attrs["config_key"] for t in study.get_trials() if is_measurement(t)]


# ------------------------------------------------------------------- claims (one process)


def _claimer(tuning: session.Tuning) -> Coordinator:
    return Coordinator.start(
        tuning.study, tuning.space, tuning.experiment.storage.url, interval_s=0.2, grace_s=5.0
    )


def _tell_ok(coordinator: Coordinator, count: int) -> None:
    for _ in range(count):
        trial = coordinator.study.ask()
        trial.set_user_attr("status", "ok")
        trial.set_user_attr("config_key", ",".join(str(v) for v in trial.params.values()))
        coordinator.study.tell(trial, 1.0)


def test_claims_share_the_budget_counting_trials_in_flight(tmp_path: Path) -> None:
    path = write_experiment(tmp_path, str(tmp_path / "c.log"), "c", trials=5, sampler="random")
    tuning = session.prepare(path)
    a, b = _claimer(tuning), _claimer(tuning)
    try:
        state_a, state_b = StudyState(), StudyState()
        first = a.claim(state_a, 4, 5)
        assert (first.trials, first.exhausted) == (4, False)
        # b sees a's four in flight: one place is left
        assert b.claim(state_b, 4, 5).trials == 1
        # nothing left to claim: b waits a moment and says so, without giving up
        started = time.monotonic()
        waiting = b.claim(state_b, 4, 5)
        assert (waiting.trials, waiting.exhausted) == (0, False)
        assert time.monotonic() - started >= b.poll_s * 0.9
        _tell_ok(a, 4)
        # b learns of a's four evaluations (others) while its own trial is still in flight
        after = b.claim(state_b, 4, 5)
        assert (after.trials, after.others, state_b.evaluations) == (0, 4, 4)
        _tell_ok(b, 1)  # told outside a runner: state_b does not know this one was b's own
        done = b.claim(state_b, 4, 5)
        assert (done.trials, done.exhausted, state_b.evaluations) == (0, False, 5)
        # a random proposal that repeats one in flight is told as a duplicate, owned by whoever
        # drew it (the random sampler is unseeded here): not one of the budget's places
        owners = collections.Counter(
            t.system_attrs[OWNER_ATTR]
            for t in load(str(tmp_path / "c.log"), "c").trials
            if "duplicate_of" not in t.user_attrs
        )
        assert owners == {a.worker_id: 4, b.worker_id: 1}
    finally:
        a.close()
        b.close()
    assert len(measured_keys(load(str(tmp_path / "c.log"), "c"))) == 5


def test_a_proposal_in_flight_elsewhere_is_recorded_as_its_duplicate(tmp_path: Path) -> None:
    url = str(tmp_path / "d.log")
    tuning = session.prepare(write_experiment(tmp_path, url, "d", trials=10, sampler="random"))
    a, b = _claimer(tuning), _claimer(tuning)
    try:
        assert a.claim(StudyState(), 1, 10).trials == 1
        running = a.study.claimed[0]
        # the same configuration enqueued again (as a resumed run redoes an interrupted one)
        tuning.study.enqueue_trial(dict(running.params))
        claim = b.claim(StudyState(), 1, 10)
        assert claim.trials == 1  # the repeat was dropped, a fresh proposal took its place
        trials = load(url, "d").trials
        dropped = [t for t in trials if "duplicate_of" in t.user_attrs]
        # the enqueued repeat, and any fresh proposal that happened to draw it again (random)
        assert len(dropped) >= 1
        for repeat in dropped:
            assert repeat.user_attrs["duplicate_of"] == running.number
            assert repeat.params == running.params and repeat.state == TrialState.FAIL
            assert not is_measurement(repeat)
        assert b.study.claimed[0].params != running.params
    finally:
        a.close()
        b.close()
    # claimed trials a runner never asked are given back, interrupted, not counted
    trials = load(url, "d").trials
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert read_study(load(url, "d"), tuning.space).evaluations == 0


# ------------------------------------------------------------------- heartbeats, stale trials


DISTRIBUTIONS = {
    "bx": optuna.distributions.CategoricalDistribution([8, 16, 32, 64]),
    "by": optuna.distributions.CategoricalDistribution([1, 2, 4, 16]),
}


def _running_trial(study: optuna.Study, owner: str | None) -> int:
    """A RUNNING trial holding a configuration, marked as ``owner``'s (None: unmarked)."""
    trial = study.ask(DISTRIBUTIONS)
    if owner is not None:
        study._storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, owner)
    return trial.number


def _record(study: optuna.Study, worker: str, beat: float, **extra: object) -> None:
    study._storage.set_study_system_attr(
        study._study_id,
        RECORD_PREFIX + worker,
        {"host": "h", "pid": 42, "device": "GPU 1", "beat": beat, "grace": 5.0, **extra},
    )


def test_stale_trials_are_interrupted_failed_and_retried_once(tmp_path: Path) -> None:
    study = optuna.create_study(storage=open_storage(str(tmp_path / "h.log")), study_name="h")
    _record(study, "dead", beat=100.0)
    _record(study, "alive", beat=198.0)
    _record(study, "gone", beat=199.0, stopped=True)
    dead = _running_trial(study, "dead")
    alive = _running_trial(study, "alive")
    mine = _running_trial(study, "me")
    gone = _running_trial(study, "gone")
    orphan = _running_trial(study, None)  # its asker died before marking it

    partial = study.ask().number  # its worker died while it was being asked
    study._storage.set_trial_param(
        study._storage.get_trial_id_from_study_id_trial_number(study._study_id, partial),
        "bx", 0.0, DISTRIBUTIONS["bx"],
    )  # fmt: skip
    study._storage.set_trial_system_attr(
        study._storage.get_trial_id_from_study_id_trial_number(study._study_id, partial),
        OWNER_ATTR, "dead",
    )  # fmt: skip

    failed = fail_stale_trials(study, now=200.0, me="me", names=list(DISTRIBUTIONS))
    assert (partial, False) in [(f.number, f.retry_enqueued) for f in failed]
    failed = [f for f in failed if f.number != partial]
    assert sorted(f.number for f in failed) == sorted([dead, gone, orphan])
    assert all(f.retry_enqueued for f in failed)
    trials = study.get_trials()
    by_number = {t.number: t for t in trials}
    for number in (alive, mine):
        assert by_number[number].state == TrialState.RUNNING
    for number in (dead, gone, orphan):
        trial = by_number[number]
        assert trial.state == TrialState.FAIL and trial.user_attrs["interrupted"] is True
    assert by_number[dead].user_attrs["stale_worker"] == "h pid 42 GPU 1"
    assert "no heartbeat record" in by_number[orphan].user_attrs["stale_worker"]
    retries = [t for t in trials if t.state == TrialState.WAITING]
    assert sorted(t.system_attrs["failed_trial"] for t in retries) == sorted([dead, gone, orphan])
    for retry in retries:
        original = by_number[retry.system_attrs["failed_trial"]]
        assert retry.params == original.params
        assert retry.system_attrs["fixed_params"] == original.params
        with warnings.catch_warnings():  # Optuna's own helper reads the link (experimental)
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retried = optuna.storages.RetryFailedTrialCallback.retried_trial_number(retry)
        assert retried == original.number

    # a retry that goes stale too is failed, but its configuration is not enqueued a third time
    retry_of_dead = next(t for t in retries if t.system_attrs["failed_trial"] == dead)
    asked = study.ask(DISTRIBUTIONS)
    while asked.number != retry_of_dead.number:  # pop the retries in order until ours
        study.tell(asked, state=TrialState.FAIL)
        asked = study.ask(DISTRIBUTIONS)
    study._storage.set_trial_system_attr(asked._trial_id, OWNER_ATTR, "dead")
    _record(study, "alive", beat=299.0)
    again = fail_stale_trials(study, now=300.0, me="me", names=list(DISTRIBUTIONS))
    assert [(f.number, f.retry_enqueued) for f in again] == [(asked.number, False)]
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert not [t for t in waiting if asked.number in t.system_attrs["retry_history"]]
    # the surrogate sampler learns nothing from a stale trial: it was not the kernel's fault
    from surrotune.surrogate.sampler import _learned

    assert _learned(by_number[dead]) is None


def test_heartbeat_record_is_written_and_marked_stopped(tmp_path: Path) -> None:
    url = str(tmp_path / "r.log")
    tuning = session.prepare(write_experiment(tmp_path, url, "r", trials=3, sampler="random"))
    coordinator = Coordinator.start(
        tuning.study, tuning.space, url, interval_s=0.1, grace_s=1.0, device="GPU 3"
    )
    first = worker_records(tuning.study)[coordinator.worker_id]["beat"]
    time.sleep(0.35)
    record = worker_records(tuning.study)[coordinator.worker_id]
    assert record["beat"] > first and record["stopped"] is False
    assert record["device"] == "GPU 3" and record["pid"] == os.getpid()
    coordinator.close()
    assert worker_records(tuning.study)[coordinator.worker_id]["stopped"] is True


# ------------------------------------------------------------------- settings and bad input


def test_heartbeat_settings_are_read_and_checked(tmp_path: Path) -> None:
    path = write_experiment(tmp_path, None, "s", trials=3, interval=2, grace=30)
    storage = load_experiment(path).storage
    assert (storage.heartbeat_interval_s, storage.grace_period_s) == (2.0, 30.0)
    bad = write_experiment(tmp_path, None, "s", trials=3, interval=10, grace=5)
    with pytest.raises(ExperimentError, match=r"storage\.grace_period.*longer than"):
        load_experiment(bad)
    text = bad.read_text().replace("heartbeat_interval = 10", 'heartbeat_interval = "soon"')
    bad.write_text(text)
    with pytest.raises(ExperimentError, match=r"storage\.heartbeat_interval"):
        load_experiment(bad)


def test_gpu_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert gpu_devices("all") == ["4", "5"]
    assert gpu_devices("1") == ["5"]
    assert gpu_devices("1,0") == ["5", "4"]
    with pytest.raises(WorkerError, match=r"2 GPU\(s\).*no GPU 2"):
        gpu_devices("0,2")
    for bad in ("x", "0,0", "-1", ""):
        with pytest.raises(WorkerError, match="--gpus"):
            gpu_devices(bad)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,-1,1")  # CUDA stops at the invalid entry
    assert gpu_devices("all") == ["0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(WorkerError, match="no GPU found"):
        gpu_devices("all")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi either
    with pytest.raises(WorkerError, match="no GPU found"):
        gpu_devices("all")
    assert gpu_devices("0,1") == ["0", "1"]  # unverifiable: taken as given


def test_gpus_all_without_a_gpu_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    path = write_experiment(tmp_path, None, "g", trials=3)
    assert main(["run", str(path), "--gpus", "all"]) == 2
    assert "--gpus all: no GPU found" in capsys.readouterr().err
    # --gpus on a replay experiment, --workers on a cuda one: said, not guessed
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert main(["run", str(path), "--gpus", "0", "--storage", str(tmp_path / "g.log")]) == 2
    assert "--gpus runs the cuda backend" in capsys.readouterr().err


def test_several_workers_never_share_sqlite(tmp_path: Path) -> None:
    default = f"sqlite:///{tmp_path / 'e.db'}"
    assert shared_storage_url(default, default, 3) == f"journal:///{tmp_path / 'e.log'}"
    assert shared_storage_url(default, default, 1) == default
    assert shared_storage_url(PG_PSYCOPG2, default, 3) == PG_PSYCOPG2
    with pytest.raises(WorkerError, match=r"cannot share a SQLite file.*\.log"):
        shared_storage_url(f"sqlite:///{tmp_path / 'mine.db'}", default, 2)
    with pytest.raises(StorageError, match="no lock"):
        coordination_for("mysql://u@db.example/optuna", object(), "s")  # type: ignore[arg-type]


def test_worker_refuses_a_missing_or_different_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = str(tmp_path / "j.log")
    path = write_experiment(tmp_path, url, "j", trials=4)
    assert main(["worker", str(path), "--no-progress"]) == 2
    assert "has no study 'j' to join" in capsys.readouterr().err
    session.prepare(path).backend.close()  # surrotune run starts the study
    other = write_experiment(
        tmp_path, url, "j", trials=4, constraints='"bx * by <= 256"', name="other"
    )
    assert main(["worker", str(other), "--no-progress"]) == 2
    assert "constraints is ['bx * by <= 256'] but study 'j'" in capsys.readouterr().err
    assert main(["worker", str(path), "--storage", str(tmp_path / "x.db")]) == 2
    assert "cannot share a SQLite file" in capsys.readouterr().err
    # a plain Optuna study of that name is not surrotune's
    optuna.create_study(storage=open_storage(url), study_name="plain")
    assert main(["worker", str(path), "--study", "plain", "--no-progress"]) == 2
    assert "was not started by surrotune run" in capsys.readouterr().err


# ------------------------------------------------------------------- processes, real servers


def _start_study(tmp_path: Path, url: str, study: str, trials: int) -> Path:
    path = write_experiment(tmp_path, url, study, trials=trials)
    session.prepare(path).backend.close()  # as surrotune run would: created and described
    return path


def _worker_ids_by_pid(study: optuna.Study) -> dict[int, str]:
    return {int(r["pid"]): worker for worker, r in worker_records(study).items()}


@pytest.mark.slow
@pytest.mark.parametrize("storage", STORAGES)
def test_a_worker_killed_mid_trial_loses_nothing(
    tmp_path: Path, storage: str, request: pytest.FixtureRequest
) -> None:
    url, name = request.getfixturevalue(storage)
    count = 3 if storage == "pg_url" else 2
    budget = 10
    path = _start_study(tmp_path, url, name, budget)
    procs = [
        subprocess.Popen(
            [sys.executable, str(SLOW_WORKER), "0.15", "worker", str(path), "--no-progress",
             "--seed", str(i)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        )
        for i in range(count)
    ]  # fmt: skip
    victim = procs[0]
    study = load(url, name)
    held: list[int] = []
    deadline = time.monotonic() + 60
    try:
        while not held and time.monotonic() < deadline:
            time.sleep(0.05)
            victim_id = _worker_ids_by_pid(study).get(victim.pid)
            held = [
                t.number
                for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if victim_id is not None and t.system_attrs.get(OWNER_ATTR) == victim_id
                and t.params
            ]  # fmt: skip
        assert held, "the victim never held a RUNNING trial"
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        outputs = [p.communicate(timeout=90)[0] for p in procs[1:]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs[1:], outputs, strict=True):
        assert p.returncode == 0, out

    study = load(url, name)
    trials = study.get_trials()
    by_number = {t.number: t for t in trials}
    keys = measured_keys(study)
    # exactly the budget, no configuration measured twice, nothing left in flight
    assert len(keys) == budget, collections.Counter(t.state for t in trials)
    assert len(set(keys)) == budget
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    # what the victim held was failed as stale, by a survivor, and measured again once
    stale = [t for t in trials if "stale_worker" in t.user_attrs]
    assert {t.number for t in stale} >= set(held)
    for t in stale:
        assert t.state == TrialState.FAIL and t.user_attrs["interrupted"] is True
        # the victim's, or one it had just asked, not yet marked, when it died in its claim
        who = t.user_attrs["stale_worker"]
        assert f"pid {victim.pid}" in who or who == "unknown (no heartbeat record)"
        retries = [r for r in trials if r.system_attrs.get("failed_trial") == t.number]
        if set(t.params) != {"bx", "by", "u"}:  # it died while asking: no configuration held
            assert not retries and t.number not in held
            continue
        assert len(retries) == 1
        assert is_measurement(retries[0]) and retries[0].params == t.params
        assert retries[0].system_attrs[OWNER_ATTR] != _worker_ids_by_pid(study)[victim.pid]
        measured_again = [k for k in keys if k == retries[0].user_attrs["config_key"]]
        assert len(measured_again) == 1
    assert all(not is_measurement(by_number[n]) for n in held)
    for out in outputs:
        assert f"Evaluations: {budget} (" in out


@pytest.mark.slow
def test_run_workers_on_postgresql_measures_exactly_the_budget(
    tmp_path: Path, pg_url: tuple[str, str]
) -> None:
    url, name = pg_url
    # random proposals collide often in 32 configurations: the claims keep the total exact
    path = write_experiment(tmp_path, url, name, trials=12, sampler="random")
    result = subprocess.run(
        [sys.executable, "-m", "surrotune", "run", str(path), "--workers", "3", "--no-progress",
         "--seed", "7"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 workers on study" in result.stdout
    assert "Stopped: the budget of evaluations is spent." in result.stdout
    assert "Evaluations: 12 (12 in this run)" in result.stdout
    keys = measured_keys(load(url, name))
    assert len(keys) == len(set(keys)) == 12
    by_worker = result.stdout.split("Evaluations by worker:", 1)[1].splitlines()[1:]
    assert sum(int(line.rsplit(":", 1)[1]) for line in by_worker) == 12
    # a worker that joins a study whose budget is spent stops at once, measuring nothing
    joined = subprocess.run(
        [sys.executable, "-m", "surrotune", "worker", str(path), "--no-progress"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert joined.returncode == 0, joined.stderr
    assert "Evaluations: 12 (0 in this run)" in joined.stdout
    assert len(measured_keys(load(url, name))) == 12


@pytest.mark.slow
def test_run_workers_default_storage_is_a_journal_file(tmp_path: Path) -> None:
    path = write_experiment(tmp_path, None, "local", trials=20, sampler="brute-force")
    result = subprocess.run(
        [sys.executable, "-m", "surrotune", "run", str(path), "--workers", "2", "--no-progress"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    journal = tmp_path / "local.log"
    assert f"Trials stored in {journal}" in result.stdout
    assert not (tmp_path / "local.db").exists()
    keys = measured_keys(load(str(journal), "local"))
    assert len(keys) == len(set(keys)) == 20
    logs = sorted((tmp_path / "local-workers").glob("local.worker*.log"))
    assert len(logs) == 2
