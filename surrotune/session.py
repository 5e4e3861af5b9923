"""One tuning session: experiment (or bare recording) → space, backend, study, runner.

This is the glue between the validated experiment and the library's parts, kept out of the CLI so
that it is usable (and tested) from Python. :func:`prepare` does every check that can fail before
anything is written: a bad file, a recording whose parameters differ from the experiment's, a
stored study made for another search space.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import TrialState

from surrotune.analysis.export import STUDY_ATTR, study_results
from surrotune.backends.base import Backend, DescribesDevice
from surrotune.backends.replay import Dataset, DatasetError, ReplayBackend, load_dataset
from surrotune.counters.policy import CountersPolicy
from surrotune.errors import SurrotuneError
from surrotune.experiment import (
    EvaluationSettings,
    Experiment,
    ObjectiveSpec,
    SearchSettings,
    StorageSettings,
    load_experiment,
)
from surrotune.finish import FinishSettings, finish_run, report_dir_for
from surrotune.result import Status
from surrotune.runner import Runner, RunSummary, batches_ahead, read_study
from surrotune.sampling import SpaceLike, make_sampler
from surrotune.space import RecordedSpace, SearchSpace, SpaceError
from surrotune.storage import StorageError, describe_storage, open_storage, storage_url
from surrotune.surrogate.rules import (
    FailureRule,
    learn_failure_rules,
    rules_from_attrs,
    rules_to_attrs,
)
from surrotune.template import Template
from surrotune.verdicts import demoted_trials
from surrotune.workers import Coordinator

__all__ = ["SetupError", "Tuning", "format_study", "format_summary", "load_study", "prepare"]

#: the study user attribute that holds the learned failure rules (docs/trials.md)
RULES_ATTR = "failure_rules"
#: the study user attribute that holds its budget of evaluations, which joining workers obey
BUDGET_ATTR = "budget"


class SetupError(SurrotuneError, ValueError):
    """Anything that stops a session before it starts; the CLI exits with code 2."""


@dataclass
class Tuning:
    """A prepared session: everything checked, nothing run yet."""

    experiment: Experiment
    space: SpaceLike
    backend: Backend
    study: optuna.Study
    dataset: Dataset | None
    #: the end-of-run checks (--sanitize, --remeasure); see surrotune/finish.py
    finish: FinishSettings = field(default_factory=FinishSettings)
    #: lines the checks left for the summary, filled by run()
    notes: list[str] = field(default_factory=list)
    #: this worker's device in the study's heartbeat records (docs/distributed.md)
    worker_label: str = ""
    #: a joining worker (surrotune worker) refuses a storage that offers no lock for workers
    shared: bool = False
    #: the warm start's model bundles (paths), handed on to worker processes
    warm_start: tuple[str, ...] = ()
    #: the warm start's sources and what differs about them (printed before the run)
    warm_notes: list[str] = field(default_factory=list)
    #: where the end of the run saves the study's model bundle (docs/transfer.md); None: not
    model_path: Path | None = None
    #: what became of the model bundle, for the summary
    model_note: str = ""

    def describe(self) -> str:
        exp = self.experiment
        what = f"replaying {exp.evaluation.dataset}" if self.dataset else f"tuning {exp.path}"
        size = getattr(self.space, "product_size", None)
        try:
            feasible = f"{len(self.space.enumerate()):,} feasible configurations"
        except SpaceError:
            feasible = f"{size:,} configurations in the product (too many to enumerate)"
        text = (
            f"surrotune: {what}\n"
            f"  {len(self.space.names)} parameters, {feasible}; sampler {exp.search.sampler}, "
            f"budget {exp.search.trials} evaluations"
        )
        return "\n".join([text, *(f"  {note}" for note in self.warm_notes)])

    def run(self, *, progress: bool = True) -> RunSummary:
        factory = _progress_bar if progress else None
        coordinator = None
        try:
            coordinator = self._coordinator()
            runner = Runner(
                study=coordinator.study if coordinator is not None else self.study,
                space=self.space,
                backend=self.backend,
                trials=self.experiment.search.trials,
                timeout_s=self.experiment.search.timeout_s,
                batch_size=self.experiment.search.batch_size,
                progress=factory,
                coordinator=coordinator,
                ask_ahead=batches_ahead(self.backend, self.experiment.search.batch_size),
            )
            summary = runner.run()
            if coordinator is not None:
                coordinator.close()
                coordinator = None
            if summary.new_evaluations and isinstance(self.backend, DescribesDevice):
                self.study.set_user_attr("device", self.backend.device())
            if summary.new_evaluations:
                self.study.set_user_attr(RULES_ATTR, rules_to_attrs(self.failure_rules()))
            if not summary.interrupted:
                summary = self._finish(summary, progress=progress)
            if summary.new_evaluations and self.model_path is not None:
                from surrotune.surrogate.bundle import save_study_bundle

                self.model_note = save_study_bundle(self.study, self.model_path)
            return summary
        finally:
            if coordinator is not None:
                coordinator.close()
            self.backend.close()

    def _coordinator(self) -> Coordinator | None:
        """Heartbeats and budget claims wherever the storage offers a lock, for a lone run too:
        another worker may join its study at any time, and trials that a run killed with SIGKILL
        left RUNNING are recognised by the next one and measured again."""
        settings = self.experiment.storage
        try:
            return Coordinator.start(
                self.study,
                self.space,
                settings.url,
                interval_s=settings.heartbeat_interval_s,
                grace_s=settings.grace_period_s,
                device=self.worker_label,
            )
        except StorageError as exc:
            if self.shared:
                raise SetupError(str(exc)) from None
            return None  # an RDB without a lock for workers (MySQL): one worker, as before

    def _finish(self, summary: RunSummary, *, progress: bool) -> RunSummary:
        """Sanitize the winner and measure the top again (surrotune/finish.py), then read the
        best and the counts back, since a sanitizer finding demotes a trial."""
        log = (lambda line: print(line, file=sys.stderr)) if progress else None
        self.notes = finish_run(
            self.study,
            self.backend,
            self.finish,
            report_dir=report_dir_for(self.experiment.storage.url, self.study.study_name),
            counters=CountersPolicy(
                mode=self.experiment.evaluation.counters,
                budget_share=self.experiment.evaluation.counters_budget,
            ),
            run_wall_s=summary.wall_time_s,
            log=log,
        )
        state = read_study(self.study, self.space)
        return replace(summary, best=state.best, counts=dict(state.counts))

    def failure_rules(self) -> list[FailureRule]:
        """The failure regions the study's measurements imply, as readable rules."""
        results = study_results(self.study)
        if not any(r.status.is_failure for r in results):
            return []
        frame = pd.DataFrame([dict(r.config) for r in results], columns=list(self.space.names))
        statuses = [r.status.value for r in results]
        return learn_failure_rules(frame, list(self.space.names), statuses)


