"""The report's figures, drawn with Matplotlib's object-oriented API on its Agg canvas.

Each function takes what the analysis computed and returns a :class:`matplotlib.figure.Figure`;
nothing here touches ``pyplot``'s global state or needs a display, so the report builds on a
headless machine (and in a test) the same way. Failures always carry their status's colour, the
same in every figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from surrotune.analysis.trials import StudyTrials

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from surrotune.analysis.importance import Dependence, Importance
    from surrotune.analysis.noise import Noise

__all__ = [
    "STATUS_COLORS",
    "comparison_figure",
    "convergence_figure",
    "dependence_figure",
    "failures_figure",
    "importance_figure",
    "noise_figure",
    "progress_axis",
    "resources_figure",
]

#: one colour per status, shared by every figure
STATUS_COLORS: dict[str, str] = {
    "ok": "#4c72b0",
    "compile": "#8172b2",
    "resource": "#dd8452",
    "launch": "#937860",
    "runtime": "#c44e52",
    "timeout": "#da8bc3",
    "correctness": "#8c8c8c",
    "constraint": "#ccb974",
}


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _horizontal() -> dict[str, Any]:
    """Horizontal boxes: ``orientation`` since Matplotlib 3.10, ``vert`` before (deprecated)."""
    import matplotlib

    major, minor = (int(p) for p in matplotlib.__version__.split(".")[:2])
    return {"orientation": "horizontal"} if (major, minor) >= (3, 10) else {"vert": False}


def _color(status: str) -> str:
    return STATUS_COLORS.get(status, "#333333")


def _log_scale(values: np.ndarray) -> bool:
    values = values[np.isfinite(values)]
    return bool(len(values)) and bool((values > 0).all()) and values.max() / values.min() > 4


def progress_axis(study: StudyTrials) -> tuple[np.ndarray, str]:
    """Seconds at which each measurement finished, and what they are.

    A replayed study's wall time is the replay's, not the GPU's; its recorded compile and
    benchmark times add up to the tuning time the run would have taken on the recorded device.
    """
    measured = study.measured
    recorded = measured[["compile_time_ms", "benchmark_time_ms"]].apply(
        pd.to_numeric, errors="coerce"
    )
    if study.backend == "replay" and recorded.notna().any().any():
        return (
            recorded.fillna(0.0).sum(axis=1).cumsum().to_numpy() / 1000.0,
            "simulated tuning time, s (recorded compile + benchmark)",
        )
    return measured["elapsed_s"].to_numpy(dtype=float), "wall time since the first trial, s"


def _convergence_panel(
    ax: Axes, x: np.ndarray, study: StudyTrials, xlabel: str, *, legend: bool
) -> None:
    from matplotlib.transforms import blended_transform_factory

    measured = study.measured
    status = measured["status"].to_numpy()
    values = measured["value"].to_numpy(dtype=float)
    ok = status == "ok"
    masked = np.where(ok, values, np.nan)
    series = pd.Series(masked)
    best = (series.cummax() if study.maximize else series.cummin()).ffill().to_numpy()
    order = np.argsort(x, kind="stable")
    ax.scatter(x[ok], values[ok], s=9, color="#9aa7b8", alpha=0.7, label="ok trial", zorder=2)
    ax.step(x[order], best[order], where="post", color=_color("ok"), lw=2, label="best so far")
    rug = blended_transform_factory(ax.transData, ax.transAxes)
    for name in dict.fromkeys(status[~ok]):
        where = status == name
        ax.scatter(
            x[where], np.full(where.sum(), 0.03), transform=rug, marker="|", s=120, lw=1.6,
            color=_color(name), label=f"{name} ({where.sum()})", zorder=3, clip_on=False,
        )  # fmt: skip
    if _log_scale(values[ok]):
        ax.set_yscale("log")
    if (~ok).any():  # a strip below the data for the failure ticks
        low, high = ax.get_ylim()
        if ax.get_yscale() == "log":
            ax.set_ylim(low / (high / low) ** 0.12, high)
        else:
            ax.set_ylim(low - 0.12 * (high - low), high)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"{study.objective} ({study.unit})")
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=8, loc="upper right" if not study.maximize else "lower right")


def convergence_figure(study: StudyTrials) -> Figure:
    """Best so far against evaluations and against time; failures as ticks in their colour."""
    fig = _figure(11, 4)
    left, right = fig.subplots(1, 2)
    evaluations = np.arange(1, len(study.measured) + 1, dtype=float)
    _convergence_panel(left, evaluations, study, "evaluations", legend=True)
    seconds, label = progress_axis(study)
    _convergence_panel(right, seconds, study, label, legend=False)
    fig.suptitle(f"{study.name}: convergence ({study.direction})")
    return fig


def failures_figure(study: StudyTrials, max_parameters: int = 12) -> Figure:
    """Counts by status, then the share of each status for each value of each parameter."""
    measured = study.measured
    names = [p for p in study.parameters if measured[study.column(p)].nunique() > 1]
    names = names[:max_parameters]
    panels = 1 + len(names)
    columns = min(4, panels)
    rows = math.ceil(panels / columns)
    fig = _figure(3.2 * columns, 2.6 * rows)
    axes = np.atleast_1d(fig.subplots(rows, columns)).ravel()
    counts = study.status_counts()
    axes[0].bar(counts.index, counts.to_numpy(), color=[_color(s) for s in counts.index])
    axes[0].set_title("measurements by status", fontsize=9)
    axes[0].tick_params(axis="x", labelrotation=30, labelsize=8)
    for ax, name in zip(axes[1:], names, strict=False):
        table = pd.crosstab(measured[study.column(name)], measured["status"], normalize="index")
        table = table.reindex([v for v in study.parameters[name] if v in table.index]).reindex(
            columns=[c for c in counts.index if c in table.columns]
        )
        bottom = np.zeros(len(table))
        labels = [str(v) for v in table.index]
        for status in table.columns:
            share = table[status].to_numpy()
            ax.bar(labels, share, bottom=bottom, color=_color(status), label=status, width=0.8)
            bottom += share
        ax.set_title(name, fontsize=9)
        ax.set_ylim(0, 1)
        ax.tick_params(axis="x", labelrotation=60 if len(labels) > 6 else 0, labelsize=7)
        ax.tick_params(axis="y", labelsize=7)
    for ax in axes[panels:]:
        ax.set_visible(False)
    handles = [_patch(status) for status in counts.index]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8)
    fig.suptitle(f"{study.name}: outcomes by status and by parameter value (share of trials)")
    return fig


def _patch(status: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(color=_color(status), label=status)


def importance_figure(study: StudyTrials, importance: Importance) -> Figure:
    """fANOVA and the surrogate's permutation importance, one bar each per parameter."""
    table = importance.table.iloc[::-1]
    fig = _figure(7, 0.45 * len(table) + 1.4)
    ax = fig.subplots()
    y = np.arange(len(table))
    ax.barh(y + 0.2, table["fanova"], height=0.4, color="#4c72b0", label="fANOVA (Optuna)")
    ax.barh(
        y - 0.2, table["surrogate"], height=0.4, xerr=table["surrogate_sd"], color="#dd8452",
        label="surrogate (XGBoost, permutation)", error_kw={"lw": 0.8, "alpha": 0.6},
    )  # fmt: skip
    ax.set_yticks(y, table["parameter"])
    ax.set_xlabel("share of importance")
    ax.set_xlim(0, None)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    r2 = "" if importance.r2 is None else f" (surrogate cross-validated R² {importance.r2:.2f})"
    ax.set_title(f"{study.name}: parameter importance{r2}", fontsize=10)
    return fig


