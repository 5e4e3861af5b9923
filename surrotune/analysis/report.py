"""``surrotune analyze``: a report on one study or several, from the storage alone.

The report is written twice from one document: ``report.md`` beside its PNG figures, and
``report.html``, a single self-contained file (figures embedded as base64, no script, no
external style sheet) to mail or attach to a ticket. Sections, per study:

1. overview: what was tuned, on which device, how many trials of each kind, the winner;
2. convergence: best so far against evaluations and against time, failures marked;
3. failures: counts by status with the most frequent message, the share of each status by
   parameter value, and the learned failure rules with their support and precision
   (:mod:`surrotune.analysis.rules`);
4. what matters: parameter importance by fANOVA and by the surrogate, and partial dependence
   (:mod:`surrotune.analysis.importance`);
5. the top configurations: objective, spread of the repeats, resources, occupancy, counters;
6. measurement noise: the spread of the repeats and whether the top ranking is beyond it
   (:mod:`surrotune.analysis.noise`);

and with several studies a comparison (:mod:`surrotune.analysis.compare`): the summaries, the
statuses and the importances side by side, each winner on the other studies, and how far their
rankings agree. Nothing needs a GPU, the kernel template or the experiment file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from surrotune.analysis.document import Document
from surrotune.analysis.trials import AnalysisError, StudyTrials

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Report", "write_report"]

#: resource and occupancy columns shown in the table of top configurations, when present
_RESOURCES = (
    "registers",
    "shared_bytes",
    "local_bytes",
    "threads_per_block",
    "occupancy",
    "active_blocks_per_sm",
    "occupancy_limiter",
)
#: the most counters listed for the top configurations
_MAX_COUNTERS = 30
#: numbers in an error message (sizes, addresses, line numbers)
_NUMBER = re.compile(r"0x[0-9a-fA-F]+|\d+")


@dataclass
class Report:
    """What :func:`write_report` wrote."""

    directory: Path
    markdown: Path
    html: Path
    figures: list[Path]
    lines: list[str] = field(default_factory=list)  # one summary line per study


# --------------------------------------------------------------------------- sections


class _Writer:
    """Builds the document and writes each figure once, under a name made from the study's."""

    def __init__(self, directory: Path, *, top: int, seed: int) -> None:
        self.directory = directory
        self.top = top
        self.seed = seed
        self.doc = Document()
        self.figures: list[Path] = []
        self.importances: dict[str, pd.DataFrame] = {}  # by study, for the comparison

    def save(self, figure: Figure | None, name: str, caption: str) -> None:
        if figure is None:
            return
        path = self.directory / f"{name}.png"
        figure.savefig(path, dpi=100)
        self.figures.append(path)
        self.doc.figure(path, caption)

    def study(self, study: StudyTrials, slug: str) -> None:
        from surrotune.analysis import plots

        doc = self.doc
        doc.heading(2, f"Study '{study.name}'")
        doc.text(_overview(study))
        doc.heading(3, "Convergence")
        doc.text(_convergence_text(study))
        self.save(
            plots.convergence_figure(study),
            f"{slug}_convergence",
            f"{study.name}: best so far against evaluations and against time; ticks at the "
            "bottom mark the failed evaluations in their status's colour",
        )
        self.failures(study, slug)
        self.importance(study, slug)
        self.top_configurations(study, slug)
        self.noise(study, slug)

    def failures(self, study: StudyTrials, slug: str) -> None:
        from surrotune.analysis import plots
        from surrotune.analysis.rules import covered, learn_rules

        doc = self.doc
        doc.heading(3, "Failures")
        measured = study.measured
        doc.table(_status_table(study), "Measurements by status")
        self.save(
            plots.failures_figure(study),
            f"{slug}_failures",
            f"{study.name}: measurements by status, and the share of each status for each "
            "value of each parameter",
        )
        failing = measured[measured["status"] != "ok"]
        if failing.empty:
            doc.text("No measurement failed.")
            return
        doc.table(_failure_rates(study), "Failed measurements / measurements, by value")
        configs = study.configs().reset_index(drop=True)
        statuses = measured["status"].astype(str).tolist()
        rules = learn_rules(configs, list(study.parameters), statuses)
        if not rules:
            doc.text(
                "No failure rule: no region of the parameters holds at least 5 failures of one "
                "status at 90 % precision."
            )
            return
        hit = covered(rules, configs) & (np.asarray(statuses) != "ok")
        doc.text(
            f"Failure rules learned from the {len(measured)} measurements by sequential "
            "covering (decision trees over the parameters and their pairwise products): "
            f"together they cover {int(hit.sum())} of the {len(failing)} failures. Support is "
            "the number of matched trials with the rule's status, precision the share of "
            "the matched trials that have it."
        )
        doc.table(
            pd.DataFrame(
                {
                    "rule": [" and ".join(r.conditions) or "always" for r in rules],
                    "status": [r.status for r in rules],
                    "support": [r.support for r in rules],
                    "matched": [r.matched for r in rules],
                    "precision": [f"{100 * r.precision:.0f} %" for r in rules],
                }
            ),
            "Learned failure rules (rule → status (support/matched))",
        )

    def importance(self, study: StudyTrials, slug: str) -> None:
        from surrotune.analysis import plots
        from surrotune.analysis.importance import parameter_importance, partial_dependences

        doc = self.doc
        doc.heading(3, "What matters")
        importance = parameter_importance(study, seed=self.seed)
        self.importances[study.name] = importance.table
        if importance.model is None:
            doc.text(importance.note)
            return
        r2 = "n/a" if importance.r2 is None else f"{importance.r2:.2f}"
        doc.text(
            f"Importance of each parameter to the objective over the {importance.trials} ok "
            "measurements, by Optuna's fANOVA evaluator and by the surrogate (an XGBoost "
            "regressor on the sampler's features, permutation importance on held-out folds; "
            f"its cross-validated R² on log(objective) is {r2}, "
            + ("so trust it)." if (importance.r2 or 0) >= 0.5 else "so take it with care).")
        )
        doc.table(
            importance.table.round(3).rename(
                columns={"fanova": "fANOVA", "surrogate_sd": "surrogate ±"}
            )
        )
        self.save(
            plots.importance_figure(study, importance),
            f"{slug}_importance",
            f"{study.name}: parameter importance (shares summing to 1 per method)",
        )
        dependences = partial_dependences(study, importance)
        if dependences:
            doc.text(
                "Partial dependence: the surrogate's prediction averaged over the measured "
                "configurations with one parameter (or the top pair) set to each value; the "
                "squares are the measured medians at that value."
            )
            self.save(
                plots.dependence_figure(study, dependences),
                f"{slug}_dependence",
                f"{study.name}: partial dependence of the objective on the top parameters",
            )

    def top_configurations(self, study: StudyTrials, slug: str) -> None:
        from surrotune.analysis import plots

        doc = self.doc
        doc.heading(3, "Top configurations")
        ranked = study.ranked.head(self.top)
        if ranked.empty:
            doc.text("No configuration ran successfully.")
            return
        doc.table(_top_table(study, ranked), f"The best {len(ranked)} configurations")
        counters = [c for c in study.counters() if ranked[c].notna().any()]
        if counters:
            table = ranked[["number", *counters[:_MAX_COUNTERS]]].set_index("number").T
            table.columns = [f"trial {n}" for n in table.columns]
            doc.table(
                table.rename_axis("counter").reset_index(),
                "Hardware counters of the top configurations (Nsight Compute)",
            )
        self.save(
            plots.resources_figure(study),
            f"{slug}_resources",
            f"{study.name}: objective against registers, shared memory and occupancy",
        )

    def noise(self, study: StudyTrials, slug: str) -> None:
        from surrotune.analysis import plots
        from surrotune.analysis.noise import measurement_noise

        doc = self.doc
        doc.heading(3, "Measurement noise")
        noise = measurement_noise(study, top=self.top)
        doc.text(noise.text)
        if noise.remeasure:
            verdict = noise.remeasure.get("verdict")
            count = len(noise.remeasure.get("trials") or [])
            doc.text(
                f"After the search, the run measured its top {count} "
                f"configurations again ({noise.remeasure.get('rounds')} interleaved rounds, "
                f"{noise.remeasure.get('source', 'measured')}); verdict on the winner: "
                f"{verdict or 'none (it failed again)'}."
            )
        if not noise.top.empty:
            columns = [
                c for c in ("rank", "number", "value", "vs_best_pct", "median_ms", "ci_low_ms",
                            "ci_high_ms", "cv_pct", "repeats", "p_vs_best", "p_vs_previous",
                            "remeasured_ms") if c in noise.top and noise.top[c].notna().any()
            ]  # fmt: skip
            shown = noise.top[columns].copy()
            for column in ("vs_best_pct", "cv_pct"):
                if column in shown:
                    shown[column] = shown[column].round(3)
            for column in ("p_vs_best", "p_vs_previous"):
                if column in shown:
                    shown[column] = shown[column].map(lambda p: float(f"{p:.2g}"))
            doc.table(
                shown.rename(
                    columns={
                        "number": "trial",
                        "vs_best_pct": "vs best %",
                        "median_ms": "median ms",
                        "ci_low_ms": "median 95 % CI low",
                        "ci_high_ms": "CI high",
                        "cv_pct": "CV %",
                        "p_vs_best": "p vs best",
                        "p_vs_previous": "p vs previous",
                        "remeasured_ms": "re-measured median",
                    }
                ),
                "The top configurations against the noise of their repeats",
            )
        if noise.has_repeats:
            self.save(
                plots.noise_figure(study, noise),
                f"{slug}_noise",
                f"{study.name}: repeats of the top configurations, and the spread of every "
                "ok configuration's repeats",
            )

    def comparison(self, studies: Sequence[StudyTrials]) -> None:
        from surrotune.analysis import plots
        from surrotune.analysis.compare import compare_studies

        doc = self.doc
        comparison = compare_studies(studies)
        doc.heading(2, "Studies side by side")
        doc.table(comparison.summary, "Summary")
        doc.table(comparison.statuses, "Measurements by status")
        importances = [
            t.set_index("parameter")[["fanova", "surrogate"]].add_prefix(f"{name} ")
            for name, t in self.importances.items()
            if not t.empty
        ]
        if importances:
            doc.table(pd.concat(importances, axis=1).reset_index(), "Parameter importance")
        best = [
            {"study": s.name, "rank": rank, "trial": int(row["number"]), "value": row["value"],
             "configuration": s.config_text(row)}
            for s in studies
            for rank, (_, row) in enumerate(s.ranked.head(3).iterrows(), start=1)
        ]  # fmt: skip
        doc.table(pd.DataFrame(best), "The best three of each study")
        doc.text(comparison.note)
        if not comparison.aligned:
            return
        doc.text(
            "How the winner of each study does on the others: measured there when the other "
            "study ran it, else predicted by the other study's surrogate (marked). The fraction "
            "of best is 1.0 when it is the other study's winner too."
        )
        doc.table(comparison.cross.drop(columns="predicted"), "Each winner on the other studies")
        doc.table(
            comparison.agreement,
            "Agreement of the rankings on the configurations both studies measured",
        )
        self.save(
            plots.comparison_figure(studies),
            "comparison",
            "Best so far of each study, and the objective of the configurations measured by "
            "the first study and each other one",
        )