def _progress_bar(total: int, initial: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=total, initial=initial, unit="eval", dynamic_ncols=True, file=sys.stderr,
        desc="surrotune",
    )  # fmt: skip


def _dataset_experiment(dataset_path: Path, overrides: Mapping[str, Any]) -> Experiment:
    """An experiment for ``surrotune run --dataset FILE``: everything comes from the file."""
    stem = dataset_path.name.removesuffix(".gz").removesuffix(".json")
    study = f"{dataset_path.parent.name}-{stem}"
    return Experiment(
        path=dataset_path,
        kernel=None,
        sizes={},
        arguments=(),
        launch=None,
        parameters={},
        constraints=(),
        objective=ObjectiveSpec(),
        reference=None,
        search=SearchSettings(),
        evaluation=EvaluationSettings(backend="replay", dataset=dataset_path),
        storage=StorageSettings(url=f"sqlite:///{Path.cwd() / 'surrotune.db'}", study=study),
    )


def _check_recorded_sizes(experiment: Experiment, dataset: Dataset) -> None:
    """A replay answers with the recording's times: at other problem sizes than the
    experiment's (``--size``, or another file's), it would report them as this size's."""
    differ = {  # a size the recording does not name (a Kernel Tuner cache's) is not checked
        name: pair
        for name, pair in dataset.size_differences(experiment.sizes).items()
        if pair[1] is not None
    }
    if differ:
        said = ", ".join(
            f"{n} = {mine} (recorded: {theirs})" for n, (mine, theirs) in differ.items()
        )
        raise SetupError(
            f"{dataset.path}: recorded at other problem sizes than the experiment's: {said}; "
            "replay the recording made at these sizes"
        )


