"""Warm start: what a model learned on one GPU (a :class:`ModelBundle`) speeds up the next.

Three things carry over, each undone by the new GPU's own data where the source is wrong:

1. **The initial design.** Instead of a blind space-filling start, the first proposals (10 by
   default) are the sources' best configurations, kept diverse: first the ones a source
   *measured* best, in their measured order (a measurement beats a prediction: an ensemble's
   mean smooths an isolated optimum away), then its best predicted ones; each proposal is the
   first in that order at least ``design_gap`` (0.3 in the [0, 1] encoding) from everything tried
   or pending, and configurations a source expects to fail are left out. With several sources,
   each proposal goes to the one that ranks the target's measurements so far best
   (``weighted_turns``; they take turns until the measurements can tell). The design ends
   early once one of its measurements stands out (``design_stop_ratio``). A source that
   cannot rank its best (more configurations within ``design_tolerance`` of it than the pool
   holds) spreads its proposals over them instead (``flat_spread``). Space-filling
   proposals, as a cold start makes them, can be interleaved (``n_fill``); there are none by
   default (these defaults were measured against the first version's as a whole,
   docs/transfer.md).
2. **A prior in the performance model.** A source predicts on its own scale (log time on the
   source GPU); an affine map ``a * s(x) + b``, fitted on the target's measurements with a ridge
   that pulls ``a`` towards 1 and keeps it non-negative, puts it on the target's. How much each
   source (and the target's own model) is believed is decided by how well it *ranks* the target's
   measurements: in the manner of the ranking-weighted ensemble of Feurer et al. ("Scalable
   meta-learning for Bayesian optimization", 2018), over bootstrap resamples of the measurements,
   each model's weight is the share of resamples in which it misorders the fewest pairs; the
   target model is scored on its out-of-bag predictions, so it wins only where it generalises.
   How the weighted prior is used is ``mode``:

   * ``"prior"`` (default): the target's own ensemble predicts, exactly as in a cold start, and
     the prior multiplies expected improvement by ``exp(-γ z(x))``, ``z`` the weighted sources'
     mapped prediction in standard deviations above their best candidate, ``γ = strength ×
     (the sources' total weight) × 10 / max(10, n)``: the acquisition of πBO (Hvarfner et al.,
     "πBO: augmenting acquisition functions with user beliefs", ICLR 2022), whose prior fades as
     the measurements ``n`` grow, here also as the sources lose their ranking weight (the
     strength is 0 by default, part of the measured defaults in docs/transfer.md);
   * ``"stack"``: the weighted mean of the target model's and the mapped sources' predictions
     (the ranking-weighted ensemble itself);
   * ``"residual"``: the target's ensemble learns the difference between the measurements and
     the weighted prior (``λ * prior + (1 - λ) * mean``, λ the sources' total weight);
   * ``"feature"``: the mapped prior is one more feature of the target's model.

   docs/transfer.md says how they compare.
3. **Failures that depend on the kernel and the limits.** A ``compile`` failure recurs on a GPU
   of the same vendor (same compiler); a ``resource`` failure recurs where the target's limit
   (shared memory, registers or threads per block: the one the source's failures hit) is the
   same or smaller. The device descriptors set a prior belief that each kind carries over (high
   where the limits say so, low where the target has more, middling where they are unknown);
   the target's measurements of configurations the source expected to fail update it (a Beta
   posterior), so a wrong transfer is unlearned. ``launch``, ``runtime``, ``timeout`` and
   ``correctness`` failures are not transferred: the target's classifier learns them. Where a
   source's bundle has a resource model (what each configuration uses of shared memory,
   registers and threads per block: the kernel's and the compiler's), its predictions judged
   against the *target's* limits replace its resource classifier, which knows only where the
   *source* ran out (:func:`resource_transfer`): a smaller GPU's new failures are foreseen, a
   larger one's vanished failures are not held against it.

Everything here is numpy over arrays; :class:`~surrotune.surrogate.sampler.SurrogateSampler`
glues it to a study.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from surrotune.surrogate.bundle import BundleError, ModelBundle, load_bundle
from surrotune.surrogate.diversity import min_distances
from surrotune.surrogate.geometry import LaunchShape
from surrotune.surrogate.performance import PerformanceModel
from surrotune.surrogate.resources import (
    RESOURCES,
    ResourceModel,
    limit_of,
    resource_row,
    transferred_fits,
)

__all__ = [
    "RESOURCE_EXPLAINED",
    "TRANSFER_MODES",
    "ResourceTransfer",
    "Source",
    "TransferFit",
    "WarmStart",
    "affine_map",
    "as_bundles",
    "check_bundle",
    "compatibility_notes",
    "failure_confidence",
    "failure_prior",
    "pick_design",
    "ranking_weights",
    "vendor",
]

TRANSFER_MODES = ("prior", "stack", "residual", "feature")

#: pseudo-observations behind the device limits' belief that a failure kind carries over
_PRIOR_STRENGTH = 4.0
#: bootstrap resamples of the target's measurements that the ranking weights are counted over
_RESAMPLES = 128
#: the ridge that pulls the affine map's slope towards 1, in observations' worth
_SLOPE_PRIOR = 3.0
#: a source's resource model stands in for its resource-failure classifier where it predicts at
#: least this share of the source's own resource failures (P(fits) < 0.5): failures it cannot
#: explain (no resource reported, a limit nobody stated) stay with the classifier
RESOURCE_EXPLAINED = 0.9


def as_bundles(sources: Sequence[ModelBundle | str | Path] | ModelBundle | str | Path) -> list:
    """Bundles or paths to bundles, as a list of loaded bundles."""
    if isinstance(sources, (ModelBundle, str, Path)):
        sources = [sources]
    return [s if isinstance(s, ModelBundle) else load_bundle(s) for s in sources]


# --------------------------------------------------------------------------- compatibility


def check_bundle(bundle: ModelBundle, parameters: Mapping[str, Sequence[Any]]) -> None:
    """Refuse a bundle that cannot read this search space's configurations, naming the
    parameters (and values) that differ."""
    problems = bundle.encoding.mismatches(parameters)
    if problems:
        raise BundleError(
            f"the model {bundle.label} was learned on other parameters: "
            + "; ".join(problems)
            + ". A warm start needs the same parameter names, and values the model has measured"
        )


def compatibility_notes(
    bundle: ModelBundle,
    *,
    sizes: Any = None,
    template_sha256: str | None = None,
    objective: str | None = None,
    device: Mapping[str, Any] | None = None,
) -> list[str]:
    """What differs between the bundle's search and this one but does not stop a warm start:
    the problem size, the kernel template, the objective, the GPU. One line each."""
    notes = []
    label = bundle.label
    if sizes and bundle.problem_size and _size(sizes) != _size(bundle.problem_size):
        notes.append(
            f"note: {label} was learned at problem size {_size(bundle.problem_size)}, this run "
            f"is {_size(sizes)}; its predictions are a prior that the new measurements correct"
        )
    theirs = (bundle.kernel or {}).get("template_sha256")
    if template_sha256 and theirs and theirs != template_sha256:
        notes.append(
            f"note: {label} was learned on another version of the kernel template (SHA-256 "
            f"{theirs[:12]}..., this one {template_sha256[:12]}...)"
        )
    elif template_sha256 and not theirs:
        notes.append(f"note: {label} records no template hash (a replayed recording)")
    if objective and bundle.objective and objective != bundle.objective:
        notes.append(
            f"note: {label} modelled {bundle.objective}, this run optimises {objective}; only "
            "the ranking carries over"
        )
    theirs_name, mine_name = bundle.device.get("name"), (device or {}).get("name")
    if theirs_name and mine_name and theirs_name != mine_name:
        notes.append(f"warm start from {label} ({theirs_name}) on {mine_name}")
    return notes


def _size(size: Any) -> str:
    if isinstance(size, Mapping):
        return ", ".join(f"{k}={v}" for k, v in size.items())
    if isinstance(size, (list, tuple)):
        return "x".join(map(str, size))
    return str(size)


# --------------------------------------------------------------------------- failures


_NVIDIA = re.compile(r"nvidia|geforce|tesla|quadro|rtx|gtx|\b[ahlbv]100\b|h200|gh200", re.I)
_AMD = re.compile(r"\bamd\b|radeon|instinct|\bmi\d{2,3}|gfx\d", re.I)


def vendor(device: Mapping[str, Any]) -> str | None:
    """``nvidia``, ``amd`` or None: which compiler family builds the kernel for this device (a
    CUDA compute capability says NVIDIA; otherwise the name does)."""
    if device.get("compute_capability") or device.get("major") is not None:
        return "nvidia"
    name = str(device.get("name") or "")
    if _NVIDIA.search(name):
        return "nvidia"
    if _AMD.search(name):
        return "amd"
    return None


#: the per-block limit that decides whether a resource failure of each kind recurs
_LIMIT_FIELDS = {
    "shared": ("shared_per_block", "shared_per_block_optin"),
    "registers": ("regs_per_block",),
    "threads": ("max_threads_per_block",),
}


def failure_prior(
    kind: str,
    limits_hit: Mapping[str, int],
    source: Mapping[str, Any],
    target: Mapping[str, Any] | None,
) -> tuple[float, str]:
    """The prior probability that the source's failures of ``kind`` recur on the target, and why.

    ``compile``: 0.9 on a GPU of the same vendor (same compiler), 0.1 on another, 0.5 unknown.
    ``resource``: per limit the source's failures hit (weighted by how many hit it), 0.9 when
    the target's limit is the same or smaller, 0.1 when it is larger, 0.7 when a limit is not
    recorded on a GPU of the same vendor; 0.1 on another vendor; 0.5 when the target is unknown.
    """
    target = target or {}
    same = vendor(source), vendor(target)
    if None in same:
        return 0.5, "the target GPU is not known yet" if not target else "vendor unknown"
    if same[0] != same[1]:
        return 0.1, f"{source.get('name')} and {target.get('name')} use different compilers"
    if kind == "compile":
        return 0.9, "same compiler"
    total, belief, reasons = 0, 0.0, []
    for limit, count in limits_hit.items():
        fields = _LIMIT_FIELDS.get(limit)
        mine = [target.get(f) for f in fields] if fields else []
        theirs = [source.get(f) for f in fields] if fields else []
        if fields and all(v is not None for v in mine + theirs):
            smaller = all(m <= t for m, t in zip(mine, theirs, strict=True))
            p = 0.9 if smaller else 0.1
            reasons.append(f"{limit}: target {'<=' if smaller else '>'} source")
        else:
            p = 0.7
            reasons.append(f"{limit}: limits not recorded")
        total += count
        belief += count * p
    if not total:
        return 0.7, "no resource failure on the source"
    return belief / total, ", ".join(reasons)


def failure_confidence(prior: float, expected_to_fail: np.ndarray, failed: np.ndarray) -> float:
    """The belief that a failure kind carries over, after the target measured configurations
    the source expected to fail: a Beta posterior whose prior is worth a few measurements."""
    n = int(np.count_nonzero(expected_to_fail))
    k = int(np.count_nonzero(expected_to_fail & failed))
    return (k + _PRIOR_STRENGTH * prior) / (n + _PRIOR_STRENGTH)


# --------------------------------------------------------------------------- the prior


def affine_map(s: np.ndarray, y: np.ndarray, spread: float) -> tuple[float, float]:
    """``(a, b)`` with ``y ≈ a * s + b``: least squares with a ridge pulling ``a`` towards 1
    (worth :data:`_SLOPE_PRIOR` observations at the source's typical ``spread``), ``a >= 0``.

    One GPU is mostly a faster or slower other GPU (on a log scale: a shift, slope 1); the slope
    moves away from 1 only as far as the target's data says, and never below 0 (a source that
    ranks backwards is not turned upside down: its ranking weight drops instead).
    """
    s = np.asarray(s, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(y) == 0:
        return 1.0, 0.0
    if len(y) < 2:
        return 1.0, float(y.mean() - s.mean())
    ds, dy = s - s.mean(), y - y.mean()
    ridge = _SLOPE_PRIOR * max(spread, 1e-12) ** 2
    a = (float(ds @ dy) + ridge) / (float(ds @ ds) + ridge)
    a = max(a, 0.0)
    return a, float(y.mean() - a * s.mean())


def ranking_weights(
    predictions: Sequence[np.ndarray], y: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Each model's share of bootstrap resamples of ``y`` in which it misorders fewest pairs.

    ``predictions[m]`` holds model ``m``'s prediction for every measurement (NaN where it has
    none, e.g. no out-of-bag member): pairs with a NaN do not count for that model. Ties split the
    resample evenly. With fewer than three distinct values nothing can be ranked and every model
    gets the same weight.
    """
    y = np.asarray(y, dtype=np.float64)
    m = len(predictions)
    if m == 0:
        return np.zeros(0)
    if len(np.unique(y)) < 3:
        return np.full(m, 1.0 / m)
    n = len(y)
    order = np.sign(y[:, None] - y[None, :])
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=_RESAMPLES).astype(np.float64)
    losses = np.empty((_RESAMPLES, m))
    for k, pred in enumerate(predictions):
        p = np.asarray(pred, dtype=np.float64)
        valid = ~np.isnan(p)
        pv = np.where(valid, p, 0.0)
        pair_ok = (order != 0) & valid[:, None] & valid[None, :]
        wrong = (np.sign(pv[:, None] - pv[None, :]) != order) & pair_ok
        num = np.einsum("bi,ij,bj->b", counts, wrong.astype(np.float64), counts)
        den = np.einsum("bi,ij,bj->b", counts, pair_ok.astype(np.float64), counts)
        losses[:, k] = np.where(den > 0, num / np.maximum(den, 1e-300), 0.5)
    best = losses <= losses.min(axis=1, keepdims=True) + 1e-12
    return (best / best.sum(axis=1, keepdims=True)).mean(axis=0)