def dependence_figure(study: StudyTrials, dependences: Sequence[Dependence]) -> Figure:
    """Partial dependence on each top parameter (line) with the measured medians (dots), and on
    the top pair (a heat map)."""
    single = [d for d in dependences if len(d.parameters) == 1]
    pair = [d for d in dependences if len(d.parameters) == 2]
    panels = len(single) + len(pair)
    columns = min(3, max(panels, 1))
    rows = math.ceil(max(panels, 1) / columns)
    fig = _figure(4.2 * columns, 3.3 * rows)
    axes = np.atleast_1d(fig.subplots(rows, columns)).ravel()
    unit = f"{study.objective} ({study.unit})"
    for ax, dep in zip(axes, single, strict=False):
        labels = [str(v) for v in dep.values[0]]
        x = np.arange(len(labels))
        ax.plot(x, dep.average, "-o", color=_color("ok"), label="partial dependence")
        if dep.observed is not None:
            ax.plot(
                x, dep.observed, "s", color="#55a868", alpha=0.8, ms=5, label="measured median"
            )
        ax.set_xticks(x, labels, rotation=60 if len(labels) > 6 else 0, fontsize=7)
        ax.set_xlabel(dep.parameters[0])
        ax.set_ylabel(unit, fontsize=8)
        ax.grid(alpha=0.3)
    if single:
        axes[0].legend(fontsize=7)
    for ax, dep in zip(axes[len(single) :], pair, strict=False):
        grid = np.asarray(dep.average, dtype=float)
        image = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis_r"
                          if not study.maximize else "viridis")  # fmt: skip
        ax.set_yticks(range(len(dep.values[0])), [str(v) for v in dep.values[0]], fontsize=7)
        ax.set_xticks(range(len(dep.values[1])), [str(v) for v in dep.values[1]], fontsize=7)
        ax.set_ylabel(dep.parameters[0])
        ax.set_xlabel(dep.parameters[1])
        if grid.size <= 64:
            for (i, j), v in np.ndenumerate(grid):
                r, g, b, _ = image.cmap(image.norm(v))
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5  # text that reads on the cell
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=6,
                        color="white" if dark else "black")  # fmt: skip
        fig.colorbar(image, ax=ax, label=unit)
    for ax in axes[panels:]:
        ax.set_visible(False)
    fig.suptitle(f"{study.name}: partial dependence of the objective (surrogate model)")
    return fig