def prepare(
    experiment_path: Path | None,
    overrides: Mapping[str, Any] | None = None,
    *,
    join: bool = False,
    warm_start: Sequence[str | Path] = (),
    save_model: str | Path | None = "auto",
) -> Tuning:
    """Load and check everything a run needs. Raises ExperimentError, SetupError or
    BundleError.

    ``join``: the study must exist already and be the same search in every respect that makes
    measurements comparable (``surrotune worker``); its stored budget replaces the file's.
    ``warm_start``: model bundles saved on other GPUs (docs/transfer.md); one learned on other
    parameters is refused, naming them. ``save_model``: where the end of the run saves this
    study's bundle (``"auto"``: beside the storage; None: nowhere; a joining worker never does).
    """
    overrides = dict(overrides or {})
    sizes = overrides.pop("sizes", None)
    if experiment_path is None:
        if sizes:
            raise SetupError("--size changes an experiment file's sizes: give the experiment file")
        dataset_path = overrides.get("dataset")
        if dataset_path is None:
            raise SetupError("no experiment file and no --dataset")
        if not Path(dataset_path).is_file():
            raise SetupError(f"--dataset: file not found: {dataset_path}")
        overrides.setdefault("backend", "replay")
        experiment = _dataset_experiment(Path(dataset_path).resolve(), overrides)
    else:
        experiment = load_experiment(experiment_path, sizes=sizes)
    experiment = experiment.with_overrides(**overrides)
    evaluation = experiment.evaluation

    dataset = None
    if evaluation.backend == "replay":
        if evaluation.dataset is None:
            raise SetupError(f"{experiment.path}: the replay backend needs a dataset (--dataset)")
        try:
            dataset = load_dataset(evaluation.dataset)
        except DatasetError as exc:
            raise SetupError(str(exc)) from None
        _check_recorded_sizes(experiment, dataset)
    space = _make_space(experiment, dataset)
    direction = dataset.direction if dataset is not None else experiment.objective.direction

    bundles, warm_notes = _warm_start(warm_start, experiment, space, dataset)
    try:
        sampler = make_sampler(
            experiment.search.sampler, space, seed=experiment.search.seed, warm_start=bundles
        )
    except (ValueError, SpaceError) as exc:
        raise SetupError(f"--sampler {experiment.search.sampler}: {exc}") from None
    backend: Backend
    if dataset is not None:
        backend = ReplayBackend(dataset)
    else:
        if importlib.util.find_spec("cupy") is None:
            raise SetupError(
                f"{experiment.path}: the cuda backend needs CuPy and an NVIDIA GPU: "
                "pip install 'surrotune[cuda]' (or replay a recording: [evaluation] "
                'backend = "replay", as in experiments/quickstart.toml)'
            )
        from surrotune.backends.cuda import CudaBackend

        backend = CudaBackend(experiment, cache_dir=_kernel_cache())
    try:
        storage = open_storage(experiment.storage.url)
    except StorageError as exc:
        raise SetupError(str(exc)) from None
    if join:
        names = optuna.study.get_all_study_names(storage)
        if experiment.storage.study not in names:
            raise SetupError(
                f"{describe_storage(experiment.storage.url)} has no study "
                f"{experiment.storage.study!r} to join (it has: {', '.join(names) or 'none'}); "
                "start it with surrotune run, or name it with --study"
            )
    study = optuna.create_study(
        storage=storage,
        study_name=experiment.storage.study,
        sampler=sampler,
        direction=direction,
        load_if_exists=True,
    )
    _check_or_record_study(study, experiment, space, direction, dataset, join=join)
    if join:
        budget = study.user_attrs.get(BUDGET_ATTR)
        if isinstance(budget, int) and budget > 0:
            experiment = experiment.with_overrides(trials=budget)
    else:
        study.set_user_attr(BUDGET_ATTR, experiment.search.trials)

    model_path = None
    if not join and save_model is not None:
        from surrotune.surrogate.bundle import default_bundle_path

        model_path = (
            default_bundle_path(experiment.storage.url, experiment.storage.study)
            if save_model == "auto"
            else Path(save_model)
        )
    return Tuning(
        experiment, space, backend, study, dataset, shared=join, warm_notes=warm_notes,
        model_path=model_path, warm_start=tuple(str(Path(p).resolve()) for p in warm_start),
    )  # fmt: skip


