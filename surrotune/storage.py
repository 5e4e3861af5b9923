"""Where trials live: one URL or path → an Optuna storage.

SQLite is the default (a file next to the experiment). PostgreSQL (``postgresql://...``) or a
journal file (``*.log``/``*.jsonl`` or ``journal:///path``) let several GPUs or hosts share one
study. The storage stays a plain Optuna storage, so ``optuna-dashboard`` and any Optuna code can
open it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import time
import urllib.parse
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalRedisBackend

from surrotune.errors import SurrotuneError

__all__ = [
    "Coordination",
    "StorageError",
    "coordination_for",
    "describe_storage",
    "open_storage",
    "redis_url_and_prefix",
    "storage_url",
]

JOURNAL_SUFFIXES = (".log", ".jsonl", ".journal")


class StorageError(SurrotuneError, ValueError):
    """A storage URL that cannot be opened."""


def storage_url(text: str) -> str:
    """Normalise a URL or a bare path to a URL (a bare ``*.db`` path means SQLite)."""
    if "://" in text:
        return text
    path = Path(text).expanduser().resolve()
    if path.suffix in JOURNAL_SUFFIXES:
        return f"journal:///{path}"
    return f"sqlite:///{path}"


def redis_url_and_prefix(url: str) -> tuple[str, str]:
    """``redis://host:6379/0?prefix=NAME`` → the server's URL and the journal's key prefix, so
    that several journals (one per team, one per test) live apart in one Redis database."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    prefix = "".join(value for key, value in query if key == "prefix")
    rest = urllib.parse.urlencode([(key, value) for key, value in query if key != "prefix"])
    return urllib.parse.urlunsplit(parts._replace(query=rest)), prefix


