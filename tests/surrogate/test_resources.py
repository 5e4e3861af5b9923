"""ResourceModel: compile-time resources parsed from trials, learned, and judged against limits;
and its use by SurrogateSampler (``resource_model``)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState
from scipy.special import ndtr

from surrotune.backends.occupancy import DeviceLimits, occupancy
from surrotune.backends.replay import ReplayBackend, load_dataset
from surrotune.runner import Runner, device_limits
from surrotune.sampling import distributions
from surrotune.space import SearchSpace
from surrotune.surrogate import SurrogateSampler
from surrotune.surrogate.resources import RESOURCES, ResourceFeatures, ResourceModel, resource_row
from tests.test_runner import write_kt_cache

optuna.logging.set_verbosity(optuna.logging.WARNING)

PTXAS = (
    "ptxas error   : Entry function 'reduction' uses too much shared data "
    "(0x{:x} bytes, 0xc000 max)"
)
LIMIT = 49152  # 0xc000
DEVICE = {"shared_per_block": LIMIT, "regs_per_block": 65536, "max_threads_per_block": 1024}
#: every limit an H200's trial records (runner.device_limits of its worker's hello)
H200_LIMITS = device_limits({
    "name": "NVIDIA H200", "multiProcessorCount": 132, "maxBlocksPerMultiProcessor": 32,
    "major": 9, "minor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiProcessor": 2048,
    "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,
    "sharedMemPerBlock": LIMIT, "sharedMemPerMultiprocessor": 233472,
    "sharedMemPerBlockOptin": 232448, "reservedSharedMemPerBlock": 1024,
})  # fmt: skip

# ------------------------------------------------------------------ resource_row


def test_an_ok_trial_reports_what_it_used() -> None:
    values, limits = resource_row(
        {"status": "ok", "shared_bytes": 4096, "registers": 40, "threads_per_block": 256}
    )
    assert values == {"shared_bytes": 4096.0, "threads_per_block": 256.0,
                      "registers_per_block": 40.0 * 256}  # fmt: skip
    assert limits == {}


def test_registers_without_threads_give_no_registers_per_block() -> None:
    values, _ = resource_row({"registers": 40, "shared_bytes": 0})
    assert values == {"shared_bytes": 0.0}


def test_the_ptxas_shared_memory_message_states_request_and_limit() -> None:
    error = (
        "ptxas error   : Entry function 'reduction' uses too much shared data "
        "(0x20080 bytes, 0xc000 max)"
    )
    values, limits = resource_row({"status": "resource", "error": error})
    assert values == {"shared_bytes": float(0x20080)}
    assert limits == {"shared_bytes": float(0xC000)}
    # decimal byte counts parse too
    values, limits = resource_row({"error": "uses too much shared data (70000 bytes, 49152 max)"})
    assert values == {"shared_bytes": 70000.0} and limits == {"shared_bytes": 49152.0}


def test_the_threads_per_block_message_states_request_and_limit() -> None:
    error = "2048 threads per block exceed the device's maxThreadsPerBlock of 1024"
    values, limits = resource_row({"status": "resource", "error": error})
    assert values == {"threads_per_block": 2048.0}
    assert limits == {"threads_per_block": 1024.0}


def test_the_registers_per_block_message_states_request_and_limit() -> None:
    # the exact text surrotune.backends.cuda.check_limits writes
    error = (
        "80 registers x 1024 threads = 81920 registers per block exceed the device's "
        "regsPerBlock of 65536"
    )
    values, limits = resource_row({"status": "resource", "error": error})
    assert values == {"threads_per_block": 1024.0, "registers_per_block": 81920.0}
    assert limits == {"registers_per_block": 65536.0}  # not the threads' limit


def test_a_message_overrides_the_attributes_it_restates() -> None:
    error = (
        "80 registers x 1024 threads = 81920 registers per block exceed the device's "
        "regsPerBlock of 65536"
    )
    values, _ = resource_row(
        {"registers": 80, "threads_per_block": 1024, "shared_bytes": 0, "error": error}
    )
    assert values == {"shared_bytes": 0.0, "threads_per_block": 1024.0,
                      "registers_per_block": 81920.0}  # fmt: skip


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"status": "ok"},
        {"shared_bytes": None, "registers": None, "threads_per_block": None, "error": ""},
        {"status": "compile", "error": "error: identifier 'x' is undefined"},
        {"status": "runtime", "error": None},
    ],
)
def test_attributes_without_resources_report_nothing(attrs: dict[str, Any]) -> None:
    assert resource_row(attrs) == ({}, {})


# ------------------------------------------------------------------ ResourceModel, planted

BLOCKS = [32, 64, 128, 256, 512, 1024]
ITEMS = [1, 2, 4, 8, 16, 32]
VECS = [1, 2, 4]
CONFIGS = list(itertools.product(BLOCKS, ITEMS, VECS))  # 108


def shared_of(config: tuple[int, int, int]) -> int:
    block, items, vec = config
    return block * items * vec * 4


def features(configs: list[tuple[int, int, int]], seed: int = 0) -> np.ndarray:
    """log2 of the parameters, their sum, and two uninformative columns."""
    logs = np.log2(np.array(configs, dtype=np.float64))
    noise = np.random.default_rng(seed).random((len(configs), 2))
    return np.column_stack([logs, logs.sum(axis=1), noise])


def planted_attrs(config: tuple[int, int, int]) -> dict[str, Any]:
    """An ok trial's attributes, or a ptxas failure's (no resources but the message's)."""
    shared = shared_of(config)
    if shared > LIMIT:
        return {"status": "resource", "error": PTXAS.format(shared)}
    block = config[0]
    return {"status": "ok", "shared_bytes": shared, "registers": 32, "threads_per_block": block}


def planted_split(seed: int = 0, n: int = 30) -> tuple[list, list]:
    order = np.random.default_rng(seed).permutation(len(CONFIGS))
    train = [CONFIGS[i] for i in order[:n]]
    held = [CONFIGS[i] for i in order[n:]]
    return train, held


def planted_fit(
    seed: int = 0, device: dict[str, Any] | None = None, **options: Any
) -> ResourceModel:
    train, _ = planted_split(seed)
    attrs = [planted_attrs(c) for c in train]
    ok = [shared_of(c) <= LIMIT for c in train]
    return ResourceModel(seed=0, **options).fit(features(train), attrs, device, ok)


@pytest.mark.parametrize("device", [{"shared_per_block": LIMIT}, None])
def test_the_planted_shared_memory_boundary_is_learned(device: dict[str, Any] | None) -> None:
    """shared = block x items x vec x 4 against 48 KB, from 30 trials of which the failures
    state their request in a ptxas message: clearly small configurations fit, clearly large
    ones do not, and the held-out ones are ordered by whether they fit. Only the shared memory
    has a known limit (the device's and/or the messages'), so only it is learned."""
    train, held = planted_split()
    assert any(shared_of(c) > LIMIT for c in train) and any(shared_of(c) <= LIMIT for c in train)
    model = planted_fit(device=device)
    assert model.informative
    assert list(model.models_) == ["shared_bytes"]  # registers, threads: no limit known
    assert model.models_["shared_bytes"].log_limit == pytest.approx(math.log2(LIMIT + 1))
    p = model.predict_fits(features(CONFIGS))
    assert p.shape == (len(CONFIGS),) and np.all((p >= 0) & (p <= 1))
    shared = np.array([shared_of(c) for c in CONFIGS])
    assert p[shared <= LIMIT // 8].min() > 0.8  # at most 6 KB
    assert p[shared >= LIMIT * 4].max() < 0.2  # at least 192 KB
    p_held = model.predict_fits(features(held))
    fits = np.array([shared_of(c) <= LIMIT for c in held])
    assert fits.any() and (~fits).any()
    assert p_held[fits].mean() > p_held[~fits].mean() + 0.5
    pairs = [(a, b) for a in p_held[fits] for b in p_held[~fits]]
    assert sum(a > b for a, b in pairs) / len(pairs) > 0.9  # AUC


def test_margins_are_log2_of_prediction_over_limit() -> None:
    """Trees alone (``hybrid`` off): one σ for every candidate."""
    model = planted_fit(device={"shared_per_block": LIMIT}, hybrid=False)
    X = features(CONFIGS)
    margins = model.margins(X)
    assert margins.shape == (len(CONFIGS), 1)
    assert model.models_["shared_bytes"].linear is None
    sigma = model.models_["shared_bytes"].sigma
    assert sigma >= model.softness
    np.testing.assert_allclose(model.predict_fits(X), ndtr(-margins[:, 0] / sigma), rtol=1e-5)
    shared = np.array([shared_of(c) for c in CONFIGS])
    assert np.all(margins[shared <= LIMIT // 8, 0] < 0)
    assert np.all(margins[shared >= LIMIT * 4, 0] > 0)


def test_a_softer_model_is_less_certain() -> None:
    train, _ = planted_split()
    attrs = [planted_attrs(c) for c in train]
    ok = [shared_of(c) <= LIMIT for c in train]
    X = features(train)
    sharp = ResourceModel(softness=0.125).fit(X, attrs, None, ok).predict_fits(features(CONFIGS))
    soft = ResourceModel(softness=4.0).fit(X, attrs, None, ok).predict_fits(features(CONFIGS))
    assert np.abs(soft - 0.5).max() < np.abs(sharp - 0.5).max()
    with pytest.raises(ValueError, match="softness"):
        ResourceModel(softness=0.0)


def test_every_resource_with_a_limit_is_learned_and_multiplied() -> None:
    """With the device's limits all three resources are learned (registers and threads vary
    with the block), and P(fits) is the product of the per-resource probabilities."""
    train, _ = planted_split()
    attrs = [planted_attrs(c) for c in train]
    ok = [shared_of(c) <= LIMIT for c in train]
    model = ResourceModel(hybrid=False).fit(features(train), attrs, DEVICE, ok)
    assert set(model.models_) == set(RESOURCES)
    margins = model.margins(features(CONFIGS))
    sigma = np.array([model.models_[name].sigma for name in model.models_])
    per = ndtr(-margins / sigma)
    np.testing.assert_allclose(model.predict_fits(features(CONFIGS)), per.prod(axis=1), rtol=1e-5)


def test_the_hybrid_widens_sigma_where_its_two_regressors_disagree() -> None:
    """With ``hybrid`` on, the prediction is the regressor of lower cross-validated error and a
    candidate's σ is sqrt(σ_cv² + (disagreement · (trees - linear))²)."""
    model = planted_fit(device={"shared_per_block": LIMIT})
    learned = model.models_["shared_bytes"]
    assert learned.linear is not None
    X = features(CONFIGS).astype(np.float32)
    trees = model._predict_trees(learned.trees, X)
    linear = model._predict_linear(learned.linear, X)
    assert np.abs(trees - linear).max() > 0.1  # they do differ somewhere
    mean = linear if learned.use_linear else trees
    np.testing.assert_allclose(model.margins(X)[:, 0], mean - learned.log_limit, rtol=1e-5)
    sigma = np.sqrt(learned.sigma**2 + (model.disagreement * (trees - linear)) ** 2)
    expected = ndtr(-(mean - learned.log_limit) / sigma)
    np.testing.assert_allclose(model.predict_fits(X), expected, rtol=1e-5, atol=1e-7)
    # disagreement 0: the σ of the chosen regressor alone, the same for every candidate
    flat = planted_fit(device={"shared_per_block": LIMIT}, disagreement=0.0)
    chosen = flat.models_["shared_bytes"]
    np.testing.assert_allclose(
        flat.predict_fits(X), ndtr(-flat.margins(X)[:, 0] / chosen.sigma), rtol=1e-5, atol=1e-7
    )
    with pytest.raises(ValueError, match="disagreement"):
        ResourceModel(disagreement=-1.0)


def test_the_linear_regressor_interpolates_a_level_nobody_measured() -> None:
    """shared = block x items x vec x 4 is a sum of logs. Without the sum among the features
    and no trial at items = 4, the trees give those configurations a measured neighbour's
    value; the ridge regression interpolates them, so the hybrid predicts them better, chooses
    the linear regressor, and its P(fits) orders them by whether they fit."""
    train = [c for c in CONFIGS if c[1] != 4]
    held = [c for c in CONFIGS if c[1] == 4]
    attrs = [planted_attrs(c) for c in train]
    ok = [shared_of(c) <= LIMIT for c in train]
    no_sum = [0, 1, 2, 4, 5]
    X, X_held = features(train)[:, no_sum], features(held)[:, no_sum]
    truth = np.log2(np.array([shared_of(c) for c in held], dtype=np.float64) + 1.0)
    trees = ResourceModel(hybrid=False).fit(X, attrs, DEVICE, ok)
    hybrid = ResourceModel().fit(X, attrs, DEVICE, ok)
    assert hybrid.models_["shared_bytes"].use_linear

    def error(model: ResourceModel) -> float:
        log_limit = model.models_["shared_bytes"].log_limit
        predicted = model.margins(X_held)[:, list(model.models_).index("shared_bytes")]
        return float(np.abs(predicted + log_limit - truth).mean())

    assert error(hybrid) < error(trees) / 2
    fits = np.array([shared_of(c) <= LIMIT for c in held])
    p = hybrid.predict_fits(X_held)
    assert p[fits].min() > p[~fits].max()


# ------------------------------------------------------------------ uninformative cases


def test_no_reported_resources_is_uninformative() -> None:
    X = features(CONFIGS[:20])
    attrs = [{"status": "ok"}] * 10 + [{"status": "compile", "error": "syntax error"}] * 10
    model = ResourceModel().fit(X, attrs, DEVICE, [True] * 10 + [False] * 10)
    assert not model.informative and model.models_ == {}
    np.testing.assert_array_equal(model.predict_fits(features(CONFIGS)), np.ones(len(CONFIGS)))
    assert model.margins(X).shape == (20, 0)


def test_a_resource_without_a_known_limit_is_not_learned() -> None:
    """Ok trials report all three resources, but without device limits and without a failure
    message that states one, no limit is known: nothing is learned."""
    train = [c for c in CONFIGS if shared_of(c) <= LIMIT][:20]
    attrs = [planted_attrs(c) for c in train]
    model = ResourceModel().fit(features(train), attrs, None, [True] * len(train))
    assert not model.informative
    model = ResourceModel().fit(features(train), attrs, {}, [True] * len(train))
    assert not model.informative
    np.testing.assert_array_equal(model.predict_fits(features(CONFIGS)), np.ones(len(CONFIGS)))


def test_too_few_rows_or_a_constant_within_the_limit_tell_nothing() -> None:
    train = [c for c in CONFIGS if shared_of(c) <= LIMIT]
    attrs = [planted_attrs(c) for c in train]
    few = ResourceModel(min_rows=5).fit(features(train[:4]), attrs[:4], DEVICE, [True] * 4)
    assert not few.informative
    constant = [{"threads_per_block": 256}] * len(train)  # always 256, the limit 1024
    model = ResourceModel().fit(features(train), constant, DEVICE, [True] * len(train))
    assert "threads_per_block" not in model.models_ and not model.informative


def test_an_ok_trial_raises_the_limit_to_what_it_used() -> None:
    """The device says 48 KB, but an ok trial used 100,000 bytes (dynamic shared memory opted
    in): the effective limit is at least that, so a configuration using 90,000 fits, where
    without the ok rows it would not."""
    used = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 90000, 100000]
    X = np.log2(np.array(used, dtype=np.float64))[:, None]
    attrs = [{"shared_bytes": s} for s in used]
    device = {"shared_per_block": LIMIT}
    raised = ResourceModel().fit(X, attrs, device, [True] * len(used))
    log_limit = raised.models_["shared_bytes"].log_limit
    assert 2**log_limit - 1 >= 100000 - 1e-6
    query = np.log2(np.array([[90000.0], [1024.0]]))
    p = raised.predict_fits(query)  # 90,000 lies 0.15 powers of two under 100,000
    assert p[0] > 0.5 and p[1] > 0.99
    not_ok = ResourceModel().fit(X, attrs, device, None)  # ok unknown: the device's 48 KB
    assert not_ok.models_["shared_bytes"].log_limit == pytest.approx(math.log2(LIMIT + 1))
    p = not_ok.predict_fits(query)
    assert p[0] < 0.3 and p[1] > 0.8
    # a failure's stated limit is raised by an ok trial just the same
    stated = [*attrs, {"error": PTXAS.format(200000)}]
    Xs = np.vstack([X, [[math.log2(200000)]]])
    model = ResourceModel().fit(Xs, stated, None, [True] * len(used) + [False])
    assert 2 ** model.models_["shared_bytes"].log_limit - 1 >= 100000 - 1e-6
    assert model.predict_fits(query)[0] > 0.5
    assert model.predict_fits(np.array([[math.log2(200000)]]))[0] < 0.2


def test_the_smallest_stated_limit_wins_over_the_device() -> None:
    used = [1024, 4096, 16384, 32768, 60000, 70000]
    X = np.log2(np.array(used, dtype=np.float64))[:, None]
    attrs = [{"shared_bytes": s} for s in used[:4]] + [
        {"error": f"uses too much shared data ({s} bytes, 49152 max)"} for s in used[4:]
    ]
    model = ResourceModel().fit(X, attrs, {"shared_per_block": 232448}, [True] * 4 + [False] * 2)
    assert model.models_["shared_bytes"].log_limit == pytest.approx(math.log2(LIMIT + 1))


# ------------------------------------------------------------------ determinism


def test_a_seed_gives_identical_predictions() -> None:
    first = planted_fit(device=DEVICE).predict_fits(features(CONFIGS))
    second = planted_fit(device=DEVICE).predict_fits(features(CONFIGS))
    np.testing.assert_array_equal(first, second)
    train, _ = planted_split()
    attrs = [planted_attrs(c) for c in train]
    ok = [shared_of(c) <= LIMIT for c in train]
    a = ResourceModel(seed=7).fit(features(train), attrs, DEVICE, ok)
    b = ResourceModel(seed=7).fit(features(train), attrs, DEVICE, ok)
    np.testing.assert_array_equal(a.margins(features(CONFIGS)), b.margins(features(CONFIGS)))


# ------------------------------------------------------------------ SurrogateSampler

SPACE = SearchSpace({"block": BLOCKS, "items": ITEMS, "vec": VECS}, ["block * items <= 16384"])


def _run_study(
    sampler: SurrogateSampler, n: int, *, report: bool = True, device: dict[str, Any] = DEVICE
) -> optuna.Study:
    """An ask/tell study on SPACE whose trials carry what surrotune's runner stores: ok trials
    their resources and the device limits, shared-memory failures a ptxas message (``report``
    False: neither, as a Kernel Tuner recording)."""
    study = optuna.create_study(direction="minimize", sampler=sampler)
    dists = distributions(SPACE)
    for _ in range(n):
        trial = study.ask(dists)
        config = (trial.params["block"], trial.params["items"], trial.params["vec"])
        shared = shared_of(config)
        attrs: dict[str, Any] = {"status": "ok"}
        if report:
            attrs = {**planted_attrs(config), "device_limits": device}
        if shared > LIMIT:
            attrs["status"] = "resource"
            for name, value in attrs.items():
                trial.set_user_attr(name, value)
            study.tell(trial, state=TrialState.FAIL)
            continue
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        block, items, vec = config
        study.tell(trial, abs(math.log2(block) - 7) + abs(math.log2(items * vec) - 3) + 1.0)
    return study


def _check_proposals(study: optuna.Study) -> None:
    trials = [t for t in study.get_trials() if t.params]
    keys = [SPACE.key(t.params) for t in trials]
    assert len(keys) == len(set(keys))  # never a configuration twice
    assert all(t.params["block"] * t.params["items"] <= 16384 for t in trials)


def test_the_sampler_learns_the_resources_its_trials_report() -> None:
    sampler = SurrogateSampler(space=SPACE, seed=0, n_startup_trials=8)
    study = _run_study(sampler, 24)
    _check_proposals(study)
    fit = sampler._fit
    assert fit is not None and fit.resources is not None
    assert set(fit.resources.models_) == set(RESOURCES)
    # over the whole candidate table the resources tell the fitting rows from the others
    table = sampler._table
    assert table is not None
    p = fit.resources.predict_fits(fit.augment(table.features))
    shared = np.array([shared_of((c["block"], c["items"], c["vec"])) for c in map(
        table.config, range(len(p))
    )])  # fmt: skip
    assert p[shared <= LIMIT].mean() > p[shared > LIMIT].mean() + 0.5
    # and P(ok) of the candidates includes them: no over-the-limit candidate passes the gate
    assert fit.cand_ok is not None
    np.testing.assert_allclose(
        fit.cand_ok, fit.feas.predict_ok(fit.augment(table.features)) * p, rtol=1e-6
    )
    assert fit.cand_ok[shared >= LIMIT * 4].max() < 0.2
    searched = [t for t in study.get_trials() if t.number >= 8]  # after the design
    assert sum(t.state == TrialState.FAIL for t in searched) <= 1  # few failures once learned


def test_resource_model_false_leaves_the_resources_out() -> None:
    sampler = SurrogateSampler(space=SPACE, seed=0, n_startup_trials=8, resource_model=False)
    study = _run_study(sampler, 14)
    _check_proposals(study)
    assert sampler._fit is not None and sampler._fit.resources is None


def test_resource_params_reach_the_resource_model() -> None:
    """``resource_params`` configures the sampler's ResourceModel: a far softer bound is far
    less certain of which candidates fit than the default one."""
    sampler = SurrogateSampler(
        space=SPACE, seed=0, n_startup_trials=8, resource_params={"softness": 8.0}
    )
    _run_study(sampler, 14)
    fit = sampler._fit
    assert fit is not None and fit.resources is not None
    assert fit.resources.softness == 8.0
    assert all(learned.sigma >= 8.0 for learned in fit.resources.models_.values())
    default = SurrogateSampler(space=SPACE, seed=0, n_startup_trials=8)
    _run_study(default, 14)
    assert default._fit is not None and default._fit.resources is not None
    table = sampler._table
    assert table is not None
    soft = fit.resources.predict_fits(fit.augment(table.features))
    sharp = default._fit.resources.predict_fits(default._fit.augment(table.features))
    # an eight-octave-wide bound is sure of nothing: it neither passes nor gates out firmly
    assert soft.max() < 0.9 < sharp.max()
    assert np.ptp(soft) < np.ptp(sharp) / 2


def test_trials_that_report_no_resources_leave_the_search_unchanged() -> None:
    """Kernel Tuner-style trials (a status, no resources, no message): no resource model, and
    the proposals are the ones of a sampler without it."""
    with_model = SurrogateSampler(space=SPACE, seed=0, n_startup_trials=8)
    study = _run_study(with_model, 14, report=False)
    _check_proposals(study)
    assert with_model._fit is not None and with_model._fit.resources is None
    without = SurrogateSampler(space=SPACE, seed=0, n_startup_trials=8, resource_model=False)
    other = _run_study(without, 14, report=False)
    assert [t.params for t in study.trials] == [t.params for t in other.trials]


def test_a_replayed_kernel_tuner_cache_learns_no_resources(tmp_path: Path) -> None:
    dataset = load_dataset(write_kt_cache(tmp_path / "tiny.json"))
    space = SearchSpace(dataset.parameters, ["bx * by <= 256"])
    sampler = SurrogateSampler(space=space, seed=0, n_startup_trials=4)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    Runner(study=study, space=space, backend=ReplayBackend(dataset), trials=12,
           batch_size=3).run()  # fmt: skip
    trials = [t for t in study.get_trials() if t.params]
    keys = [space.key(t.params) for t in trials]
    assert len(keys) == len(set(keys))
    assert all(t.params["bx"] * t.params["by"] <= 256 for t in trials)
    assert sampler._fit is not None and sampler._fit.resources is None


def test_the_plain_optuna_path_learns_the_resources_too() -> None:
    """Without a SearchSpace (the random-pool path) the resources are learned from the same
    attributes and the proposals stay inside the distributions, never repeated."""
    sampler = SurrogateSampler(seed=0, n_startup_trials=6, pool_size=256)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    for _ in range(14):
        trial = study.ask()
        block = trial.suggest_categorical("block", BLOCKS)
        items = trial.suggest_categorical("items", ITEMS)
        vec = trial.suggest_categorical("vec", VECS)
        attrs = {**planted_attrs((block, items, vec)), "device_limits": DEVICE}
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        if attrs["status"] != "ok":
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, abs(math.log2(block) - 7) + abs(math.log2(items * vec) - 3))
    keys = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(keys) == len(set(keys))
    assert sampler._fit is not None and sampler._fit.resources is not None
    assert "shared_bytes" in sampler._fit.resources.models_


# ------------------------------------------------------------------ the cross-validation schedule


def have_rows(attrs: list[dict[str, Any]], name: str) -> list[int]:
    """The rows that report resource ``name``."""
    return [i for i, a in enumerate(attrs) if name in resource_row(a)[0]]


def _counted_errors(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the row count of every cross-validation ResourceModel runs."""
    calls: list[int] = []
    errors = ResourceModel._errors

    def counted(self: ResourceModel, X: np.ndarray, y: np.ndarray) -> Any:
        calls.append(len(y))
        return errors(self, X, y)

    monkeypatch.setattr(ResourceModel, "_errors", counted)
    return calls


def test_a_refit_takes_the_cross_validated_errors_over_until_the_rows_grow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given the previous refit's model, the errors (σ, which regressor predicts) stand while
    the rows have grown by less than ``cv_growth``; past it they are cross-validated again.
    The regressors themselves are fitted on every row each time."""
    order = np.random.default_rng(0).permutation(len(CONFIGS))
    rows = [CONFIGS[i] for i in order[:60]]
    attrs = [planted_attrs(c) for c in rows]
    ok = [shared_of(c) <= LIMIT for c in rows]
    X = features(rows)
    calls = _counted_errors(monkeypatch)

    def fit(n: int, previous: ResourceModel | None) -> ResourceModel:
        return ResourceModel(cv_growth=0.25).fit(
            X[:n], attrs[:n], DEVICE, ok[:n], previous=previous
        )

    first = fit(40, None)
    assert len(calls) == len(first.models_) > 0
    grown = fit(44, first)  # each resource's rows grow by under 25 %: nothing cross-validated
    for name, learned in grown.models_.items():
        assert first.errors_[name].rows * 1.25 > len(have_rows(attrs[:44], name))
        assert learned.sigma == first.models_[name].sigma
        assert grown.errors_[name] == first.errors_[name]
    assert len(calls) == len(first.models_)
    # the regressors did learn the new rows
    assert not np.allclose(grown.margins(features(CONFIGS)), first.margins(features(CONFIGS)))
    again = fit(60, grown)  # past 25 % on every resource: each is cross-validated again
    assert len(calls) == 2 * len(first.models_)
    for name, errors in again.errors_.items():
        assert errors.rows == len(have_rows(attrs, name)) > first.errors_[name].rows * 1.25


def test_without_the_schedule_every_fit_cross_validates_and_matches_a_fresh_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order = np.random.default_rng(1).permutation(len(CONFIGS))
    rows = [CONFIGS[i] for i in order[:45]]
    attrs = [planted_attrs(c) for c in rows]
    ok = [shared_of(c) <= LIMIT for c in rows]
    X = features(rows)
    first = ResourceModel(cv_growth=0.0).fit(X[:40], attrs[:40], DEVICE, ok[:40])
    calls = _counted_errors(monkeypatch)
    chained = ResourceModel(cv_growth=0.0).fit(X, attrs, DEVICE, ok, previous=first)
    assert len(calls) == len(chained.models_)
    fresh = ResourceModel(cv_growth=0.0).fit(X, attrs, DEVICE, ok)
    np.testing.assert_array_equal(
        chained.predict_fits(features(CONFIGS)), fresh.predict_fits(features(CONFIGS))
    )


def test_a_trees_only_model_cannot_hand_its_errors_to_a_hybrid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A previous model without the ridge's error (``hybrid=False``) does not decide for a
    hybrid one: it cross-validates both."""
    train, _ = planted_split()
    attrs = [planted_attrs(c) for c in train]
    ok = [shared_of(c) <= LIMIT for c in train]
    X = features(train)
    trees = ResourceModel(hybrid=False).fit(X, attrs, DEVICE, ok)
    calls = _counted_errors(monkeypatch)
    hybrid = ResourceModel().fit(X, attrs, DEVICE, ok, previous=trees)
    assert len(calls) == len(hybrid.models_)
    assert all(e.linear is not None for e in hybrid.errors_.values())


def test_cv_growth_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="cv_growth"):
        ResourceModel(cv_growth=-0.1)


def test_the_sampler_hands_its_last_resource_model_to_the_next_refit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a search the sampler passes each refit the resource model it fitted last, so most
    refits reuse the errors (the rows grow by 5 % between refits, by 10 % between
    cross-validations)."""
    seen: list[ResourceModel | None] = []
    fit = ResourceModel.fit

    def spy(self: ResourceModel, *args: Any, previous: ResourceModel | None = None) -> Any:
        seen.append(previous)
        return fit(self, *args, previous=previous)

    monkeypatch.setattr(ResourceModel, "fit", spy)
    calls = _counted_errors(monkeypatch)
    _run_study(SurrogateSampler(space=SPACE, seed=0, n_startup_trials=8), 60)
    assert len(seen) >= 5 and seen[0] is None
    assert all(p is not None for p in seen[-3:])
    assert len(calls) < len(seen) * 2  # far fewer cross-validations than refits x resources


# ------------------------------------------------------------------ ResourceFeatures


def test_resource_features_are_the_predicted_resources_and_their_occupancy() -> None:
    """The columns are the resource model's predictions (shared bytes, registers per thread)
    and the occupancy the calculator gives for them on the trials' device: the same function
    for every row, measured or not."""
    train, _ = planted_split()
    ok = [shared_of(c) <= LIMIT for c in train]
    model = ResourceModel(seed=0).fit(
        features(train), [planted_attrs(c) for c in train], H200_LIMITS, ok
    )
    X = features(CONFIGS)
    columns = ResourceFeatures(model, H200_LIMITS).columns(X)
    assert columns.shape == (len(CONFIGS), 4)
    predicted = model.predict_log(X)
    shared = np.exp2(predicted["shared_bytes"][0]) - 1
    threads = np.exp2(predicted["threads_per_block"][0]) - 1
    per_thread = (np.exp2(predicted["registers_per_block"][0]) - 1) / threads
    np.testing.assert_allclose(columns[:, 0], np.log2(shared + 1), rtol=1e-9)
    np.testing.assert_allclose(columns[:, 1], np.log2(per_thread + 1), rtol=1e-9)
    limits = DeviceLimits.from_limits(H200_LIMITS)
    for k in range(0, len(CONFIGS), 7):
        one = occupancy(limits, registers=math.ceil(per_thread[k]), threads=round(threads[k]),
                        static_shared=round(shared[k]))  # fmt: skip
        assert columns[k, 2] == one.fraction
        assert columns[k, 3] == pytest.approx(math.log2(one.active_blocks_per_sm + 1))
    # the planted kernel uses 32 registers a thread, and the prediction knows it
    assert np.median(per_thread) == pytest.approx(32, rel=0.15)
    # blocks past the 48 KB the planted kernel fails at cannot run: no occupancy
    fits = np.array([shared_of(c) <= LIMIT for c in CONFIGS])
    assert columns[fits, 2].mean() > columns[~fits, 2].mean() + 0.2
    only = ResourceFeatures(model, H200_LIMITS, occupancy_only=True).columns(X)
    np.testing.assert_array_equal(only, columns[:, 2:])
    augmented = ResourceFeatures(model, H200_LIMITS).augment(X)
    assert augmented.dtype == np.float32 and augmented.shape == (len(CONFIGS), X.shape[1] + 4)
    np.testing.assert_array_equal(augmented[:, : X.shape[1]], X.astype(np.float32))


def test_without_the_device_limits_the_occupancy_is_left_out() -> None:
    """Limits that the calculator cannot use (here: the three the resource model judges by,
    nothing else) leave only the predicted resources."""
    train, _ = planted_split()
    ok = [shared_of(c) <= LIMIT for c in train]
    attrs = [planted_attrs(c) for c in train]
    model = ResourceModel(seed=0).fit(features(train), attrs, DEVICE, ok)
    assert ResourceFeatures(model, DEVICE).columns(features(CONFIGS)).shape == (len(CONFIGS), 2)
    assert ResourceFeatures(model, None).columns(features(CONFIGS)).shape == (len(CONFIGS), 2)


def test_a_resource_that_never_varies_still_sets_the_occupancy() -> None:
    """Every trial at 256 threads and 40 registers: not learned (it cannot fail), but the
    occupancy needs it, so the model keeps the constant."""
    train = [c for c in CONFIGS if shared_of(c) <= LIMIT]
    attrs = [{"shared_bytes": shared_of(c), "registers": 40, "threads_per_block": 256}
             for c in train]  # fmt: skip
    model = ResourceModel(seed=0).fit(features(train), attrs, H200_LIMITS, [True] * len(train))
    assert list(model.models_) == ["shared_bytes"]
    assert model.constants_ == {"threads_per_block": 256.0, "registers_per_block": 10240.0}
    columns = ResourceFeatures(model, H200_LIMITS).columns(features(CONFIGS))
    np.testing.assert_allclose(columns[:, 1], math.log2(41))
    # 40 registers x 256 threads: six blocks by the registers; shared memory cuts it further
    assert columns[:, 3].max() == pytest.approx(math.log2(7))
    assert columns[:, 3].min() < columns[:, 3].max()


def test_resource_features_become_columns_of_the_performance_model() -> None:
    """``resource_features=True``: the performance model learns on the features plus the four
    columns, and ranks the candidates on the same; by default it sees the features alone."""
    sampler = SurrogateSampler(space=SPACE, seed=0, n_startup_trials=8, resource_features=True)
    study = _run_study(sampler, 24, device=H200_LIMITS)
    _check_proposals(study)
    fit, table = sampler._fit, sampler._table
    assert fit is not None and table is not None and fit.resource_features is not None
    assert fit.perf is not None and fit.perf.n_features_in_ == table.features.shape[1] + 4
    assert fit.cand_mean is not None and np.isfinite(fit.cand_mean).all()
    plain = SurrogateSampler(space=SPACE, seed=0, n_startup_trials=8)
    _run_study(plain, 24, device=H200_LIMITS)
    assert plain._fit is not None and plain._fit.resource_features is None
    assert plain._fit.perf is not None
    assert plain._fit.perf.n_features_in_ == table.features.shape[1]


def test_resource_features_must_be_a_known_choice() -> None:
    with pytest.raises(ValueError, match="resource_features"):
        SurrogateSampler(space=SPACE, resource_features="registers")  # type: ignore[arg-type]
