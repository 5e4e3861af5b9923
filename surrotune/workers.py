"""Several workers on one study: one per GPU (``--gpus``), per replay process (``--workers``), or
joined from another host (``surrotune worker``).

Every worker runs its own :class:`~surrotune.runner.Runner`; the study in the storage is the only
thing they share. What keeps their total exact and free of repeats is one rule: a worker asks
trials only while it holds the study's lock (:func:`surrotune.storage.coordination_for`), and under
that lock it

1. fails the trials of dead workers and enqueues their configurations once more
   (:mod:`surrotune.heartbeat`);
2. reads the study afresh: evaluations stored, trials in flight (RUNNING with a configuration,
   whoever holds them);
3. asks at most ``budget - evaluations - in flight`` trials, marking each as its own; a proposal
   that repeats a configuration another worker has in flight (or enqueued) is recorded as
   ``duplicate_of`` that trial and never measured (surrotune's samplers never make one; Optuna's
   random, TPE and GP samplers can).

Each trial in flight becomes exactly one evaluation or frees its place (a ``constraint``
proposal, a repeat answered from the study, an interrupted or stale trial, whose retry then takes
the place), so the study never holds more than the budget, and workers go on until it holds
exactly that many. A worker whose share is all in flight elsewhere waits and keeps checking
heartbeats, so a survivor retries what a dead worker left.
"""

from __future__ import annotations

import collections
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import Trial, TrialState

from surrotune.errors import SurrotuneError
from surrotune.heartbeat import OWNER_ATTR, Heartbeat, fail_stale_trials, worker_records
from surrotune.runner import Claim, StudyState, read_study
from surrotune.sampling import SpaceLike, distributions, held_params
from surrotune.storage import Coordination, coordination_for

if TYPE_CHECKING:
    from surrotune.session import Tuning

__all__ = [
    "ClaimingStudy",
    "Coordinator",
    "WorkerError",
    "gpu_devices",
    "run_workers",
    "shared_storage_url",
]


class WorkerError(SurrotuneError, ValueError):
    """Bad ``--gpus``/``--workers`` input, or a storage several workers cannot share."""


class ClaimingStudy(optuna.Study):
    """The study as one worker's runner sees it: ``ask`` hands out the trials that
    :meth:`Coordinator.claim` asked under the shared lock, and nothing else."""

    def __init__(self, study: optuna.Study) -> None:
        super().__init__(
            study_name=study.study_name,
            storage=study._storage,
            sampler=study.sampler,
            pruner=study.pruner,
        )
        self.claimed: collections.deque[Trial] = collections.deque()

    def ask(self, fixed_distributions: dict[str, Any] | None = None) -> Trial:
        if self.claimed:
            return self.claimed.popleft()
        raise optuna.exceptions.OptunaError("this worker's claimed trials are all handed out")

    def ask_now(self, fixed_distributions: dict[str, Any]) -> Trial:
        """Optuna's own ask; only the coordinator calls it, holding the lock."""
        return super().ask(fixed_distributions)


