"""Storages: URLs and paths, SQLite's write-ahead log, and one study shared by two processes.

The PostgreSQL tests use the server at 127.0.0.1:5432 (user postgres, database ``test``) that runs
here and on CI; they skip, saying why, where it cannot be reached.
"""

from __future__ import annotations

import collections
import contextlib
import re
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage, RDBStorage
from optuna.trial import TrialState

from surrotune import session
from surrotune.backends.replay import load_dataset
from surrotune.errors import SurrotuneError
from surrotune.storage import StorageError, describe_storage, open_storage, storage_url

sys.path.insert(0, str(Path(__file__).parent))
from test_runner import write_kt_cache

optuna.logging.set_verbosity(optuna.logging.WARNING)

PG_HOST, PG_PORT, PG_DB = "127.0.0.1", 5432, "test"
#: the URL as users write it (SQLAlchemy picks the driver)
PG_PLAIN = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/{PG_DB}"
#: with the driver the test extra installs (psycopg2-binary) named explicitly
PG_PSYCOPG2 = f"postgresql+psycopg2://postgres@{PG_HOST}:{PG_PORT}/{PG_DB}"
#: nothing listens on port 1
PG_CLOSED = "postgres@127.0.0.1:1/test"


def _postgres_unreachable() -> str | None:
    """Why the PostgreSQL server cannot be used, or None when it can."""
    try:
        import psycopg2
    except ImportError:
        return "psycopg2 is not installed (pip install -e '.[test]')"
    try:
        psycopg2.connect(
            host=PG_HOST, port=PG_PORT, user="postgres", dbname=PG_DB, connect_timeout=5
        ).close()
    except psycopg2.Error as exc:
        return f"PostgreSQL at {PG_HOST}:{PG_PORT}/{PG_DB} is not reachable: {exc}".strip()
    return None


@pytest.fixture(scope="module")
def postgres() -> str:
    """The PostgreSQL URL to use; skips the test where the server is not reachable."""
    reason = _postgres_unreachable()
    if reason is not None:
        pytest.skip(reason)
    return PG_PSYCOPG2


@pytest.fixture
def pg_study_name(postgres: str) -> Iterator[str]:
    """A fresh study name, deleted from the server afterwards."""
    name = f"surrotune-test-{uuid.uuid4().hex[:12]}"
    yield name
    with contextlib.suppress(KeyError):  # never created
        optuna.delete_study(study_name=name, storage=postgres)


# ------------------------------------------------------------------- URLs and paths


def test_bare_db_path_is_an_absolute_sqlite_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert storage_url("runs.db") == f"sqlite:///{tmp_path.resolve() / 'runs.db'}"
    assert storage_url("sub/../x.db") == f"sqlite:///{tmp_path.resolve() / 'x.db'}"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert storage_url("~/t.db") == f"sqlite:///{(tmp_path / 'home' / 't.db').resolve()}"
    # any suffix that is not a journal's is SQLite
    assert storage_url("trials.sqlite3").startswith("sqlite:///")


@pytest.mark.parametrize("suffix", [".log", ".jsonl", ".journal"])
def test_journal_suffixes_are_journal_urls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    monkeypatch.chdir(tmp_path)
    assert storage_url(f"trials{suffix}") == f"journal:///{tmp_path.resolve()}/trials{suffix}"


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////abs/trials.db",
        PG_PLAIN,
        PG_PSYCOPG2,
        "mysql+pymysql://u:p@db.example/optuna",
        "redis://127.0.0.1:6379/0",
        "journal:///abs/trials.log",
    ],
)
def test_urls_pass_through_unchanged(url: str) -> None:
    assert storage_url(url) == url


def test_describe_storage_gives_paths_for_files_and_urls_otherwise(tmp_path: Path) -> None:
    db, log = tmp_path / "a.db", tmp_path / "a.log"
    assert describe_storage(str(db)) == str(db.resolve())
    assert describe_storage(f"sqlite:///{db}") == str(db)
    assert describe_storage(str(log)) == str(log.resolve())
    assert describe_storage(PG_PLAIN) == PG_PLAIN


def _round_trip(text: str, name: str = "s") -> None:
    """A study created through one opening is seen, with its trial, through a fresh one."""
    study = optuna.create_study(storage=open_storage(text), study_name=name)
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=3.5))
    study.set_user_attr("surrotune", {"direction": "minimize"})
    again = optuna.load_study(study_name=name, storage=open_storage(text))
    assert [t.value for t in again.trials] == [3.5]
    assert again.user_attrs["surrotune"] == {"direction": "minimize"}


def test_open_bare_db_path_creates_sqlite_and_its_folders(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "trials.db"
    storage = open_storage(str(path))
    assert isinstance(storage, RDBStorage)
    assert path.is_file()
    _round_trip(str(path))


def test_open_sqlite_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'u' / 'trials.db'}"
    assert isinstance(open_storage(url), RDBStorage)
    _round_trip(url)


def test_open_journal_path_creates_a_journal_file(tmp_path: Path) -> None:
    path = tmp_path / "j" / "trials.log"
    storage = open_storage(str(path))
    assert isinstance(storage, JournalStorage)
    _round_trip(str(path))
    assert path.is_file() and path.stat().st_size > 0
    # a journal is one JSON operation per line
    assert path.read_text().splitlines()[0].startswith("{")


