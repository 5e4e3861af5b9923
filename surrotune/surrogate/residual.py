"""A Gaussian process on the tree ensemble's out-of-bag errors: uncertainty that knows distance.

The bootstrap ensemble's spread (:mod:`.performance`) measures how much the members disagree,
and boosted trees agree far from the data as readily as near it: a region no measurement
touched is predicted as the nearest leaf predicts it, with the confidence of that leaf. Expected
improvement then never asks for the unmeasured region, which is why the sampler spends a fixed
share of its proposals on explicit exploration (``explore_share``).

This model asks a Gaussian process the question the trees cannot answer: how wrong is the
ensemble *here*? Each measured configuration's out-of-bag prediction (the mean of the members
whose bootstrap resample left it out: an honest, cross-validated prediction) gives the ensemble's
error there; a GP with a Matérn kernel (one length scale per parameter, fitted by maximum
likelihood, plus a noise term) learns those errors over the encoded parameters. Its posterior
gives, for any candidate, a correction of the ensemble's mean (where nearby errors agree) and a
standard deviation that is small next to measured configurations and grows to the size of the
ensemble's typical error far from them. That is the uncertainty expected improvement wants, in
the units of the ensemble's own mistakes; it is the "GP on the residuals of a parametric mean"
construction (e.g. Rasmussen and Williams 2006, section 2.7), with the trees as the mean.

scikit-learn's ``GaussianProcessRegressor`` does the work; this module only chooses the rows,
the kernel and the bounds, and keeps a fit cheap: at most ``max_rows`` rows (a seeded random
subset beyond that), constant columns dropped.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning, NotFittedError

__all__ = ["ResidualGP", "out_of_bag_residuals"]


def out_of_bag_residuals(
    members: np.ndarray, out_of_bag: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, residuals)``: for each training row that at least one member never saw, the
    target minus the mean of those members' predictions.

    ``members`` is ``(K, n)`` predictions on the training rows, ``out_of_bag`` the ``(K, n)``
    mask of rows each member left out (:meth:`PerformanceModel.out_of_bag`). With K = 5 bootstrap
    members about 10 % of rows are in every resample; they are left out rather than given an
    in-bag (overfitted, near zero) error.
    """
    members = np.asarray(members, dtype=np.float64)
    mask = np.asarray(out_of_bag, dtype=bool)
    if members.ndim != 2 or members.shape != mask.shape or members.shape[1] != len(y):
        raise ValueError(
            f"members {members.shape}, out_of_bag {mask.shape} and y ({len(y)},) do not match"
        )
    count = mask.sum(axis=0)
    rows = np.flatnonzero(count > 0)
    oob_mean = (members * mask).sum(axis=0)[rows] / count[rows]
    return rows, np.asarray(y, dtype=np.float64)[rows] - oob_mean