@dataclass
class Coordinator:
    """One worker's share of a study: heartbeat, stale trials, claims (see the module text)."""

    study: ClaimingStudy
    space: SpaceLike
    coordination: Coordination
    heartbeat: Heartbeat
    poll_s: float
    _stale_checked: float = -math.inf  # time.monotonic() of the last look for stale trials

    @classmethod
    def start(
        cls,
        study: optuna.Study,
        space: SpaceLike,
        storage_text: str,
        *,
        interval_s: float,
        grace_s: float,
        device: str = "",
    ) -> Coordinator:
        """Join ``study``: write this worker's first heartbeat and start beating."""
        coordination = coordination_for(
            storage_text, study._storage, study.study_name, lock_timeout_s=grace_s
        )
        heartbeat = Heartbeat(
            study,
            coordination.now,
            interval_s=interval_s,
            grace_s=grace_s,
            device=device,
            beat_hook=coordination.keep_alive,
        )
        heartbeat.start()
        return cls(ClaimingStudy(study), space, coordination, heartbeat, min(1.0, interval_s))

    @property
    def worker_id(self) -> str:
        return self.heartbeat.worker_id

    def claim(self, state: StudyState, want: int, budget: int) -> Claim:
        """Bring ``state`` up to date with the study and claim at most ``want`` trials of what the
        budget leaves; waits a moment (outside the lock) when there is nothing to claim yet."""
        names = set(self.space.names)
        me = self.worker_id
        with self.coordination.lock():
            # a worker is declared dead after a grace period of several heartbeats: looking
            # once a heartbeat is soon enough, and spares the storage a query per batch
            if time.monotonic() - self._stale_checked >= self.heartbeat.interval_s:
                self._stale_checked = time.monotonic()
                fail_stale_trials(self.study, self.coordination.now(), me=me, names=names)
            pending: dict[str, int] = {}  # configuration → a trial holding it, not ours
            waiting: set[int] = set()
            in_flight = others_in_flight = 0
            for t in self.study.get_trials(deepcopy=False):
                params = held_params(t)
                if set(params) != names:
                    continue
                if t.state == TrialState.RUNNING:
                    in_flight += 1
                    if t.system_attrs.get(OWNER_ATTR) != me:
                        others_in_flight += 1
                        pending.setdefault(self.space.key(params), t.number)
                elif t.state == TrialState.WAITING:
                    waiting.add(t.number)
                    pending.setdefault(self.space.key(params), t.number)
            fresh = read_study(self.study, self.space)
            take = min(want, budget - fresh.evaluations - in_flight)
            claimed = dropped = 0
            sampler_empty = False
            while claimed < take and dropped <= 2 * take + 4:  # a few repeats, not forever
                try:
                    trial = self.study.ask_now(distributions(self.space))
                except optuna.exceptions.OptunaError:
                    sampler_empty = True  # the sampler has nothing left (brute force, surrogate)
                    break
                waiting.discard(trial.number)
                self.study._storage.set_trial_system_attr(trial._trial_id, OWNER_ATTR, me)
                key = self.space.key(trial.params)
                other = pending.get(key)
                if other is not None and other != trial.number:
                    trial.set_user_attr("config_key", key)
                    trial.set_user_attr("duplicate_of", other)
                    self.study.tell(trial, state=TrialState.FAIL)
                    dropped += 1
                    continue
                self.study.claimed.append(trial)
                claimed += 1
            others = max(0, fresh.evaluations - state.evaluations)
            for name in ("evaluated", "counts", "evaluations", "duplicates", "measured", "best"):
                setattr(state, name, getattr(fresh, name))
        exhausted = sampler_empty and not claimed and not waiting and not others_in_flight
        if not claimed and not exhausted and fresh.evaluations < budget:
            time.sleep(self.poll_s)  # let the trials in flight elsewhere finish
        return Claim(trials=claimed, others=others, exhausted=exhausted)

    def close(self) -> None:
        """Give back claimed trials the runner never asked, stop beating, free the lock."""
        try:
            while self.study.claimed:
                trial = self.study.claimed.popleft()
                trial.set_user_attr("interrupted", True)
                self.study.tell(trial, state=TrialState.FAIL)
            self.heartbeat.stop()
        finally:
            self.coordination.close()


# --------------------------------------------------------------------------- several processes


def shared_storage_url(url: str, default_url: str, workers: int) -> str:
    """The storage several workers on this host use: the default SQLite file becomes a journal
    file beside it (several processes writing one SQLite file wait on its single write lock, and
    on a network file system they can corrupt it); SQLite chosen on purpose is refused."""
    if workers <= 1 or not url.startswith("sqlite:///"):
        return url
    path = Path(url.removeprefix("sqlite:///"))
    if url == default_url:
        return f"journal:///{path.with_suffix('.log')}"
    raise WorkerError(
        f"--storage {path}: {workers} workers cannot share a SQLite file safely; use a journal "
        f"file on one host (--storage {path.with_suffix('.log')}) or PostgreSQL or Redis "
        "(--storage postgresql://... or redis://...) across hosts"
    )


def _visible_devices() -> list[str] | None:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES's entries where it is set, else one
    per ``nvidia-smi -L`` line; None when neither says."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        # CUDA stops at the first invalid entry ("-1", "NoDevFiles"): none after it are visible
        valid = []
        for entry in entries:
            if entry.startswith("-") or entry == "NoDevFiles":
                break
            valid.append(entry)
        return valid
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        listed = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [str(i) for i, _ in enumerate(re.findall(r"^GPU \d+:", listed.stdout, re.M))]