def _overview(study: StudyTrials) -> str:
    frame = study.frame
    counts = study.status_counts()
    dataset = study.described.get("dataset")
    what = f"Kernel `{study.kernel}`" if study.kernel else "A kernel"
    if study.backend == "replay" and dataset:
        what += f" replayed from the recording `{Path(str(dataset)).name}`, measured"
    fixed = [f"{n}={v[0]}" for n, v in study.parameters.items() if len(v) == 1]
    parts = [
        f"{what} on {study.device_name}"
        + (f" ({study.backend} backend)" if study.backend and study.backend != "replay" else "")
        + f"; storage {study.storage or 'unknown'}. Objective: {study.objective}"
        + (f" ({study.unit})" if study.unit != study.objective else "")
        + f", {study.direction}d. Tuned: "
        + ", ".join(f"{n} ({len(study.parameters[n])} values)" for n in study.tuned)
        + (f"; fixed: {', '.join(fixed)}" if fixed else "")
        + ".",
        f"{len(frame)} trials: {len(study.measured)} measurements ("
        + ", ".join(f"{s} {n}" for s, n in counts.items())
        + ")",
    ]
    extra = {
        "proposals broke a known constraint": int((frame["status"] == "constraint").sum()),
        "repeated a measured configuration": int(frame["duplicate_of"].notna().sum()),
        "were interrupted": int(frame["interrupted"].fillna(False).astype(bool).sum()),
    }
    parts[-1] += "".join(f"; {n} {what}" for what, n in extra.items() if n) + "."
    demoted = frame[frame["demoted"] != ""]
    if len(demoted):
        parts.append(
            f"compute-sanitizer demoted {len(demoted)} trial(s) ("
            + ", ".join(
                f"{n} → {s}" for n, s in zip(demoted["number"], demoted["demoted"], strict=True)
            )
            + "): they are not ranked."
        )
    best = study.best
    if best is None:
        parts.append("**No configuration ran successfully.**")
    else:
        parts.append(
            f"**Best: {best['value']:.6g} {study.unit}** (trial {int(best['number'])}): "
            f"`{study.config_text(best)}`."
        )
    return " ".join(parts)