def test_sqlite_uses_the_write_ahead_log(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    storage = open_storage(str(path))
    assert isinstance(storage, RDBStorage)
    optuna.create_study(storage=storage, study_name="w")
    with storage.engine.connect() as connection:
        mode = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
        synchronous = connection.exec_driver_sql("PRAGMA synchronous").scalar()
    assert mode == "wal"
    assert synchronous == 1  # NORMAL
    # WAL is a property of the file itself: any other reader sees it too
    with sqlite3.connect(path) as plain:
        assert plain.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_storage_error_is_a_surrotune_and_value_error() -> None:
    assert issubclass(StorageError, SurrotuneError)
    assert issubclass(StorageError, ValueError)


def test_unopenable_sqlite_path_is_a_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises((StorageError, OSError)):
        open_storage(str(blocker / "trials.db"))


@pytest.mark.parametrize(
    "url", [f"postgresql+psycopg2://{PG_CLOSED}", f"postgresql://{PG_CLOSED}"]
)
def test_unreachable_postgresql_is_a_storage_error(url: str) -> None:
    with pytest.raises(StorageError) as info:
        open_storage(url)
    message = str(info.value)
    assert "127.0.0.1" in message
    # it says the server could not be reached, not that a driver is missing
    assert "import" not in message.lower()


def test_plain_postgresql_url_opens(postgres: str) -> None:
    assert isinstance(open_storage(PG_PLAIN), RDBStorage)


def test_postgresql_round_trip(postgres: str, pg_study_name: str) -> None:
    storage = open_storage(postgres)
    assert isinstance(storage, RDBStorage)
    _round_trip(postgres, pg_study_name)


# ------------------------------------------------------------------- one study, two processes

EVALUATIONS = re.compile(r"Evaluations: (\d+) \((\d+) in this run\)")


def _two_runners(cache: Path, url: str, study: str, cwd: Path) -> list[str]:
    """Run two ``surrotune run`` processes on one study at the same time; their stdouts."""
    # the study is created (and described) once, as the first runner would; both runners then
    # start together, so their ask/tell loops overlap
    tuning = session.prepare(
        None,
        {"dataset": cache, "url": url, "study": study, "sampler": "brute-force", "trials": 32},
    )
    tuning.backend.close()
    command = [
        sys.executable, "-m", "surrotune", "run", "--dataset", str(cache),
        "--sampler", "brute-force", "--storage", url, "--study", study, "--trials", "32",
        "--batch-size", "2", "--no-progress",
    ]  # fmt: skip
    procs = [
        subprocess.Popen(
            command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"runner exited {proc.returncode}:\n{out}\n{err}"
        outputs.append(out)
    return outputs


def _check_shared_study(cache: Path, storage: object, study_name: str, outputs: list[str]) -> None:
    dataset = load_dataset(cache)
    study = optuna.load_study(study_name=study_name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    keys_of = {t.number: dataset.key(t.params) for t in trials if t.params}

    # no configuration is ever left mid-flight: a RUNNING trial is at most the brute force's
    # "nothing left" ask, which never received params (see test_sampling.py)
    assert all(not t.params for t in trials if t.state == TrialState.RUNNING)
    finished = [t for t in trials if t.state.is_finished() and "status" in t.user_attrs]
    measured = [t for t in finished if "duplicate_of" not in t.user_attrs]
    answered = [t for t in finished if "duplicate_of" in t.user_attrs]

    # together they measured every configuration of the recording
    assert {keys_of[t.number] for t in measured} == set(dataset.results)
    # each measurement agrees with the recording
    for t in measured:
        assert t.user_attrs["status"] == dataset.results[keys_of[t.number]].status.value
    # what the runners counted is what the study holds
    runs = [EVALUATIONS.search(out) for out in outputs]
    assert all(runs), outputs
    assert sum(int(m.group(2)) for m in runs if m) == len(measured)
    # a trial answered from the study points at an earlier trial with the same configuration
    for t in answered:
        first = study.trials[t.user_attrs["duplicate_of"]]
        assert first.params == t.params and first.number < t.number
    # the runners ask under the study's lock, and brute force skips what any trial holds: no
    # configuration is measured twice, and together they measured exactly the budget
    times = collections.Counter(keys_of[t.number] for t in measured)
    assert max(times.values()) == 1
    assert len(measured) == 32
    split = [int(m.group(2)) for m in runs if m]
    print(
        f"\n{study_name}: {len(measured)} measurements of {len(dataset.results)} "
        f"configurations (runners {split}), {len(answered)} answered from the study"
    )


@pytest.mark.slow
def test_two_runners_share_one_study_through_postgresql(
    tmp_path: Path, postgres: str, pg_study_name: str
) -> None:
    cache = write_kt_cache(tmp_path / "tiny.json")
    outputs = _two_runners(cache, postgres, pg_study_name, tmp_path)
    _check_shared_study(cache, postgres, pg_study_name, outputs)


@pytest.mark.slow
def test_two_runners_share_one_study_through_a_journal_file(tmp_path: Path) -> None:
    cache = write_kt_cache(tmp_path / "tiny.json")
    journal = tmp_path / "shared.log"
    outputs = _two_runners(cache, str(journal), "shared", tmp_path)
    _check_shared_study(cache, open_storage(str(journal)), "shared", outputs)