def _warm_start(
    paths: Sequence[str | Path], experiment: Experiment, space: SpaceLike, dataset: Dataset | None
) -> tuple[list[Any], list[str]]:
    """The warm start's bundles, checked against the space (a BundleError names what differs),
    and one line per source plus the notes on what differs but is allowed."""
    if not paths:
        return [], []
    from surrotune.surrogate.bundle import load_bundle
    from surrotune.surrogate.transfer import check_bundle, compatibility_notes

    bundles = [load_bundle(p) for p in paths]
    kernel = experiment.kernel
    sha = Template.from_file(kernel.template).sha256 if kernel is not None else None
    sizes = dict(experiment.sizes) or (dataset.problem_size if dataset is not None else None)
    objective = dataset.objective if dataset is not None else experiment.objective.metric
    device = {"name": dataset.device_name} if dataset is not None else None
    notes = []
    for bundle in bundles:
        check_bundle(bundle, space.values)
        src = bundle.source
        notes.append(
            f"warm start from {bundle.path} ({bundle.device.get('name') or 'unknown GPU'}, "
            f"{src.get('measurements', '?')} measurements)"
        )
        notes += [
            f"  {n}"
            for n in compatibility_notes(
                bundle, sizes=sizes, template_sha256=sha, objective=objective, device=device
            )
            if n.startswith("note:")
        ]
    return bundles, notes


def _kernel_cache() -> Path:
    """Compiled kernels are cached on disk, keyed by source, options, arch and compiler: a
    resumed or repeated run never compiles the same configuration twice."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "surrotune" / "kernels"


def _make_space(experiment: Experiment, dataset: Dataset | None) -> SpaceLike:
    parameters = dict(experiment.parameters)
    constraints = list(experiment.constraints)
    sizes = dict(experiment.sizes)
    if dataset is not None:
        if parameters and list(parameters) != list(dataset.parameters):
            raise SetupError(
                f"{experiment.path}: [parameters] are {', '.join(parameters)} but the recording "
                f"{dataset.path} has {', '.join(dataset.parameters)}"
            )
        if parameters:
            for name, values in parameters.items():
                extra = [v for v in values if v not in dataset.parameters[name]]
                if extra:
                    raise SetupError(
                        f"{experiment.path}: parameters.{name}: values {extra} are not in the "
                        f"recording {dataset.path}"
                    )
        else:
            parameters = {name: tuple(v) for name, v in dataset.parameters.items()}
        constraints = constraints or list(dataset.constraints)
        if not sizes and isinstance(dataset.problem_size, Mapping):
            sizes = dict(dataset.problem_size)  # the recording's constraints may name sizes
        if not constraints:
            return RecordedSpace(dataset)
    try:
        return SearchSpace(parameters, constraints, sizes)
    except SpaceError as exc:
        raise SetupError(f"{experiment.path}: {exc}") from None


def _check_or_record_study(
    study: optuna.Study,
    experiment: Experiment,
    space: SpaceLike,
    direction: str,
    dataset: Dataset | None,
    *,
    join: bool = False,
) -> None:
    """A resumed study must be the same search; a new one records what it is. A joining worker
    (``join``) must also agree on the kernel, sizes, constraints, objective and backend: its
    measurements land beside the others'."""
    described = {
        "parameters": {name: list(space.values[name]) for name in space.names},
        "constraints": list(experiment.constraints),
        "direction": direction,
        "objective": dataset.objective if dataset is not None else experiment.objective.metric,
        "backend": experiment.evaluation.backend,
        "dataset": str(experiment.evaluation.dataset) if experiment.evaluation.dataset else None,
        "experiment": str(experiment.path),
        "sizes": dict(experiment.sizes),
        "kernel": _kernel_description(experiment),
    }
    # trials first, then the attribute: a runner that started this study wrote the attribute
    # before its first trial, so a concurrent start never mistakes it for a foreign study
    has_trials = bool(study.get_trials(deepcopy=False))
    stored = study.user_attrs.get(STUDY_ATTR)
    if stored is None and join:
        raise SetupError(
            f"study {study.study_name!r} in {describe_storage(experiment.storage.url)} was not "
            "started by surrotune run; a worker joins only a surrotune study"
        )
    if stored is None:
        if has_trials:
            raise SetupError(
                f"study {study.study_name!r} in {describe_storage(experiment.storage.url)} holds "
                "trials that surrotune did not write; choose another --study name"
            )
        study.set_user_attr(STUDY_ATTR, described)
        return
    if stored.get("parameters") != described["parameters"]:
        raise SetupError(
            f"study {study.study_name!r} in {describe_storage(experiment.storage.url)} was made "
            f"for other parameters ({_short(stored.get('parameters'))}) than this run's "
            f"({_short(described['parameters'])}); choose another --study name or --storage"
        )
    if stored.get("direction") != direction:
        raise SetupError(
            f"study {study.study_name!r} optimises {stored.get('direction')}, this run {direction}"
        )
    if join:
        _check_same_search(study.study_name, experiment, stored, described)


