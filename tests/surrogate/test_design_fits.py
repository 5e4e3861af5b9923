"""SurrogateSampler(design_fits): after a resource failure, the rest of the space-filling design
is drawn among the configurations the resource model expects to fit."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from surrotune.surrogate import SurrogateSampler
from tests.surrogate.test_resources import SPACE, _check_proposals, _run_study


def design_failures(design_fits: float | None, seed: int, report: bool = True) -> int:
    sampler = SurrogateSampler(
        space=SPACE, seed=seed, n_startup_trials=24, design_fits=design_fits
    )  # fmt: skip
    study = _run_study(sampler, 24, report=report)
    _check_proposals(study)
    return sum(t.state == TrialState.FAIL for t in study.trials)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.5, 2.0])
def test_design_fits_must_be_a_probability(bad: float) -> None:
    with pytest.raises(ValueError, match="design_fits"):
        SurrogateSampler(space=SPACE, seed=0, design_fits=bad)


def test_the_design_stops_running_into_the_shared_memory_limit() -> None:
    """A 24-point maximin design on SPACE (a third of it over the 48 KB limit) fails on far
    fewer points once the failures it met teach the resource model where the limit runs."""
    plain = [design_failures(None, seed) for seed in range(3)]
    gated = [design_failures(0.5, seed) for seed in range(3)]
    assert all(g <= p for g, p in zip(gated, plain, strict=True)), (plain, gated)
    assert sum(gated) < sum(plain), (plain, gated)


def test_trials_without_resources_leave_the_design_unchanged() -> None:
    """Kernel Tuner-style trials report no resources: no model, so the same design."""

    def params(design_fits: float | None) -> list[dict]:
        sampler = SurrogateSampler(
            space=SPACE, seed=0, n_startup_trials=16, design_fits=design_fits
        )  # fmt: skip
        return [t.params for t in _run_study(sampler, 16, report=False).trials]

    assert params(0.5) == params(None)
