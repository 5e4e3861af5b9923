"""The resource model in a bundle, and a warm start that judges it against the target's limits.

A kernel whose blocks use ``BX * BY * TILE * 64`` bytes of dynamic shared memory, fastest where
the tile is largest: on the source GPU (232,448 bytes a block may opt in to) its best
configurations use 128 KB; on a target that allows 64 KB those fail. The source measured no
failure there, so its resource classifier cannot know; its resource model, judged against the
target's limit, does.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from surrotune.result import Result, Status
from surrotune.space import SearchSpace
from surrotune.surrogate.bundle import (
    ModelBundle,
    describe_device,
    fit_bundle,
    format_bundle,
    load_bundle,
)
from surrotune.surrogate.resources import limit_of, transferred_fits
from surrotune.surrogate.sampler import SurrogateSampler
from surrotune.surrogate.transfer import Source, WarmStart, resource_transfer

optuna.logging.set_verbosity(optuna.logging.WARNING)

PARAMS = {"BX": [16, 32, 64, 128, 256], "BY": [1, 2, 4, 8], "TILE": [1, 2, 4], "FLAG": [0, 1]}
SOURCE = {
    "name": "NVIDIA H100", "major": 9, "minor": 0, "sharedMemPerBlock": 49152,
    "sharedMemPerBlockOptin": 232448, "regsPerBlock": 65536, "maxThreadsPerBlock": 1024,
}  # fmt: skip
#: a GPU whose blocks may opt in to 64 KB only (a Turing card's limit)
SMALL = {**SOURCE, "name": "NVIDIA T4", "major": 7, "minor": 5, "sharedMemPerBlockOptin": 65536}


def shared_of(c: dict[str, Any]) -> int:
    return c["BX"] * c["BY"] * c["TILE"] * 64


def time_of(c: dict[str, Any]) -> float:
    """Larger tiles are faster; FLAG=1 a little."""
    return float(8.0 / math.sqrt(c["BX"] * c["BY"] * c["TILE"]) * (1.0 - 0.05 * c["FLAG"]))


def measure(c: dict[str, Any], optin: int) -> Result:
    """One configuration on a GPU whose blocks may opt in to ``optin`` bytes of shared memory:
    the launch check's refusal past it, else a time; both report the shared memory."""
    shared = shared_of(c)
    if shared > optin:
        error = (f"{shared} bytes of shared memory per block exceed the device's "
                 f"sharedMemPerBlockOptin of {optin}")  # fmt: skip
        return Result(config=c, status=Status.RESOURCE, error=error, shared_bytes=shared)
    t = time_of(c)
    return Result(config=c, status=Status.OK, objective=t, times_ms=(t,), shared_bytes=shared)


CONFIGS = [dict(zip(PARAMS, v, strict=True)) for v in itertools.product(*PARAMS.values())]