def _fraction(study: StudyTrials, values: np.ndarray, best: float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return values / best if study.maximize else best / values


def _convergence_text(study: StudyTrials) -> str:
    from surrotune.analysis.plots import progress_axis

    measured = study.measured
    best = study.best
    if best is None:
        return f"{len(measured)} evaluations, none ok."
    values = np.where(measured["status"] == "ok", measured["value"].astype(float), np.nan)
    series = pd.Series(values)
    so_far = (series.cummax() if study.maximize else series.cummin()).to_numpy()
    fraction = np.nan_to_num(_fraction(study, so_far, float(best["value"])), nan=0.0)
    seconds, label = progress_axis(study)
    reached = []
    for target in (0.9, 0.95, 0.98, 1.0):
        index = int(np.argmax(fraction >= target - 1e-12))
        reached.append(f"{100 * target:.0f} % after {index + 1} ({seconds[index]:.0f} s)")
    return (
        f"{len(measured)} evaluations in {seconds[-1]:.0f} s ({label.split(',')[0]}). "
        "Evaluations (and seconds) needed to reach a fraction of the final best: "
        + ", ".join(reached)
        + "."
    )


def _first_line(text: Any) -> str:
    line = text.strip().splitlines() if isinstance(text, str) else []
    return (line[0][:140] + ("…" if len(line[0]) > 140 else "")) if line else ""


def _status_table(study: StudyTrials) -> pd.DataFrame:
    measured = study.measured
    counts = study.status_counts()
    rows = []
    for status, n in counts.items():
        errors = measured.loc[measured["status"] == status, "error"].map(_first_line)
        # one message per cause: the sizes and addresses in it vary from trial to trial
        errors = errors[errors != ""].map(lambda e: _NUMBER.sub("N", e))
        common = errors.value_counts()
        rows.append(
            {
                "status": status,
                "measurements": int(n),
                "share": f"{100 * n / max(len(measured), 1):.1f} %",
                "most frequent message": f"{common.index[0]} ({common.iloc[0]}×)"
                if len(common)
                else "",
            }
        )
    return pd.DataFrame(rows)


def _failure_rates(study: StudyTrials) -> pd.DataFrame:
    measured = study.measured
    failed = measured["status"] != "ok"
    rows = []
    for name in study.parameters:
        column = measured[study.column(name)]
        if column.nunique() < 2:
            continue
        cells = []
        for value in study.parameters[name]:
            at = column == value
            if at.any():
                cells.append(f"{value}: {int((failed & at).sum())}/{int(at.sum())}")
        rows.append({"parameter": name, "failed/measured by value": " · ".join(cells)})
    return pd.DataFrame(rows)


def _top_table(study: StudyTrials, ranked: pd.DataFrame) -> pd.DataFrame:
    table = pd.DataFrame({"rank": range(1, len(ranked) + 1), "trial": ranked["number"]})
    table[f"{study.objective} ({study.unit})"] = ranked["value"].to_numpy()
    times = ranked["times_ms"].map(lambda t: list(t) if isinstance(t, list) else [])
    table["median ms"] = ranked["time_ms"].to_numpy()
    table["CV %"] = [
        round(100 * float(np.std(t, ddof=1) / np.mean(t)), 3) if len(t) > 1 else math.nan
        for t in times
    ]
    table["repeats"] = [len(t) for t in times]
    for name in study.tuned:
        table[name] = ranked[study.column(name)].to_numpy()
    for column in _RESOURCES:
        if column in ranked and ranked[column].notna().any():
            table[column] = ranked[column].to_numpy()
    if "occupancy" not in table:
        computed = _computed_occupancy(study, ranked)
        if computed is not None:
            table["occupancy (computed)"], table["limiter (computed)"] = computed
    if ranked["sanitizer"].astype(bool).any():
        table["sanitizer"] = ranked["sanitizer"].to_numpy()
    return table.dropna(axis=1, how="all")


def _computed_occupancy(
    study: StudyTrials, ranked: pd.DataFrame
) -> tuple[list[float], list[str]] | None:
    """Theoretical occupancy from the stored registers, shared memory and threads per block and
    the device's limits, for trials recorded before surrotune stored it (CUDA's occupancy
    calculator, :mod:`surrotune.backends.occupancy`); None where the inputs are missing."""
    from surrotune.backends.occupancy import DeviceLimits, OccupancyError, occupancy

    needed = ("registers", "threads_per_block", "shared_bytes")
    if not all(c in ranked and ranked[c].notna().all() for c in needed):
        return None
    try:
        limits = DeviceLimits.from_properties(study.device)
        found = [
            occupancy(
                limits,
                registers=int(row["registers"]),
                threads=int(row["threads_per_block"]),
                dynamic_shared=int(row["shared_bytes"]),
            )
            for _, row in ranked.iterrows()
        ]
    except OccupancyError:
        return None
    return [o.fraction for o in found], [o.limiter for o in found]


# --------------------------------------------------------------------------- entry point


def _slug(name: str, taken: set[str]) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "study"
    base, k = slug, 2
    while slug in taken:
        slug, k = f"{base}_{k}", k + 1
    taken.add(slug)
    return slug


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise AnalysisError(
            "surrotune analyze draws its figures with Matplotlib, which is not installed: "
            "pip install 'surrotune[analysis]'"
        ) from None


def write_report(
    studies: Sequence[StudyTrials],
    directory: str | Path,
    *,
    top: int = 10,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> Report:
    """Analyse ``studies`` and write ``report.md``, its figures and ``report.html``.

    Raises:
        AnalysisError: no study, a study with no measurement, or Matplotlib missing.
    """
    if not studies:
        raise AnalysisError("no study to analyse")
    for study in studies:
        if study.measured.empty:
            raise AnalysisError(
                f"study {study.name!r} holds no measurement ({len(study.frame)} trials, none "
                "evaluated a configuration): nothing to analyse"
            )
    _require_matplotlib()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    writer = _Writer(directory, top=top, seed=seed)
    names = ", ".join(f"'{s.name}'" for s in studies)
    writer.doc.heading(1, f"surrotune report: {names}")
    storages = sorted({s.storage for s in studies if s.storage})
    writer.doc.text(
        f"Read from {', '.join(storages) or 'the storage'}: {len(studies)} "
        f"stud{'y' if len(studies) == 1 else 'ies'}. Every number below comes from the "
        "stored trials; the storage stays a plain Optuna storage (`optuna-dashboard` opens it)."
    )
    taken: set[str] = {"comparison", "report"}
    lines = []
    for study in studies:
        if log is not None:
            log(f"analysing study '{study.name}' ({len(study.measured)} measurements)")
        writer.study(study, _slug(study.name, taken))
        best = study.best
        lines.append(
            f"{study.name}: {len(study.measured)} measurements, "
            + (
                f"best {best['value']:.6g} {study.unit} (trial {int(best['number'])})"
                if best is not None
                else "no ok configuration"
            )
        )
    if len(studies) > 1:
        writer.comparison(studies)
    markdown = directory / "report.md"
    markdown.write_text(writer.doc.markdown(), encoding="utf-8")
    page = directory / "report.html"
    page.write_text(writer.doc.html(f"surrotune report: {names}"), encoding="utf-8")
    return Report(directory, markdown, page, writer.figures, lines)
