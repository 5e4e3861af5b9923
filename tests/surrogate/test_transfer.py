"""Model bundles and the warm start: round trips, refusals, weights, failures, and the payoff."""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import pytest

from surrotune.backends.replay import ReplayBackend
from surrotune.bench import metrics
from surrotune.bench.harness import evaluation_sequence, prepare_dataset
from surrotune.result import Result, Status
from surrotune.runner import Runner
from surrotune.space import SearchSpace
from surrotune.surrogate.bundle import (
    BUNDLE_VERSION,
    BundleError,
    ModelBundle,
    bundle_from_dataset,
    describe_device,
    fit_bundle,
    format_bundle,
    load_bundle,
    resource_limit,
)
from surrotune.surrogate.sampler import SurrogateSampler
from surrotune.surrogate.transfer import (
    Source,
    WarmStart,
    affine_map,
    failure_confidence,
    failure_prior,
    ranking_weights,
)

PARAMS = {"BX": [16, 32, 64, 128, 256], "BY": [1, 2, 4, 8], "TILE": [1, 2, 4], "FLAG": [0, 1]}
H100 = {
    "name": "NVIDIA H100",
    "major": 9,
    "minor": 0,
    "sharedMemPerBlock": 49152,
    "sharedMemPerBlockOptin": 232448,
    "regsPerBlock": 65536,
    "maxThreadsPerBlock": 1024,
}


def _time(c: dict, shift: float = 0.0) -> float:
    """A smooth landscape with its optimum at BX=64, BY=4, TILE=2, FLAG=1."""
    return float(np.exp(
        abs(np.log2(c["BX"] / (64 * 2**shift))) * 0.3 + abs(np.log2(c["BY"] / 4)) * 0.2
        + abs(c["TILE"] - 2) * 0.15 + (1 - c["FLAG"]) * 0.1
    ))  # fmt: skip


def _results(shift: float = 0.0, noise: float = 0.0, seed: int = 0) -> list[Result]:
    """Every configuration of PARAMS; BX * BY * TILE > 1024 needs too much shared memory."""
    rng = np.random.default_rng(seed)
    out = []
    for values in itertools.product(*PARAMS.values()):
        c = dict(zip(PARAMS, values, strict=True))
        if c["BX"] * c["BY"] * c["TILE"] > 1024:
            out.append(Result(config=c, status=Status.RESOURCE,
                              error="ptxas error: uses too much shared data"))  # fmt: skip
        else:
            t = _time(c, shift) * float(np.exp(noise * rng.normal()))
            out.append(Result(config=c, status=Status.OK, objective=t, times_ms=(t,)))
    return out