@dataclass
class ResourceTransfer:
    """The sources' resource models judged against the target GPU's limits."""

    fits: np.ndarray  # (n,) P(every resource fits the target's limits) per candidate
    replaced: frozenset[str]  # labels of the sources whose resource classifier this replaces
    limits: dict[str, float]  # resource -> the target's limit it was judged against


def resource_transfer(
    candidates: Sequence[Source],
    observed: Sequence[Source],
    attrs: Sequence[Mapping[str, Any]],
    ok: Sequence[bool],
    target_device: Mapping[str, Any] | None,
    own: ResourceModel | None = None,
    X: np.ndarray | None = None,
) -> ResourceTransfer | None:
    """P(fits the target's limits) per candidate from the sources' resource models.

    ``candidates``/``observed``: the sources at the candidates and at the target's learned
    measurements, whose trial attributes are ``attrs`` (``ok``: which ran ok); ``own``: the
    target's own :class:`ResourceModel` on the candidates' features ``X``. A source counts
    where its bundle has a resource model that explains its resource failures
    (:data:`RESOURCE_EXPLAINED`) and the target is a GPU of the same compiler; their
    predictions are averaged (σ widened by their disagreement). Each resource is judged
    against the target's limit (:func:`~surrotune.surrogate.resources.limit_of`: a limit the
    target's failures stated, else a compiler limit a source stated, else the target device's),
    shifted by what the target measured (:func:`~surrotune.surrogate.resources.transferred_fits`).
    None where no source counts or the target GPU is not known yet.
    """
    if not target_device or vendor(target_device) is None:
        return None
    usable = [
        k for k, c in enumerate(candidates)
        if c.resources and vendor(c.bundle.device) == vendor(target_device)
        and (c.bundle.resources_explained is None
             or c.bundle.resources_explained >= RESOURCE_EXPLAINED)
    ]  # fmt: skip
    if not usable:
        return None
    prior: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    at_obs: dict[str, np.ndarray] = {}
    limits: dict[str, float] = {}
    for name in RESOURCES:
        having = [k for k in usable if name in candidates[k].resources]
        if not having:
            continue
        mus = np.array([candidates[k].resources[name][0] for k in having])
        sds = np.array([candidates[k].resources[name][1] for k in having])
        prior[name] = mus.mean(axis=0), np.sqrt((sds**2).mean(axis=0) + mus.var(axis=0))
        at_obs[name] = np.mean([observed[k].resources[name][0] for k in having], axis=0)
        stated = [
            2.0**learned.log_limit - 1.0
            for k in having
            if (learned := _learned(candidates[k].bundle, name)) is not None
            and learned.limit_origin == "compiler"
        ]
        found = limit_of(name, attrs, target_device, ok, compiler=min(stated, default=None))
        if found is not None:
            limits[name] = found[0]
    residuals: dict[str, list[float]] = {name: [] for name in prior}
    for i, a in enumerate(attrs):
        for name, value in resource_row(a)[0].items():
            if name in prior:
                residuals[name].append(math.log2(value + 1.0) - float(at_obs[name][i]))
    fits = transferred_fits(
        prior, limits, {k: np.asarray(v) for k, v in residuals.items()}, own, X
    )
    return ResourceTransfer(
        fits=fits,
        replaced=frozenset(candidates[k].bundle.label for k in usable),
        limits=limits,
    )