class ResidualGP:
    """The ensemble's out-of-bag errors, learned by a Gaussian process over the encoding.

    Args:
        correct_mean: add the GP's posterior mean to the ensemble's prediction (False: use the
            GP for the spread only).
        max_rows: fit on at most this many rows (a random subset drawn with ``seed`` beyond it),
            so that the cubic cost stays bounded at thousands of trials.
        seed: seeds that subset.
        refit_growth: given the previous refit's GP (``fit``'s ``previous``), its kernel's
            hyperparameters (length scales, signal and noise variance) are kept, and only the
            posterior is computed on the new rows, until the rows have grown by this share since
            they were last fitted by maximum likelihood; 0 (the default) fits them every time.
            The likelihood's optimisation is a quarter of a 200-evaluation search's time (a
            transpose run: 5.7 s of 20.4 s, dev machine), but keeping the length scales for
            25 % more rows cost gemm_h200 its goal: 108 [86, 121] evaluations to 98 % over 20
            seeds against 87 [72, 103], 98 at 10 % (docs/BENCHMARKS.md, "Fitting on a
            schedule").
    """

    def __init__(
        self,
        *,
        correct_mean: bool = True,
        max_rows: int = 400,
        seed: int = 0,
        refit_growth: float = 0.0,
    ) -> None:
        if refit_growth < 0:
            raise ValueError(f"refit_growth must be at least 0; got {refit_growth}")
        self.correct_mean = correct_mean
        self.max_rows = max_rows
        self.seed = seed
        self.refit_growth = refit_growth
        #: the rows the kernel's hyperparameters were last fitted on
        self.fitted_rows_ = 0

    def fit(
        self, encoded: np.ndarray, residuals: np.ndarray, previous: ResidualGP | None = None
    ) -> ResidualGP:
        """Fit on the encoded configurations (``[0, 1]`` per parameter) and their errors;
        ``previous``: the last refit's GP on the same search, whose hyperparameters stand
        while the rows have grown by less than ``refit_growth`` (and the columns that vary are
        the same)."""
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        X = np.asarray(encoded, dtype=np.float64)
        r = np.asarray(residuals, dtype=np.float64)
        if X.ndim != 2 or len(X) != len(r) or len(r) < 2:
            raise ValueError(
                f"ResidualGP.fit needs a 2-D X with one row per residual and at least 2 rows; "
                f"got X {X.shape} and {len(r)} residuals"
            )
        if len(r) > self.max_rows:
            keep = np.random.default_rng(self.seed).choice(len(r), self.max_rows, replace=False)
            X, r = X[keep], r[keep]
        self.columns_ = np.flatnonzero(np.ptp(X, axis=0) > 0)
        if len(self.columns_) == 0:
            self.columns_ = np.arange(X.shape[1])
        keep_hyper = (  # the out-of-bag rows may also shrink between refits
            self.refit_growth > 0
            and previous is not None
            and hasattr(previous, "gp_")
            and np.array_equal(previous.columns_, self.columns_)
            and len(r) < previous.fitted_rows_ * (1.0 + self.refit_growth)
        )
        if keep_hyper:
            assert previous is not None
            self.gp_ = GaussianProcessRegressor(
                kernel=previous.gp_.kernel_, optimizer=None, normalize_y=False, random_state=0
            )
            self.fitted_rows_ = previous.fitted_rows_
        else:
            variance = float(np.mean(r**2)) or 1e-6
            kernel = ConstantKernel(variance, (variance * 1e-2, variance * 1e2)) * Matern(
                length_scale=np.full(len(self.columns_), 0.3),
                length_scale_bounds=(0.05, 10.0),
                nu=2.5,
            ) + WhiteKernel(variance * 0.1, (variance * 1e-4, variance * 2))
            self.gp_ = GaussianProcessRegressor(kernel=kernel, normalize_y=False, random_state=0)
            self.fitted_rows_ = len(r)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.gp_.fit(X[:, self.columns_], r)
        self.noise_ = float(self.gp_.kernel_.k2.noise_level)
        return self

    def predict(self, encoded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(mean correction, standard deviation)`` at the encoded configurations: the
        correction is zeros where ``correct_mean`` is False; the deviation is the latent
        error's (without the fitted noise: a re-measurement's noise is not improvement)."""
        if not hasattr(self, "gp_"):
            raise NotFittedError("ResidualGP is not fitted yet; call fit first")
        X = np.asarray(encoded, dtype=np.float64)[:, self.columns_]
        mean, std = self.gp_.predict(X, return_std=True)
        latent = np.sqrt(np.maximum(std**2 - self.noise_, 0.0))
        return (mean if self.correct_mean else np.zeros_like(mean)), latent

    def sample_deviation(self, encoded: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One joint draw of the latent error around the posterior mean at the encoded
        configurations (zero-mean; the noise left out): what Thompson sampling adds to the
        ensemble's prediction so that configurations near each other move together, as one
        plausible function would, instead of each by its own independent spread."""
        if not hasattr(self, "gp_"):
            raise NotFittedError("ResidualGP is not fitted yet; call fit first")
        X = np.asarray(encoded, dtype=np.float64)[:, self.columns_]
        _, cov = self.gp_.predict(X, return_cov=True)
        cov[np.diag_indices_from(cov)] -= self.noise_
        cov = (cov + cov.T) / 2
        jitter = 1e-9 * max(float(np.mean(np.diag(cov))), 1e-12)
        try:
            root = np.linalg.cholesky(cov + jitter * np.eye(len(cov)))
        except np.linalg.LinAlgError:  # not positive definite within rounding: the slow way
            values, vectors = np.linalg.eigh(cov)
            root = vectors * np.sqrt(np.clip(values, 0.0, None))
        return root @ rng.standard_normal(len(X))
