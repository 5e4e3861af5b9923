"""Compile-time resources, learned: configuration → shared memory, registers, threads per block.

Most failures of a kernel template are resource failures: ptxas refuses a block whose static
shared memory passes 48 KB, the launch refuses one whose registers times threads pass the
register file, or threads per block pass 1,024. They hinge on products of three or four
parameters (block × items × vector width × 4 bytes), an oblique boundary that the failure
classifier, fitted on the few failures seen so far, draws only after many of them: on the H200
recordings it let through 45 % to 100 % of the failures at P(ok) ≥ 0.5 after 20 measurements
(docs/BENCHMARKS.md, "Learning the compile-time resources").

But every *compiled* trial reports its resources (the Result's ``shared_bytes``, ``registers``
and ``threads_per_block``), and a resource failure's message states what it asked for
(``uses too much shared data (0x20080 bytes, 0xc000 max)``, ``2048 threads per block exceed the
device's maxThreadsPerBlock of 1024``, ``80 registers x 1024 threads = 81920 registers per block
exceed ...``). So each measurement, ok or not, is a labelled row for a regressor of the log of
each resource, a far richer signal than one ok/failed bit: with twenty rows the regressor
already places the boundary. :class:`ResourceModel` fits one boosted regressor per resource on
the features the other models see, and turns its prediction against the device's limit into a
probability that the configuration fits: ``Φ(-(log2 predicted - log2 limit) / σ)``, σ the
regressor's cross-validated error (wide while the rows are few). The sampler multiplies the
failure classifier's P(ok) by it.

Trees extrapolate a region nobody measured from its neighbours, and the cross-validated error,
taken over the measured rows, does not see it: on a transpose search (seed 3, dev machine) the
tree regressor put the unmeasured 64-wide shared tiles (16 KB) at the 128-wide ones' 64 KB for
the first 40 evaluations, P(fits) ≈ 0 for the optimum's group. A resource is a product of
parameters, a sum of their logs, which a linear model on the features interpolates where trees
cannot; but it extrapolates saturating resources (registers) badly. So each resource gets two
regressors (``hybrid``): the trees, and a ridge regression on the standardized features with
trees fitted to its residuals. The one of lower cross-validated error gives the prediction,
and where the two disagree σ widens by ``disagreement`` times their difference: a candidate
that the data pins down gets the same value from both, one in a region nobody measured
seldom does. On the sampler's own training rows of the twelve H200 recordings (after 20, 40,
80 evaluations, 4 seeds) this lifted the AUC of P(fits) against the recorded resource
failures from 0.856/0.899/0.929 to 0.887/0.915/0.940 and cut the ok configurations it rules
out (P(fits) < 0.1) from 1.9 % to 0.2 %, at the same share of failures let through
(docs/BENCHMARKS.md, "Two regressors per resource").

Where the limit comes from: the limit a failure's message states (ptxas's static shared-memory
limit, the device's limits the launch check cites; not a kernel's own ``__launch_bounds__``,
which may differ per configuration), else the device's (the trial attribute ``device_limits``:
``shared_per_block_optin``, ``regs_per_block``, ``max_threads_per_block``),
raised to the largest value an ok trial used (dynamic shared memory may opt in past 48 KB, and an
ok trial proves the limit is not below it). A resource without a known limit, or with fewer than
``min_rows`` reported values, is left out; with none left the model is uninformative and P(fits)
is 1 everywhere. Kernel Tuner's recordings report no resources, so searches on them are unchanged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import xgboost as xgb
from scipy.special import ndtr
from sklearn.linear_model import RidgeCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from surrotune.backends.occupancy import DeviceLimits, OccupancyError, occupancy_arrays
from surrotune.surrogate.performance import dump_booster, load_booster

__all__ = [
    "RESOURCES",
    "LearnedResource",
    "ResourceFeatures",
    "ResourceModel",
    "limit_of",
    "resource_row",
    "transferred_fits",
]

#: the resources learned, in column order
RESOURCES = ("shared_bytes", "registers_per_block", "threads_per_block")

#: the device-limit key (runner.device_limits) each resource is judged against
#: (the largest a block may opt in to: until ptxas states its static limit, 48 KB, in a failure,
#: a configuration that uses dynamic shared memory may use more)
_DEVICE_KEYS = {
    "shared_bytes": "shared_per_block_optin",
    "registers_per_block": "regs_per_block",
    "threads_per_block": "max_threads_per_block",
}

#: ptxas: ``uses too much shared data (0x20080 bytes, 0xc000 max)``
_SHARED = re.compile(
    r"too much shared data \((0x[0-9a-fA-F]+|\d+) bytes?,\s*(0x[0-9a-fA-F]+|\d+) max"
)
#: the launch check (backends/cuda.py): ``... = 90000 bytes of shared memory per block exceed the
#: device's sharedMemPerBlockOptin of 232448``
_SHARED_LAUNCH = re.compile(
    r"= (\d+) bytes of shared memory per block exceed the device's \w+ of (\d+)"
)
#: ``2048 threads per block exceed the device's maxThreadsPerBlock of 1024``; a kernel's own
#: ``__launch_bounds__`` maximum may differ per configuration, so only the device's is a limit
_THREADS = re.compile(r"(\d+) threads per block exceed the (device's|kernel's)[^\d]*(\d+)")
_REGISTERS = re.compile(
    r"(\d+) registers x (\d+) threads = (\d+) registers per block exceed[^\d]*(\d+)?"
)


def _int(text: str | None) -> int | None:
    if not text:
        return None
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def resource_row(attrs: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """``(values, limits)`` that one trial's user attributes report: the resources it used (or,
    for a resource failure, asked for), and the limits its error message states."""
    values: dict[str, float] = {}
    limits: dict[str, float] = {}
    shared = attrs.get("shared_bytes")
    registers = attrs.get("registers")
    threads = attrs.get("threads_per_block")
    if shared is not None:
        values["shared_bytes"] = float(shared)
    if threads:
        values["threads_per_block"] = float(threads)
        if registers is not None:
            values["registers_per_block"] = float(registers) * float(threads)
    error = str(attrs.get("error") or "")
    if not error:
        return values, limits
    if m := _SHARED.search(error) or _SHARED_LAUNCH.search(error):
        values["shared_bytes"] = float(_int(m.group(1)) or 0)
        if (limit := _int(m.group(2))) is not None:
            limits["shared_bytes"] = float(limit)
    if m := _REGISTERS.search(error):
        values["threads_per_block"] = float(m.group(2))
        values["registers_per_block"] = float(m.group(3))
        if m.group(4):
            limits["registers_per_block"] = float(m.group(4))
    elif m := _THREADS.search(error):
        values["threads_per_block"] = float(m.group(1))
        if m.group(2) == "device's":
            limits["threads_per_block"] = float(m.group(3))
    return values, limits


#: the ridge penalties the linear regressor chooses among (generalized cross-validation)
_ALPHAS = np.logspace(-3, 3, 13)


class _Linear(NamedTuple):
    """A ridge regression on the standardized features, and trees fitted to its residuals.

    The ridge is kept as its arrays (``(X - center) / scale @ coef + intercept``), which is all
    it computes and what a model bundle writes out."""

    center: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    trees: xgb.Booster

    def ridge(self, X: np.ndarray) -> np.ndarray:
        """The ridge regression's prediction (the trees' base margin)."""
        return ((X - self.center) / self.scale) @ self.coef + self.intercept


class _Errors(NamedTuple):
    """A resource's cross-validated root-mean-square errors, and how many rows they were on."""

    rows: int
    trees: float
    linear: float | None  # the ridge and its trees (``hybrid``), else None