def noise_figure(study: StudyTrials, noise: Noise) -> Figure:
    """The repeats of the top configurations (boxes), and the spread of every configuration's
    repeats against its median time."""
    fig = _figure(11, max(3.5, 0.35 * len(noise.top) + 1.5))
    left, right = fig.subplots(1, 2)
    top = study.ranked.head(len(noise.top))
    repeats = [list(t) if isinstance(t, list) else [] for t in top["times_ms"]]
    labels = [f"#{r} (trial {n})" for r, n in zip(noise.top["rank"], noise.top["number"],
                                                   strict=True)]  # fmt: skip
    shown = [(lab, r) for lab, r in zip(labels, repeats, strict=True) if r][::-1]
    if shown:
        left.boxplot([r for _, r in shown], flierprops={"ms": 3}, **_horizontal())
        left.set_yticks(range(1, len(shown) + 1), [lab for lab, _ in shown])
        left.set_xlabel("time per repeat, ms")
        left.tick_params(axis="y", labelsize=7)
    left.set_title("repeats of the top configurations", fontsize=10)
    left.grid(axis="x", alpha=0.3)
    spread = noise.spread
    if not spread.empty:
        right.scatter(spread["median_ms"], spread["cv_pct"], s=10, color=_color("ok"), alpha=0.6)
        winners = spread[spread["number"].isin(noise.top["number"])]
        right.scatter(winners["median_ms"], winners["cv_pct"], s=22, color="#c44e52",
                      label="top configurations")  # fmt: skip
        if _log_scale(spread["median_ms"].to_numpy(dtype=float)):
            right.set_xscale("log")
        right.legend(fontsize=8)
    right.set_xlabel("median time, ms")
    right.set_ylabel("coefficient of variation of the repeats, %")
    right.set_title("spread of the repeats, every ok configuration", fontsize=10)
    right.grid(alpha=0.3)
    fig.suptitle(f"{study.name}: measurement noise")
    return fig


def resources_figure(study: StudyTrials) -> Figure | None:
    """The objective against registers, shared memory and occupancy, where the trials hold them;
    None when they hold none (a replayed Kernel Tuner cache)."""
    ok = study.ranked
    present = [
        (c, label) for c, label in (
            ("registers", "registers per thread"), ("shared_bytes", "shared memory per block, B"),
            ("occupancy", "theoretical occupancy"),
        ) if c in ok and pd.to_numeric(ok[c], errors="coerce").notna().any()
    ]  # fmt: skip
    if not present:
        return None
    fig = _figure(3.8 * len(present), 3.3)
    axes = np.atleast_1d(fig.subplots(1, len(present)))
    values = ok["value"].to_numpy(dtype=float)
    for ax, (column, label) in zip(axes, present, strict=True):
        x = pd.to_numeric(ok[column], errors="coerce").to_numpy(dtype=float)
        ax.scatter(x, values, s=10, alpha=0.6, color=_color("ok"))
        ax.scatter(x[:1], values[:1], s=40, color="#c44e52", label="best")
        ax.set_xlabel(label)
        ax.set_ylabel(f"{study.objective} ({study.unit})", fontsize=8)
        if _log_scale(values):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{study.name}: objective against the compiled kernel's resources")
    return fig


def comparison_figure(studies: Sequence[StudyTrials]) -> Figure:
    """Each study's best so far against evaluations, and the objective of the configurations
    that the first study and each other one both ran, one against the other."""
    from surrotune.analysis.compare import common_values

    reference = studies[0]
    others = [s for s in studies[1:] if set(s.parameters) == set(reference.parameters)]
    panels = 1 + len(others)
    fig = _figure(4.5 * panels, 4)
    axes = np.atleast_1d(fig.subplots(1, panels))
    for study in studies:
        values = np.where(
            study.measured["status"] == "ok", study.measured["value"].astype(float), np.nan
        )
        series = pd.Series(values)
        best = (series.cummax() if study.maximize else series.cummin()).ffill().to_numpy()
        axes[0].step(np.arange(1, len(best) + 1), best, where="post", label=study.name)
    axes[0].set_xlabel("evaluations")
    axes[0].set_ylabel(f"best so far ({reference.unit})")
    axes[0].set_yscale("log")
    axes[0].grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    for ax, other in zip(axes[1:], others, strict=True):
        _, x, y = common_values(reference, other)
        ax.scatter(x, y, s=12, alpha=0.7, color=_color("ok"))
        if len(x):
            low, high = np.nanmin(np.r_[x, y]), np.nanmax(np.r_[x, y])
            ax.plot([low, high], [low, high], ls="--", color="#999999", lw=1)
            if _log_scale(np.r_[x, y]):
                ax.set_xscale("log")
                ax.set_yscale("log")
        ax.set_xlabel(f"{reference.name} ({reference.unit})")
        ax.set_ylabel(f"{other.name} ({other.unit})")
        ax.set_title(f"ok on both: {len(x)} configurations", fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle("studies side by side")
    return fig