def _check_same_search(
    name: str, experiment: Experiment, stored: Mapping[str, Any], described: Mapping[str, Any]
) -> None:
    """A joining worker's experiment must describe the study's search (file paths aside: they
    differ from host to host, the template's hash does not)."""
    for key in ("constraints", "objective", "backend", "sizes"):
        if key in stored and stored[key] != described[key]:
            raise SetupError(
                f"{experiment.path}: {key} is {described[key]!r} but study {name!r} in "
                f"{describe_storage(experiment.storage.url)} was started with {stored[key]!r}; "
                "a worker must run the study's own experiment"
            )
    kernel, mine = stored.get("kernel"), described["kernel"]
    if kernel is None or mine is None:
        return
    for key in ("name", "template_sha256", "options"):
        if kernel.get(key) != mine.get(key):
            what = "template (its SHA-256)" if key == "template_sha256" else f"kernel {key}"
            raise SetupError(
                f"{experiment.path}: the {what} differs from the one study {name!r} in "
                f"{describe_storage(experiment.storage.url)} was started with "
                f"({kernel.get(key)!r}, this file: {mine.get(key)!r}); a worker must run the "
                "study's own kernel"
            )


def _kernel_description(experiment: Experiment) -> dict[str, Any] | None:
    kernel = experiment.kernel
    if kernel is None:
        return None
    return {
        "name": kernel.name,
        "template": str(kernel.template),
        "template_sha256": Template.from_file(kernel.template).sha256,
        "options": list(kernel.options),
        "warmup": experiment.evaluation.warmup,
        "repeats": experiment.evaluation.repeats,
    }


def _short(parameters: Any) -> str:
    if not isinstance(parameters, dict):
        return repr(parameters)
    return ", ".join(f"{k}={v}" for k, v in parameters.items())[:300]


# --------------------------------------------------------------------------- printing