def _learned(bundle: ModelBundle, name: str) -> Any:
    return None if bundle.resources is None else bundle.resources.models_.get(name)


# --------------------------------------------------------------------------- design


def pick_design(
    score: np.ndarray,
    encoded: np.ndarray,
    rows: np.ndarray,
    existing: np.ndarray,
    *,
    pool: int,
    gap: float,
) -> int:
    """The next configuration of the warm initial design (an index into ``rows``).

    Among the ``pool`` best-scored available rows (lower score is better), the best-scored one
    at least ``gap`` away (in the [0, 1] encoding) from every ``existing`` configuration: good by
    the source's reckoning, and not a near-copy of what was tried already. When none is that far,
    the farthest of them.
    """
    if len(rows) == 0:
        raise ValueError("no configuration left to propose")
    s = score[rows]
    top = np.argsort(s, kind="stable")[: max(1, min(pool, len(rows)))]
    if len(existing) == 0:
        return int(top[0])
    distance = min_distances(encoded[rows[top]], existing)
    far = np.flatnonzero(distance >= gap)
    return int(top[far[0]]) if len(far) else int(top[np.argmax(distance)])


# --------------------------------------------------------------------------- fitting


@dataclass
class Source:
    """One bundle's view of the candidate set: predictions and failure probabilities."""

    bundle: ModelBundle
    members: np.ndarray  # (K, n) performance predictions, the source's scale
    fail: dict[str, np.ndarray]  # kind -> P(fails with it on the source GPU), (n,)
    top: np.ndarray | None = None  # (n,) rank among the source's best measured; inf elsewhere
    #: resource -> the source's predicted (log2(value + 1), σ), (n,) each; empty: no model
    resources: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def mean(self) -> np.ndarray:
        return self.members.mean(axis=0)

    @property
    def spread(self) -> float:
        """The typical spread of the source's predictions over the candidates."""
        return float(np.std(self.mean)) or 1.0

    @classmethod
    def on(
        cls,
        bundle: ModelBundle,
        frame: pd.DataFrame,
        target: LaunchShape | None = None,
        sizes: Mapping[str, Any] | None = None,
    ) -> Source:
        """The bundle's predictions for ``frame``; with the ``target``'s launch shape, at the
        target's sizes and SM count, where the bundle learned launch geometry too. Its measured
        best configurations rank first where they were measured at the target's sizes
        (``sizes``, or the target shape's); at another size only the best of them does, the
        one a kernel engineer tries first on a new size: ten measurements at another size led
        the GEMM 1024³ → 2048³ search into a second basin, while the convolution's best at
        2048² is within 3 % of the optimum at 4096² (docs/BENCHMARKS.md, "Across problem
        sizes")."""
        shape = bundle.encoding.launch_shape
        wanted = sizes or (target.sizes if target is not None else None)
        measured_at = bundle.problem_size if isinstance(bundle.problem_size, Mapping) else {}
        measured_at = measured_at or (shape.sizes if shape is not None else {})
        resized = bool(wanted and measured_at) and dict(measured_at) != dict(wanted)
        if shape is not None and target is not None:
            at = shape.at(target.sizes, target.sm_count)
            bundle = dataclasses.replace(
                bundle, encoding=dataclasses.replace(bundle.encoding, launch_shape=at)
            )
        names = list(bundle.encoding.names)
        # at another size only the source's very best measured configuration leads (once)
        kept = bundle.top if not resized else bundle.top[:1]
        top = None
        if kept:
            ranks = {tuple(e["config"][n] for n in names): k for k, e in enumerate(kept)}
            top = np.array(
                [ranks.get(tuple(row), np.inf) for row in frame[names].itertuples(index=False)],
                dtype=np.float64,
            )
        members = bundle.predict(frame, members=True)
        return cls(
            bundle, members, bundle.predict_failures(frame), top, bundle.predict_resources(frame)
        )

    def take(self, rows: np.ndarray) -> Source:
        return Source(
            self.bundle,
            self.members[:, rows],
            {k: v[rows] for k, v in self.fail.items()},
            None if self.top is None else self.top[rows],
            {k: (m[rows], sd[rows]) for k, (m, sd) in self.resources.items()},
        )


