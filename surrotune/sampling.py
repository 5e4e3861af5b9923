"""Samplers by name, and the distributions every sampler sees.

Every parameter is an Optuna ``CategoricalDistribution`` over its ordered value list: the values
of a kernel parameter are a designer's chosen set (tile sizes, flags), not a continuum, and one
distribution type keeps the stored trials uniform across samplers. ``brute-force`` walks the
*feasible* set (the known constraints applied), not the Cartesian product that Optuna's own
``BruteForceSampler`` would walk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import optuna
import pandas as pd
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from surrotune.experiment import SAMPLERS
from surrotune.result import ParamValue

__all__ = [
    "ABLATIONS",
    "SAMPLER_NAMES",
    "FeasibleBruteForceSampler",
    "SpaceLike",
    "distributions",
    "held_params",
    "make_sampler",
]

#: every name :func:`make_sampler` knows: the experiment file's list, so the two cannot part
SAMPLER_NAMES = SAMPLERS

#: parts of the surrogate sampler that ``surrotune bench --ablate`` can switch off
ABLATIONS = ("classifier", "diversity", "features")


class SpaceLike(Protocol):
    """What the runner and samplers need of a search space."""

    @property
    def names(self) -> tuple[str, ...]: ...

    @property
    def values(self) -> Mapping[str, Sequence[ParamValue]]: ...

    def is_feasible(self, config: Mapping[str, ParamValue]) -> bool: ...

    def violated(self, config: Mapping[str, ParamValue]) -> list[str]: ...

    def key(self, config: Mapping[str, ParamValue]) -> str: ...

    def keys(self, frame: pd.DataFrame) -> list[str]: ...

    def enumerate(self) -> pd.DataFrame: ...


def distributions(space: SpaceLike) -> dict[str, BaseDistribution]:
    return {name: CategoricalDistribution(list(space.values[name])) for name in space.names}


class FeasibleBruteForceSampler(BaseSampler):
    """Proposes every feasible configuration once, in a seeded random order.

    It skips configurations that any trial of the study already holds (finished, running or
    waiting), so several runners sharing one study split the work, and a resumed run goes on
    where it stopped.
    """

    def __init__(self, space: SpaceLike, *, seed: int | None = None) -> None:
        self._space = space
        frame = space.enumerate()
        order = np.random.default_rng(seed).permutation(len(frame))
        records = frame.iloc[order].to_dict("records")
        self._configs: list[dict[str, Any]] = [
            {name: _python(value) for name, value in record.items()} for record in records
        ]
        self._keys = [space.key(config) for config in self._configs]
        self._cursor = 0
        # (study, trial number) -> configuration key: keying only new trials keeps a proposal
        # cheap in a study of thousands (measured: 38 -> 3 ms at 4,000 trials)
        self._trial_keys: dict[tuple[str, int], str] = {}

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return distributions(self._space)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        names = set(self._space.names)
        taken = set()
        for other in study.get_trials(deepcopy=False):
            if other.number == trial.number:
                continue
            cache_key = (study.study_name, other.number)
            key = self._trial_keys.get(cache_key)
            if key is None:
                params = held_params(other)
                if set(params) != names:
                    continue
                key = self._space.key(params)
                if other.state != TrialState.WAITING:  # a trial's params never change again
                    self._trial_keys[cache_key] = key
            taken.add(key)
        while self._cursor < len(self._configs) and self._keys[self._cursor] in taken:
            self._cursor += 1
        if self._cursor >= len(self._configs):
            # the trial that ask() created would otherwise stay RUNNING forever
            study.tell(trial.number, state=TrialState.FAIL)
            raise optuna.exceptions.OptunaError("brute force: every feasible configuration taken")
        config = self._configs[self._cursor]
        self._cursor += 1
        return dict(config)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        # only reached for parameters outside the space; the first choice is as good as any
        assert isinstance(param_distribution, CategoricalDistribution)
        return param_distribution.choices[0]

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        return None


def held_params(trial: FrozenTrial) -> dict[str, Any]:
    """The configuration a trial holds; a WAITING (enqueued) trial keeps it in the system
    attribute ``fixed_params`` until it is asked (Optuna's ``enqueue_trial`` contract)."""
    if trial.state == TrialState.WAITING:
        return dict(trial.system_attrs.get("fixed_params") or {})
    return dict(trial.params)


def _python(value: Any) -> ParamValue:
    """NumPy scalars from a DataFrame → plain Python values Optuna can store."""
    return value.item() if isinstance(value, np.generic) else value


def make_sampler(
    name: str,
    space: SpaceLike,
    *,
    seed: int | None,
    ablate: Sequence[str] = (),
    warm_start: Sequence[Any] = (),
    transfer_mode: str = "prior",
    warm_params: Mapping[str, Any] | None = None,
) -> BaseSampler:
    """The sampler called ``name``; raises ValueError for an unknown name or a missing extra.

    ``ablate`` switches parts of the surrogate sampler off (see :data:`ABLATIONS`).
    ``warm_start``: model bundles (or their paths) that warm-start the surrogate sampler
    (docs/transfer.md); a BundleError when one does not fit the space. ``warm_params``: further
    :class:`~surrotune.surrogate.transfer.WarmStart` options, for measuring them.
    """
    unknown = sorted(set(ablate) - set(ABLATIONS))
    if unknown or (ablate and name != "surrogate"):
        raise ValueError(
            f"ablate={list(ablate)}: only the surrogate sampler has parts to switch off, "
            f"namely {', '.join(ABLATIONS)}"
        )
    if warm_start and name != "surrogate":
        raise ValueError(
            f"--warm-start needs the surrogate sampler (the sampler is {name!r}): only it "
            "learns from a saved model"
        )
    if name == "surrogate":
        from surrotune.space import SearchSpace
        from surrotune.surrogate.sampler import SurrogateSampler

        if not isinstance(space, SearchSpace):
            raise ValueError("the surrogate sampler needs a SearchSpace")
        return SurrogateSampler(
            space=space,
            seed=seed,
            use_classifier="classifier" not in ablate,
            pending_weight=0.0 if "diversity" in ablate else 0.5,
            explore_share=0.0 if "diversity" in ablate else 0.2,
            diversity_weight=0.0,
            pairwise="features" not in ablate,
            alignment="features" not in ablate,
            warm_start=list(warm_start) or None,
            transfer_mode=transfer_mode,
            warm_params=warm_params,
        )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":  # Optuna's default TPESampler (in Optuna 5: multivariate unless told not)
        return optuna.samplers.TPESampler(seed=seed)
    if name == "tpe-multivariate":  # joint densities over the parameters that occur together
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)
    if name == "tpe-independent":  # one density per parameter: TPE as the 2011 paper has it
        return optuna.samplers.TPESampler(seed=seed, multivariate=False)
    if name == "gp":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ValueError(
                "the 'gp' sampler (Optuna's GPSampler) needs PyTorch: pip install torch"
            ) from None
        return optuna.samplers.GPSampler(seed=seed)
    if name == "brute-force":
        return FeasibleBruteForceSampler(space, seed=seed)
    raise ValueError(f"unknown sampler {name!r}; expected one of {', '.join(SAMPLER_NAMES)}")