def gpu_devices(spec: str) -> list[str]:
    """``--gpus all`` or ``--gpus 0,2``: the CUDA_VISIBLE_DEVICES value of each worker.

    Indices count the GPUs this process sees (those CUDA_VISIBLE_DEVICES names, when it is set),
    so ``CUDA_VISIBLE_DEVICES=4,5 surrotune run --gpus 1`` runs one worker on GPU 5.
    """
    visible = _visible_devices()
    if spec.strip() == "all":
        if not visible:
            raise WorkerError(
                "--gpus all: no GPU found (nvidia-smi -L lists none"
                + (", CUDA_VISIBLE_DEVICES is empty" if visible is not None else "")
                + "); name them: --gpus 0,1"
            )
        return visible
    try:
        indices = [int(part) for part in spec.split(",")]
    except ValueError:
        raise WorkerError(f"--gpus {spec!r}: expected 'all' or GPU indices like 0,1") from None
    if any(i < 0 for i in indices) or len(set(indices)) != len(indices):
        raise WorkerError(f"--gpus {spec!r}: expected distinct GPU indices from 0 up")
    if visible is None:
        return [str(i) for i in indices]
    beyond = [i for i in indices if i >= len(visible)]
    if beyond:
        raise WorkerError(
            f"--gpus {spec}: this machine has {len(visible)} GPU(s) (indices 0 to "
            f"{len(visible) - 1}); no GPU {', '.join(map(str, beyond))}"
        )
    return [visible[i] for i in indices]


@dataclass
class _Child:
    label: str
    process: subprocess.Popen[str]
    log: Path


def run_workers(
    tuning: Tuning,
    worker_args: Sequence[str],
    devices: Sequence[str | None],
    *,
    seed: int | None,
    progress: bool,
    log_dir: Path,
) -> tuple[list[tuple[str, int, str]], bool]:
    """Run one ``surrotune worker`` process per entry of ``devices`` (a CUDA_VISIBLE_DEVICES value,
    or None for a replay worker) on ``tuning``'s study, showing the study's progress, until all
    have stopped. Returns each worker's (label, exit code, last lines of its output) and whether a
    Ctrl-C interrupted them.

    Worker ``i`` gets the seed ``seed + i + 1`` (the same seed in every worker would make
    Optuna's samplers propose the same sequence in each).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    children: list[_Child] = []
    for i, device in enumerate(devices):
        env = dict(os.environ)
        label = f"worker {i}"
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
            label = f"GPU {device}"
        command = [sys.executable, "-m", "surrotune", "worker", *worker_args, "--no-progress"]
        command += ["--device-label", label]
        if seed is not None:
            command += ["--seed", str(seed + i + 1)]
        log = log_dir / f"{tuning.study.study_name}.worker{i}.log"
        with log.open("w") as out:
            # a session of its own: a Ctrl-C reaches each worker once, forwarded below
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, text=True, env=env,
                start_new_session=True,
            )  # fmt: skip
        children.append(_Child(label, process, log))

    interrupted = False
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal interrupted
        interrupted = True
        for child in children:  # the first stops each after its batch, a second at once
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGINT)

    signal.signal(signal.SIGINT, on_sigint)
    bar = None
    try:
        if progress:
            from surrotune.session import _progress_bar

            bar = _progress_bar(tuning.experiment.search.trials, 0)
        while any(c.process.poll() is None for c in children):
            if bar is not None:
                state = read_study(tuning.study, tuning.space)
                bar.n = min(state.evaluations, bar.total)
                bar.refresh()
            time.sleep(0.5)
    finally:
        signal.signal(signal.SIGINT, previous)
        if bar is not None:
            state = read_study(tuning.study, tuning.space)
            bar.n = min(state.evaluations, bar.total)
            bar.close()
    results = []
    for child in children:
        lines = child.log.read_text(errors="replace").splitlines()
        results.append((child.label, child.process.returncode, "\n".join(lines[-15:])))
    return results, interrupted


def evaluations_by_worker(study: optuna.Study, space: SpaceLike) -> list[tuple[str, int]]:
    """How many of the study's evaluations each worker measured, by its record's description."""
    from surrotune.runner import is_measurement

    records = worker_records(study)
    counts: collections.Counter[str] = collections.Counter()
    for t in study.get_trials(deepcopy=False):
        if not is_measurement(t):
            continue
        record = records.get(t.system_attrs.get(OWNER_ATTR, ""))
        if record is None:
            counts["(no worker record)"] += 1
            continue
        device = f"{record.get('device')}, " if record.get("device") else ""
        counts[f"{device}{record.get('host')} pid {record.get('pid')}"] += 1
    return sorted(counts.items())


def _worker_arguments(tuning: Tuning) -> list[str]:
    """The ``surrotune worker`` arguments that reproduce this session's search in a child."""
    exp = tuning.experiment
    args: list[str] = []
    if exp.path.suffix == ".toml":  # else a bare recording (surrotune run --dataset)
        args.append(str(exp.path))
        for name, value in exp.sizes.items():  # as given to run --size, or the file's own
            args += ["--size", f"{name}={value}"]
    if exp.evaluation.dataset is not None:
        args += ["--dataset", str(exp.evaluation.dataset)]
    args += ["--storage", exp.storage.url, "--study", exp.storage.study]
    args += ["--backend", exp.evaluation.backend, "--sampler", exp.search.sampler]
    args += ["--batch-size", str(exp.search.batch_size)]
    for bundle in tuning.warm_start:
        args += ["--warm-start", str(bundle)]
    if exp.search.timeout_s is not None:
        args += ["--timeout", f"{exp.search.timeout_s}s"]
    return args