@dataclass
class TransferFit:
    """The warm-started models' predictions over the candidates, and the weights behind them."""

    mean: np.ndarray
    std: np.ndarray
    p_ok: np.ndarray  # the factor that transferred failures put on P(ok)
    prior: np.ndarray | None = None  # the factor the prior puts on expected improvement
    weights: dict[str, float] = field(default_factory=dict)  # label -> weight; "target" too
    maps: dict[str, tuple[float, float]] = field(default_factory=dict)
    confidence: dict[str, float] = field(default_factory=dict)  # failure kind -> belief


class WarmStart:
    """The sources of a warm start and the maths that uses them (see the module docstring).

    Args:
        bundles: the source models (or paths to them).
        mode: how the prior enters the performance model: ``residual``, ``stack``, ``feature``.
        n_design: proposals of the initial design that the sources choose.
        n_fill: space-filling proposals interleaved with them (source first, then one of each
            in turn), as a cold start would measure them. None by default: the design
            without them (and with the other defaults here) needed fewer evaluations on the
            shared recordings than the first version's 5 + 10 (docs/transfer.md).
        design_pool: the design chooses among this many of a source's best configurations.
        design_gap: a design proposal keeps at least this distance (in the [0, 1] encoding)
            from everything tried or pending: the sources' best configurations, kept diverse.
            0.3 since 2026-12-03 (0.1 before): a source whose ten best configurations sit in
            one region (the A100's optimum, 5 % of the MI250X's on the convolution) then
            spends its design on several of its good regions, one of which often holds the
            target's optimum (docs/BENCHMARKS.md, "A more diverse design").
        prior_strength: the prior's exponent right after the design (``mode="prior"``). 0 by
            default (part of the measured defaults, docs/transfer.md): the sources act through
            the initial design and the failure transfer.
        adaptive: the design's ``n_design + n_fill`` proposals are not a fixed sequence: the
            first is a source's, the second space-filling, and each later one a source's while
            the best measurement of the sources' picks is at least as good as the best of the
            space-filling ones, space-filling otherwise. A source whose best configurations are
            good on the target keeps the design; one that misleads hands it to the cold start's
            space-filling points after a single comparison.
        weighted_turns: with several sources, a design proposal goes to the source that ranks
            the target's measurements so far best (its :func:`ranking_weights` share, once
            three measurements differ), instead of the sources taking turns: each source's
            picks lie in its own good regions, so the other's picks test it where it claims
            nothing, which a single source's picks cannot. On by default since 2026-12-04:
            25, 25 and 14 evaluations to 98 % on three pairs of sources against 36, 25.5 and
            14.5 when they take turns (docs/BENCHMARKS.md, "Several sources").
        design_stop_ratio: the design ends early once, among at least three measured
            proposals, the best is this many times better than their median
            (:meth:`design_found`): the search takes over from the region it found instead of
            spending the rest of the design on the source's other regions. 3 by default since
            2026-12-04 (convolution A4000 -> W6600: 7 evaluations to 98 % against 15 without;
            A100 -> MI250X 32.5 against 26 on the H200 host's CPU; the other pairs unchanged;
            docs/BENCHMARKS.md, "Ending the design"); None never ends it early.
        design_tolerance: a source that predicts more than ``design_pool`` configurations
            within this fraction of its best (on its log-time scale) cannot rank them: its
            order among them is noise (the A100 runs 1,300 dedispersion configurations within
            2 % of its optimum, the MI250X 11). Its design proposals after the first then
            spread over that set, each the farthest from everything tried (greedy maximin, as
            a cold start's design), instead of following the noise into one region.
            None ranks the best ``design_pool`` in the source's order always.
        flat_spread: where such a source's proposals spread: ``"near"``, over the
            configurations it predicts within the tolerance; ``"space"``, over every
            configuration it does not expect to fail (a cold start's design, the source
            keeping its first proposal and its failures).
        fill_after: where the whole design ran without a pick standing out
            (``design_stop_ratio``), this many space-filling proposals follow it, each the
            farthest from everything measured: the sources' regions look undistinguished on
            the target, so the search first looks where they claim nothing, as a cold start
            would. 0 by default.
        design_resume_after: once the design ended early (``design_stop_ratio``), the search
            has this many measurements to beat the pick that stood out; where it does not, the
            design goes on with the sources' remaining picks (once), as a kernel engineer goes
            back to the old GPU's other picks when tuning around the first good one leads
            nowhere. None never resumes it.
        transfer_resources: judge the sources' resource models (where their bundles have
            one) against the target GPU's limits, in place of their resource-failure
            classifiers (:func:`resource_transfer`); False keeps the classifiers.
        keep_resource_classifiers: with ``transfer_resources``, keep the sources' resource
            classifiers too (both gate a candidate) instead of replacing them.
        search_model: the target's performance model after the design (``mode="prior"``):
            ``"ensemble"``, the bootstrap ensemble alone (this class's own fit), or
            ``"search"``, the models a cold search fits at that point (the GP on the
            ensemble's errors, the sampler's ``model_params`` and fit schedule), the sources
            then acting through the design, the failure transfer and the prior only. Off:
            on the three pairs where the source misleads it needs fewer evaluations (GEMM
            1024³ -> 2048³ 107 against 131.5, 2048³ -> 1024³ 35.5 against 62.5, dedispersion
            A100 -> MI250X never worse on a seed), but convolution A100 -> W7800 159.5
            against 83.5 (dev, 20 seeds, five source runs; docs/BENCHMARKS.md, "The warm
            start's search after the design").
    """

    def __init__(
        self,
        bundles: Sequence[ModelBundle | str | Path] | ModelBundle | str | Path,
        *,
        mode: str = "prior",
        n_design: int = 10,
        n_fill: int = 0,
        design_pool: int = 64,
        design_gap: float = 0.3,
        prior_strength: float = 0.0,
        adaptive: bool = False,
        weighted_turns: bool = True,
        design_stop_ratio: float | None = 3.0,
        design_tolerance: float | None = 0.02,
        flat_spread: Literal["near", "space"] = "near",
        fill_after: int = 0,
        design_resume_after: int | None = None,
        transfer_resources: bool = True,
        keep_resource_classifiers: bool = False,
        search_model: Literal["ensemble", "search"] = "ensemble",
    ) -> None:
        if mode not in TRANSFER_MODES:
            raise ValueError(f"mode must be one of {', '.join(TRANSFER_MODES)}; got {mode!r}")
        self.bundles = as_bundles(bundles)
        if not self.bundles:
            raise ValueError("a warm start needs at least one model bundle")
        labels = [b.label for b in self.bundles]
        if len(set(labels)) != len(labels):  # two bundles of one name: number them
            for k, b in enumerate(self.bundles):
                b.path = f"{b.label}#{k + 1}"
        if search_model not in ("ensemble", "search"):
            raise ValueError(f"search_model must be 'ensemble' or 'search'; got {search_model!r}")
        if search_model == "search" and mode != "prior":
            raise ValueError(f"search_model='search' needs mode='prior'; got mode={mode!r}")
        self.search_model = search_model
        self.mode = mode
        self.n_design = n_design
        self.n_fill = n_fill
        self.prior_strength = prior_strength
        self.design_gap = design_gap
        self.adaptive = adaptive
        self.weighted_turns = weighted_turns
        self.design_stop_ratio = design_stop_ratio
        if design_tolerance is not None and design_tolerance < 0:
            raise ValueError(f"design_tolerance must be >= 0 or None; got {design_tolerance}")
        self.design_tolerance = design_tolerance
        if flat_spread not in ("near", "space"):
            raise ValueError(f"flat_spread must be 'near' or 'space'; got {flat_spread!r}")
        self.flat_spread = flat_spread
        if fill_after < 0:
            raise ValueError(f"fill_after must be >= 0; got {fill_after}")
        self.fill_after = fill_after
        if design_resume_after is not None and design_resume_after < 1:
            raise ValueError(
                f"design_resume_after must be >= 1 or None; got {design_resume_after}"
            )
        self.design_resume_after = design_resume_after
        self.transfer_resources = transfer_resources
        self.keep_resource_classifiers = keep_resource_classifiers
        sequence: list[bool] = []  # True: the sources choose; False: space-filling
        while len(sequence) < n_design + n_fill:
            chosen = sum(sequence)
            filled = len(sequence) - chosen
            sequence.append(chosen < n_design and (len(sequence) % 2 == 0 or filled >= n_fill))
        self._sequence = sequence
        self.design_pool = design_pool

    def check(self, parameters: Mapping[str, Sequence[Any]]) -> None:
        for bundle in self.bundles:
            check_bundle(bundle, parameters)

    def sources(
        self,
        frame: pd.DataFrame,
        target: LaunchShape | None = None,
        sizes: Mapping[str, Any] | None = None,
    ) -> list[Source]:
        """Every bundle's predictions on the configurations of ``frame`` (at the ``target``'s
        launch shape and ``sizes``: :meth:`Source.on`)."""
        return [Source.on(b, frame, target, sizes) for b in self.bundles]

    def design_found(self, values: Sequence[float], direction: str = "minimize") -> bool:
        """Whether the design can end early (``design_stop_ratio``): among at least three
        measured proposals, the best is that many times better than their median, a region
        the search can take over from, as a kernel engineer stops trying the old GPU's picks
        once one of them stands out."""
        v = np.asarray([x for x in values if x is not None], dtype=np.float64)
        if self.design_stop_ratio is None or len(v) < 3 or (v <= 0).any():
            return False
        best = v.min() if direction == "minimize" else v.max()
        ratio = np.median(v) / best if direction == "minimize" else best / np.median(v)
        return bool(ratio >= self.design_stop_ratio)

    @property
    def design_length(self) -> int:
        return len(self._sequence)

    def design_turn(
        self,
        turn: int,
        source_best: float | None = None,
        fill_best: float | None = None,
        n_source: int = 0,
        weights: np.ndarray | None = None,
    ) -> int | None:
        """Which source chooses the ``turn``-th proposal of the design (they take turns), or
        None for a space-filling one. ``adaptive``: decided by ``source_best`` and
        ``fill_best``, the best measurements so far of the sources' picks and of the
        space-filling ones (lower is better; None before one is measured), ``n_source`` the
        sources' picks so far. ``weighted_turns``: the source of the largest of ``weights``
        (each source's ranking weight on the target's measurements) chooses, where they
        differ."""
        if turn >= len(self._sequence):
            return None
        if self.adaptive:
            if turn == 0:
                source = True
            elif turn == 1:
                source = False  # one space-filling point to compare the sources' picks with
            elif source_best is None or fill_best is None:  # nothing to compare yet: alternate
                source = n_source <= turn - n_source
            else:
                source = source_best <= fill_best
            return n_source % len(self.bundles) if source else None
        if not self._sequence[turn]:
            return None
        if (self.weighted_turns and weights is not None and len(weights) > 1
                and np.ptp(weights) > 1e-9):  # fmt: skip
            return int(np.argmax(weights))
        return sum(self._sequence[:turn]) % len(self.bundles)

    def classifiers_replaced(self, resources: ResourceTransfer | None) -> frozenset[str]:
        """The sources whose resource-failure classifier ``resources`` stands in for: those it
        judges, unless ``keep_resource_classifiers`` keeps their classifiers beside it."""
        if resources is None or self.keep_resource_classifiers:
            return frozenset()
        return resources.replaced

    def design_score(
        self, sources: Sequence[Source], which: int, resources: ResourceTransfer | None = None
    ) -> np.ndarray:
        """The score source ``which``'s design proposal ranks by (lower first): the source's
        best *measured* configurations first, in their measured order (a measurement beats a
        prediction: the ensemble's mean smooths an isolated optimum away), then its predicted
        value, configurations it expects to fail (transferable kinds, P > 0.5) last. Where
        ``resources`` replaces the source's resource classifier, the configurations it expects
        past the *target's* limits (P(fits) < 0.5) are last instead, measured best or not."""
        source = sources[which]
        replaced = resources is not None and source.bundle.label in resources.replaced
        without_classifier = source.bundle.label in self.classifiers_replaced(resources)
        expected_fail = np.zeros(source.members.shape[1], dtype=bool)
        for kind, p in source.fail.items():
            if not (without_classifier and kind == "resource"):
                expected_fail |= p > 0.5
        score = np.where(expected_fail, np.inf, source.mean)
        if source.top is not None:
            score = np.where(np.isfinite(source.top), source.top - 1e12, score)
        if replaced:  # past the target's limits even what ran best on the source fails
            assert resources is not None
            score = np.where(resources.fits < 0.5, np.inf, score)
        return score

    def indifferent(
        self, source: Source, rows: np.ndarray, resources: ResourceTransfer | None = None
    ) -> np.ndarray | None:
        """Where ``source`` cannot rank its best (``design_tolerance``): the positions in
        ``rows`` of the configurations it predicts within that fraction of its best and does
        not expect to fail, when there are more of them than ``design_pool``; None otherwise
        (or when the bundle does not model a log scale, where a fraction means nothing)."""
        if self.design_tolerance is None or source.bundle.transform != "log":
            return None
        score = self.design_score([source], 0, resources)
        mean = np.where(np.isfinite(score), source.mean, np.inf)
        if not np.isfinite(mean).any():
            return None
        near = mean <= mean.min() + np.log1p(self.design_tolerance)
        if int(near.sum()) <= self.design_pool:
            return None
        keep = near if self.flat_spread == "near" else np.isfinite(score)
        inside = np.flatnonzero(keep[rows])
        return inside if len(inside) else None

    def fit(
        self,
        *,
        X: np.ndarray,
        y: np.ndarray,
        ok: np.ndarray,
        statuses: Sequence[str],
        observed: Sequence[Source],
        candidates: Sequence[Source],
        X_candidates: np.ndarray,
        target_device: Mapping[str, Any] | None,
        rng: np.random.Generator,
        n_models: int,
        seed: int,
        n_jobs: int,
        replaced: frozenset[str] = frozenset(),
    ) -> TransferFit:
        """Fit the warm-started performance model on the target's measurements.

        ``X``: features of every measurement; ``y``: the transformed objective of the ``ok``
        ones, in order; ``observed``/``candidates``: the sources at the measurements and at the
        candidates (same order as ``self.bundles``); ``replaced``: the sources whose resource
        classifier a :class:`ResourceTransfer` replaces (left out of ``p_ok``).
        """
        Xok = X[ok]
        labels = [s.bundle.label for s in candidates]
        maps = []
        for obs, cand in zip(observed, candidates, strict=True):
            maps.append(affine_map(obs.mean[ok], y, cand.spread))
        mapped_obs = [a * o.mean[ok] + b for (a, b), o in zip(maps, observed, strict=True)]
        target = PerformanceModel(n_models=n_models, seed=seed, n_jobs=n_jobs)
        enough = len(y) >= 3
        oob = None
        if self.mode != "feature" and enough:
            target.fit(Xok, y)
            members = target.predict_members(Xok)
            mask = target.out_of_bag(len(y))
            counted = mask.sum(axis=0)
            oob = np.where(counted > 0, (members * mask).sum(axis=0) / np.maximum(counted, 1),
                           np.nan)  # fmt: skip
        preds = [*mapped_obs, oob] if oob is not None else mapped_obs
        prior = None
        weights = ranking_weights(preds, y, rng)
        w_src = weights[: len(candidates)]
        w_target = float(weights[-1]) if oob is not None else 0.0
        total = float(w_src.sum())
        share = w_src / total if total > 0 else np.full(len(w_src), 1.0 / len(w_src))
        prior_cand = sum(
            w * (a * c.mean + b) for w, (a, b), c in zip(share, maps, candidates, strict=True)
        )
        prior_obs = sum(w * m for w, m in zip(share, mapped_obs, strict=True))
        prior_std = np.sqrt(sum(
            (w * a) ** 2 * c.members.var(axis=0)
            for w, (a, _), c in zip(share, maps, candidates, strict=True)
        ))  # fmt: skip
        if self.mode == "prior":
            if oob is not None:
                mean, std = target.predict(X_candidates, return_std=True)
            else:  # too few measurements for a model of the target: the prior alone
                mean, std = prior_cand, prior_std
            spread = float(np.std(prior_cand)) or 1.0
            decay = 10  # as many measurements as a cold start's design: full strength until then
            strength = self.prior_strength * (1.0 - w_target) * decay / max(decay, len(ok))
            prior = np.exp(-strength * (prior_cand - prior_cand.min()) / spread)
        elif self.mode == "stack" and oob is not None:
            t_mean, t_std = target.predict(X_candidates, return_std=True)
            mean = w_target * t_mean + (1 - w_target) * prior_cand
            std = np.sqrt((w_target * t_std) ** 2 + ((1 - w_target) * prior_std) ** 2)
        elif self.mode == "stack" or (self.mode == "residual" and len(y) < 2):
            mean, std = prior_cand, prior_std
        elif self.mode == "residual":
            lam = 1.0 - w_target
            base_obs = lam * prior_obs + (1 - lam) * y.mean()
            base_cand = lam * prior_cand + (1 - lam) * y.mean()
            residual = PerformanceModel(n_models=n_models, seed=seed, n_jobs=n_jobs)
            residual.fit(Xok, y - base_obs)
            r_mean, r_std = residual.predict(X_candidates, return_std=True)
            mean, std = base_cand + r_mean, r_std
        else:  # feature
            stacked = PerformanceModel(n_models=n_models, seed=seed, n_jobs=n_jobs)
            stacked.fit(np.column_stack([Xok, prior_obs]), y)
            mean, std = stacked.predict(np.column_stack([X_candidates, prior_cand]),
                                        return_std=True)  # fmt: skip
        p_ok, confidence = self._failure_factor(observed, candidates, share, statuses,
                                                target_device, replaced)  # fmt: skip
        return TransferFit(
            mean=np.asarray(mean, dtype=np.float64),
            std=np.asarray(std, dtype=np.float64),
            p_ok=p_ok,
            prior=prior,
            weights={
                **{lab: float(w) for lab, w in zip(labels, w_src, strict=True)},
                "target": w_target,
            },
            maps={lab: m for lab, m in zip(labels, maps, strict=True)},
            confidence=confidence,
        )

    def failure_factor(
        self,
        observed: Sequence[Source],
        candidates: Sequence[Source],
        statuses: Sequence[str],
        target_device: Mapping[str, Any] | None,
        replaced: frozenset[str] = frozenset(),
    ) -> np.ndarray:
        """P(no transferred failure) per candidate, the sources weighted equally."""
        share = np.full(len(candidates), 1.0 / len(candidates))
        return self._failure_factor(
            observed, candidates, share, statuses, target_device, replaced
        )[0]

    def _failure_factor(
        self,
        observed: Sequence[Source],
        candidates: Sequence[Source],
        share: np.ndarray,
        statuses: Sequence[str],
        target_device: Mapping[str, Any] | None,
        replaced: frozenset[str] = frozenset(),
    ) -> tuple[np.ndarray, dict[str, float]]:
        status = np.asarray(list(statuses), dtype=object)
        n = candidates[0].members.shape[1]
        factor = np.ones(n)
        confidence: dict[str, float] = {}
        for w, obs, cand in zip(share, observed, candidates, strict=True):
            for kind, p_fail in cand.fail.items():
                model = cand.bundle.failures[kind]
                if not model.count or (kind == "resource" and cand.bundle.label in replaced):
                    continue
                prior, _ = failure_prior(kind, model.limits, cand.bundle.device, target_device)
                expected = obs.fail[kind] > 0.5
                c = failure_confidence(prior, expected, status == kind)
                confidence[f"{cand.bundle.label}:{kind}"] = c
                factor *= 1.0 - w * c * p_fail
        return np.clip(factor, 0.0, 1.0), confidence