def source_bundle() -> ModelBundle:
    results = [measure(c, SOURCE["sharedMemPerBlockOptin"]) for c in CONFIGS]
    return fit_bundle(
        results, parameters=PARAMS, direction="minimize", objective="time",
        device=describe_device(SOURCE), kernel={"name": "k", "template_sha256": "ab" * 32},
        problem_size={"N": 4096}, source={"study": "test"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return source_bundle()


def frame() -> pd.DataFrame:
    return pd.DataFrame(CONFIGS)


# ------------------------------------------------------------------ the bundle


def test_the_bundle_learns_the_resources_and_round_trips_them(
    bundle: ModelBundle, tmp_path: Path
) -> None:
    assert bundle.resources is not None and list(bundle.resources.models_) == ["shared_bytes"]
    learned = bundle.resources.models_["shared_bytes"]
    assert learned.limit_origin == "device"
    assert 2**learned.log_limit - 1 == pytest.approx(SOURCE["sharedMemPerBlockOptin"])
    assert bundle.resources_explained == 1.0  # every failure past the limit is predicted
    loaded = load_bundle(bundle.save(tmp_path / "m.json.gz"))
    assert loaded.resources is not None and loaded.resources_explained == 1.0
    theirs, mine = loaded.predict_resources(frame()), bundle.predict_resources(frame())
    assert set(theirs) == set(mine) == {"shared_bytes"}
    np.testing.assert_array_equal(theirs["shared_bytes"][0], mine["shared_bytes"][0])
    np.testing.assert_array_equal(theirs["shared_bytes"][1], mine["shared_bytes"][1])
    # what it predicts is the shared memory itself, within a few per cent
    truth = np.log2(np.array([shared_of(c) for c in CONFIGS], dtype=np.float64) + 1.0)
    assert np.abs(mine["shared_bytes"][0] - truth).max() < 0.1
    shown = format_bundle(loaded)
    assert "predicts 100 % of its resource failures" in shown
    assert "    shared bytes: limit 232,448 (set by the device), " in shown


def test_a_bundle_without_resources_loads_without_a_resource_model(
    bundle: ModelBundle, tmp_path: Path
) -> None:
    """Kernel Tuner's recordings report no resources, and older bundles carry none."""
    doc = bundle.to_json()
    del doc["resources"]
    older = ModelBundle.from_json(doc)
    assert older.resources is None and older.predict_resources(frame()) == {}
    bare = [Result(config=r.config, status=r.status, objective=r.objective, error=r.error)
            for r in (measure(c, 232448) for c in CONFIGS)]  # fmt: skip
    plain = fit_bundle(bare, parameters=PARAMS, direction="minimize", objective="time",
                       device=describe_device(SOURCE), kernel=None, problem_size=None,
                       source={})  # fmt: skip
    assert plain.resources is None and plain.to_json()["resources"] is None


# ------------------------------------------------------------------ judged against the target


def test_the_target_limit_outranks_the_source_but_a_compiler_limit_carries_over() -> None:
    device = describe_device(SMALL)
    assert limit_of("shared_bytes", [], device) == (65536.0, "device")
    # ptxas's static 48 KB, stated on the source, applies on any GPU of the same compiler
    assert limit_of("shared_bytes", [], device, compiler=49152.0) == (49152.0, "compiler")
    # a limit the target's own failure states wins over both
    stated = [{"error": "uses too much shared data (0x10000 bytes, 0x8000 max)"}]
    assert limit_of("shared_bytes", stated, device, compiler=49152.0) == (32768.0, "compiler")
    assert limit_of("shared_bytes", [], None) is None


def test_transferred_fits_follow_the_targets_limit_and_measurements() -> None:
    log_bytes = np.log2(np.array([16384.0, 65536.0, 131072.0]) + 1.0)
    prior = {"shared_bytes": (log_bytes, np.full(3, 0.125))}
    on_large = transferred_fits(prior, {"shared_bytes": 232448.0})
    on_small = transferred_fits(prior, {"shared_bytes": 65536.0})
    assert on_large.min() > 0.99
    assert on_small[0] > 0.99 and on_small[1] == pytest.approx(0.5, abs=0.01)
    assert on_small[2] < 0.01
    # the target measured twice as much as the source predicted: the prior shifts up
    doubled = transferred_fits(prior, {"shared_bytes": 65536.0}, {"shared_bytes": np.ones(6)})
    assert doubled[0] > 0.9 and doubled[1] < 0.2
    # no limit known on the target: nothing is judged
    np.testing.assert_array_equal(transferred_fits(prior, {}), np.ones(3))


def test_the_target_model_takes_over_only_where_it_predicts_better_than_the_prior() -> None:
    """With the target's own resource model learned on all its rows: a prior that the target's
    rows contradict (residuals scattered by 1.5 powers of two) gives way to it; an exact prior
    keeps predicting (its error on the rows, 0, is not above the target model's σ)."""
    from surrotune.surrogate.resources import ResourceModel

    X = np.array([[math.log2(c["BX"]), math.log2(c["BY"]), math.log2(c["TILE"]), c["FLAG"]]
                  for c in CONFIGS])  # fmt: skip
    truth = np.log2(np.array([shared_of(c) for c in CONFIGS], dtype=np.float64) + 1.0)
    attrs = [{"shared_bytes": shared_of(c)} for c in CONFIGS]
    own = ResourceModel().fit(X, attrs, {"shared_per_block_optin": 65536}, None)
    limits = {"shared_bytes": 65536.0}
    scatter = np.random.default_rng(0).normal(0.0, 1.5, len(CONFIGS))
    wrong = {"shared_bytes": (truth - scatter, np.full(len(CONFIGS), 0.125))}
    residuals = {"shared_bytes": scatter}
    p = transferred_fits(wrong, limits, residuals, own, X)
    np.testing.assert_allclose(p, own.predict_fits(X), rtol=1e-6)
    exact = {"shared_bytes": (truth, np.full(len(CONFIGS), 0.125))}
    p = transferred_fits(exact, limits, {"shared_bytes": np.zeros(len(CONFIGS))}, own, X)
    np.testing.assert_allclose(p, transferred_fits(exact, limits), rtol=1e-6)


def test_resource_transfer_needs_a_known_target_of_the_same_compiler(bundle: ModelBundle) -> None:
    cand = Source.on(bundle, frame())
    obs = cand.take(np.array([], dtype=np.int64))
    assert resource_transfer([cand], [obs], [], [], None) is None
    assert resource_transfer([cand], [obs], [], [], {"name": "AMD Instinct MI250X"}) is None
    moved = resource_transfer([cand], [obs], [], [], describe_device(SMALL))
    assert moved is not None and moved.replaced == {bundle.label}
    assert moved.limits == {"shared_bytes": 65536.0}
    shared = np.array([shared_of(c) for c in CONFIGS])
    assert moved.fits[shared < 65536].min() > 0.99
    assert moved.fits[shared > 65536].max() < 0.01
    assert moved.fits[shared == 65536] == pytest.approx(0.5, abs=0.01)  # at the limit itself
    # the source's own classifier saw no failure at 128 KB: it would let those through
    p_fail = cand.fail["resource"]
    at_128k = np.array([shared_of(c) == 131072 for c in CONFIGS])
    assert p_fail[at_128k].max() < 0.5


def _warm_run(
    bundle: ModelBundle, n: int, sampler: SurrogateSampler | None = None, **warm: Any
) -> list[Result]:
    """``n`` evaluations on the small GPU, warm-started from ``bundle``; the results in order."""
    space = SearchSpace(PARAMS)
    if sampler is None:
        sampler = SurrogateSampler(space=space, seed=0, warm_start=WarmStart([bundle], **warm))
    study = optuna.create_study(sampler=sampler)
    study.set_user_attr("device", SMALL)
    out = []
    for _ in range(n):
        trial = study.ask()
        config = {k: trial.suggest_categorical(k, space.values[k]) for k in space.names}
        result = measure(config, SMALL["sharedMemPerBlockOptin"])
        trial.set_user_attr("status", result.status.value)
        trial.set_user_attr("shared_bytes", result.shared_bytes)
        if result.ok:
            study.tell(trial, result.objective)
        else:
            trial.set_user_attr("error", result.error)
            study.tell(trial, state=TrialState.FAIL)
        out.append(result)
    return out


@pytest.mark.parametrize("keep", [False, True])
def test_the_warm_design_leaves_out_what_the_targets_limits_refuse(
    bundle: ModelBundle, keep: bool
) -> None:
    """The source's best configurations use 128 KB. Judged by the source's classifier they
    fit, and the warm design spends its first proposals on them; judged by its resource model
    against the target's 64 KB (with the classifier kept beside it or not), no design proposal
    fails."""
    judged = _warm_run(bundle, 10, keep_resource_classifiers=keep)
    classified = _warm_run(bundle, 10, transfer_resources=False)
    failed = [sum(r.status is Status.RESOURCE for r in run) for run in (judged, classified)]
    assert failed[0] == 0
    assert failed[1] >= 3
    best = min(r.objective for r in judged if r.ok)
    optimum = min(time_of(c) for c in CONFIGS if shared_of(c) <= 65536)
    assert best == pytest.approx(optimum)


def test_the_end_of_a_run_names_the_limits_the_sources_were_judged_against(
    bundle: ModelBundle,
) -> None:
    sampler = SurrogateSampler(space=SearchSpace(PARAMS), seed=0, warm_start=[bundle])
    _warm_run(bundle, 14, sampler)
    assert sampler.last_resource_transfer is not None
    assert sampler.warm_design_summary()[-1] == (
        "resource limits: the source's resource model judged against this GPU's (shared bytes "
        "65,536)"
    ).replace("the source", bundle.label)


@pytest.mark.parametrize("keep", [False, True])
def test_the_resource_classifier_is_replaced_unless_kept(bundle: ModelBundle, keep: bool) -> None:
    """The transferred failure beliefs name a source's resource classifier only where it still
    gates candidates (``keep_resource_classifiers``)."""
    warm = WarmStart([bundle], keep_resource_classifiers=keep)
    sampler = SurrogateSampler(space=SearchSpace(PARAMS), seed=0, warm_start=warm)
    _warm_run(bundle, 14, sampler)
    assert sampler.last_transfer is not None and sampler.last_resource_transfer is not None
    assert (f"{bundle.label}:resource" in sampler.last_transfer.confidence) is keep