def _bundle(results: list[Result] | None = None, device: dict | None = None) -> ModelBundle:
    return fit_bundle(
        results if results is not None else _results(),
        parameters=PARAMS, direction="minimize", objective="time",
        device=describe_device(device or H100), kernel={"name": "k", "template_sha256": "ab" * 32},
        problem_size={"N": 4096}, source={"study": "test"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return _bundle()


def _tune(
    sampler: SurrogateSampler, n: int, objective: Any, space: SearchSpace | None = None
) -> list[dict]:
    """``n`` ask-and-tell rounds of a study over ``space`` (PARAMS by default) with
    ``sampler``, ``objective(k, config)`` the k-th measurement; the configurations proposed,
    in order."""
    space = space or SearchSpace(PARAMS)
    study = optuna.create_study(sampler=sampler)
    configs = []
    for k in range(n):
        trial = study.ask()
        config = {n: trial.suggest_categorical(n, space.values[n]) for n in space.names}
        configs.append(config)
        study.tell(trial, objective(k, config))
    return configs


def _frame() -> pd.DataFrame:
    return pd.DataFrame([dict(zip(PARAMS, v, strict=True))
                         for v in itertools.product(*PARAMS.values())])  # fmt: skip


# ------------------------------------------------------------------ bundles


@pytest.mark.parametrize("name", ["m.json", "m.json.gz"])
def test_round_trip_gives_identical_predictions(
    bundle: ModelBundle, tmp_path: Path, name: str
) -> None:
    path = bundle.save(tmp_path / name)
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == name.endswith(".gz")
    loaded = load_bundle(path)
    frame = _frame()
    assert np.array_equal(loaded.predict(frame, members=True), bundle.predict(frame, members=True))
    theirs, mine = loaded.predict_failures(frame), bundle.predict_failures(frame)
    assert set(theirs) == {"compile", "resource"}
    for kind in theirs:
        assert np.array_equal(theirs[kind], mine[kind])
    assert loaded.device["compute_capability"] == "9.0"
    assert loaded.failures["resource"].limits == {"shared": bundle.failures["resource"].count}
    assert loaded.top[0]["config"] == {"BX": 64, "BY": 4, "TILE": 2, "FLAG": 1}


def test_bundle_holds_xgboost_json_and_the_encoding(bundle: ModelBundle, tmp_path: Path) -> None:
    doc = json.loads(bundle.save(tmp_path / "m.json").read_text())
    assert doc["format"] == "surrotune-model" and doc["version"] == BUNDLE_VERSION
    assert "learner" in doc["performance"]["boosters"][0]  # XGBoost's own JSON model format
    names = [p["name"] for p in doc["encoding"]["parameters"]]
    assert names == list(PARAMS)
    assert doc["objective"] == {"metric": "time", "direction": "minimize", "transform": "log"}
    assert doc["kernel"]["template_sha256"] == "ab" * 32 and doc["problem_size"] == {"N": 4096}
    text = format_bundle(load_bundle(tmp_path / "m.json"))
    assert "NVIDIA H100" in text and "template SHA-256" in text and "BX: 16, 32" in text


def test_older_and_newer_versions_are_refused_with_the_reason(
    bundle: ModelBundle, tmp_path: Path
) -> None:
    doc = bundle.to_json()
    for version, words in ((0, "no longer read"), (BUNDLE_VERSION + 1, "newer surrotune")):
        path = tmp_path / f"v{version}.json.gz"
        path.write_bytes(gzip.compress(json.dumps({**doc, "version": version}).encode()))
        with pytest.raises(BundleError, match=words):
            load_bundle(path)
    doc["encoding"]["features_version"] = 99
    (tmp_path / "f.json").write_text(json.dumps(doc))
    with pytest.raises(BundleError, match="version 99"):
        load_bundle(tmp_path / "f.json")
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(BundleError, match="not a surrotune model bundle"):
        load_bundle(tmp_path / "junk.json")


def test_resource_limits_are_read_from_the_error_or_the_usage() -> None:
    c = {"BX": 16}
    shared = Result(config=c, status=Status.RESOURCE, error="uses too much shared data (0xd000)")
    assert resource_limit(shared) == "shared"
    limits = describe_device(H100)
    usage = Result(config=c, status=Status.RESOURCE, registers=128, threads_per_block=1024)
    assert resource_limit(usage, limits) == "registers"
    assert resource_limit(Result(config=c, status=Status.RESOURCE)) == "unknown"


# ------------------------------------------------------------------ refusals


def test_a_bundle_for_other_parameters_is_refused_naming_them(bundle: ModelBundle) -> None:
    other = SearchSpace({"BX": [16, 32], "BLOCK_Y": [1, 2], "TILE": [1, 2], "FLAG": [0, 1]})
    with pytest.raises(BundleError, match="BY") as info:
        SurrogateSampler(space=other, warm_start=[bundle])
    assert "BLOCK_Y" in str(info.value)
    new_value = SearchSpace({**PARAMS, "BX": [16, 32, 512]})
    with pytest.raises(BundleError, match="BX: values 512"):
        SurrogateSampler(space=new_value, warm_start=[bundle])
    with pytest.raises(ValueError, match="needs space"):
        SurrogateSampler(warm_start=[bundle])


def test_a_subset_of_the_values_is_accepted(bundle: ModelBundle) -> None:
    """A target that tries fewer values than the source measured keeps the warm start: its
    design proposes the source's best configuration among the values it has."""
    subset = SearchSpace({**PARAMS, "BX": [16, 32]})  # the source's best BX, 64, is left out
    sampler = SurrogateSampler(space=subset, seed=0, warm_start=[bundle], n_warm_design=3)
    configs = _tune(sampler, 3, lambda k, c: _time(c), space=subset)
    assert all(c["BX"] in (16, 32) for c in configs)
    assert configs[0] == {"BX": 32, "BY": 4, "TILE": 2, "FLAG": 1}  # the best left in the subset


# ------------------------------------------------------------------ the maths


def test_ranking_weights_favour_the_model_that_orders_the_measurements() -> None:
    rng = np.random.default_rng(0)
    y = rng.normal(size=12)
    good = y + 0.1 * rng.normal(size=12)
    poor = rng.normal(size=12)
    weights = ranking_weights([good, poor], y, np.random.default_rng(1))
    assert weights.sum() == pytest.approx(1.0) and weights[0] > 0.9
    flat = ranking_weights([good, poor], np.array([1.0, 1.0, 2.0]), np.random.default_rng(1))
    assert np.allclose(flat, 0.5)  # too few distinct values to rank: no preference


def test_affine_map_shifts_first_and_never_turns_a_source_upside_down() -> None:
    s = np.array([0.0, 1.0, 2.0, 3.0])
    a, b = affine_map(s, s + 5.0, spread=1.0)
    assert a == pytest.approx(1.0) and b == pytest.approx(5.0)
    a, _ = affine_map(s, -3 * s, spread=1.0)
    assert a == 0.0
    assert affine_map(s[:1], np.array([2.0]), spread=1.0) == (1.0, 2.0)


def test_failures_transfer_where_the_limits_say_so() -> None:
    src = describe_device(H100)
    smaller = describe_device({**H100, "name": "NVIDIA L4", "sharedMemPerBlockOptin": 101376})
    larger = describe_device({**H100, "name": "NVIDIA B200", "sharedMemPerBlock": 98304})
    amd = {"name": "AMD Radeon PRO W7800"}
    assert failure_prior("resource", {"shared": 5}, src, smaller)[0] == pytest.approx(0.9)
    assert failure_prior("resource", {"shared": 5}, src, larger)[0] == pytest.approx(0.1)
    assert failure_prior("resource", {"shared": 5}, src, amd)[0] == pytest.approx(0.1)
    assert failure_prior("compile", {}, src, smaller)[0] == pytest.approx(0.9)
    assert failure_prior("compile", {}, src, None)[0] == pytest.approx(0.5)
    expected = np.array([True] * 6 + [False] * 4)
    contradicted = failure_confidence(0.9, expected, np.zeros(10, dtype=bool))
    confirmed = failure_confidence(0.9, expected, expected)
    assert contradicted < 0.4 < 0.9 < confirmed


def test_several_sources_are_weighted_by_how_well_they_rank_the_target() -> None:
    """A source whose GPU behaves like the target's against one whose optimum lies elsewhere:
    after a few measurements, the first carries the larger weight."""
    near = _bundle(_results(shift=0.0, noise=0.05, seed=1), {**H100, "name": "NVIDIA near"})
    far = _bundle(_results(shift=-2.0, noise=0.3, seed=2), {**H100, "name": "NVIDIA far"})
    warm = WarmStart([far, near])
    frame = _frame()
    target = _results(shift=0.3, noise=0.02, seed=3)
    ok = [r for r in target if r.ok]
    measured = [ok[i] for i in np.random.default_rng(0).choice(len(ok), 12, replace=False)]
    measured_frame = pd.DataFrame([r.config for r in measured])
    y = np.log([r.objective for r in measured])
    fit = warm.fit(
        X=near.features(measured_frame), y=y, ok=np.ones(len(y), dtype=bool),
        statuses=["ok"] * len(y), observed=warm.sources(measured_frame),
        candidates=warm.sources(frame), X_candidates=near.features(frame), target_device=H100,
        rng=np.random.default_rng(0), n_models=3, seed=0, n_jobs=1,
    )  # fmt: skip
    assert fit.weights["NVIDIA near"] > fit.weights["NVIDIA far"]
    assert sum(fit.weights.values()) == pytest.approx(1.0)
    assert fit.mean.shape == (len(frame),)
    # the shared-memory failures of the source (same limits) lower P(ok) where they happened
    big = (frame.BX * frame.BY * frame.TILE > 1024).to_numpy()
    assert fit.p_ok[big].max() < 0.5 < fit.p_ok[~big].min()


def test_design_proposes_the_sources_best_configurations_kept_apart(bundle: ModelBundle) -> None:
    space = SearchSpace(PARAMS)
    sampler = SurrogateSampler(
        space=space, seed=0, warm_start=[bundle], n_warm_design=4, n_warm_fill=0
    )
    configs = _tune(sampler, 4, lambda k, c: _time(c))
    assert configs[0] == {"BX": 64, "BY": 4, "TILE": 2, "FLAG": 1}  # the predicted best first
    assert all(c["BX"] * c["BY"] * c["TILE"] <= 1024 for c in configs)  # none expected to fail
    encoded = space.encode(pd.DataFrame(configs))
    pairs = itertools.combinations(range(4), 2)
    gaps = [np.linalg.norm(encoded[i] - encoded[j]) for i, j in pairs]
    assert min(gaps) >= 0.1  # kept diverse: no two closer than the design gap


def test_design_interleaves_space_filling_proposals() -> None:
    warm = WarmStart([_bundle()], n_design=3, n_fill=4)
    turns = [warm.design_turn(t) for t in range(warm.design_length + 1)]
    assert turns == [0, None, 0, None, 0, None, None, None]
    two = WarmStart([_bundle(), _bundle()], n_design=4, n_fill=0)
    assert [two.design_turn(t) for t in range(4)] == [0, 1, 0, 1]  # no weights yet: turns


def test_adaptive_design_follows_whichever_kind_measured_best() -> None:
    warm = WarmStart([_bundle()], n_design=6, adaptive=True)
    assert warm.design_turn(0) == 0  # a source's pick first ...
    assert warm.design_turn(1, source_best=1.0, n_source=1) is None  # ... then one to compare
    assert warm.design_turn(2, source_best=1.0, fill_best=2.0, n_source=1) == 0
    assert warm.design_turn(2, source_best=3.0, fill_best=2.0, n_source=1) is None
    assert warm.design_turn(2, source_best=2.0, fill_best=2.0, n_source=1) == 0  # ties: source
    # nothing measured yet (a batch in flight): the two kinds alternate
    assert warm.design_turn(2, n_source=1) == 0 and warm.design_turn(3, n_source=2) is None
    assert warm.design_turn(6, source_best=1.0, fill_best=2.0, n_source=5) is None  # design over


def test_weighted_turns_give_the_design_to_the_source_that_ranks_the_target() -> None:
    two = [_bundle(), _bundle()]
    warm = WarmStart(two, n_design=4, weighted_turns=True)
    assert warm.design_turn(2, weights=np.array([0.2, 0.8])) == 1
    assert warm.design_turn(2, weights=np.array([0.5, 0.5])) == 0  # level: they take turns
    assert warm.design_turn(3) == 1  # nothing measured yet: turns
    assert warm.design_turn(4, weights=np.array([0.2, 0.8])) is None  # design over
    assert WarmStart(two, n_design=4).weighted_turns  # the default
    plain = WarmStart(two, n_design=4, weighted_turns=False)  # the sources take turns
    assert plain.design_turn(2, weights=np.array([0.2, 0.8])) == 0


@pytest.mark.parametrize("weighted", [True, False])
def test_weighted_turns_follow_the_right_one_of_two_sources(weighted: bool) -> None:
    """A misleading source (its optimum at BX=16) and a right one (BX=64): with weighted turns
    the right one, which orders the target's measurements, chooses most of the design."""
    space = SearchSpace(PARAMS)
    wrong, right = _bundle(_results(shift=-2.0)), _bundle()
    warm = WarmStart([wrong, right], n_design=8, weighted_turns=weighted)
    turns: list[int | None] = []
    design_turn = warm.design_turn

    def recorded(*args: object, **kwargs: object) -> int | None:
        turns.append(design_turn(*args, **kwargs))  # type: ignore[arg-type]
        return turns[-1]

    warm.design_turn = recorded  # type: ignore[method-assign]
    _tune(SurrogateSampler(space=space, seed=0, warm_start=warm), 8, lambda k, c: _time(c))
    assert len(turns) == 8 and None not in turns
    if weighted:
        assert turns[:2] == [0, 1] and turns.count(1) >= 6, turns
    else:
        assert turns == [0, 1] * 4


def test_design_ends_once_a_pick_stands_out() -> None:
    warm = WarmStart([_bundle()], design_stop_ratio=3.0)
    assert not warm.design_found([5.0, 1.0])  # fewer than three: too early to tell
    assert not warm.design_found([5.0, 4.0, 2.0])  # 2x better than the median: go on
    assert warm.design_found([5.0, 4.0, None, 1.0])  # 4x: a region to take over from
    assert not warm.design_found([1.0, 4.0, 5.0], "maximize")  # 5 against a median of 4
    throughput = [3.0, 4.0, 5.0]  # maximised: the best is 1.25x the median
    assert WarmStart([_bundle()], design_stop_ratio=1.2).design_found(throughput, "maximize")
    assert not WarmStart([_bundle()], design_stop_ratio=1.3).design_found(throughput, "maximize")
    assert WarmStart([_bundle()]).design_stop_ratio == 3.0  # the default
    assert not WarmStart([_bundle()], design_stop_ratio=None).design_found([5.0, 4.0, 1.0])


def test_the_sampler_leaves_the_design_once_a_pick_stands_out(bundle: ModelBundle) -> None:
    """The design is ten proposals; a target where the third stands out (5x the median) ends
    it there, and the search after it never returns to the design."""
    space = SearchSpace(PARAMS)
    warm = WarmStart([bundle], n_design=10, design_stop_ratio=3.0)
    sampler = SurrogateSampler(space=space, seed=0, warm_start=warm)
    third_stands_out = lambda k, c: 1.0 if k == 2 else 5.0 + k  # noqa: E731
    _tune(sampler, 8, third_stands_out)
    assert len(sampler._source_picks) == 3 and sampler._design_over
    assert "a pick stood out after 3 measurements, the search took over" in (
        sampler.warm_design_summary()[0]
    )
    never = WarmStart([bundle], n_design=10, design_stop_ratio=None)
    plain = SurrogateSampler(space=space, seed=0, warm_start=never)
    _tune(plain, 8, third_stands_out)
    assert len(plain._source_picks) == 8  # never ended early: the design goes on


def _flat_results() -> list[Result]:
    """A source GPU on which every configuration runs within 2 % of the best (the A100 on the
    dedispersion kernel); TILE=4 is a hair faster, which is all its order says."""
    out = []
    for values in itertools.product(*PARAMS.values()):
        c = dict(zip(PARAMS, values, strict=True))
        t = 1.0 - 0.01 * (c["TILE"] == 4) + 0.001 * c["BY"]
        out.append(Result(config=c, status=Status.OK, objective=t, times_ms=(t,)))
    return out


def test_a_source_that_cannot_rank_its_best_spreads_the_design(bundle: ModelBundle) -> None:
    """Where a source predicts more configurations within ``design_tolerance`` of its best
    than ``design_pool`` holds, its order among them is noise: the design spreads over them
    instead, and reaches a target optimum (TILE=1, BX=16) that the source's order never
    would. A source with a clear best keeps its order."""
    flat = _bundle(_flat_results())
    rows = np.arange(len(_frame()))
    on_flat, on_clear = Source.on(flat, _frame()), Source.on(bundle, _frame())
    assert len(WarmStart([flat], design_pool=8).indifferent(on_flat, rows)) > 8
    assert WarmStart([bundle], design_pool=8).indifferent(on_clear, rows) is None
    never = WarmStart([flat], design_pool=8, design_tolerance=None)
    assert never.indifferent(on_flat, rows) is None
    with pytest.raises(ValueError, match="design_tolerance"):
        WarmStart([flat], design_tolerance=-0.1)

    def target(c: dict) -> float:
        return float(np.exp(abs(np.log2(c["BX"] / 16)) * 0.3 + abs(c["TILE"] - 1) * 0.3
                            + abs(np.log2(c["BY"] / 4)) * 0.1))  # fmt: skip

    space = SearchSpace(PARAMS)
    designs = {}
    for tolerance in (0.02, None):
        warm = WarmStart([flat], n_design=6, design_pool=8, design_tolerance=tolerance,
                         design_stop_ratio=None)  # fmt: skip
        sampler = SurrogateSampler(space=space, seed=0, warm_start=warm)
        designs[tolerance] = _tune(sampler, 6, lambda k, c: target(c))
    summary = sampler.warm_design_summary()  # the last one: no tolerance
    assert summary == ["design: 6 proposals chosen by the sources"]
    flat_run = SurrogateSampler(space=space, seed=0, warm_start=WarmStart(
        [flat], n_design=6, design_pool=8, design_stop_ratio=None))  # fmt: skip
    _tune(flat_run, 6, lambda k, c: target(c))
    assert "could not rank its best (" in flat_run.warm_design_summary()[1]
    assert designs[0.02][0] == designs[None][0]  # the first pick is the source's best either way
    assert {c["TILE"] for c in designs[None]} == {4}  # the source's order: its noise
    assert len({c["TILE"] for c in designs[0.02]}) >= 2  # spread over what it cannot rank
    assert min(map(target, designs[0.02])) < min(map(target, designs[None]))


def test_a_flat_source_spreads_over_its_near_set_or_the_whole_space() -> None:
    """``flat_spread``: ``near`` keeps a flat source's proposals among the configurations it
    predicts within the tolerance (FLAG=1 here, FLAG=0 runs 10 % slower on it); ``space``
    spreads them over every configuration, as a cold start's design."""
    results = [
        dataclasses.replace(r, objective=r.objective * (1.0 if r.config["FLAG"] else 1.1))
        for r in _flat_results()
    ]
    half_flat = _bundle(results)
    frame, rows = _frame(), np.arange(len(_frame()))
    source = Source.on(half_flat, frame)
    near = WarmStart([half_flat], design_pool=8).indifferent(source, rows)
    space = WarmStart([half_flat], design_pool=8, flat_spread="space").indifferent(source, rows)
    assert set(frame.loc[near, "FLAG"]) == {1} and len(near) == (frame.FLAG == 1).sum()
    assert len(space) == len(frame)
    with pytest.raises(ValueError, match="flat_spread"):
        WarmStart([half_flat], flat_spread="everywhere")


def test_space_filling_follows_a_design_where_nothing_stood_out(bundle: ModelBundle) -> None:
    """``fill_after``: after a design whose picks measured alike, the next proposal is the
    farthest configuration from everything measured, not the search's."""
    space = SearchSpace(PARAMS)

    def proposals(values: list[float], fill_after: int) -> list[np.ndarray]:
        warm = WarmStart([bundle], n_design=4, fill_after=fill_after)
        sampler = SurrogateSampler(space=space, seed=0, warm_start=warm)
        configs = _tune(sampler, len(values), lambda k, c: values[k])
        return [space.encode(pd.DataFrame([c]))[0] for c in configs]

    alike = [2.0, 2.1, 2.2, 2.3, 5.0, 5.0]
    filled = proposals(alike, 2)
    design = np.array(filled[:4])
    assert np.array_equal(design, np.array(proposals(alike, 0)[:4]))  # the design is the same
    fifth = np.linalg.norm(design - filled[4], axis=1).min()
    searched = proposals(alike, 0)[4]
    assert fifth >= np.linalg.norm(design - searched, axis=1).min()
    assert fifth == max(  # the farthest configuration from the design there is
        np.linalg.norm(design - row, axis=1).min() for row in space.encode(_frame())
    )
    with pytest.raises(ValueError, match="fill_after"):
        WarmStart([bundle], fill_after=-1)


@pytest.mark.parametrize("improves", [False, True])
def test_the_design_resumes_where_the_search_beats_nothing(
    bundle: ModelBundle, improves: bool
) -> None:
    """``design_resume_after=3``: the third pick stands out and ends the design; where the
    three searched configurations after it are all worse, the sources' remaining picks follow;
    where one beats it, the search goes on."""
    space = SearchSpace(PARAMS)
    warm = WarmStart([bundle], n_design=10, design_stop_ratio=3.0, design_resume_after=3)
    sampler = SurrogateSampler(space=space, seed=0, warm_start=warm)
    values = [6.0, 7.0, 1.0, 5.0, 0.5 if improves else 5.5, 6.0]
    _tune(sampler, 12, lambda k, c: values[k] if k < len(values) else 5.0 + k)
    assert sampler._design_resumed is not improves
    assert ("the design went on" in sampler.warm_design_summary()[0]) is not improves
    assert len(sampler._source_picks) == (3 if improves else 9)  # 3 + the 6 proposals after


def test_warm_params_reach_the_warm_start(bundle: ModelBundle) -> None:
    sampler = SurrogateSampler(
        space=SearchSpace(PARAMS), seed=0, warm_start=[bundle], n_warm_design=5, n_warm_fill=5,
        warm_params=(("design_gap", 0.0), ("adaptive", True)),
    )  # fmt: skip
    warm = sampler._warm
    assert warm is not None and warm.design_gap == 0.0 and warm.adaptive
    assert warm.n_design == 5 and warm.n_fill == 5 and warm.design_length == 10


@pytest.mark.parametrize("shift, most", [(0.0, "source"), (-2.0, "fill")])
def test_adaptive_design_hands_a_misleading_source_to_space_filling(
    shift: float, most: str
) -> None:
    space = SearchSpace(PARAMS)
    source = _bundle(_results(shift=shift))  # shift -2: the source's optimum is BX=16, not 64
    sampler = SurrogateSampler(
        space=space, seed=0, warm_start=WarmStart([source], n_design=8, adaptive=True)
    )
    study = optuna.create_study(sampler=sampler)
    for _ in range(8):
        trial = study.ask()
        config = {n: trial.suggest_categorical(n, space.values[n]) for n in space.names}
        study.tell(trial, _time(config, shift=2.0 if shift else 0.0))
    picks = {"source": len(sampler._source_picks), "fill": len(sampler._fill_picks)}
    assert sum(picks.values()) == 8
    assert picks[most] > 8 - picks[most], picks


def test_search_model_fits_the_cold_searchs_models_after_the_design(bundle: ModelBundle) -> None:
    """``search_model="search"``: after the design the warm start predicts with the models a
    cold search fits on the same trials (the GP on the ensemble's errors among them), and the
    sources still act on P(ok): the candidates' mean is the cold fit's, P(ok) the cold fit's
    times the transferred failure factor. The default (``"ensemble"``) fits no GP."""
    space = SearchSpace(PARAMS)

    def after(search_model: str) -> SurrogateSampler:
        warm = WarmStart([bundle], n_design=6, search_model=search_model)
        sampler = SurrogateSampler(space=space, seed=2, warm_start=warm)
        study = optuna.create_study(sampler=sampler)
        for _ in range(24):
            trial = study.ask()
            config = {n: trial.suggest_categorical(n, space.values[n]) for n in space.names}
            if config["BX"] * config["BY"] * config["TILE"] > 1024:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            study.tell(trial, _time(config, shift=0.5))
        return sampler

    searched = after("search")
    fit, table = searched._fit, searched._table
    assert fit is not None and fit.perf is not None and fit.residual is not None
    features = fit.augment(table.features)
    members = fit.perf.predict_members(fit.perf_input(features))
    correction, _ = fit.residual.predict(table.encoded)
    np.testing.assert_allclose(fit.cand_mean, members.mean(axis=0) + correction, rtol=1e-6)
    transfer = searched.last_transfer
    assert transfer is not None
    np.testing.assert_allclose(fit.cand_ok, fit.p_ok(features) * transfer.p_ok, rtol=1e-6)
    plain = after("ensemble")._fit
    assert plain is not None and plain.perf is None and plain.residual is None
    with pytest.raises(ValueError, match="search_model"):
        WarmStart([bundle], search_model="gp")
    with pytest.raises(ValueError, match="needs mode='prior'"):
        WarmStart([bundle], mode="stack", search_model="search")


def test_warm_start_is_deterministic_for_a_seed(bundle: ModelBundle) -> None:
    space = SearchSpace(PARAMS)

    def proposals() -> list[dict]:
        study = optuna.create_study(sampler=SurrogateSampler(space=space, seed=3,
                                                             warm_start=[bundle]))  # fmt: skip
        out = []
        for _ in range(12):
            trial = study.ask()
            config = {n: trial.suggest_categorical(n, space.values[n]) for n in space.names}
            study.tell(trial, _time(config, shift=0.5))
            out.append(config)
        return out

    assert proposals() == proposals()


# ------------------------------------------------------------------ the payoff, on replay


def test_warm_start_beats_cold_start_on_a_shared_recording(kt_datasets: Path) -> None:
    """dedispersion A100 -> A4000 (seed 0, 20 evaluations): the A100's model reaches 98 % of
    the A4000's optimum within its first proposals; the cold start needs more than 20."""
    source = bundle_from_dataset(kt_datasets / "dedispersion_milo" / "A100.json.gz")
    target = kt_datasets / "dedispersion_milo" / "A4000.json.gz"
    dataset, space, _, summary = prepare_dataset(target)

    def evaluations_to_98(warm: list[ModelBundle] | None) -> int:
        sampler = SurrogateSampler(space=space, seed=0, warm_start=warm)
        study = optuna.create_study(sampler=sampler, direction=dataset.direction)
        Runner(study=study, space=space, backend=ReplayBackend(dataset), trials=20,
               batch_size=1).run()  # fmt: skip
        values, _ = evaluation_sequence(study.get_trials(deepcopy=False))
        reached = metrics.evaluations_to_reach(values, summary.optimum, summary.direction, 0.98)
        return reached if reached is not None else 21

    warm, cold = evaluations_to_98([source]), evaluations_to_98(None)
    assert warm <= 5 and 2 * warm <= cold, (warm, cold)


def test_sources_on_candidates_match_the_bundle(bundle: ModelBundle) -> None:
    frame = _frame()
    source = Source.on(bundle, frame)
    assert np.allclose(source.mean, bundle.predict(frame))
    assert np.array_equal(source.take(np.array([3, 1])).members, source.members[:, [3, 1]])


def test_alignment_columns_travel_with_the_bundle_and_older_bundles_load(tmp_path: Path) -> None:
    """A width that mixes powers of two with other values is an alignment feature of the saved
    models; the round trip keeps it (identical predictions), and a bundle written before the
    key existed loads and predicts on the columns it was trained on."""
    params = {"BX": [16, 32, 48, 64], "TILE": [1, 2, 3]}
    results = [
        Result(config={"BX": bx, "TILE": t}, status=Status.OK,
               objective=1.0 + (bx & (bx - 1) != 0) + 0.1 * t, times_ms=(1.0,))
        for bx in params["BX"] for t in params["TILE"]
    ]  # fmt: skip
    aligned = fit_bundle(
        results, parameters=params, direction="minimize", objective="time",
        device=describe_device(H100), kernel=None, problem_size={}, source={"study": "t"},
    )  # fmt: skip
    assert aligned.encoding.alignment_columns == (0, 1)
    assert aligned.performance.n_features_in_ == 2 + 2 + 4  # encoded, pairwise, alignment
    frame = pd.DataFrame([{"BX": bx, "TILE": t} for bx in params["BX"] for t in params["TILE"]])
    loaded = load_bundle(aligned.save(tmp_path / "a.json"))
    assert loaded.encoding.alignment_columns == (0, 1)
    assert np.array_equal(loaded.predict(frame), aligned.predict(frame))
    assert "alignment features (the power of two dividing it, is it one): BX, TILE" in (
        format_bundle(loaded)
    )
    older = json.loads(_bundle().save(tmp_path / "old.json").read_text())
    del older["encoding"]["alignment_columns"]
    (tmp_path / "old.json").write_text(json.dumps(older))
    old = load_bundle(tmp_path / "old.json")
    assert old.encoding.alignment_columns == ()
    assert np.array_equal(old.predict(_frame()), _bundle().predict(_frame()))