class LearnedResource(NamedTuple):
    """One learned resource: its regressors, its limit and the spread of their error."""

    trees: xgb.Booster
    linear: _Linear | None  # None: ``hybrid`` off
    log_limit: float  # log2(limit + 1)
    sigma: float  # σ of the chosen regressor's error in log2 units (at least ``softness``)
    use_linear: bool  # the linear regressor cross-validated better and gives the prediction
    #: where the limit came from: ``compiler`` (ptxas's static shared-memory limit, which a GPU
    #: of the same compiler shares) or ``device`` (the device's own limits, another GPU's differ)
    limit_origin: str = "device"


class ResourceModel:
    """P(a configuration fits the device's resource limits), from regressors of its resources.

    Args:
        softness: the least spread σ, in log2 units of the resource, of the prediction's
            error: P(fits) = Φ(-(log2 predicted - log2 limit) / σ), σ the regressor's
            cross-validated root-mean-square error (``folds`` folds) or this, whichever is
            larger. The cross-validated σ is wide while the rows are few (2.5 log2 units for
            registers per block after 20 transpose evaluations, 0.35 after 200); the first
            version's fixed σ of 0.125 lost a transpose seed in a dev screen
            (docs/BENCHMARKS.md, "Learning the compile-time resources").
        folds: the folds of that cross-validation (fewer rows than ``2 * folds``: σ is the
            resource's own standard deviation, the error of knowing nothing).
        cv_rows: the most rows the cross-validation uses (a seeded sample of them).
        min_rows: the fewest trials reporting a resource before it is learned.
        n_estimators, max_depth, learning_rate: the regressors' boosting parameters.
        hybrid: fit a second regressor per resource, a ridge regression with trees on its
            residuals, next to the trees (see the module's docstring); the lower
            cross-validated error chooses which predicts.
        disagreement: where both are fitted, σ of a candidate is
            ``sqrt(σ_cv² + (disagreement · (trees - linear))²)``; 0 keeps σ_cv. Half the
            difference cut the ok configurations ruled out as much as the whole of it
            (0.2 % for both, from 1.9 %) and kept more of the optimum's group (P(fits) 0.73
            against 0.69 after 20 evaluations, 0.66 without) at the failures let through of
            the trees alone (20 % against 17 % with the whole difference); docs/BENCHMARKS.md.
        cv_growth: given the model of the previous refit (``fit``'s ``previous``), a
            resource's cross-validated errors (its σ, and which of the two regressors predicts)
            are taken over from it until its rows have grown by this share since they were
            cross-validated; 0 cross-validates at every fit. The cross-validation fits six
            boosters per resource where the fit itself fits two: three quarters of the
            resource model's time, a third of a 200-evaluation search's (a transpose run,
            10.2 s of 27.6 s, dev machine). At 10 % a search takes 17-19 % less time and
            needed as many evaluations to 98 % over 20 seeds (gemm_h200 86.5 against 87,
            convolution_h200 46.5 against 49.5); at 25 % the stale σ cost convolution_h200
            17 evaluations (66.5) (docs/BENCHMARKS.md, "Fitting on a schedule").
        seed: XGBoost seed (deterministic for a seed).
        n_jobs: XGBoost threads.
    """

    def __init__(
        self,
        *,
        softness: float = 0.125,
        folds: int = 3,
        cv_rows: int = 256,
        min_rows: int = 5,
        n_estimators: int = 50,
        max_depth: int = 4,
        learning_rate: float = 0.3,
        hybrid: bool = True,
        disagreement: float = 0.5,
        cv_growth: float = 0.1,
        seed: int = 0,
        n_jobs: int = 1,
    ) -> None:
        if softness <= 0:
            raise ValueError(f"softness must be positive; got {softness}")
        if disagreement < 0:
            raise ValueError(f"disagreement must be at least 0; got {disagreement}")
        if cv_growth < 0:
            raise ValueError(f"cv_growth must be at least 0; got {cv_growth}")
        self.softness = softness
        self.folds = folds
        self.cv_rows = cv_rows
        self.min_rows = min_rows
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.learning_rate = learning_rate
        self.hybrid = hybrid
        self.disagreement = disagreement
        self.cv_growth = cv_growth
        self.seed = seed
        self.n_jobs = n_jobs
        #: resource -> its regressors, limit and error spread
        self.models_: dict[str, LearnedResource] = {}
        #: resource -> its cross-validated errors and the rows they were taken on
        self.errors_: dict[str, _Errors] = {}
        #: resource -> the one value every row reported, where it was not learned for that
        #: reason (it cannot fail, but it still sets the occupancy: ResourceFeatures)
        self.constants_: dict[str, float] = {}

    @property
    def informative(self) -> bool:
        """Whether any resource was learned (else P(fits) is 1 everywhere)."""
        return bool(self.models_)

    def fit(
        self,
        X: np.ndarray,
        attrs: Sequence[Mapping[str, Any]],
        device: Mapping[str, Any] | None = None,
        ok: Sequence[bool] | None = None,
        previous: ResourceModel | None = None,
    ) -> ResourceModel:
        """Learn each resource from the rows of ``X`` whose trial attributes ``attrs`` report it.

        ``device``: the device limits (``runner.device_limits``); ``ok``: which rows ran ok
        (their values raise the limit to at least what they used); ``previous``: the model of
        the last refit on the same search, whose cross-validated errors stand until the rows
        have grown by ``cv_growth``."""
        rows = [resource_row(a) for a in attrs]
        earlier = previous.errors_ if previous is not None else {}
        self.models_ = {}
        self.errors_ = {}
        self.constants_ = {}
        for name in RESOURCES:
            have = [i for i, (values, _) in enumerate(rows) if name in values]
            if len(have) < self.min_rows:
                continue
            found = limit_of(name, attrs, device, ok)
            if found is None:
                continue
            limit, origin = found
            y = np.log2(np.array([rows[i][0][name] for i in have], dtype=np.float64) + 1.0)
            if np.ptp(y) == 0 and y[0] <= math.log2(limit + 1.0):
                self.constants_[name] = float(rows[have[0]][0][name])
                continue  # constant and within the limit: it cannot fail
            rows_X = np.asarray(X, dtype=np.float32)[have]
            errors = earlier.get(name)
            if (
                errors is None
                or len(y) >= errors.rows * (1.0 + self.cv_growth)
                or (self.hybrid and errors.linear is None)
            ):
                errors = self._errors(rows_X, y)
            self.errors_[name] = errors
            self.models_[name] = self._learn(rows_X, y, math.log2(limit + 1.0), origin, errors)
        return self

    def _errors(self, X: np.ndarray, y: np.ndarray) -> _Errors:
        """The cross-validated errors of the trees and (``hybrid``) of the ridge and its trees."""
        linear = self._error(X, y, linear=True) if self.hybrid else None
        return _Errors(len(y), self._error(X, y, linear=False), linear)

    def _learn(
        self, X: np.ndarray, y: np.ndarray, log_limit: float, origin: str, errors: _Errors
    ) -> LearnedResource:
        trees = self._trees(X, y)
        error = errors.trees
        if not self.hybrid or errors.linear is None:
            sigma = max(self.softness, error)
            return LearnedResource(trees, None, log_limit, sigma, False, origin)
        linear_error = errors.linear
        use_linear = linear_error < error
        sigma = max(self.softness, min(error, linear_error))
        if not use_linear and self.disagreement == 0:  # the trees predict and σ is theirs
            return LearnedResource(trees, None, log_limit, sigma, False, origin)
        return LearnedResource(trees, self._linear(X, y), log_limit, sigma, use_linear, origin)

    def _params(self) -> dict[str, Any]:
        return {
            "objective": "reg:squarederror", "max_depth": self.max_depth,
            "eta": self.learning_rate, "tree_method": "hist", "nthread": self.n_jobs,
            "seed": self.seed, "verbosity": 0,
        }  # fmt: skip

    def _trees(self, X: np.ndarray, y: np.ndarray) -> xgb.Booster:
        data = xgb.DMatrix(X, label=y, nthread=self.n_jobs)
        return xgb.train(self._params(), data, num_boost_round=self.n_estimators)

    def _linear(self, X: np.ndarray, y: np.ndarray) -> _Linear:
        """Ridge on the standardized features (its penalty by generalized cross-validation),
        then trees on what it leaves: the ridge's prediction is their base margin."""
        pipeline = make_pipeline(StandardScaler(), RidgeCV(alphas=_ALPHAS)).fit(X, y)
        scaler, ridge = pipeline[0], pipeline[-1]
        margin = pipeline.predict(X)
        data = xgb.DMatrix(X, label=y, base_margin=margin, nthread=self.n_jobs)
        trees = xgb.train(self._params(), data, num_boost_round=self.n_estimators)
        center, scale, coef = (
            np.asarray(a, dtype=np.float64) for a in (scaler.mean_, scaler.scale_, ridge.coef_)
        )
        return _Linear(center, scale, coef, float(ridge.intercept_), trees)

    @staticmethod
    def _predict_trees(model: xgb.Booster, X: np.ndarray) -> np.ndarray:
        return model.inplace_predict(X)

    @staticmethod
    def _predict_linear(model: _Linear, X: np.ndarray) -> np.ndarray:
        return model.trees.inplace_predict(X, base_margin=model.ridge(X))

    def _error(self, X: np.ndarray, y: np.ndarray, *, linear: bool) -> float:
        """A regressor's cross-validated root-mean-square error on these rows (on a seeded
        sample of ``cv_rows`` of them where there are more: the spread needs no more rows, and
        the cross-validation would cost most of a refit at thousands of trials)."""
        if len(y) < 2 * self.folds:
            return float(np.std(y))
        if len(y) > self.cv_rows:
            keep = np.random.default_rng(self.seed).choice(len(y), self.cv_rows, replace=False)
            X, y = X[keep], y[keep]
        folds = np.arange(len(y)) % self.folds
        np.random.default_rng(self.seed).shuffle(folds)
        errors = np.empty(len(y))
        for k in range(self.folds):
            held = folds == k
            if linear:
                fitted = self._predict_linear(self._linear(X[~held], y[~held]), X[held])
            else:
                fitted = self._predict_trees(self._trees(X[~held], y[~held]), X[held])
            errors[held] = fitted - y[held]
        return float(np.sqrt(np.mean(errors**2)))

    def predict_log(self, X: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each learned resource's predicted ``log2(value + 1)`` and σ of that prediction, per
        row of ``X``: what the resource is, whatever the limit (a warm start judges a source's
        prediction against the target GPU's limits)."""
        X = np.asarray(X, dtype=np.float32)
        out = {}
        for name, learned in self.models_.items():
            trees = self._predict_trees(learned.trees, X).astype(np.float64)
            if learned.linear is None:
                out[name] = trees, np.full(len(X), learned.sigma)
                continue
            linear = self._predict_linear(learned.linear, X).astype(np.float64)
            spread = self.disagreement * (trees - linear)
            mean = linear if learned.use_linear else trees
            out[name] = mean, np.sqrt(learned.sigma**2 + spread**2)
        return out

    def _margins_and_sigmas(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(n, k)`` log2 of each learned resource's prediction over its limit, and ``(n, k)``
        σ of each prediction."""
        predicted = self.predict_log(X)
        margins = [predicted[n][0] - learned.log_limit for n, learned in self.models_.items()]
        return np.column_stack(margins), np.column_stack([m[1] for m in predicted.values()])

    def margins(self, X: np.ndarray) -> np.ndarray:
        """``(n, k)``: log2 of each learned resource's prediction over its limit (> 0: past it)."""
        if not self.models_:
            return np.zeros((len(X), 0))
        return self._margins_and_sigmas(X)[0]

    def predict_fits(self, X: np.ndarray) -> np.ndarray:
        """P(every learned resource fits its limit), the product over resources."""
        if not self.models_:
            return np.ones(len(X))
        margins, sigmas = self._margins_and_sigmas(X)
        return np.prod(ndtr(-margins / sigmas), axis=1)

    # -- (de)serialisation: a model bundle carries the source GPU's resources ---------------

    def to_json(self) -> dict[str, Any]:
        """The learned regressors (XGBoost's own JSON model format, the ridge's arrays), each
        resource's limit and σ, and the options that shape a prediction."""
        resources = {}
        for name, learned in self.models_.items():
            linear = None
            if learned.linear is not None:
                lin = learned.linear
                linear = {
                    "center": lin.center.tolist(), "scale": lin.scale.tolist(),
                    "coef": lin.coef.tolist(), "intercept": lin.intercept,
                    "trees": dump_booster(lin.trees),
                }  # fmt: skip
            resources[name] = {
                "trees": dump_booster(learned.trees),
                "linear": linear,
                "limit": 2.0**learned.log_limit - 1.0,
                "limit_origin": learned.limit_origin,
                "sigma": learned.sigma,
                "use_linear": learned.use_linear,
            }
        return {
            "softness": self.softness,
            "disagreement": self.disagreement,
            "hybrid": self.hybrid,
            "resources": resources,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResourceModel:
        model = cls(
            softness=float(data.get("softness", 0.125)),
            disagreement=float(data.get("disagreement", 0.5)),
            hybrid=bool(data.get("hybrid", True)),
        )
        for name, entry in (data.get("resources") or {}).items():
            if name not in RESOURCES:
                raise ValueError(f"unknown resource {name!r} (known: {', '.join(RESOURCES)})")
            linear = None
            if entry.get("linear"):
                lin = entry["linear"]
                linear = _Linear(
                    np.asarray(lin["center"], dtype=np.float64),
                    np.asarray(lin["scale"], dtype=np.float64),
                    np.asarray(lin["coef"], dtype=np.float64),
                    float(lin["intercept"]),
                    load_booster(lin["trees"]),
                )
            model.models_[name] = LearnedResource(
                load_booster(entry["trees"]),
                linear,
                math.log2(float(entry["limit"]) + 1.0),
                float(entry["sigma"]),
                bool(entry.get("use_linear", False)),
                str(entry.get("limit_origin", "device")),
            )
        return model


def limit_of(
    name: str,
    attrs: Sequence[Mapping[str, Any]],
    device: Mapping[str, Any] | None,
    ok: Sequence[bool] | None = None,
    compiler: float | None = None,
) -> tuple[float, str] | None:
    """The limit ``name`` is judged against on these trials' GPU, and where it came from
    (``compiler`` or ``device``); None where none is known.

    The lowest limit a failure's message states (ptxas's static shared-memory limit, a
    ``compiler`` one; the launch check's, a ``device`` one), else ``compiler`` (a limit the
    same compiler stated on a warm start's source GPU, which outranks the device's: a kernel
    whose shared memory is static never reaches the device's opt-in limit), else the
    device's, raised to the most an ``ok`` trial used (an ok trial proves the limit is not
    below it)."""
    device = device or {}
    ok_rows = list(ok) if ok is not None else [False] * len(attrs)
    stated, used_ok, stated_by_compiler = [], [], False
    for a, fine in zip(attrs, ok_rows, strict=True):
        values, limits = resource_row(a)
        if name in limits:
            stated.append(limits[name])
            error = str(a.get("error") or "")
            stated_by_compiler |= name == "shared_bytes" and bool(_SHARED.search(error))
        if fine and name in values:
            used_ok.append(values[name])
    origin = "compiler" if stated_by_compiler else "device"
    if stated:
        limit: float | None = min(stated)
    elif compiler:
        limit, origin = compiler, "compiler"
    else:
        limit = device.get(_DEVICE_KEYS[name])
        if not limit and name == "shared_bytes":
            limit = device.get("shared_per_block")
    if not limit:
        return None
    return max(float(limit), max(used_ok, default=0.0)), origin


#: rows' worth of belief in a source GPU's resource prediction: the target's own measured
#: resources move it (an offset) and widen its σ (their spread about it) after a few rows
_PRIOR_ROWS = 2.0


def transferred_fits(
    prior: Mapping[str, tuple[np.ndarray, np.ndarray]],
    limits: Mapping[str, float],
    residuals: Mapping[str, np.ndarray] | None = None,
    own: ResourceModel | None = None,
    X: np.ndarray | None = None,
) -> np.ndarray:
    """P(every resource fits the target GPU's limits) per candidate, from a source GPU's
    learned resources: what a configuration uses is the kernel's and the compiler's, what it
    may use is the GPU's, so a source's prediction judged against the *target's* limit says
    where its resource failures recur (a smaller limit: more of them; a larger: fewer).

    ``prior[name]``: the source's ``(log2(value + 1), σ)`` at the candidates; ``limits[name]``:
    the target's limit (a resource without one is left out); ``residuals[name]``: at the
    target's measurements that report it, measured ``log2(value + 1)`` minus the source's
    prediction (their mean, shrunk by :data:`_PRIOR_ROWS`, shifts the prior; their spread about
    that shift widens its σ: a compiler that allocates differently is noticed within a few
    rows); ``own``: the target's own :class:`ResourceModel` on the candidates' features ``X``.
    Where both learned a resource, the one of lower error on the target's rows predicts (the
    prior's: the spread of the residuals about their shift; the target's own: its
    cross-validated σ), the prior on a tie or while the target has no rows: a target model
    fitted on the design's few clustered rows cross-validates well there and extrapolates
    badly elsewhere (GEMM 1024³ → 2048³ after 15 evaluations: 78 % of the resource failures
    let through when the two were combined by their precisions, 1 % by the prior alone;
    docs/BENCHMARKS.md, "The resource model in the bundle"). Only the target's own model
    judges a resource the sources did not learn.
    """
    residuals = residuals or {}
    own_pred = own.predict_log(X) if own is not None and own.informative and X is not None else {}
    sizes = [len(v[0]) for v in prior.values()] + [len(v[0]) for v in own_pred.values()]
    p = np.ones(sizes[0] if sizes else (0 if X is None else len(X)))
    for name in RESOURCES:
        from_prior = name in prior and limits.get(name)
        if name in own_pred:
            assert own is not None
            mean, var = own_pred[name][0], own_pred[name][1] ** 2
            log_limit = own.models_[name].log_limit
        if from_prior:
            mu, sd = prior[name]
            r = np.asarray(residuals.get(name, ()), dtype=np.float64)
            offset = float(r.sum()) / (len(r) + _PRIOR_ROWS)
            prior_mean = mu + offset
            prior_var = sd**2 + float(((r - offset) ** 2).sum()) / (len(r) + 1.0)
            prior_error = math.sqrt(float(((r - offset) ** 2).mean())) if len(r) else 0.0
            if name not in own_pred or prior_error <= own.models_[name].sigma:
                mean, var = prior_mean, prior_var
                log_limit = math.log2(float(limits[name]) + 1.0)
        elif name not in own_pred:
            continue
        p *= ndtr(-(mean - log_limit) / np.sqrt(var))
    return p


class ResourceFeatures:
    """A configuration's predicted resources and the theoretical occupancy they give, as
    columns of the performance model (``SurrogateSampler(resource_features=True)``).

    Issue 3 names the compile-time registers, shared memory and theoretical occupancy among the
    performance model's features. Measured, they exist only for what was compiled, never for the
    candidates the model ranks; but the :class:`ResourceModel` predicts them for every
    configuration, and the occupancy is a known function of them and of the device
    (:func:`~surrotune.backends.occupancy.occupancy_arrays`: whole blocks per multiprocessor,
    registers allocated per warp, the floors a tree on the parameters would need many splits
    for). The columns are the same function for the training rows and the candidates: the
    predictions, not the measured values, so that the model learns on what it will see.

    Columns: log2 of the shared bytes per block and of the registers per thread (not with
    ``occupancy_only``), the occupancy (0 to 1) and log2 of the active blocks per
    multiprocessor plus one; those whose
    inputs were neither learned nor constant over the rows are left out, the occupancy too
    where the device's limits are unknown or its architecture is not one the calculator knows.
    """

    def __init__(
        self, model: ResourceModel, device: Mapping[str, Any] | None, occupancy_only: bool = False
    ) -> None:
        self.model = model
        self.occupancy_only = occupancy_only
        self.limits: DeviceLimits | None = None
        if device:
            try:
                self.limits = DeviceLimits.from_limits(device)
            except OccupancyError:
                self.limits = None

    def _values(self, X: np.ndarray) -> dict[str, np.ndarray]:
        """Each resource's predicted value (learned) or its constant, per row of ``X``."""
        values = {name: np.full(len(X), v) for name, v in self.model.constants_.items()}
        for name, (log_value, _) in self.model.predict_log(X).items():
            values[name] = np.maximum(np.exp2(log_value) - 1.0, 0.0)
        return values

    def columns(self, X: np.ndarray) -> np.ndarray:
        """``(n, k)``: the resource columns of the rows of ``X`` (k may be 0)."""
        values = self._values(X)
        cols = []
        shared = values.get("shared_bytes")
        if shared is not None and not self.occupancy_only:
            cols.append(np.log2(shared + 1.0))
        threads = values.get("threads_per_block")
        per_block = values.get("registers_per_block")
        if threads is not None and per_block is not None:
            per_thread = per_block / np.maximum(threads, 1.0)
            if not self.occupancy_only:
                cols.append(np.log2(per_thread + 1.0))
            if self.limits is not None:
                fraction, blocks = occupancy_arrays(
                    self.limits, per_thread, threads,
                    shared if shared is not None else np.zeros(len(X)),
                )  # fmt: skip
                cols += [fraction, np.log2(blocks + 1.0)]
        return np.column_stack(cols) if cols else np.zeros((len(X), 0))

    def augment(self, X: np.ndarray) -> np.ndarray:
        """``X`` with the resource columns appended (float32, as the models take it)."""
        return np.hstack([np.asarray(X, dtype=np.float32), self.columns(X).astype(np.float32)])