def _with_installed_driver(url: str) -> str:
    """A plain ``postgresql://`` URL names SQLAlchemy's default driver, psycopg 3; where only
    psycopg2 is installed (the ``test`` extra's ``psycopg2-binary``), use that one."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{driver}://" + url.split("://", 1)[1]
    return url


def open_storage(text: str) -> BaseStorage:
    """Open (creating where needed) the storage that ``text`` names."""
    url = storage_url(text)
    try:
        if url.startswith("journal:///"):
            path = Path(url.removeprefix("journal:///")).resolve()
            path.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(
                JournalFileBackend(str(path), lock_obj=_FlockJournalLock(path))  # type: ignore[arg-type]
            )
        if url.startswith("redis://"):
            server, prefix = redis_url_and_prefix(url)
            with warnings.catch_warnings():  # "experimental" since Optuna 3.1
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return JournalStorage(JournalRedisBackend(server, prefix=prefix))
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        storage = _rdb_storage(url)
        if url.startswith("sqlite"):
            _use_write_ahead_log(storage)
        return storage
    except (
        ImportError,
        optuna.exceptions.StorageInternalError,
        sqlalchemy.exc.SQLAlchemyError,
        ValueError,
    ) as exc:
        raise StorageError(f"cannot open storage {url}: {exc}") from exc


class _FlockJournalLock:
    """The journal file's write lock, as ``fcntl.flock`` on ``<journal>.flock``.

    Optuna's default (a symlink, or a file opened exclusively) outlives a writer killed with
    SIGKILL, and every other worker then waits out its 30 s grace period before taking it over;
    the kernel drops a flock with its holder. Each instance opens its own descriptor, so two
    storages in one process exclude each other too. (flock needs a local file system; a journal
    shared over NFS wants Optuna's own JournalFileSymlinkLock, and PostgreSQL suits that better.)
    """

    def __init__(self, journal: Path) -> None:
        self._fd = os.open(journal.with_name(journal.name + ".flock"), os.O_RDWR | os.O_CREAT)

    def acquire(self) -> bool:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return True

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _rdb_storage(url: str) -> RDBStorage:
    """Open an RDB storage; two runners that create the same new SQLite file at once race on
    its schema (one sees "UNIQUE constraint failed: alembic_version"), so that is retried."""
    attempts = 5 if url.startswith("sqlite") else 1
    for attempt in range(attempts):
        try:
            return RDBStorage(_with_installed_driver(url), engine_kwargs=_engine_kwargs(url))
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _use_write_ahead_log(storage: RDBStorage) -> None:
    """SQLite in WAL mode with normal syncing: a trial's attribute writes cost a third as much,
    readers never block the writer, and a crash can lose at most the last transactions, never
    corrupt the file."""

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(storage.engine, "connect", on_connect)
    storage.engine.dispose()  # connections opened before the listener reconnect with it


def _engine_kwargs(url: str) -> dict[str, object]:
    if url.startswith("sqlite"):
        # several runners on one SQLite file wait for the lock rather than fail at once
        return {"connect_args": {"timeout": 60}}
    return {}


def describe_storage(text: str) -> str:
    """A short human description: the file path for file storages, else the URL."""
    url = storage_url(text)
    for prefix in ("sqlite:///", "journal:///"):
        if url.startswith(prefix):
            return url.removeprefix(prefix)
    return url


# --------------------------------------------------------------------------- coordination


@dataclass
class Coordination:
    """A lock that one worker of a study holds at a time, and the clock every worker reads.

    ``lock()`` blocks until held; a worker that dies holding it releases it (the server ends its
    session, the kernel drops its file lock, the Redis key expires). ``now()`` is in seconds.
    ``keep_alive()`` is called from the heartbeat thread: a lock with an expiry (Redis) is
    extended there while held, so that a long ask is not cut short. ``close()`` frees what it
    opened.
    """

    kind: str
    lock: Callable[[], contextlib.AbstractContextManager[None]]
    now: Callable[[], float]
    keep_alive: Callable[[], None] = lambda: None
    close: Callable[[], None] = lambda: None


def coordination_for(
    text: str, storage: BaseStorage, study_name: str, *, lock_timeout_s: float = 60.0
) -> Coordination:
    """What workers sharing ``study_name`` in the storage ``text`` coordinate through.

    Raises StorageError for a storage that offers neither a lock nor a shared clock (an RDB
    other than PostgreSQL or SQLite): several workers cannot share a study there safely.
    """
    url = storage_url(text)
    if url.startswith(("journal:///", "sqlite:///")):
        path = Path(url.split(":///", 1)[1])
        return _file_coordination(path.with_name(path.name + ".surrotune.lock"))
    if url.startswith(("postgresql", "postgres://")):
        return _postgres_coordination(storage, study_name)
    if url.startswith("redis://"):
        return _redis_coordination(url, study_name, lock_timeout_s)
    raise StorageError(
        f"{url}: workers sharing a study need PostgreSQL (postgresql://...), Redis "
        "(redis://...), a journal file (*.log) or SQLite on one host; this storage offers "
        "no lock for them"
    )


def _file_coordination(path: Path) -> Coordination:
    """flock on a file beside the storage: released by the kernel when the holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    @contextlib.contextmanager
    def lock() -> Iterator[None]:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    return Coordination("file", lock, time.time, close=lambda: os.close(fd))


def _lock_key(study_name: str) -> int:
    """A signed 64-bit advisory-lock key for the study (PostgreSQL's bigint)."""
    digest = hashlib.sha256(f"surrotune:{study_name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _postgres_coordination(storage: BaseStorage, study_name: str) -> Coordination:
    """A session-level advisory lock on a dedicated connection (the server releases it when the
    connection dies with its worker) and the server's clock."""
    rdb = getattr(storage, "_backend", storage)  # create_study wraps RDBStorage in a cache
    if not isinstance(rdb, RDBStorage):
        raise StorageError(f"expected a PostgreSQL RDBStorage, got {type(storage).__name__}")
    engine = rdb.engine
    connection = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    key = _lock_key(study_name)

    @contextlib.contextmanager
    def lock() -> Iterator[None]:
        connection.exec_driver_sql(f"SELECT pg_advisory_lock({key})")
        try:
            yield
        finally:
            connection.exec_driver_sql(f"SELECT pg_advisory_unlock({key})")

    def now() -> float:
        with engine.connect() as clock:
            return float(
                clock.exec_driver_sql("SELECT EXTRACT(EPOCH FROM clock_timestamp())").scalar()
            )

    return Coordination("postgresql", lock, now, close=connection.close)


def _redis_coordination(url: str, study_name: str, timeout_s: float) -> Coordination:
    """A Redis lock that expires ``timeout_s`` after its holder stops extending it (so a dead
    holder blocks the others that long at most) and the server's clock."""
    import redis

    server, prefix = redis_url_and_prefix(url)
    client = redis.Redis.from_url(server)
    held = redis.lock.Lock(
        client, f"{prefix}:surrotune:lock:{study_name}", timeout=timeout_s, thread_local=False
    )

    @contextlib.contextmanager
    def lock() -> Iterator[None]:
        held.acquire(blocking=True)
        try:
            yield
        finally:
            with contextlib.suppress(redis.exceptions.LockError):  # expired while held
                held.release()

    def keep_alive() -> None:
        if held.owned():
            with contextlib.suppress(redis.exceptions.LockError):
                held.reacquire()

    def now() -> float:
        seconds, micros = client.time()
        return seconds + micros / 1e6

    return Coordination("redis", lock, now, keep_alive=keep_alive, close=client.close)
