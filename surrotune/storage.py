"""Where trials live: one URL or path → an Optuna storage.

SQLite is the default (a file next to the experiment). PostgreSQL (``postgresql://...``) or a
journal file (``*.log``/``*.jsonl`` or ``journal:///path``) let several GPUs or hosts share one
study. The storage stays a plain Optuna storage, so ``optuna-dashboard`` and any Optuna code can
open it.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalRedisBackend

from surrotune.errors import SurrotuneError

__all__ = ["StorageError", "describe_storage", "open_storage", "storage_url"]

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
            return JournalStorage(JournalFileBackend(str(path)))
        if url.startswith("redis://"):
            return JournalStorage(JournalRedisBackend(url))
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
