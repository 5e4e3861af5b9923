"""SurrogateSampler: the Optuna sampler that learns from every trial, failures included.

Glue over the pure parts (:mod:`.features`, :mod:`.performance`, :mod:`.residual`,
:mod:`.feasibility`, :mod:`.acquisition`, :mod:`.diversity`). Per suggestion it reads the
study's trials:

* COMPLETE trials teach the performance model (their value; a Gaussian process on its
  out-of-bag errors gives the uncertainty) and the feasibility model (ok);
* FAIL trials teach the feasibility model (a failure of their ``status``; a FAIL without one is a
  generic failure). FAIL trials marked ``interrupted`` or ``duplicate_of``, and ``constraint``
  ones, teach nothing: they say nothing about the kernel;
* RUNNING and WAITING trials are pending work of this or another worker: never proposed again,
  and candidates near them are penalised so that one batch spreads out.

Two ways to describe the space:

* a :class:`~surrotune.space.SearchSpace` (surrotune's runner): the whole configuration is
  proposed in ``sample_relative``, chosen over the enumerated feasible set (or a large random
  pool of it when it is too large to enumerate), so no known constraint is ever broken and no
  configuration is proposed twice;
* nothing (plain Optuna): the space is the intersection of the distributions of finished trials;
  the first trial (and parameters outside that space) come from a ``RandomSampler``, later ones
  from a pool of random and mutated configurations scored by the models; ``is_feasible`` filters
  the pool.

With ``warm_start`` (one or more :class:`~surrotune.surrogate.bundle.ModelBundle`, needs a
SearchSpace), the models saved on another GPU choose part of the initial design and stay in the
search as a prior that fades (:mod:`surrotune.surrogate.transfer`).

Models are refitted on a schedule (when the observations grew by ``refit_growth``, at least one)
and kept on the instance keyed by the number of observations, so most suggestions only score the
cached predictions: a few vectorised array operations over the candidate set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import optuna
import pandas as pd
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from surrotune.counters.policy import PREDICTION_ATTR
from surrotune.result import Status
from surrotune.sampling import held_params
from surrotune.space import SearchSpace, SpaceError, SpaceTooLarge
from surrotune.surrogate.acquisition import (
    acquisition_scores,
    boundary_scores,
    ensemble_expected_improvement,
    expected_improvement,
    feasibility_gate,
    max_value_entropy,
)
from surrotune.surrogate.counter_model import (
    MIN_PROFILED,
    CounterModel,
    counter_row,
    trial_counters,
)
from surrotune.surrogate.diversity import (
    MAXIMIN_POOL,
    greedy_maximin,
    greedy_maxpro,
    min_distances,
    proximity,
)
from surrotune.surrogate.feasibility import FeasibilityModel
from surrotune.surrogate.features import (
    DeriveFn,
    DistributionEncoder,
    alignment_columns,
    derive_columns,
    make_features,
    positive_columns,
    raw_values,
)
from surrotune.surrogate.geometry import LaunchShape
from surrotune.surrogate.performance import (
    CopulaScale,
    PerformanceModel,
    PowerScale,
    objective_transform,
    transform_objective,
)
from surrotune.surrogate.residual import ResidualGP, out_of_bag_residuals
from surrotune.surrogate.resources import ResourceFeatures, ResourceModel
from surrotune.verdicts import demoted_trials

if TYPE_CHECKING:
    from surrotune.surrogate.bundle import ModelBundle
    from surrotune.surrogate.transfer import ResourceTransfer, Source, TransferFit, WarmStart

__all__ = ["SurrogateSampler"]

#: statuses that say nothing about the kernel (never compiled): not learned
_NOT_LEARNED = {Status.CONSTRAINT.value}
_ACQUISITIONS = ("ei", "ei-members", "ei-kde", "mes")
#: the acquisitions that rank by the ensemble's members; the others read the mean and spread
_MEMBER_ACQUISITIONS = ("ei-members", "ei-kde")
_DESIGNS = {"maximin": greedy_maximin, "maxpro": greedy_maxpro}
_BOUNDARY_SCORES = ("uncertainty", "acquisition")
_OBJECTIVE_SCALES = ("log", "copula", "power")
_UNCERTAINTIES = ("ensemble", "gp", "gp-spread")
#: ok observations before a ``uncertainty="gp"`` model is fitted (the ensemble's spread before)
_MIN_RESIDUAL_ROWS = 8
#: the label of a FAIL trial without a ``status`` attribute
GENERIC_FAILURE = "fail"


@dataclass
class _Observed:
    """The study's trials, as the models need them (rows of features, in trial order)."""

    features: list[np.ndarray] = field(default_factory=list)
    encoded: list[np.ndarray] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)  # None for failures
    statuses: list[str] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    pending: list[np.ndarray] = field(default_factory=list)  # encoded rows
    taken: set[Any] = field(default_factory=set)  # keys (ranks or tuples)
    failed_keys: list[Any] = field(default_factory=list)
    keys: list[Any] = field(default_factory=list)  # aligned with values
    #: the learned trials' user attributes and the device limits, once read (_resource_attrs)
    resource_attrs: tuple[list[dict[str, Any]], dict[str, Any] | None] | None = None

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def n_ok(self) -> int:
        return sum(v is not None for v in self.values)

    def tried(self, dim: int) -> np.ndarray:
        """Every measured or pending configuration, encoded, as an ``(n, dim)`` array."""
        return np.array(self.encoded + self.pending).reshape(-1, dim)

    def ok_keys_best_first(self, direction: str) -> list[Any]:
        """The keys of the ok observations, best value first; ties keep trial order."""
        sign = -1.0 if direction == "maximize" else 1.0
        ok = [(sign * v, k) for v, k in zip(self.values, self.keys, strict=True) if v is not None]
        return [k for _, k in sorted(ok, key=lambda vk: vk[0])]


def _elite_index(table: _Table, obs: _Observed, direction: str, k: int) -> np.ndarray | None:
    """The value positions (``(m, d)``, m ≤ k) of the k best ok observations, best first; None
    where there is none or the observations are not table rows."""
    ok = obs.ok_keys_best_first(direction)
    if not ok or not isinstance(ok[0], (int, np.integer)):
        return None
    return table.index_of_keys(np.array(ok[:k], dtype=np.int64))


