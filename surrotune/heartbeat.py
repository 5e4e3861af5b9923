"""Heartbeats: which worker of a shared study is alive, and what to do with a dead one's trials.

Every worker writes a record into the study (a study system attribute ``surrotune:worker:<id>``:
host, pid, device, the storage clock's time of its last beat, its interval and grace period) from
a thread, every ``interval`` seconds, and marks each trial it asks with its id (the trial system
attribute ``surrotune:worker``). A RUNNING trial is *stale* when its worker's last beat is older
than that worker's grace period by the storage's clock, when its worker has stopped, or when it
has no worker at all (its asker died inside the shared lock, between asking and marking, or it
was asked by code that is not surrotune's).

A stale trial was not the kernel's fault, so it is marked ``interrupted`` (the models do not learn
from it, and it does not count as an evaluation) and ``stale_worker`` (who left it) while it is
still RUNNING, then failed, and its configuration is enqueued again, once: the new WAITING trial
carries Optuna's ``failed_trial`` and ``retry_history`` system attributes, as
``optuna.storages.RetryFailedTrialCallback`` writes them, so Optuna's own helpers read it.

Why not Optuna's heartbeat (``RDBStorage(heartbeat_interval=...)`` with ``fail_stale_trials``)?
In Optuna 5 only RDBStorage implements it (JournalStorage, file or Redis, does not), it ignores a
trial that died before its first beat, and it fails a stale trial without a way to say why: the
FAIL it writes looks like the kernel's failure to the models. One mechanism for every storage,
judged by the storage's clock, is also one mechanism to test.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

__all__ = [
    "OWNER_ATTR",
    "RECORD_PREFIX",
    "Heartbeat",
    "fail_stale_trials",
    "stale_trials",
    "worker_records",
]

#: trial system attribute: the id of the worker that asked the trial
OWNER_ATTR = "surrotune:worker"
#: study system attribute prefix of a worker's record
RECORD_PREFIX = "surrotune:worker:"
#: how often a stale trial's configuration is enqueued again
MAX_RETRY = 1

_log = logging.getLogger(__name__)


def worker_records(study: Study) -> dict[str, Mapping[str, Any]]:
    """Every worker that ever joined ``study``, by id: its last record."""
    attrs = study._storage.get_study_system_attrs(study._study_id)
    return {
        key.removeprefix(RECORD_PREFIX): value
        for key, value in attrs.items()
        if key.startswith(RECORD_PREFIX) and isinstance(value, Mapping)
    }


class Heartbeat:
    """One worker's record in the study, rewritten every ``interval_s`` seconds by a thread.

    The record is written once before :meth:`start` returns, so a trial asked afterwards always
    has a live owner to find. ``beat_hook`` runs on each beat (a Redis lock is extended there).
    """

    def __init__(
        self,
        study: Study,
        clock: Callable[[], float],
        *,
        interval_s: float,
        grace_s: float,
        device: str = "",
        beat_hook: Callable[[], None] = lambda: None,
    ) -> None:
        if not 0 < interval_s < grace_s:
            raise ValueError(
                f"heartbeat interval ({interval_s} s) must be positive and shorter than the "
                f"grace period ({grace_s} s)"
            )
        self.study = study
        self.clock = clock
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.worker_id = uuid.uuid4().hex[:12]
        self.record: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "device": device,
            "interval": interval_s,
            "grace": grace_s,
        }
        self._beat_hook = beat_hook
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def describe(self) -> str:
        r = self.record
        device = f" {r['device']}" if r["device"] else ""
        return f"{r['host']} pid {r['pid']}{device}"

    def _write(self, **extra: Any) -> None:
        self.study._storage.set_study_system_attr(
            self.study._study_id,
            RECORD_PREFIX + self.worker_id,
            {**self.record, "beat": self.clock(), **extra},
        )

    def start(self) -> None:
        self._write(stopped=False)
        self._thread = threading.Thread(target=self._run, name="surrotune-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._write(stopped=False)
                self._beat_hook()
            except Exception as exc:  # the storage is briefly unreachable: beat again later
                _log.warning("surrotune: heartbeat not written: %s", exc)

    def stop(self) -> None:
        """Stop beating and say so: trials this worker still holds are stale at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._write(stopped=True)


def _is_dead(record: Mapping[str, Any] | None, now: float) -> bool:
    if record is None or record.get("stopped"):
        return True
    try:
        return now - float(record["beat"]) > float(record["grace"])
    except (KeyError, TypeError, ValueError):
        return True


def stale_trials(study: Study, now: float, *, me: str | None = None) -> list[FrozenTrial]:
    """RUNNING trials of ``study`` whose worker is dead or unknown (``me``'s are never stale).

    Only meaningful under the study's shared lock: every surrotune worker marks a trial it asks
    before it lets go of the lock, so an unmarked RUNNING trial seen under the lock is an orphan.
    """
    records = worker_records(study)
    stale = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.system_attrs.get(OWNER_ATTR)
        if owner is not None and owner == me:
            continue
        if _is_dead(records.get(owner) if owner is not None else None, now):
            stale.append(trial)
    return stale


@dataclass(frozen=True)
class StaleTrial:
    """A trial this checker failed, and the retry it enqueued (None: none, retried before)."""

    number: int
    retry_enqueued: bool


def fail_stale_trials(
    study: Study, now: float, *, me: str | None = None, names: Collection[str] = ()
) -> list[StaleTrial]:
    """Mark each stale trial ``interrupted``, fail it and enqueue its configuration once more.

    ``names``: the parameters of a whole configuration; a trial whose worker died while it was
    being asked holds only some of them, and is failed without a retry (it held no
    configuration; the sampler proposes afresh). Call under the study's shared lock. A trial
    finished meanwhile by its own worker (it was slow, not dead) is left as that worker told it.
    """
    records = worker_records(study)
    storage = study._storage
    failed = []
    for trial in stale_trials(study, now, me=me):
        owner = trial.system_attrs.get(OWNER_ATTR)
        record = records.get(owner) if owner is not None else None
        who = (
            f"{record.get('host')} pid {record.get('pid')} {record.get('device') or ''}".strip()
            if record is not None
            else "unknown (no heartbeat record)"
        )
        try:
            storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
            storage.set_trial_user_attr(trial._trial_id, "stale_worker", who)
            if not storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # its worker told it after all
        whole = bool(trial.params) and set(names) <= set(trial.params)
        failed.append(StaleTrial(trial.number, whole and _enqueue_retry(study, trial)))
    return failed


def _enqueue_retry(study: Study, trial: FrozenTrial) -> bool:
    """Enqueue the stale trial's configuration again unless it was itself a retry too often."""
    history = [*trial.system_attrs.get("retry_history", []), trial.number]
    if len(history) > MAX_RETRY:
        return False
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.WAITING,
            params=dict(trial.params),
            distributions=dict(trial.distributions),
            system_attrs={
                "failed_trial": trial.system_attrs.get("failed_trial", trial.number),
                "retry_history": history,
                "fixed_params": dict(trial.params),
            },
        )
    )
    return True