def _config_text(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def format_summary(tuning: Tuning, summary: RunSummary) -> str:
    exp = tuning.experiment
    lines = []
    reasons = {
        "budget": "the budget of evaluations is spent",
        "timeout": "the time limit was reached",
        "exhausted": "every feasible configuration has been evaluated",
        "stalled": "the sampler kept proposing configurations already tried or infeasible",
        "interrupted": "interrupted; run the same command again to continue",
    }
    lines.append(f"\nStopped: {reasons.get(summary.stop_reason, summary.stop_reason)}.")
    best = summary.best
    if best is not None:
        unit = _objective_unit(tuning, summary.direction)
        lines.append(f"Best configuration (trial {best.number}): {_config_text(best.params)}")
        extra = ""
        time_ms = best.user_attrs.get("time_ms")
        if tuning.dataset is None and time_ms:
            rates = exp.objective.rates(time_ms, {**exp.sizes, **best.params})
            extra = "".join(f", {v:,.1f} {k}" for k, v in rates.items())
        lines.append(f"  objective: {best.value:.6g} {unit}{extra}")
    else:
        lines.append("No configuration ran successfully.")
    lines.extend(tuning.notes)
    counts = summary.counts
    counted = [s for s in Status if s.counts_as_evaluation and counts.get(s)]
    parts = ", ".join(f"{s.value} {counts[s]}" for s in counted)
    lines.append(
        f"Evaluations: {summary.evaluations} ({summary.new_evaluations} in this run): {parts}"
    )
    if counts.get(Status.CONSTRAINT):
        lines.append(
            f"  {counts[Status.CONSTRAINT]} proposals broke a known constraint "
            "(recorded, never compiled, not counted)"
        )
    if summary.duplicates:
        lines.append(
            f"  {summary.duplicates} proposals repeated a measured configuration "
            "(answered from the study, not counted)"
        )
    if tuning.dataset is not None and best is not None:
        optimum = _recorded_optimum(tuning.dataset)
        if optimum is not None and best.value:
            ratio = (
                optimum / best.value if summary.direction == "minimize" else best.value / optimum
            )
            lines.append(
                f"  the recording's optimum is {optimum:.6g}: "
                f"this run reached {100 * ratio:.1f} % of it"
            )
    rules = rules_from_attrs(tuning.study.user_attrs.get(RULES_ATTR) or [])
    if rules:
        lines.append("Failure rules learned from the trials (support/matched):")
        lines.extend(f"  {rule}" for rule in rules[:5])
    transfer = getattr(tuning.study.sampler, "last_transfer", None)
    if transfer is not None:
        weights = ", ".join(f"{k} {v:.2f}" for k, v in transfer.weights.items())
        lines.append(f"Warm start: final weights {weights} (this GPU's own model: 'target')")
    summary_of_design = getattr(tuning.study.sampler, "warm_design_summary", None)
    if callable(summary_of_design):
        lines.extend(f"  {line}" for line in summary_of_design())
    if tuning.model_note:
        lines.append(tuning.model_note)
    if summary.simulated_time_ms is not None:
        lines.append(
            f"Simulated tuning time (recorded compile + benchmark): "
            f"{summary.simulated_time_ms / 1000:.1f} s"
        )
    where = describe_storage(exp.storage.url)
    lines.append(f"Trials stored in {where} (study '{summary.study_name}').")
    lines.append(f"  surrotune show {where} --study {summary.study_name}")
    return "\n".join(lines)


def _objective_unit(tuning: Tuning, direction: str) -> str:
    """What the objective's value is measured in: a replayed recording says it (Kernel Tuner's
    ``time`` is ms, a maximised ``GFLOP/s`` is itself), a live experiment by its metric."""
    if tuning.dataset is not None:
        name = tuning.dataset.objective
        return "ms" if name == "time" else name
    metric = tuning.experiment.objective.metric
    return "ms" if metric == "time" and direction == "minimize" else metric


def _recorded_optimum(dataset: Dataset) -> float | None:
    try:
        return dataset.optimum.objective
    except DatasetError:
        return None


def load_study(storage: str, study_name: str | None) -> optuna.Study:
    url = storage_url(storage)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        raise SetupError(f"{storage}: no such database file")
    try:
        opened = open_storage(storage)
    except StorageError as exc:
        raise SetupError(str(exc)) from None
    names = [s.study_name for s in optuna.get_all_study_summaries(opened)]
    if study_name is None:
        if len(names) != 1:
            raise SetupError(
                f"{storage} holds {len(names)} studies; choose one with --study: "
                + ", ".join(names)
            )
        study_name = names[0]
    if study_name not in names:
        raise SetupError(f"{storage} has no study {study_name!r}; it has: {', '.join(names)}")
    return optuna.load_study(study_name=study_name, storage=opened)


def format_study(storage: str, study_name: str | None, *, top: int = 10) -> str:
    """The best configurations of a stored study, as a table, plus the counts by status."""
    study = load_study(storage, study_name)
    trials = study.get_trials(deepcopy=False)
    demoted = demoted_trials(study)  # a sanitizer finding: COMPLETE, but no longer ok
    done = [
        t for t in trials
        if t.state == TrialState.COMPLETE and "duplicate_of" not in t.user_attrs
        and t.number not in demoted
    ]  # fmt: skip
    reverse = study.direction == optuna.study.StudyDirection.MAXIMIZE
    done.sort(key=lambda t: t.value if t.value is not None else float("nan"), reverse=reverse)
    counts: dict[str, int] = {}
    for t in trials:
        status = demoted[t.number].value if t.number in demoted else t.user_attrs.get("status")
        if status and "duplicate_of" not in t.user_attrs:
            counts[status] = counts.get(status, 0) + 1
    rows = []
    for rank, t in enumerate(done[:top], start=1):
        times = t.user_attrs.get("times_ms") or []
        spread = (
            f"{100 * statistics.pstdev(times) / statistics.median(times):.1f}"
            if len(times) > 1 else "-"
        )  # fmt: skip
        row = {"rank": rank, "trial": t.number, "value": t.value, **t.params, "sd%": spread}
        if "registers" in t.user_attrs:
            row["regs"] = t.user_attrs["registers"]
        rows.append(row)
    header = (
        f"study '{study.study_name}' in {describe_storage(storage)}: {len(trials)} trials, "
        f"direction {study.direction.name.lower()}\n"
        "by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )
    if not rows:
        return header + "\nno successful configuration yet"
    table = pd.DataFrame(rows).fillna("-").to_string(index=False)
    return f"{header}\n\n{table}"