class SurrogateSampler(BaseSampler):
    """Proposes configurations by expected improvement × P(ok) − diversity penalty.

    Args:
        space: surrotune's search space; then whole configurations are proposed over its
            feasible set. Without it, the space is inferred from the trials' distributions.
        is_feasible: ``params -> bool``: further known constraints; infeasible candidates are
            never proposed.
        seed: seeds everything; two studies with the same seed and outcomes get the same
            proposals.
        n_startup_trials: observations (ok or failed) before the models are used; until then
            proposals follow a space-filling (greedy maximin) design.
        design_fits: None (default) draws the space-filling design from every allowed
            configuration. A probability p: once a design point has failed for its resources,
            the rest of the design is drawn among the configurations the resource model
            (``resource_model``) gives P(fits) >= p. A maximin design runs to the ends of
            every range, where the largest tiles outgrow the shared memory, and a failed
            design point teaches the performance model nothing.
        design_pool: each space-filling proposal is the farthest from those before among this
            many random candidates: the default (``MAXIMIN_POOL``, 2,048: the whole of most
            spaces) spreads the design to the space's corners; 1 makes it a random design; in
            between, a compromise. Under measurement (docs/BENCHMARKS.md).
        design_criterion: how the space-filling design spreads: ``"maximin"`` (each proposal
            the farthest from those before) or ``"maxpro"`` (the maximum projection criterion:
            even coverage of every parameter's values, interior ones included;
            :func:`~surrotune.surrogate.diversity.greedy_maxpro`). A warm start's space-filling
            proposals and its spread over a flat source's near-best set use it too.
        derive: optional ``frame -> DataFrame`` of extra numeric features per configuration.
        pairwise: add log2 products and ratios of positive numeric parameters as features.
        n_models: performance ensemble size (the uncertainty of expected improvement).
        refit_growth: refit when the observations grew by this fraction (at least one).
        refit_every_below: up to this many observations, refit after every new one (the
            growth schedule above it): at a tuning budget's few hundred trials a refit costs a
            fraction of a second, while a proposal from a model that has not seen the last
            evaluations repeats their mistakes (docs/BENCHMARKS.md).
        marginal_share: probability per proposal of choosing by the parameters' marginal
            densities instead (TPE's ratio l(x)/g(x) of the good tenth's value frequencies
            over the rest's, failures among the rest, over the feasible unevaluated candidates
            that pass the P(ok) gate): a corner that every parameter's good values point to is
            found by its marginals before the trees resolve it. 0.1 since 2026-12-02: over
            the 14 recordings at 20 seeds, the mean methodology score 0.669 against 0.644 and
            fewer evaluations to 98 % on six of the nine datasets where the goal is missed
            (docs/BENCHMARKS.md).
        xi: expected-improvement margin on the model's scale (``objective_scale``, standardised).
        acquisition: ``"ei"``: expected improvement under a normal distribution with the
            ensemble's mean and spread; ``"ei-members"``: the improvement averaged over the
            ensemble's members themselves; ``"ei-kde"``: under their kernel density
            (:func:`~surrotune.surrogate.acquisition.ensemble_expected_improvement`). They
            differ where the members disagree in two camps, as around a lone slow measurement
            that only some bootstrap resamples hold: there the normal's spread is wide and
            promises improvement that no member predicts. ``"ei"`` stays the default: on the
            14 recordings (20 seeds) ``"ei-members"`` raised the mean methodology score from
            0.678 to 0.691 (reduction 0.14 to 0.51, transpose 0.60 to 0.65) but needed more
            evaluations to 98 % on all five convolution recordings of Kernel Tuner (A100 146
            to 188.5, W7800 87 to 108.5), where the goal is furthest; ``"ei-kde"`` ran close
            to ``"ei"`` on the four recordings it was screened on, neither gain nor loss
            kept (docs/BENCHMARKS.md).
            ``"mes"``: max-value entropy search (Wang and Jegelka 2017) on the same mean and
            spread (:func:`~surrotune.surrogate.acquisition.max_value_entropy`): what a
            measurement tells about the optimum's value, not what it gains itself. Off by
            default, mixed at 20 seeds (the H100 host's CPU): convolution A100 152 evaluations
            to 98 % against 181.5 (score 0.39 against 0.27), convolution_h200 40 against 56.5,
            gemm_h200 92.5 against 109.5, but convolution W7800 98.5 against 70.5; the small
            targets level (docs/BENCHMARKS.md, "Two other acquisitions"). Over all twenty
            recordings, paired by seed, level: the score +0.007 on average, significantly
            more evaluations on three recordings and significantly fewer on none
            (docs/BENCHMARKS.md, "Max-value entropy search on every recording").
        gate_threshold: candidates with P(ok) below it are not proposed ...
        gate_epsilon: ... except with this probability per proposal (the gate is skipped).
        boundary_share: probability per proposal of choosing among candidates one step from a
            known failure, ranked by ``boundary_score`` (needs a SearchSpace). Off by default:
            on convolution_milo/A100 and gemm_h200 (5 seeds) it did not help reach the optimum,
            nor, at 0.2 with either score, on transpose, reduction and convolution_h200 (20
            seeds, docs/BENCHMARKS.md), whose near-optimal configurations sit at a failure
            boundary.
        boundary_score: how a boundary proposal ranks those candidates: ``"uncertainty"``
            (default: P(ok) nearest 0.5 first, weighted by the expected improvement, to learn
            where the boundary runs) or ``"acquisition"`` (the usual expected improvement times
            P(ok), only among them: fast kernels often sit one step from a resource limit, the
            largest tile that still fits).
        diversity_weight: penalty weight for proximity to evaluated configurations (off by
            default, measured like ``boundary_share``; pending ones are always penalised).
        pending_weight: penalty weight for proximity to pending (RUNNING/WAITING) ones.
        local_share: the share of proposals restricted to configurations one parameter away
            (up to ``local_radius`` parameters away) from the ``local_elites`` best measured
            ones.
        local_radius: see ``local_share`` (1 by default: the elites' one-parameter neighbours).
        subspace_share: the share of proposals restricted to the configurations that share
            every parameter value the ``subspace_elites`` best measured configurations agree on
            (off by default). Where a kernel's best configurations share a few settings (a
            tile shape, a memory path) and differ in the rest, its optimum can stand alone
            among them, slower configurations all around it, so that a smooth model ranks it
            below its neighbours; this sweeps the elites' common subspace by expected
            improvement instead of their one-parameter neighbours only.
        subspace_elites: see ``subspace_share``.
        explore_share: the share of proposals that go to the candidate *farthest* from every
            evaluated (and pending) configuration among those the model ranks in its best
            ``explore_top`` fraction (and the gate lets through). An ensemble of trees is
            confident where it has no data, so expected improvement alone settles in the first
            good basin it finds; this sends a share of the budget to the regions the model
            believes in but has never measured (on convolution W6600 the best basin is 16 %
            faster than the second and far from it). See docs/BENCHMARKS.md.
        explore_top: see ``explore_share``.
        design_on_stall: 0 (default) ends the space-filling design after ``n_startup_trials``;
            k > 0 adds one greedy-maximin point over the whole space (corners included, whatever
            ``design_pool``) each time the best value has gone k evaluations without improving,
            at most ``design_on_stall_max`` of them: a design whose length follows the search's
            progress, short where the models find the top at once, longer where they settle.
            Cold starts over a SearchSpace only, and only while no trial is pending.
        design_on_stall_max: see ``design_on_stall``.
        explore_after_stall: 0 (default) draws ``explore_share`` on every proposal; k > 0 only
            once the best value has not improved for k evaluations (failures count): a search
            that keeps improving keeps exploiting, one that has settled in a basin looks away.
        thompson_share: the share of proposals chosen by Thompson sampling (Thompson 1933;
            Russo et al. 2018) instead of expected improvement: one of the ensemble's members
            plus one joint draw of the residual GP's error over the ``thompson_pool``
            candidates of lowest lower confidence bound, and the best of that draw (gate
            applied). It explores where the model's own uncertainty says a better
            configuration may be, correlated over neighbours (a whole region moves together,
            as one plausible function would), where ``explore_share`` goes where nothing was
            measured. With ``uncertainty="ensemble"`` the draw is a member alone.
        thompson_pool: see ``thompson_share``.
        use_classifier: False switches the failure classifier off (P(ok) = 1, no gate): the
            ablation that shows what learning from failures is worth.
        resource_model: learn the compile-time resources (shared memory, registers per block,
            threads per block) that every compiled trial reports and a resource failure's
            message states, and multiply P(ok) by the probability that a candidate fits the
            device's limits (:mod:`surrotune.surrogate.resources`). Trials that report no
            resources (Kernel Tuner's recordings) leave it out.
        resource_features: where the resource model learned something, its predicted shared
            memory and registers per thread, and the theoretical occupancy they give on the
            device (:class:`~surrotune.surrogate.resources.ResourceFeatures`), become columns
            of the performance model, for the training rows and the candidates alike;
            ``"occupancy"``: the occupancy columns alone. Off: measured in docs/BENCHMARKS.md
            ("Predicted resources and occupancy as features"). Not used by a warm start's
            models.
        length_scale: distance (in the [0, 1] encoding) at which the penalty falls to 1/e.
        max_candidates: pool size for spaces too large to enumerate.
        pool_size: random pool per proposal on the plain-Optuna path.
        n_jobs: XGBoost threads.
        warm_start: model bundles saved on other GPUs (or their paths, or a
            :class:`~surrotune.surrogate.transfer.WarmStart`): their best predicted
            configurations, kept diverse, are the first proposals, and they stay in the
            performance model as a prior weighted by how well each ranks this study's
            measurements (docs/transfer.md). Needs ``space``; a bundle learned on other
            parameters (or values it never measured) is refused with a BundleError naming them.
        transfer_mode: how the sources' prior enters the search: ``prior`` (a fading factor on
            expected improvement), ``stack``, ``residual`` or ``feature``
            (:mod:`surrotune.surrogate.transfer`).
        n_warm_design: proposals of the initial design that the sources choose (they replace
            the ``n_startup_trials`` space-filling ones) ...
        n_warm_fill: ... and space-filling ones interleaved with them (none by default: the
            measured defaults, docs/transfer.md).
        warm_params: further :class:`~surrotune.surrogate.transfer.WarmStart` options
            (``design_gap``, ``adaptive``, ...), for measuring them
            (benchmarks/warm_design_variants.py).
        counter_features: once at least ``MIN_PROFILED`` (10) learned trials carry Nsight
            Compute counters (the trial attribute ``counters``, or the study attribute
            ``counters.<number>``), small models learn configuration → counters on them and
            their predictions become extra features of the performance model and the failure
            classifier (:mod:`surrotune.surrogate.counter_model`); with fewer, nothing changes.
            Off by default: see docs/BENCHMARKS.md, "Counter-informed sampler (issue 6)". Not
            used by a warm start's models.
        launch_shape: the experiment's launch grid and block at its sizes (and the GPU's SM
            count), which ``surrotune bench`` fills in from a recording when ...
        launch_features: ... and, where True, blocks, threads per block, waves and the last
            wave's fill become features (:mod:`surrotune.surrogate.geometry`), and a warm
            start's sources are read at these sizes, their measured best configurations leading
            the design only where they were measured at these sizes. Off by default: measured
            in docs/BENCHMARKS.md ("Launch geometry"), it helped at one GEMM size and not at the
            other. Needs ``space``.
        cap_quantile: where given, the transformed objective is capped at this quantile of the
            measured values before the performance model is fitted, so that its trees spend
            their splits on ranking the good configurations rather than on how slow the slow
            ones are (the acquisition only cares about the good end).
        objective_scale: what the performance model learns. ``"copula"`` (the default since
            2026-12-03): the normal scores by rank of the log of a time (the negative log of a
            rate) (:class:`~surrotune.surrogate.performance.CopulaScale`), the order and
            nothing else, so that a few very slow measurements cannot widen the ensemble's
            spread over a region they barely touch; ``"log"``: that log itself (the default
            before); ``"power"``: a Yeo-Johnson transform of the log
            (:class:`~surrotune.surrogate.performance.PowerScale`), which pulls the slow tail
            in only as far as its skew asks. Over the 14 recordings at 20 seeds the mean
            methodology score was 0.719 with the copula, 0.678 with the log and 0.667 with
            the power transform (docs/BENCHMARKS.md, "The objective's scale"). Expected
            improvement is computed on the same scale; the recorded prediction is mapped back
            to the objective's units.
        uncertainty: where expected improvement's mean and spread come from. ``"gp"`` (the
            default): the ensemble's mean corrected, and its spread replaced, by a Gaussian
            process on the members' out-of-bag errors over the encoded parameters
            (:class:`~surrotune.surrogate.residual.ResidualGP`): a spread that grows with the
            distance from what was measured, which the trees' spread does not (mean score 0.741
            against 0.719 on the 14 recordings, docs/BENCHMARKS.md). ``"ensemble"``: the
            bootstrap members' mean and spread, the default before. ``"gp-spread"``: the GP's
            spread only, the ensemble's mean kept (needs ``acquisition="ei"``). With the member
            acquisitions, ``"gp"`` shifts the members by the GP's correction and their own
            spread ranks. Not used by a warm start's models.
        alignment: add, for every integer parameter that mixes powers of two with other values,
            its alignment (the power of two that divides it) and whether it is a power of two
            as features (:func:`~surrotune.surrogate.features.alignment_features`), on both
            paths. On by default: on Kernel Tuner's convolution spaces it took the evaluations
            to 98 % of the optimum from 194 to 121.5 on the A100 and from 194.5 to 148 on the
            W7800 (median of 20 seeds; docs/BENCHMARKS.md, "Alignment features").
        model_params: further :class:`~surrotune.surrogate.performance.PerformanceModel`
            options of the performance model (``max_depth``, ``full_mean``, ...), for
            measuring them (docs/BENCHMARKS.md); a warm start's models keep their own.
        forest_below: 0 (default) or k: while fewer than k measurements ran ok, the performance
            model is a forest of 50 extremely randomised trees (``PerformanceModel(forest=
            "extra")``), the XGBoost ensemble from then on. Off: the forest ranks unseen
            configurations better after a random sample, as a design is, yet searched no
            better, from the first measurements or throughout (docs/BENCHMARKS.md,
            "Forests, a ranking objective, BORE").
        feasibility_params: further :class:`~surrotune.surrogate.feasibility.FeasibilityModel`
            options of the failure classifier (``calibration``, ``calibrate_min``, ...).
        resource_params: further :class:`~surrotune.surrogate.resources.ResourceModel`
            options of the resource regressors (``softness``, ``n_estimators``, ...).
        residual_params: further :class:`~surrotune.surrogate.residual.ResidualGP` options
            of the GP on the ensemble's errors (``max_rows``, ``refit_growth``).
        portfolio: choose each proposal's strategy (expected improvement, exploration, the
            elites' neighbours) by a Hedge over how the model bears out each one's nominees
            (:meth:`_portfolio`), instead of the fixed ``explore_share`` and ``local_share``;
            ``portfolio_eta`` is its learning rate, ``portfolio_floor`` the uniform share,
            ``portfolio_reward`` how a strategy is scored (``model`` or ``outcome``);
            ``portfolio_explore`` False keeps exploration out of it, at ``explore_share``. Off:
            under measurement (docs/BENCHMARKS.md). Needs ``space``.
        counter_targets: the counters learned (names of ``COUNTER_TARGETS``); default
            ``DEFAULT_TARGETS`` (occupancy, L2 hit rate, bank conflicts, registers, spills, the
            main stalls: not the throughputs, which restate the objective).
    """

    def __init__(
        self,
        *,
        space: SearchSpace | None = None,
        is_feasible: Callable[[dict[str, Any]], bool] | None = None,
        seed: int | None = None,
        n_startup_trials: int = 10,
        design_pool: int = MAXIMIN_POOL,
        design_criterion: str = "maximin",
        design_fits: float | None = None,
        derive: DeriveFn | None = None,
        pairwise: bool = True,
        n_models: int = 5,
        refit_growth: float = 0.05,
        refit_every_below: int = 0,
        marginal_share: float = 0.1,
        xi: float = 0.0,
        acquisition: str = "ei",
        gate_threshold: float = 0.1,
        gate_epsilon: float = 0.05,
        boundary_share: float = 0.0,
        boundary_score: str = "uncertainty",
        diversity_weight: float = 0.0,
        pending_weight: float = 0.5,
        length_scale: float = 0.15,
        max_candidates: int = 50_000,
        pool_size: int = 2048,
        n_jobs: int = 1,
        use_classifier: bool = True,
        resource_model: bool = True,
        resource_features: bool | Literal["occupancy"] = False,
        local_share: float = 0.0,
        local_elites: int = 3,
        local_radius: int = 1,
        subspace_share: float = 0.0,
        subspace_elites: int = 5,
        explore_share: float = 0.2,
        explore_top: float = 0.1,
        explore_after_stall: int = 0,
        design_on_stall: int = 0,
        design_on_stall_max: int = 5,
        thompson_share: float = 0.0,
        thompson_pool: int = 1024,
        warm_start: Sequence[ModelBundle | str | Path] | WarmStart | None = None,
        transfer_mode: str = "prior",
        n_warm_design: int = 10,
        n_warm_fill: int = 0,
        warm_params: Mapping[str, Any] | None = None,
        counter_features: bool = False,
        counter_targets: Sequence[str] | None = None,
        cap_quantile: float | None = None,
        objective_scale: str = "copula",
        uncertainty: str = "gp",
        launch_shape: LaunchShape | None = None,
        launch_features: bool = False,
        alignment: bool = True,
        model_params: Mapping[str, Any] | None = None,
        forest_below: int = 0,
        feasibility_params: Mapping[str, Any] | None = None,
        resource_params: Mapping[str, Any] | None = None,
        residual_params: Mapping[str, Any] | None = None,
        portfolio: bool = False,
        portfolio_eta: float = 0.2,
        portfolio_floor: float = 0.1,
        portfolio_reward: str = "model",
        portfolio_explore: bool = True,
    ) -> None:
        self._space = space
        self._is_feasible = is_feasible
        self._seed = (
            int(seed) if seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
        )
        self._random = RandomSampler(seed=self._seed)
        self.n_startup_trials = n_startup_trials
        if design_pool < 1:
            raise ValueError(f"design_pool must be at least 1; got {design_pool}")
        self.design_pool = design_pool
        if design_fits is not None and not 0.0 < design_fits < 1.0:
            raise ValueError(f"design_fits must be None or in (0, 1); got {design_fits!r}")
        self.design_fits = design_fits
        if design_criterion not in _DESIGNS:
            raise ValueError(
                f"design_criterion must be one of {tuple(_DESIGNS)}; got {design_criterion!r}"
            )
        self.design_criterion = design_criterion
        self.derive = derive
        self.pairwise = pairwise
        self.n_models = n_models
        self.refit_growth = refit_growth
        self.refit_every_below = refit_every_below
        self.marginal_share = marginal_share
        self.xi = xi
        if acquisition not in _ACQUISITIONS:
            raise ValueError(f"acquisition must be one of {_ACQUISITIONS}; got {acquisition!r}")
        self.acquisition = acquisition
        self.gate_threshold = gate_threshold
        self.gate_epsilon = gate_epsilon
        self.boundary_share = boundary_share
        if boundary_score not in _BOUNDARY_SCORES:
            raise ValueError(
                f"boundary_score must be one of {_BOUNDARY_SCORES}; got {boundary_score!r}"
            )
        self.boundary_score = boundary_score
        self.diversity_weight = diversity_weight
        self.pending_weight = pending_weight
        self.use_classifier = use_classifier
        self.resource_model = resource_model
        if resource_features not in (True, False, "occupancy"):
            raise ValueError(
                f"resource_features must be True, False or 'occupancy'; got {resource_features!r}"
            )
        self.resource_features = resource_features
        self.local_share = local_share
        self.local_elites = local_elites
        if local_radius < 1:
            raise ValueError(f"local_radius must be 1 or more; got {local_radius}")
        self.local_radius = local_radius
        if not 0.0 <= subspace_share <= 1.0:
            raise ValueError(f"subspace_share must be in [0, 1]; got {subspace_share}")
        if subspace_elites < 2:
            raise ValueError(f"subspace_elites must be 2 or more; got {subspace_elites}")
        self.subspace_share = subspace_share
        self.subspace_elites = subspace_elites
        self.explore_share = explore_share
        if explore_after_stall < 0:
            raise ValueError(f"explore_after_stall must be 0 or more; got {explore_after_stall}")
        self.explore_after_stall = explore_after_stall
        if design_on_stall < 0 or design_on_stall_max < 0:
            raise ValueError(
                "design_on_stall and design_on_stall_max must be 0 or more; got "
                f"{design_on_stall} and {design_on_stall_max}"
            )
        self.design_on_stall = design_on_stall
        self.design_on_stall_max = design_on_stall_max
        self._stall_designs: set[int] = set()  # trial numbers proposed by design_on_stall
        self.explore_top = explore_top
        if not 0.0 <= thompson_share <= 1.0:
            raise ValueError(f"thompson_share must be in [0, 1]; got {thompson_share}")
        self.thompson_share = thompson_share
        if thompson_pool < 1:
            raise ValueError(f"thompson_pool must be at least 1; got {thompson_pool}")
        self.thompson_pool = thompson_pool
        self.length_scale = length_scale
        self.max_candidates = max_candidates
        self.pool_size = pool_size
        self.n_jobs = n_jobs
        self.counter_features = counter_features
        self.counter_targets = counter_targets
        self.cap_quantile = cap_quantile
        if objective_scale not in _OBJECTIVE_SCALES:
            raise ValueError(
                f"objective_scale must be one of {_OBJECTIVE_SCALES}; got {objective_scale!r}"
            )
        self.objective_scale = objective_scale
        if uncertainty not in _UNCERTAINTIES:
            raise ValueError(f"uncertainty must be one of {_UNCERTAINTIES}; got {uncertainty!r}")
        if uncertainty == "gp-spread" and acquisition in _MEMBER_ACQUISITIONS:
            raise ValueError(
                f"uncertainty='gp-spread' needs acquisition='ei' or 'mes' (got {acquisition!r}): "
                "the other acquisitions rank by the members' own spread, which the GP does not "
                "change"
            )
        self.uncertainty = uncertainty
        self.launch_shape = launch_shape
        self.launch_features = launch_features
        self.alignment = alignment
        self.model_params = model_params
        self.forest_below = forest_below
        self.feasibility_params = feasibility_params
        self.resource_params = resource_params
        self.residual_params = residual_params
        self.portfolio = portfolio
        self.portfolio_eta = portfolio_eta
        self.portfolio_floor = portfolio_floor
        if portfolio_reward not in ("model", "outcome"):
            raise ValueError(
                f"portfolio_reward must be 'model' or 'outcome'; got {portfolio_reward!r}"
            )
        self.portfolio_reward = portfolio_reward
        self.portfolio_explore = portfolio_explore
        self._arm_of: dict[int, tuple[int, float]] = {}
        self._gains = np.zeros(3)
        self._nominees: list[int | None] | None = None
        self._table: _Table | None = None
        self._fit: _Fit | None = None
        self._trial_keys: dict[int, Any] = {}
        self._near: np.ndarray | None = None
        self._near_seen: set[int] = set()
        self._warm = _warm_start(
            warm_start, space, transfer_mode, n_warm_design, n_warm_fill, dict(warm_params or {})
        )
        self._warm_sources: list[Source] | None = None
        self._source_picks: set[int] = set()  # table keys the warm design's sources chose
        self._fill_picks: set[int] = set()  # ... and its space-filling proposals
        self._design_paused: tuple[int, float] | None = None  # (measurements, best) at its end
        self._design_resumed = False  # the search found nothing better: the design went on
        self._flat_sources: dict[str, int] = {}  # label -> configurations it could not rank
        self._target_device: dict[str, Any] | None = None
        #: the weights, affine maps and failure beliefs of the latest warm-started fit
        self.last_transfer: TransferFit | None = None
        #: the last refit's resource models of the sources against the target's limits
        self.last_resource_transfer: ResourceTransfer | None = None

    # ------------------------------------------------------------------ Optuna's sampler API

    def reseed_rng(self) -> None:
        self._seed = int(np.random.SeedSequence().generate_state(1)[0])
        self._random.reseed_rng()

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if self._space is not None:
            from surrotune.sampling import distributions

            return distributions(self._space)
        return _intersection(study.get_trials(deepcopy=False))

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        if len(study.directions) > 1:
            raise ValueError("SurrogateSampler supports single-objective studies only")
        rng = np.random.default_rng([self._seed, trial.number])
        if self._space is not None:
            return self._sample_space(study, trial, self._space, rng)
        return self._sample_plain(study, trial, search_space, rng)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    # ------------------------------------------------------------------ SearchSpace path

    def _sample_space(
        self, study: Study, trial: FrozenTrial, space: SearchSpace, rng: np.random.Generator
    ) -> dict[str, Any]:
        table = self._table_for(space)
        obs = self._observe_space(study, trial, table)
        available = table.allowed & ~table.isin(obs.taken)
        if not available.any():
            study.tell(trial.number, state=TrialState.FAIL)  # else it stays RUNNING forever
            raise optuna.exceptions.OptunaError(
                "SurrogateSampler: every feasible configuration has been proposed"
            )
        rows = np.flatnonzero(available)
        phase = self._design_phase(obs, _direction_of(study)) if self._warm else "search"
        if self._warm is not None and (phase == "design" or obs.n_ok < 2):
            choice = self._warm_design(study, table, obs, rows, rng, _direction_of(study))
            return table.config(int(rows[choice]))
        if phase == "fill":  # nothing stood out: look where the sources claim nothing
            design = _DESIGNS[self.design_criterion]
            pick = design(table.encoded[rows], 1, rng, existing=obs.tried(table.dim))
            return table.config(int(rows[pick[0]]))
        if self._warm is None and (obs.n < self.n_startup_trials or obs.n_ok < 2):
            among = self._fitting_rows(study, obs, table, rows)
            pick = _DESIGNS[self.design_criterion](
                table.encoded[among], 1, rng, existing=obs.tried(table.dim), pool=self.design_pool
            )
            return table.config(int(among[pick[0]]))
        if self._warm is None and self._stalled_design_due(obs, _direction_of(study), trial):
            design = _DESIGNS[self.design_criterion]
            pick = design(table.encoded[rows], 1, rng, existing=obs.tried(table.dim))
            return table.config(int(rows[pick[0]]))
        if self._warm is not None:
            fit = self._refit_warm(study, obs, table)
        else:
            fit = self._refit(study, obs, table.features.shape[1], key=("space", id(table)))
        if fit.cand_mean is None:
            fit.predict_candidates(table)
        assert fit.cand_std is not None and fit.cand_ok is not None
        self._update_near(table, obs)
        assert self._near is not None
        pending = min_distances(table.encoded[rows], np.array(obs.pending).reshape(-1, table.dim))
        boundary = None
        if (
            self.boundary_share > 0
            and obs.failed_keys
            and fit.feas.informative
            and rng.random() < self.boundary_share
        ):
            boundary = table.boundary_mask(obs.failed_keys)[rows]
        if self.portfolio:
            row = self._portfolio(table, fit, obs, rows, pending, rng, trial.number)
            _record_prediction(study, trial, obs, fit, float(fit.cand_mean[row]))
            return table.config(row)
        if self.marginal_share > 0 and rng.random() < self.marginal_share:
            row = self._marginal_choice(table, fit, obs, rows, rng)
            if row is not None:
                _record_prediction(study, trial, obs, fit, float(fit.cand_mean[row]))
                return table.config(row)
        if self.local_share > 0 and rng.random() < self.local_share:
            local = self._local_mask(table, obs, rows, fit.direction)
            if local.any():
                rows = rows[local]
                pending = pending[local]
        elif self.subspace_share > 0 and rng.random() < self.subspace_share:
            inside = self._subspace_mask(table, obs, rows, fit.direction)
            if inside.any():
                rows = rows[inside]
                pending = pending[inside]
        if self.thompson_share > 0 and rng.random() < self.thompson_share:
            choice = self._thompson_choice(
                fit, fit.cand_mean[rows], fit.cand_std[rows], fit.cand_ok[rows],
                fit.cand_members[:, rows] if fit.cand_members is not None else None,
                table.encoded[rows], pending, rng,
            )  # fmt: skip
            if choice is not None:
                _record_prediction(study, trial, obs, fit, float(fit.cand_mean[rows][choice]))
                return table.config(int(rows[choice]))
        choice = self._choose(
            fit,
            obs,
            fit.cand_mean[rows],
            fit.cand_std[rows],
            fit.cand_ok[rows],
            self._near[rows],
            pending,
            boundary,
            rng,
            prior=fit.cand_prior[rows] if fit.cand_prior is not None else None,
            members=(
                fit.cand_members[:, rows]
                if self.acquisition in _MEMBER_ACQUISITIONS and fit.cand_members is not None
                else None
            ),
        )
        _record_prediction(study, trial, obs, fit, float(fit.cand_mean[rows][choice]))
        return table.config(int(rows[choice]))

    def _fitting_rows(
        self, study: Study, obs: _Observed, table: _Table, rows: np.ndarray
    ) -> np.ndarray:
        """The design's candidates: ``rows``, or (``design_fits``, after a resource failure)
        those the resource model expects to fit; ``rows`` where it can say nothing."""
        if self.design_fits is None or "resource" not in obs.statuses or obs.n_ok < 1:
            return rows
        X, ok, *_ = self._training_set(study, obs)
        model = self._resources(study, obs, X, ok)
        if model is None:
            return rows
        fits = model.predict_fits(table.features[rows]) >= self.design_fits
        return rows[fits] if fits.any() else rows

    def _stalled_design_due(self, obs: _Observed, direction: str, trial: FrozenTrial) -> bool:
        """Whether this proposal is one of ``design_on_stall``'s space-filling points: the
        best has gone a multiple of k evaluations without improving, and fewer than
        ``design_on_stall_max`` were made (one per trial number, so a retried ask repeats it)."""
        k = self.design_on_stall
        if k <= 0 or obs.pending:
            return False
        if trial.number in self._stall_designs:
            return True
        if len(self._stall_designs) >= self.design_on_stall_max:
            return False
        stall = _since_improvement(obs.values, direction)
        if stall < k or stall % k:
            return False
        self._stall_designs.add(trial.number)
        return True

    def _thompson_choice(
        self,
        fit: _Fit,
        mean: np.ndarray,
        std: np.ndarray,
        p_ok: np.ndarray,
        members: np.ndarray | None,
        encoded: np.ndarray,
        pending: np.ndarray,
        rng: np.random.Generator,
    ) -> int | None:
        """The index of the candidate that one Thompson draw ranks best (``thompson_share``),
        or None where the gate lets nothing through. Every array holds the candidates in one
        order (``members`` is ``(K, n)``). Pending configurations are left out: a draw would
        often pick what another worker is measuring."""
        inside = np.flatnonzero((p_ok >= self.gate_threshold) & (pending > 1e-12))
        if len(inside) == 0:
            return None
        lower = mean[inside] - 2.0 * std[inside]
        pool = inside[np.argsort(lower, kind="stable")[: self.thompson_pool]]
        if members is not None:
            draw = members[int(rng.integers(len(members))), pool].copy()
        else:
            draw = mean[pool].copy()
        if fit.residual is not None:
            draw += fit.residual.sample_deviation(encoded[pool], rng)
        return int(pool[int(np.argmin(draw))])

    def _portfolio(
        self,
        table: _Table,
        fit: _Fit,
        obs: _Observed,
        rows: np.ndarray,
        pending: np.ndarray,
        rng: np.random.Generator,
        number: int,
    ) -> int:
        """The table row to propose, by a Hedge over three strategies (GP-Hedge: Hoffman,
        Brochu and de Freitas, "Portfolio allocation for Bayesian optimization", UAI 2011):
        expected improvement, exploration among the believed candidates, and expected
        improvement among the elites' one-parameter neighbours. Each nominates a candidate;
        one is chosen with probability ``∝ exp(eta * gain)``, mixed with a uniform share; at
        the next proposal every strategy's nominee is scored by the refreshed model (its
        predicted value, in standard deviations of the predictions above the best), so that
        the strategies whose nominees the data bear out gain weight, each run its own.

        With ``portfolio_reward="outcome"`` only the chosen strategy is scored, by what its
        proposal measured: 1 where it set a new best, else 0, divided by the probability it
        was chosen with (EXP3's unbiased estimate), so that the model's own optimism about
        the nominees of strategies it never tests does not decide."""
        assert fit.cand_mean is not None and fit.cand_std is not None
        assert fit.cand_ok is not None and self._near is not None
        mean = fit.cand_mean
        if self.portfolio_reward == "outcome":
            self._reward_outcomes(obs, fit.direction)
        elif self._nominees is not None:
            scale = float(np.std(mean)) or 1.0
            for arm, row in enumerate(self._nominees):
                if row is not None:
                    self._gains[arm] -= (mean[row] - mean.min()) / scale

        def nominee(among: np.ndarray | slice, explore: bool) -> int:
            """The table row ``_choose`` picks among ``rows[among]``."""
            subset = rows[among]
            choice = self._choose(
                fit, obs, mean[subset], fit.cand_std[subset], fit.cand_ok[subset],
                self._near[subset], pending[among], None, rng,
                prior=fit.cand_prior[subset] if fit.cand_prior is not None else None,
                explore=explore,
            )  # fmt: skip
            return int(subset[choice])

        every = slice(None)
        if not self.portfolio_explore and rng.random() < self.explore_share:
            return nominee(every, explore=True)  # exploration kept at its fixed share
        local = self._local_mask(table, obs, rows, fit.direction)
        nominees: list[int | None] = [
            nominee(every, explore=False),
            nominee(every, explore=True) if self.portfolio_explore else None,
            nominee(local, explore=False) if local.any() else None,
        ]
        available = np.array([n is not None for n in nominees])
        weights = np.where(
            available, np.exp(self.portfolio_eta * (self._gains - self._gains[available].max())), 0
        )
        weights = weights / weights.sum()
        uniform = available / available.sum()
        p = (1 - self.portfolio_floor) * weights + self.portfolio_floor * uniform
        arm = int(rng.choice(len(nominees), p=p))
        self._nominees = nominees
        self._arm_of[number] = (arm, float(p[arm]))
        chosen = nominees[arm]
        assert chosen is not None
        return chosen

    def _reward_outcomes(self, obs: _Observed, direction: str) -> None:
        """Score the strategies of the portfolio's proposals measured since the last call:
        ``1 / p`` to the strategy of each that set a new best (in trial order)."""
        sign = -1.0 if direction == "maximize" else 1.0
        best = math.inf
        for number, value in zip(obs.numbers, obs.values, strict=True):
            improved = value is not None and sign * value < best
            if value is not None:
                best = min(best, sign * value)
            chosen = self._arm_of.pop(number, None)
            if chosen is not None and improved:
                arm, p = chosen
                self._gains[arm] += 1.0 / p

    def _marginal_choice(
        self, table: _Table, fit: _Fit, obs: _Observed, rows: np.ndarray, rng: np.random.Generator
    ) -> int | None:
        """The table row of TPE's choice over the candidates ``rows``: per parameter, the
        frequencies of its values among the best tenth of the ok observations (l, at most 25
        of them, as Optuna's default gamma) and among the rest and the failures (g), each with
        a uniform prior of weight one; 24 candidates drawn in proportion to l(x), the one with
        the highest l(x)/g(x) chosen. Candidates whose P(ok) is under the gate are left out
        (None where none is left, or the observations are not table rows)."""
        assert fit.cand_ok is not None
        if not obs.keys or not isinstance(obs.keys[0], (int, np.integer)):
            return None
        ok = obs.ok_keys_best_first(fit.direction)
        n_good = min(math.ceil(0.1 * len(ok)), 25)
        good = np.array(ok[:n_good], dtype=np.int64)
        bad = np.array(
            ok[n_good:] + [k for v, k in zip(obs.values, obs.keys, strict=True) if v is None],
            dtype=np.int64,
        )
        candidates = rows[fit.cand_ok[rows] >= self.gate_threshold]
        if len(candidates) == 0 or len(good) == 0:
            return None
        index = table.index[candidates]

        def log_density(keys: np.ndarray) -> np.ndarray:
            """Each candidate's log density under the product of the per-parameter value
            frequencies of ``keys``."""
            positions = table.index_of_keys(keys)
            total = np.zeros(len(candidates))
            for d, size in enumerate(table.lengths):
                counts = np.bincount(positions[:, d], minlength=size) + 1.0 / size
                total += np.log(counts / counts.sum())[index[:, d]]
            return total

        log_l, log_g = log_density(good), log_density(bad)
        weights = np.exp(log_l - log_l.max())
        drawn = rng.choice(len(candidates), size=24, p=weights / weights.sum())
        return int(candidates[drawn[np.argmax((log_l - log_g)[drawn])]])

    def _local_mask(
        self, table: _Table, obs: _Observed, rows: np.ndarray, direction: str
    ) -> np.ndarray:
        """Candidates that differ from one of the best measured configurations in exactly one
        parameter: a model smooth enough to generalise misses an optimum that stands alone
        (every neighbour much slower), so a share of proposals walks the elites' coordinates."""
        elite_index = _elite_index(table, obs, direction, self.local_elites)
        if elite_index is None:
            return np.zeros(len(rows), dtype=bool)
        candidates = table.index[rows]
        differing = (candidates[:, None, :] != elite_index[None, :, :]).sum(axis=2)
        return ((differing >= 1) & (differing <= self.local_radius)).any(axis=1)

    def _subspace_mask(
        self, table: _Table, obs: _Observed, rows: np.ndarray, direction: str
    ) -> np.ndarray:
        """Candidates that hold every parameter value the ``subspace_elites`` best measured
        configurations agree on (``subspace_share``); all False where they agree on nothing
        that varies, or fewer than that many have been measured."""
        elites = _elite_index(table, obs, direction, self.subspace_elites)
        if elites is None or len(elites) < self.subspace_elites:
            return np.zeros(len(rows), dtype=bool)
        agreed = (elites == elites[0]).all(axis=0) & (table.lengths > 1)
        if not agreed.any():
            return np.zeros(len(rows), dtype=bool)
        candidates = table.index[rows]
        return (candidates[:, agreed] == elites[0, agreed]).all(axis=1)

    def _launch_target(self) -> LaunchShape | None:
        return self.launch_shape if self.launch_features else None

    def _table_for(self, space: SearchSpace) -> _Table:
        if self._table is None or self._table.space is not space:
            self._table = _Table.build(space, self, np.random.default_rng(self._seed))
            self._fit = None
            self._trial_keys = {}
            self._near = None
            self._near_seen = set()
            self._warm_sources = None
            self._gains = np.zeros(3)
            self._nominees = None
            self._arm_of = {}
        return self._table

    def _observe_space(self, study: Study, trial: FrozenTrial, table: _Table) -> _Observed:
        trials = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
        new = [t for t in trials if t.number not in self._trial_keys]
        if new:
            self._index_trials(new, table)
        obs = _Observed()
        demoted = demoted_trials(study.user_attrs)
        if self._warm is not None and self._target_device is None:
            self._target_device = _device_of(study, trials)
        for t in trials:
            key = self._trial_keys.get(t.number)
            if key is None:
                continue
            if t.state in (TrialState.RUNNING, TrialState.WAITING):
                obs.taken.add(key)
                obs.pending.append(table.encoded_of(key))
                continue
            learned = _learned(t, demoted)
            if t.state.is_finished() and not t.user_attrs.get("interrupted"):
                obs.taken.add(key)
            if learned is None:
                continue
            value, status = learned
            obs.features.append(table.features_of(key))
            obs.encoded.append(table.encoded_of(key))
            obs.values.append(value)
            obs.statuses.append(status)
            obs.numbers.append(t.number)
            obs.keys.append(key)
            if value is None:
                obs.failed_keys.append(key)
        return obs

    def _index_trials(self, trials: Sequence[FrozenTrial], table: _Table) -> None:
        """Record each trial's key once (params never change); incomplete ones are retried."""
        names = table.space.names
        full = []
        for t in trials:
            params = held_params(t)
            if set(names) <= set(params):
                full.append((t.number, {n: params[n] for n in names}))
        if not full:
            return
        try:
            index = table.space.index_of(pd.DataFrame([p for _, p in full]))
            keys = table.keys_of(index)
            for (number, _), key in zip(full, keys, strict=True):
                self._trial_keys[number] = key
        except SpaceError:
            for number, params in full:
                try:
                    index = table.space.index_of(params)
                except SpaceError:
                    self._trial_keys[number] = None  # outside the space: ignored
                    continue
                self._trial_keys[number] = table.keys_of(index)[0]
        for number, params in full:
            key = self._trial_keys.get(number)
            if key is not None:
                table.remember(key, params)

    def _update_near(self, table: _Table, obs: _Observed) -> None:
        """Nearest-evaluated distance per candidate, updated with the new observations only."""
        if self._near is None:
            self._near = np.full(len(table.keys), np.inf)
        fresh = [i for i, number in enumerate(obs.numbers) if number not in self._near_seen]
        if fresh:
            rows = np.array([obs.encoded[i] for i in fresh])
            self._near = np.minimum(self._near, min_distances(table.encoded, rows))
            self._near_seen.update(obs.numbers[i] for i in fresh)

    # ------------------------------------------------------------------ warm start

    def _sources(self, table: _Table) -> list[Source]:
        """The warm start's sources on every candidate, computed once per table."""
        assert self._warm is not None
        if self._warm_sources is None:
            self._warm_sources = self._warm.sources(
                table.frame, self._launch_target(), table.space.sizes
            )
        return self._warm_sources

    @property
    def _design_over(self) -> bool:
        """The warm design ended early (``WarmStart.design_found``) and has not resumed."""
        return self._design_paused is not None and not self._design_resumed

    def _design_phase(self, obs: _Observed, direction: str) -> str:
        """Where the warm start stands: ``design`` (the sources' picks), ``fill`` (space-filling
        after a design where nothing stood out: ``fill_after``) or ``search``. The design ends
        early once a pick stands out (``design_stop_ratio``), and goes on with the sources'
        remaining picks where the search then cannot beat it (``design_resume_after``)."""
        warm = self._warm
        assert warm is not None
        proposed = obs.n + len(obs.pending)
        if self._design_resumed:
            return "design" if len(self._source_picks) < warm.n_design else "search"
        in_design = proposed < warm.design_length
        if in_design and self._design_paused is None and warm.design_found(obs.values, direction):
            self._design_paused = (obs.n, _best_transformed(obs.values, direction))
        if self._design_paused is not None:
            n0, best0 = self._design_paused
            if (warm.design_resume_after is not None and obs.n - n0 >= warm.design_resume_after
                    and _best_transformed(obs.values, direction) >= best0
                    and len(self._source_picks) < warm.n_design):  # fmt: skip
                self._design_resumed = True
                return "design"
            return "search"
        if in_design:
            return "design"
        if warm.fill_after and proposed < warm.design_length + warm.fill_after:
            return "search" if warm.design_found(obs.values, direction) else "fill"
        return "search"

    def warm_design_summary(self) -> list[str]:
        """How the warm start's initial design went, one line each, for the end of a run: how
        many proposals the sources chose, whether one stood out and ended it early (and
        whether it resumed), which sources could not rank their best."""
        if self._warm is None or not (self._source_picks or self._fill_picks):
            return []
        picks = len(self._source_picks)
        line = f"design: {picks} proposal{'s' if picks != 1 else ''} chosen by the sources"
        if self._fill_picks:
            line += f", {len(self._fill_picks)} space-filling"
        if self._design_paused is not None:
            line += f"; a pick stood out after {self._design_paused[0]} measurements"
            line += (", the search found nothing better and the design went on"
                     if self._design_resumed else ", the search took over")  # fmt: skip
        lines = [line]
        tolerance = f"{100 * (self._warm.design_tolerance or 0):g} %"
        for label, count in self._flat_sources.items():
            lines.append(
                f"{label} could not rank its best ({count:,} configurations within {tolerance} "
                "of it): its picks spread over them"
            )
        moved = self.last_resource_transfer
        if moved is not None and moved.limits:
            limits = ", ".join(f"{name.replace('_', ' ')} {value:,.0f}"
                               for name, value in moved.limits.items())  # fmt: skip
            lines.append(
                f"resource limits: {', '.join(sorted(moved.replaced))}'s resource model judged "
                f"against this GPU's ({limits})"
            )
        return lines

    def _warm_design(
        self,
        study: Study,
        table: _Table,
        obs: _Observed,
        rows: np.ndarray,
        rng: np.random.Generator,
        direction: str = "minimize",
    ) -> int:
        """The next proposal of the warm initial design (an index into ``rows``): a source's
        best predicted configuration kept apart from the others, or a space-filling one."""
        from surrotune.surrogate.transfer import pick_design

        assert self._warm is not None
        existing = obs.tried(table.dim)
        bests = self._design_bests(obs, direction) if self._warm.adaptive else (None, None)
        sources = self._sources(table)
        resources = self._resource_transfer(study, table, obs)
        weights = None
        if self._warm.weighted_turns and len(sources) > 1:
            weights = self._design_weights(table, obs, direction, rng)
        turn = obs.n + len(obs.pending)
        if self._design_resumed:  # the search's proposals in between are not the design's
            turn = len(self._source_picks) + len(self._fill_picks)
        which = self._warm.design_turn(turn, *bests, len(self._source_picks), weights)
        if which is None:
            # the space-filling points a cold start would measure: spread among themselves,
            # blind to the sources' picks (a misleading source must not push them away)
            picks = np.concatenate([
                np.argsort(self._warm.design_score(sources, k, resources), kind="stable")[
                    : self._warm.design_pool
                ]
                for k in range(len(sources))
            ])  # fmt: skip
            if len(existing):
                existing = existing[min_distances(existing, table.encoded[picks]) > 0]
            design = _DESIGNS[self.design_criterion]
            choice = int(design(table.encoded[rows], 1, rng, existing=existing)[0])
            self._fill_picks.add(int(table.keys[rows[choice]]))
            return choice
        flat = self._warm.indifferent(sources[which], rows, resources) if len(existing) else None
        if flat is not None:  # the source cannot rank these: spread over them
            self._flat_sources.setdefault(sources[which].bundle.label, len(flat))
            design = _DESIGNS[self.design_criterion]
            pick = design(table.encoded[rows[flat]], 1, rng, existing=existing)
            choice = int(flat[pick[0]])
            self._source_picks.add(int(table.keys[rows[choice]]))
            return choice
        score = self._warm.design_score(sources, which, resources)
        choice = pick_design(
            score, table.encoded, rows, existing, pool=self._warm.design_pool,
            gap=self._warm.design_gap,
        )  # fmt: skip
        self._source_picks.add(int(table.keys[rows[choice]]))
        return choice

    def _design_weights(
        self, table: _Table, obs: _Observed, direction: str, rng: np.random.Generator
    ) -> np.ndarray | None:
        """Each source's ranking weight on the target's measurements so far (None before any
        measured ok): how well its predictions order what the design has measured."""
        from surrotune.surrogate.transfer import ranking_weights

        ok = [i for i, v in enumerate(obs.values) if v is not None]
        if not ok:
            return None
        y = transform_objective(np.array([obs.values[i] for i in ok]), direction)
        observed = self._observed_sources(table, [obs.keys[i] for i in ok])
        return ranking_weights([s.mean for s in observed], y, rng)

    def _design_bests(self, obs: _Observed, direction: str) -> tuple[float | None, float | None]:
        """The best measurements (transformed: lower is better) of the warm design's source
        picks and of its space-filling ones; None where none of the kind is measured ok."""
        bests: list[float | None] = []
        for picks in (self._source_picks, self._fill_picks):
            values = [v for v, k in zip(obs.values, obs.keys, strict=True)
                      if v is not None and int(k) in picks]  # fmt: skip
            bests.append(_best_transformed(values, direction) if values else None)
        return bests[0], bests[1]

    def _observed_sources(self, table: _Table, keys: Sequence[int]) -> list[Source]:
        """The sources at the measured configurations: read from the candidates' predictions,
        computed only for the few measured ones that are not candidates."""
        from surrotune.surrogate.transfer import Source

        assert self._warm is not None
        rows = np.array([table.lookup.get(int(k), -1) for k in keys], dtype=np.int64)
        out = [s.take(np.maximum(rows, 0)) for s in self._sources(table)]
        missing = np.flatnonzero(rows < 0)
        if len(missing):
            extra = self._warm.sources(
                table.frame_of([keys[i] for i in missing]),
                self._launch_target(),
                table.space.sizes,
            )
            out = [
                Source(
                    s.bundle,
                    _put(s.members, missing, e.members, axis=1),
                    {k: _put(v, missing, e.fail[k]) for k, v in s.fail.items()},
                    resources={
                        k: (
                            _put(m, missing, e.resources[k][0]),
                            _put(sd, missing, e.resources[k][1]),
                        )
                        for k, (m, sd) in s.resources.items()
                    },
                )
                for s, e in zip(out, extra, strict=True)
            ]
        return out

    def _refit_warm(self, study: Study, obs: _Observed, table: _Table) -> _Fit:
        """The warm-started models for these observations, with their candidate predictions;
        reused until the refit schedule says otherwise (as :meth:`_refit`)."""
        assert self._warm is not None
        key = ("warm", id(table))
        current = self._current_fit(obs, key, table.features.shape[1])
        if current is not None:
            return current
        X, ok, direction, y, scale = self._training_set(study, obs)
        searched = None
        if self._warm.search_model == "search" and int(ok.sum()) >= 3:
            searched = self._refit(study, obs, table.features.shape[1], key=key)
            feas, own = searched.feas, searched.own_resources
        else:
            feas = self._feasibility().fit(X, ok, obs.statuses)
            own = self._resources(study, obs, X, ok)
        candidates = self._sources(table)
        observed = self._observed_sources(table, obs.keys)
        resources = self._resource_transfer(study, table, obs, own, observed)
        transfer = self._warm.fit(
            X=X, y=y, ok=ok, statuses=obs.statuses, observed=observed, candidates=candidates,
            X_candidates=table.features, target_device=self._target_device,
            rng=np.random.default_rng([self._seed, obs.n]), n_models=self.n_models,
            seed=self._seed, n_jobs=self.n_jobs,
            replaced=self._warm.classifiers_replaced(resources),
        )  # fmt: skip
        self.last_transfer = transfer
        self.last_resource_transfer = resources
        if searched is not None:  # the cold search's models, the sources acting on P(ok)
            fit = searched
            if resources is not None:  # the target's own resource model is inside its fits
                fit.resources = None
            fit.predict_candidates(table)
            fit.cand_prior, fit.gate = transfer.prior, True
        else:
            fit = _Fit(
                key=key, n=obs.n, n_features=table.features.shape[1], perf=None, feas=feas,
                direction=direction, cand_mean=transfer.mean, cand_std=transfer.std,
                cand_prior=transfer.prior, scale=scale, gate=True,
                resources=own if resources is None else None, own_resources=own,
            )  # fmt: skip
            fit.cand_ok = fit.p_ok(table.features)
        assert fit.cand_ok is not None
        fit.cand_ok = fit.cand_ok * transfer.p_ok
        if resources is not None:
            fit.cand_ok = fit.cand_ok * resources.fits
        self._fit = fit
        return fit

    def _resource_transfer(
        self,
        study: Study,
        table: _Table,
        obs: _Observed,
        own: ResourceModel | None = None,
        observed: Sequence[Source] | None = None,
    ) -> ResourceTransfer | None:
        """The sources' resource models against the target GPU's limits, with what the target
        measured (and its own resource model, ``own``); None where none applies
        (:func:`~surrotune.surrogate.transfer.resource_transfer`) or ``resource_model`` is off.
        ``observed``: the sources at the measurements, where the caller has them already."""
        from surrotune.surrogate.transfer import resource_transfer

        if self._warm is None or not self._warm.transfer_resources:
            return None
        if not self.resource_model or not self.use_classifier:
            return None
        attrs, _ = self._resource_attrs(study, obs)
        if observed is None:
            observed = self._observed_sources(table, obs.keys)
        return resource_transfer(
            self._sources(table), observed, attrs,
            [v is not None for v in obs.values], self._target_device, own, table.features,
        )  # fmt: skip

    # ------------------------------------------------------------------ plain-Optuna path

    def _sample_plain(
        self,
        study: Study,
        trial: FrozenTrial,
        search_space: dict[str, BaseDistribution],
        rng: np.random.Generator,
    ) -> dict[str, Any]:
        encoder = DistributionEncoder(search_space)
        obs_configs: list[dict[str, Any]] = []
        obs = _Observed()
        pending_configs: list[dict[str, Any]] = []
        demoted = demoted_trials(study.user_attrs)
        for t in study.get_trials(deepcopy=False):
            if t.number == trial.number:
                continue
            params = held_params(t)
            if not all(n in params for n in encoder.names):
                continue
            if t.state != TrialState.WAITING and any(
                t.distributions.get(n) != search_space[n] for n in encoder.names
            ):
                continue
            config = {n: params[n] for n in encoder.names}
            key = encoder.key(config)
            if t.state in (TrialState.RUNNING, TrialState.WAITING):
                obs.taken.add(key)
                pending_configs.append(config)
                continue
            if t.state.is_finished() and not t.user_attrs.get("interrupted"):
                obs.taken.add(key)
            learned = _learned(t, demoted)
            if learned is None:
                continue
            obs_configs.append(config)
            obs.values.append(learned[0])
            obs.statuses.append(learned[1])
            obs.numbers.append(t.number)
        # candidates: a random pool plus mutations of the best observed configurations
        pool = encoder.sample(self.pool_size, rng)
        ok = [(v, c) for v, c in zip(obs.values, obs_configs, strict=True) if v is not None]
        if ok:
            maximize = study.direction == StudyDirection.MAXIMIZE
            ok.sort(key=lambda vc: -vc[0] if maximize else vc[0])
            elites = [c for _, c in ok[: max(1, min(10, len(ok) // 5))]]
            pool += encoder.mutate(elites, self.pool_size // 2, rng)
        seen: set[Any] = set(obs.taken)
        candidates = []
        for config in pool:
            key = encoder.key(config)
            if key in seen:
                continue
            seen.add(key)
            if self._is_feasible is not None and not self._is_feasible(dict(config)):
                continue
            candidates.append(config)
        if not candidates:
            return {}  # nothing new found: fall back to independent random sampling
        cand_enc, cand_raw = encoder.encode(candidates)
        pair_cols = _positive_dist_columns(encoder) if self.pairwise else []
        align_cols = _alignment_dist_columns(encoder) if self.alignment else []
        cand_feat = self._plain_features(cand_enc, cand_raw, pair_cols, align_cols, candidates)
        obs_enc, obs_raw = encoder.encode(obs_configs) if obs_configs else (cand_enc[:0],) * 2
        pend_enc = encoder.encode(pending_configs)[0] if pending_configs else cand_enc[:0]
        if obs.n < self.n_startup_trials or obs.n_ok < 2:
            existing = np.concatenate([obs_enc, pend_enc])
            pick = _DESIGNS[self.design_criterion](
                cand_enc, 1, rng, existing=existing, pool=self.design_pool
            )
            return candidates[int(pick[0])]
        obs_feat = self._plain_features(obs_enc, obs_raw, pair_cols, align_cols, obs_configs)
        obs.features = list(obs_feat)
        obs.encoded = list(obs_enc)
        fit = self._refit(study, obs, cand_feat.shape[1], key=("plain", encoder.names))
        assert fit.perf is not None
        cand_feat = fit.augment(cand_feat)
        mean, std = fit.perf.predict(fit.perf_input(cand_feat), return_std=True)
        if fit.residual is not None:
            correction, std = fit.residual.predict(cand_enc)
            mean = mean + correction
        p_ok = fit.p_ok(cand_feat)
        pending = min_distances(cand_enc, pend_enc)
        if self.thompson_share > 0 and rng.random() < self.thompson_share:
            members = fit.perf.predict_members(fit.perf_input(cand_feat))
            if fit.residual is not None:
                members = members + correction
            choice = self._thompson_choice(fit, mean, std, p_ok, members, cand_enc, pending, rng)
            if choice is not None:
                _record_prediction(study, trial, obs, fit, float(mean[choice]))
                return candidates[choice]
        choice = self._choose(
            fit,
            obs,
            mean,
            std,
            p_ok,
            min_distances(cand_enc, obs_enc),
            pending,
            None,
            rng,
        )
        _record_prediction(study, trial, obs, fit, float(mean[choice]))
        return candidates[choice]

    def _plain_features(
        self,
        encoded: np.ndarray,
        raw: np.ndarray,
        pair_cols: Sequence[int],
        align_cols: Sequence[int],
        configs: Sequence[Mapping[str, Any]],
    ) -> np.ndarray:
        extra = derive_columns(self.derive, pd.DataFrame(list(configs))) if self.derive else None
        return make_features(
            encoded, raw, pair_columns=pair_cols, extra=extra, alignment_columns=align_cols
        )

    # ------------------------------------------------------------------ models and choice

    def _refit(self, study: Study, obs: _Observed, n_features: int, key: Any) -> _Fit:
        """The fitted models for these observations: reused until the schedule says refit."""
        current = self._current_fit(obs, key, n_features)
        if current is not None:
            return current
        X, ok, direction, y, scale = self._training_set(study, obs)
        counters = self._counter_model(study, obs, X) if self.counter_features else None
        if counters is not None:
            X = counters.augment(X)
        resources = self._resources(study, obs, X, ok)
        derived = None
        if self.resource_features and resources is not None:
            derived = ResourceFeatures(
                resources, self._resource_attrs(study, obs)[1],
                occupancy_only=self.resource_features == "occupancy",
            )  # fmt: skip
        X_perf = derived.augment(X) if derived is not None else X
        params = dict(self.model_params or {})
        if len(y) < self.forest_below:
            params.update(forest="extra", n_trees=50)
        perf = PerformanceModel(
            n_models=self.n_models, seed=self._seed, n_jobs=self.n_jobs, **params
        )
        perf.fit(X_perf[ok], y)
        feas = self._feasibility().fit(X, ok, obs.statuses)
        residual = self._residual_model(perf, X_perf[ok], y, obs)
        self._fit = _Fit(
            key=key, n=obs.n, n_features=n_features, perf=perf, feas=feas, direction=direction,
            counters=counters, scale=scale, residual=residual,
            resources=resources, own_resources=resources, resource_features=derived,
        )  # fmt: skip
        return self._fit

    def _residual_model(
        self, perf: PerformanceModel, X_ok: np.ndarray, y: np.ndarray, obs: _Observed
    ) -> ResidualGP | None:
        """The GP on the ensemble's out-of-bag errors (``uncertainty`` ``"gp"`` or
        ``"gp-spread"``); None for ``"ensemble"`` or while too few errors are known."""
        if self.uncertainty == "ensemble" or len(obs.encoded) != obs.n:
            return None
        members = perf.predict_members(X_ok)
        rows, residuals = out_of_bag_residuals(members, perf.out_of_bag(len(y)), y)
        if len(rows) < _MIN_RESIDUAL_ROWS:
            return None
        encoded = np.array(obs.encoded)[[v is not None for v in obs.values]][rows]
        model = ResidualGP(
            correct_mean=self.uncertainty == "gp", seed=self._seed,
            **dict(self.residual_params or {}),
        )  # fmt: skip
        previous = self._fit.residual if self._fit is not None else None
        return model.fit(encoded, residuals, previous=previous)

    def _feasibility(self) -> FeasibilityModel:
        """An unfitted failure classifier with this sampler's seed and options."""
        params = {"seed": self._seed, "n_jobs": self.n_jobs, **dict(self.feasibility_params or {})}
        return FeasibilityModel(**params)

    def _resources(
        self, study: Study, obs: _Observed, X: np.ndarray, ok: np.ndarray
    ) -> ResourceModel | None:
        """Regressors of the compile-time resources the learned trials report (``resource_model``;
        :mod:`surrotune.surrogate.resources`); None where none could be learned."""
        if not self.resource_model or not self.use_classifier:
            return None
        attrs, device = self._resource_attrs(study, obs)
        params = {"seed": self._seed, "n_jobs": self.n_jobs, **dict(self.resource_params or {})}
        previous = self._fit.own_resources if self._fit is not None else None
        model = ResourceModel(**params).fit(X, attrs, device, ok, previous=previous)
        return model if model.informative else None

    @staticmethod
    def _resource_attrs(
        study: Study, obs: _Observed
    ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The user attributes of the learned trials, in ``obs`` order, and the device limits
        the first of them to record any stored: what :class:`ResourceModel` learns from.
        Read once per observation set (a warm refit wants them twice, and on a database
        storage each read is a query of every trial)."""
        if obs.resource_attrs is None:
            by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
            attrs = [by_number[n].user_attrs if n in by_number else {} for n in obs.numbers]
            device = next((a["device_limits"] for a in attrs if a.get("device_limits")), None)
            obs.resource_attrs = attrs, device
        return obs.resource_attrs

    def _current_fit(self, obs: _Observed, key: Any, n_features: int) -> _Fit | None:
        """The last fit, where it is of the same models (``key``, feature count) and too few
        observations arrived since for the refit schedule (``refit_growth``)."""
        fit = self._fit
        if (
            fit is not None
            and fit.key == key
            and fit.n_features == n_features
            and obs.n - fit.n < max(1, math.floor(self.refit_growth * fit.n))
            and not fit.n < obs.n <= self.refit_every_below
        ):
            return fit
        return None

    def _training_set(
        self, study: Study, obs: _Observed
    ) -> tuple[np.ndarray, np.ndarray, str, np.ndarray, CopulaScale | PowerScale | None]:
        """Features of every learned trial, which of them are ok, the direction, the
        transformed objective of the ok ones, and the scale that transformed it further
        (``objective_scale`` ``"copula"`` or ``"power"``; None for ``"log"``)."""
        X = np.array(obs.features, dtype=np.float32)
        ok = np.array([v is not None for v in obs.values])
        direction = _direction_of(study)
        values = np.array([v for v in obs.values if v is not None], dtype=np.float64)
        y = transform_objective(values, direction)
        if self.cap_quantile is not None and len(y) >= 10:
            y = np.minimum(y, np.quantile(y, self.cap_quantile))
        scale = None
        if self.objective_scale != "log" and len(y) >= 2:
            scale = (CopulaScale if self.objective_scale == "copula" else PowerScale)().fit(y)
            y = scale.transform(y)
        return X, ok, direction, y, scale

    def _counter_model(self, study: Study, obs: _Observed, X: np.ndarray) -> CounterModel | None:
        """Counter predictors fitted on the learned trials that carry counters; None while
        fewer than ``MIN_PROFILED`` do (the models then see the configuration only)."""
        found = trial_counters(study.get_trials(deepcopy=False), study.user_attrs)
        rows = [i for i, number in enumerate(obs.numbers) if number in found]
        if len(rows) < MIN_PROFILED:
            return None
        targets = {"targets": tuple(self.counter_targets)} if self.counter_targets else {}
        model = CounterModel(seed=self._seed, n_jobs=self.n_jobs, **targets)
        Y = np.stack([counter_row(found[obs.numbers[i]], model.targets) for i in rows])
        model.fit(X[rows], Y)
        return model if model.targets_ else None

    def _choose(
        self,
        fit: _Fit,
        obs: _Observed,
        mean: np.ndarray,
        std: np.ndarray,
        p_ok: np.ndarray,
        near_evaluated: np.ndarray,
        near_pending: np.ndarray,
        boundary: np.ndarray | None,
        rng: np.random.Generator,
        prior: np.ndarray | None = None,
        explore: bool | None = None,
        members: np.ndarray | None = None,
    ) -> int:
        """Index of the best candidate by the acquisition (or by boundary uncertainty, or, for
        an ``explore_share`` of proposals, by distance among the candidates the model believes
        in; ``explore`` True or False decides that instead of the share)."""
        if not self.use_classifier:  # ablation: failures teach nothing, P(ok) = 1 everywhere
            p_ok = np.ones_like(mean)
            boundary = None
        if explore is None:
            explore = (
                self.explore_share > 0 and len(mean) > 10 and rng.random() < self.explore_share
            )
            if explore and self.explore_after_stall > 0:
                explore = _since_improvement(obs.values, fit.direction) >= self.explore_after_stall
        if explore:
            believed = mean <= np.quantile(mean, self.explore_top)
            believed &= p_ok >= self.gate_threshold
            if believed.any():
                distance = np.minimum(near_evaluated, near_pending)
                return int(np.argmax(np.where(believed, distance, -np.inf)))
        best = fit.best_of(obs)
        if self.acquisition == "mes":
            ei = max_value_entropy(mean, std, best, rng)
        elif members is not None:  # under the ensemble's own distribution
            smoothing = self.acquisition == "ei-kde"
            ei = ensemble_expected_improvement(members, best, xi=self.xi, smoothing=smoothing)
        else:
            ei = expected_improvement(mean, std, best, xi=self.xi)
        if not (ei > 0).any():  # nothing expected to improve: rank by the predicted mean
            ei = np.exp(-(mean - mean.min()))
        if prior is not None:  # a warm start's prior belief in where the optimum lies
            ei = ei * prior
        top = float(ei.max())
        promise = ei / top if top > 0 else ei
        penalty = self.diversity_weight * proximity(near_evaluated, self.length_scale)
        penalty = penalty + self.pending_weight * proximity(near_pending, self.length_scale)
        allowed = np.ones(len(mean), dtype=bool)
        if fit.feas.informative or fit.gate:
            allowed = feasibility_gate(p_ok, self.gate_threshold, rng, epsilon=self.gate_epsilon)
            if not allowed.any():
                allowed[:] = True
        scores = acquisition_scores(ei, p_ok, penalty, weight=1.0)
        if boundary is not None and (boundary & allowed).any():
            if self.boundary_score == "uncertainty":
                scores = boundary_scores(p_ok, promise) - penalty
            allowed = boundary & allowed
        scores[~allowed] = -np.inf
        return int(np.argmax(scores))


@dataclass
class _Fit:
    """Models fitted on the first ``n`` observations, with cached candidate predictions."""

    key: Any
    n: int
    n_features: int
    perf: PerformanceModel | None  # None where a warm start predicts the candidates itself
    feas: FeasibilityModel
    direction: str = "minimize"
    cand_mean: np.ndarray | None = None
    cand_std: np.ndarray | None = None
    cand_ok: np.ndarray | None = None
    cand_members: np.ndarray | None = None  # (K, n): the members' predictions
    cand_prior: np.ndarray | None = None  # a warm start's factor on expected improvement
    gate: bool = False  # gate on P(ok) even where the classifier alone is not informative
    counters: CounterModel | None = None  # predicted counters as extra features (if fitted)
    scale: CopulaScale | PowerScale | None = None  # on top of the log, where the models learn it
    residual: ResidualGP | None = None  # the GP on the ensemble's errors (``uncertainty``)
    resources: ResourceModel | None = None  # P(fits the resource limits), where learned
    #: the resource model fitted on this search's own trials, also where a warm start's
    #: transfer stands in for it: the next refit takes its cross-validated errors over
    own_resources: ResourceModel | None = None
    #: the predicted resources and occupancy as performance-model columns (resource_features)
    resource_features: ResourceFeatures | None = None

    def p_ok(self, features: np.ndarray) -> np.ndarray:
        """P(ok) of these (augmented) features: the classifier's, times P(fits the
        resource limits) where a resource model was learned."""
        p = self.feas.predict_ok(features)
        return p if self.resources is None else p * self.resources.predict_fits(features)

    def best_of(self, obs: _Observed) -> float:
        """The best ok measurement so far on the models' scale (lower is better), counting
        those that arrived after this fit."""
        values = np.array([v for v in obs.values if v is not None], dtype=np.float64)
        best = transform_objective(values, self.direction).min(keepdims=True)
        return float((self.scale.transform(best) if self.scale is not None else best)[0])

    def to_transformed(self, predicted: float) -> float:
        """A prediction on the models' scale back on the log (or identity) scale."""
        if self.scale is None:
            return predicted
        return float(self.scale.inverse(np.array([predicted]))[0])

    def augment(self, features: np.ndarray) -> np.ndarray:
        """The models' input for these configuration features (predicted counters added)."""
        return features if self.counters is None else self.counters.augment(features)

    def predict_candidates(self, table: _Table) -> None:
        """The fitted models' predictions over the candidate set, cached here: the members,
        their mean and spread (the GP's correction and deviation where it is fitted) and
        P(ok)."""
        assert self.perf is not None
        features = self.augment(table.features)
        self.cand_members = self.perf.predict_members(self.perf_input(features))
        self.cand_mean = self.cand_members.mean(axis=0)
        self.cand_std = self.cand_members.std(axis=0)
        self.cand_ok = self.p_ok(features)
        if self.residual is not None:
            correction, self.cand_std = self.residual.predict(table.encoded)
            self.cand_mean = self.cand_mean + correction
            self.cand_members = self.cand_members + correction

    def perf_input(self, augmented: np.ndarray) -> np.ndarray:
        """The performance model's input for :meth:`augment`'s output: with the predicted
        resources and occupancy (``resource_features``) where they were learned."""
        if self.resource_features is None:
            return augmented
        return self.resource_features.augment(augmented)


class _Table:
    """The candidate set of a SearchSpace: keys, encodings, features, the ``is_feasible`` mask.

    Keys are mixed-radix ranks of the value positions (int64), so that membership tests over the
    whole set are ``np.isin`` calls rather than Python loops.
    """

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.lengths = np.array([len(space.values[n]) for n in space.names], dtype=np.int64)
        strides = np.ones(len(self.lengths), dtype=np.int64)
        for k in range(len(self.lengths) - 2, -1, -1):
            strides[k] = strides[k + 1] * self.lengths[k + 1]
        self.strides = strides
        self.dim = len(space.names)
        self._extra_rows: dict[Any, tuple[np.ndarray, np.ndarray]] = {}

    @classmethod
    def build(cls, space: SearchSpace, sampler: SurrogateSampler, rng: np.random.Generator):
        if space.product_size >= 2**62:
            raise SpaceError(
                f"SurrogateSampler needs a space whose product fits in 62 bits; this one has "
                f"{space.product_size:,} configurations"
            )
        table = cls(space)
        try:
            frame = space.enumerate()
        except SpaceTooLarge:
            frame = space.sample(sampler.max_candidates, rng)
        index = space.index_of(frame)
        order = np.argsort(index @ table.strides, kind="stable")
        frame = frame.iloc[order].reset_index(drop=True)
        index = index[order]
        table.frame = frame
        table.keys = index @ table.strides
        table.lookup = {int(k): row for row, k in enumerate(table.keys)}
        table.index = index
        table.encoded = space.encode(frame)
        table.raw = raw_values(space, index)
        table.pair_cols = positive_columns(table.raw) if sampler.pairwise else []
        table.align_cols = alignment_columns(table.raw) if sampler.alignment else []
        table.derive = sampler.derive
        table.launch_shape = sampler._launch_target()
        table.features = table._features(table.encoded, table.raw, frame)
        allowed = np.ones(len(frame), dtype=bool)
        if sampler._is_feasible is not None:
            records = frame.to_dict("records")
            allowed = np.array([bool(sampler._is_feasible(_plain(r))) for r in records])
        table.allowed = allowed
        return table

    def _features(self, encoded: np.ndarray, raw: np.ndarray, frame: pd.DataFrame) -> np.ndarray:
        parts = [derive_columns(self.derive, frame) if self.derive is not None else None]
        if self.launch_shape is not None:
            parts.append(self.launch_shape.columns(frame))
        given = [p for p in parts if p is not None]
        extra = np.concatenate(given, axis=1) if given else None
        return make_features(
            encoded, raw, pair_columns=self.pair_cols, extra=extra,
            alignment_columns=self.align_cols,
        )  # fmt: skip

    def keys_of(self, index: np.ndarray) -> list[int]:
        return [int(k) for k in np.atleast_2d(index) @ self.strides]

    def index_of_keys(self, keys: Sequence[int] | np.ndarray) -> np.ndarray:
        """The value positions (one row per key, one column per parameter) of ``keys``: the
        inverse of :meth:`keys_of`, for candidates or not."""
        k = np.asarray(keys, dtype=np.int64).reshape(-1)
        return (k[:, None] // self.strides[None, :]) % self.lengths[None, :]

    def isin(self, keys: set[Any]) -> np.ndarray:
        if not keys:
            return np.zeros(len(self.keys), dtype=bool)
        return np.isin(self.keys, np.fromiter(keys, dtype=np.int64, count=len(keys)))

    def remember(self, key: int, params: Mapping[str, Any]) -> None:
        """Keep the encoding of an observed configuration that is not among the candidates."""
        if key in self.lookup or key in self._extra_rows:
            return
        frame = pd.DataFrame([dict(params)], columns=list(self.space.names))
        index = self.space.index_of(frame)
        encoded = self.space.encode(frame)
        features = self._features(encoded, raw_values(self.space, index), frame)
        self._extra_rows[key] = (encoded[0], features[0])

    def encoded_of(self, key: int) -> np.ndarray:
        row = self.lookup.get(key)
        return self.encoded[row] if row is not None else self._extra_rows[key][0]

    def features_of(self, key: int) -> np.ndarray:
        row = self.lookup.get(key)
        return self.features[row] if row is not None else self._extra_rows[key][1]

    def frame_of(self, keys: Sequence[int]) -> pd.DataFrame:
        """The configurations of ``keys`` (candidates or not) as a frame in ``names`` order."""
        index = self.index_of_keys(list(keys))
        return pd.DataFrame(
            {
                n: [
                    _python(v) for v in np.asarray(self.space.values[n], dtype=object)[index[:, j]]
                ]
                for j, n in enumerate(self.space.names)
            },
            columns=list(self.space.names),
        )

    def config(self, row: int) -> dict[str, Any]:
        return {n: _python(self.space.values[n][int(self.index[row, k])])
                for k, n in enumerate(self.space.names)}  # fmt: skip

    def boundary_mask(self, failed: Sequence[int]) -> np.ndarray:
        """Candidates one value step (in one parameter) from a failed configuration."""
        keys = np.asarray(failed, dtype=np.int64)
        index = self.index_of_keys(keys)
        near = []
        for k in range(self.dim):
            for step in (-1, 1):
                ok = (index[:, k] + step >= 0) & (index[:, k] + step < self.lengths[k])
                near.append(keys[ok] + step * self.strides[k])
        return np.isin(self.keys, np.concatenate(near))


def _direction_of(study: Study) -> str:
    """``"maximize"`` or ``"minimize"``, as transform_objective takes it."""
    return "maximize" if study.direction == StudyDirection.MAXIMIZE else "minimize"


def _warm_start(
    warm_start: Any,
    space: SearchSpace | None,
    mode: str,
    n_design: int,
    n_fill: int,
    params: Mapping[str, Any],
) -> WarmStart | None:
    """The sampler's WarmStart, checked against the space; None without one."""
    if warm_start is None or (isinstance(warm_start, Sequence) and not warm_start
                              and not isinstance(warm_start, str)):  # fmt: skip
        return None
    from surrotune.surrogate.transfer import WarmStart

    if space is None:
        raise ValueError(
            "SurrogateSampler(warm_start=...) needs space=SearchSpace(...): a warm start ranks "
            "the whole candidate set by the source models"
        )
    warm = (
        warm_start
        if isinstance(warm_start, WarmStart)
        else WarmStart(
            warm_start, **{"mode": mode, "n_design": n_design, "n_fill": n_fill, **params}
        )
    )
    warm.check(space.values)
    return warm


def _put(array: np.ndarray, at: np.ndarray, values: np.ndarray, axis: int = 0) -> np.ndarray:
    """A copy of ``array`` with ``values`` at positions ``at`` along ``axis``."""
    out = np.array(array, copy=True)
    if axis == 0:
        out[at] = values
    else:
        out[:, at] = values
    return out


def _device_of(study: Study, trials: Sequence[FrozenTrial]) -> dict[str, Any] | None:
    """The target GPU's descriptor: the limits a measured trial recorded, else the study's
    ``device`` attribute; None before anything was measured."""
    from surrotune.surrogate.bundle import describe_device

    limits = next((t.user_attrs["device_limits"] for t in trials
                   if t.user_attrs.get("device_limits")), None)  # fmt: skip
    device = study.user_attrs.get("device")
    if not limits and not device:
        return None
    return describe_device(device, limits)


def _since_improvement(values: Sequence[float | None], direction: str) -> int:
    """Evaluations (failures included) after the one that set the best value so far; all of
    them where none is ok yet."""
    sign = -1.0 if direction == "maximize" else 1.0
    best, at = math.inf, -1
    for i, value in enumerate(values):
        if value is not None and sign * value < best:
            best, at = sign * value, i
    return len(values) - 1 - at


def _best_transformed(values: Sequence[float | None], direction: str) -> float:
    """The best of ``values`` on the lower-is-better transformed scale (inf when none)."""
    ok = np.array([v for v in values if v is not None], dtype=np.float64)
    return float(transform_objective(ok, direction).min()) if len(ok) else float("inf")


def _record_prediction(
    study: Study, trial: FrozenTrial, obs: _Observed, fit: _Fit, predicted: float
) -> None:
    """Leave the model's prediction for the proposed trial, in the objective's own units, as
    the system attribute :data:`PREDICTION_ATTR` (the counters policy ``failures`` compares it
    with the measurement)."""
    values = np.array([v for v in obs.values if v is not None], dtype=np.float64)
    predicted = fit.to_transformed(predicted)
    y = -predicted if fit.direction == "maximize" else predicted
    value = math.exp(min(y, 700.0)) if objective_transform(values) == "log" else y
    if math.isfinite(value):
        study._storage.set_trial_system_attr(trial._trial_id, PREDICTION_ATTR, value)


def _learned(
    trial: FrozenTrial, demoted: Mapping[int, Status] | None = None
) -> tuple[float | None, str] | None:
    """``(value or None, status)`` of a trial the models learn from; None for the others.

    ``demoted``: trials that a verdict after the fact (a sanitizer finding, stored as a study
    attribute because a finished trial cannot change) turned into failures of that status.
    """
    attrs = trial.user_attrs
    if attrs.get("interrupted") or "duplicate_of" in attrs:
        return None
    if demoted and trial.number in demoted:
        return None, demoted[trial.number].value
    if trial.state == TrialState.COMPLETE:
        if trial.value is None or not math.isfinite(trial.value):
            return None
        return float(trial.value), Status.OK.value
    if trial.state == TrialState.FAIL:
        status = str(attrs.get("status", GENERIC_FAILURE))
        if status in _NOT_LEARNED or status == Status.OK.value:
            return None
        return None, status
    return None


def _intersection(trials: Sequence[FrozenTrial]) -> dict[str, BaseDistribution]:
    """The distributions every finished (COMPLETE or FAIL) trial shares, by name."""
    space: dict[str, BaseDistribution] | None = None
    for t in trials:
        if t.state not in (TrialState.COMPLETE, TrialState.FAIL) or not t.distributions:
            continue
        if space is None:
            space = dict(t.distributions)
            continue
        space = {n: d for n, d in space.items() if t.distributions.get(n) == d}
    return dict(sorted((space or {}).items()))


def _positive_dist_columns(encoder: DistributionEncoder) -> list[int]:
    from optuna.distributions import CategoricalDistribution

    out = []
    for k, name in enumerate(encoder.names):
        dist = encoder.distributions[name]
        if isinstance(dist, CategoricalDistribution):
            choices = dist.choices
            if (
                len(choices) > 1
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in choices)
                and min(choices) > 0  # type: ignore[type-var]
            ):
                out.append(k)
        elif dist.low > 0 and dist.high > dist.low:  # type: ignore[attr-defined]
            out.append(k)
    return out


def _alignment_dist_columns(encoder: DistributionEncoder, limit: int = 4096) -> list[int]:
    """:func:`alignment_columns` of the distributions' values (the first ``limit`` of an
    integer range): chosen from the space, so that training rows and candidates agree."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    grids: list[np.ndarray] = []
    for name in encoder.names:
        dist = encoder.distributions[name]
        values: list[Any] = []
        if isinstance(dist, CategoricalDistribution):
            values = [v for v in dist.choices if not isinstance(v, bool)]
            if len(values) != len(dist.choices) or not all(isinstance(v, int) for v in values):
                values = []
        elif isinstance(dist, IntDistribution):
            values = list(range(dist.low, min(dist.high, dist.low + limit * dist.step) + 1,
                                dist.step))  # fmt: skip
        grids.append(np.asarray(values if values else [np.nan], dtype=np.float64))
    longest = max(len(g) for g in grids)
    raw = np.column_stack([np.resize(g, longest) for g in grids])
    return alignment_columns(raw)


def _python(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _plain(record: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _python(v) for k, v in record.items()}