def launch(
    tuning: Tuning,
    devices: Sequence[str | None],
    *,
    progress: bool,
) -> int:
    """Run one worker process per device on the prepared ``tuning``'s study, then print the
    study's summary and each worker's share. Returns the exit code for the command line."""
    from surrotune.runner import RunSummary
    from surrotune.session import format_summary

    tuning.backend.close()  # the workers measure; this process only watches
    start = time.monotonic()
    initial = read_study(tuning.study, tuning.space).evaluations
    exp = tuning.experiment
    log_dir = _log_dir(exp.storage.url)
    print(
        f"  {len(devices)} workers on study '{exp.storage.study}' "
        f"(their output: {log_dir}/{exp.storage.study}.worker*.log)"
    )
    results, interrupted = run_workers(
        tuning,
        _worker_arguments(tuning),
        devices,
        seed=exp.search.seed,
        progress=progress,
        log_dir=log_dir,
    )
    state = read_study(tuning.study, tuning.space)
    reason = "the workers stopped before the budget was spent (see their logs)"
    if state.evaluations >= exp.search.trials:
        reason = "budget"
    elif interrupted:
        reason = "interrupted"
    summary = RunSummary.of(
        tuning.study, state, initial=initial, interrupted=interrupted, stop_reason=reason,
        wall_time_s=time.monotonic() - start,
    )  # fmt: skip
    if state.evaluations > initial and tuning.model_path is not None:
        from surrotune.surrogate.bundle import save_study_bundle

        tuning.model_note = save_study_bundle(tuning.study, tuning.model_path)
    print(format_summary(tuning, summary))
    print("Evaluations by worker:")
    for who, count in evaluations_by_worker(tuning.study, tuning.space):
        print(f"  {who}: {count}")
    failed = [(label, code, tail) for label, code, tail in results if code not in (0, 130)]
    for label, code, tail in failed:
        print(f"surrotune: {label} exited with code {code}:\n{tail}", file=sys.stderr)
    if interrupted:
        return 130
    if failed:
        return 2 if all(code == 2 for _, code, _ in failed) else 1
    return 0


def _log_dir(url: str) -> Path:
    """Worker logs go beside a file storage, else into the working directory."""
    from surrotune.storage import storage_url

    full = storage_url(url)
    for scheme in ("sqlite:///", "journal:///"):
        if full.startswith(scheme):
            path = Path(full.removeprefix(scheme))
            return path.parent / f"{path.stem}-workers"
    return Path.cwd() / "surrotune-workers"
