"""Tests for surrotune.space: enumeration against brute force, sampling, keys, encoding."""

from __future__ import annotations

import gzip
import itertools
import json
import random
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from surrotune.errors import SurrotuneError
from surrotune.expressions import Expression
from surrotune.space import (
    ENCODING_VERSION,
    RecordedSpace,
    SearchSpace,
    SpaceError,
    SpaceTooLarge,
)

SIZES = {"N": 96, "LIMIT": 40}

# constraint templates by arity; {a}, {b}, {c} are parameter names, {k} a small constant
TEMPLATES = {
    1: [
        "{a} % {k} == 0",
        "{a} >= {k}",
        "not ({a} == {k})",
        "N % {a} == 0",
    ],
    2: [
        "{a} * {b} <= LIMIT",
        "{a} % {b} == 0 or {a} < {b}",
        "({a} + {b}) % {k} != 0",
        "{a} <= N // 8 or {b} > 2",
        "not ({a} > {b} and {b} > 1)",
    ],
    3: [
        "{a} * {b} * {c} <= N",
        "{a} + {b} > {c} and not {a} == {c}",
        "max({a}, {b}) // min({b}, {c}) <= 4",
        "({a} * {b}) % {c} == 0 or {c} > {a} + {b}",
    ],
}


def random_space(seed: int) -> tuple[dict[str, list[Any]], list[str]]:
    """A small random space: 2-6 numeric parameters (some unconstrained) and 0-4 constraints."""
    params, constraints, _ = generate_space(seed)
    return params, constraints


def generate_space(seed: int) -> tuple[dict[str, list[Any]], list[str], list[str]]:
    """:func:`random_space` plus the templates its constraints came from."""
    rnd = random.Random(seed)
    kinds = [
        lambda n: [2**i for i in range(n)],
        lambda n: [8 * (i + 1) for i in range(n)],
        lambda n: list(range(1, n + 1)),
        lambda n: [0.5 * (i + 1) for i in range(n)],
        lambda n: rnd.sample(range(1, 20), n),  # unsorted list: order is the list's, not numeric
    ]
    params = {f"p{i}": rnd.choice(kinds)(rnd.randint(1, 5)) for i in range(rnd.randint(2, 6))}
    names = list(params)
    constraints = []
    templates = []
    for _ in range(rnd.randint(0, 4)):
        arity = rnd.randint(1, min(3, len(names)))
        chosen = rnd.sample(names[:-1] if len(names) > 3 else names, arity)  # keep one free
        template = rnd.choice(TEMPLATES[arity])
        templates.append(template)
        letters = dict(zip("abc", chosen, strict=False))
        constraints.append(template.format(k=rnd.randint(1, 4), **letters))
    return params, constraints, templates


def brute_force(
    params: Mapping[str, list[Any]], constraints: list[str], sizes: Mapping[str, Any]
) -> list[tuple[Any, ...]]:
    """The obvious reference: every product element, every constraint, one at a time."""
    exprs = [Expression.parse(c) for c in constraints]
    out = []
    for combo in itertools.product(*params.values()):
        env = {**sizes, **dict(zip(params, combo, strict=True))}
        if all(bool(e.evaluate(env)) for e in exprs):
            out.append(combo)
    return out


def rows(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in frame.itertuples(index=False)]


# -------------------------------------------------------------------------------- enumeration


@pytest.mark.parametrize("seed", range(40))
def test_enumerate_equals_brute_force_on_random_spaces(seed: int) -> None:
    params, constraints = random_space(seed)
    space = SearchSpace(params, constraints, SIZES)
    assert rows(space.enumerate()) == brute_force(params, constraints, SIZES)
    assert len(space) == len(brute_force(params, constraints, SIZES))


def test_random_spaces_exercise_every_template_and_some_filtering() -> None:
    """Guard the generator: the brute-force comparison must cover all templates and prune."""
    used: set[str] = set()
    pruned = free = 0
    for seed in range(40):
        params, constraints, templates = generate_space(seed)
        used.update(templates)
        space = SearchSpace(params, constraints, SIZES)
        pruned += len(space) < space.product_size
        free += any(all(name not in c for c in constraints) for name in params)
    assert used == {t for group in TEMPLATES.values() for t in group}
    assert free >= 20
    assert pruned >= 15


def test_enumerate_pushes_constraints_down_a_large_product() -> None:
    """10^8 product, 81 feasible: enumerable with a 10^4-row limit only thanks to push-down."""
    params = {f"a{i}": list(range(10)) for i in range(8)}
    constraints = ["a0 + a1 <= 1", "a2 + a3 <= 1", "a4 + a5 <= 1", "a6 + a7 <= 1", "a0 <= a7"]
    space = SearchSpace(params, constraints, max_enumerate=10_000)
    assert space.product_size == 10**8
    pair = [(0, 0), (0, 1), (1, 0)]
    expected = [
        sum(combo, ()) for combo in itertools.product(pair, repeat=4) if combo[0][0] <= combo[3][1]
    ]
    assert rows(space.enumerate()) == expected
    assert space.enumerable


def test_enumerate_order_dtypes_and_cache() -> None:
    space = SearchSpace(
        {"x": [4, 1, 2], "f": [0.5, 1.0], "s": ["b", "a"], "t": [True, False]},
        ["x * f >= 1", "N % x == 0"],
        {"N": 8},
    )
    frame = space.enumerate()
    assert list(frame.columns) == ["x", "f", "s", "t"]
    assert frame["x"].dtype == np.int64
    assert frame["f"].dtype == np.float64
    assert frame["t"].dtype == np.bool_
    # lexicographic by value position (list order), not by value
    index = space.index_of(frame)
    assert [tuple(r) for r in index] == sorted(tuple(r) for r in index)
    assert frame.iloc[0].tolist() == [4, 0.5, "b", True]
    # cached, identical across instances, and callers cannot alter the cache
    again = SearchSpace(space.values, [c.text for c in space.constraints], space.sizes)
    pd.testing.assert_frame_equal(frame, again.enumerate())
    frame.loc[0, "x"] = 2
    assert space.enumerate().loc[0, "x"] == 4


def test_false_constant_constraint_gives_an_empty_space() -> None:
    space = SearchSpace({"a": [1, 2]}, ["N > 10"], {"N": 4})
    assert len(space) == 0
    assert list(space.enumerate().columns) == ["a"]
    assert len(space.sample(5, np.random.default_rng(0))) == 0


def test_space_too_large() -> None:
    space = SearchSpace({"a": list(range(10)), "b": list(range(10))}, max_enumerate=50)
    assert not space.enumerable
    with pytest.raises(SpaceTooLarge, match="sample"):
        space.enumerate()
    with pytest.raises(SpaceError):  # a SpaceTooLarge is a SpaceError
        len(space)
    assert issubclass(SpaceError, SurrotuneError) and issubclass(SpaceError, ValueError)
    assert SearchSpace({"a": list(range(10))}, max_enumerate=10).enumerable


# ------------------------------------------------------------------------------------ errors


def test_unknown_name_in_constraint_names_constraint_and_name() -> None:
    with pytest.raises(SpaceError, match=r"'a \* bogus < 4'.*bogus"):
        SearchSpace({"a": [1, 2]}, ["a * bogus < 4"])
    # sizes are known names
    assert len(SearchSpace({"a": [1, 2]}, ["a * M < 4"], {"M": 2})) == 1


@pytest.mark.parametrize(
    ("parameters", "constraints", "sizes", "message"),
    [
        ({}, [], None, "at least one parameter"),
        ({"a": []}, [], None, "no values"),
        ({"a": [1, 1.0]}, [], None, "distinct"),
        ({"a": [1, [2]]}, [], None, "type list"),
        ({"a b": [1]}, [], None, "identifier"),
        ({"a": [1]}, ["a +"], None, "invalid"),
        ({"a": [1]}, ["__import__('os')"], None, "invalid"),
        ({"a": [1]}, [], {"a": 3}, "both a parameter and a size"),
    ],
)
def test_invalid_spaces_are_refused(
    parameters: dict[str, list[Any]],
    constraints: list[str],
    sizes: dict[str, int] | None,
    message: str,
) -> None:
    with pytest.raises(SpaceError, match=message):
        SearchSpace(parameters, constraints, sizes)


# ---------------------------------------------------------------------------------- sampling


def test_sample_returns_distinct_feasible_configurations() -> None:
    params, constraints = random_space(3)
    space = SearchSpace(params, constraints, SIZES)
    total = len(space)
    assert total > 10
    sample = space.sample(10, np.random.default_rng(1))
    assert len(sample) == 10
    assert space.feasible_mask(sample).all()
    assert len(set(space.keys(sample))) == 10
    assert list(sample.dtypes) == list(space.enumerate().dtypes)
    pd.testing.assert_frame_equal(sample, space.sample(10, np.random.default_rng(1)))


@pytest.mark.parametrize("seed", range(5))
def test_sample_returns_all_when_asked_for_more_than_exist(seed: int) -> None:
    params, constraints = random_space(seed)
    space = SearchSpace(params, constraints, SIZES)
    sample = space.sample(len(space) + 5, np.random.default_rng(seed), max_tries=3)
    assert sorted(space.keys(sample)) == sorted(space.keys(space.enumerate()))


def test_sample_from_a_product_too_large_to_enumerate() -> None:
    params = {f"a{i}": [1, 2, 4, 8, 16, 32, 64, 128] for i in range(10)}  # 8^10 = 2^30
    constraints = ["a0 * a1 * a2 <= 64", "a3 % a4 == 0", "a5 + a6 + a7 <= 100"]
    space = SearchSpace(params, constraints, max_enumerate=1000)
    assert not space.enumerable
    sample = space.sample(500, np.random.default_rng(7))
    assert len(sample) == 500
    assert space.feasible_mask(sample).all()
    assert len(set(space.keys(sample))) == 500


def test_sample_is_uniform_over_the_feasible_set() -> None:
    """Each of the 6 feasible configurations appears as the first draw about equally often."""
    space = SearchSpace({"a": [1, 2, 3, 4], "b": [1, 2, 3, 4]}, ["a < b"])
    firsts = [space.key(space.sample(1, np.random.default_rng(s)).iloc[0]) for s in range(600)]
    counts = pd.Series(firsts).value_counts()
    assert len(counts) == 6
    assert counts.min() > 60  # expected 100 each; a binomial tail this far out is ~1e-4


# ------------------------------------------------------------------------- feasibility, keys


def test_is_feasible_mask_and_violated_agree() -> None:
    space = SearchSpace(
        {"a": [1, 2, 4], "b": [8, 16]}, ["a * b <= 16", "a != 2 or b == 8"], {"N": 3}
    )
    configs = [{"a": a, "b": b} for a in [1, 2, 3, 4] for b in [8, 16]]
    mask = space.feasible_mask(pd.DataFrame(configs))
    assert mask.tolist() == [space.is_feasible(c) for c in configs]
    assert mask.tolist() == [True, True, True, False, False, False, False, False]
    assert space.violated({"a": 4, "b": 16}) == ["a * b <= 16"]
    assert space.violated({"a": 2, "b": 16}) == ["a * b <= 16", "a != 2 or b == 8"]
    assert space.violated({"a": 3, "b": 8}) == ["a in (1, 2, 4)"]
    assert space.is_feasible({"a": 1.0, "b": np.int64(16)})
    with pytest.raises(SpaceError, match="lacks"):
        space.is_feasible({"a": 1})


def test_key_prints_values_like_the_list() -> None:
    space = SearchSpace({"a": [1, 2], "f": [0.5, 2], "s": ["x", "y"], "t": [False, True]})
    assert space.key({"a": 2.0, "f": 2.0, "s": "y", "t": True}) == "2,2,y,True"
    frame = pd.DataFrame({"a": [1.0, 2.0], "f": [0.5, 2.0], "s": ["x", "y"], "t": [0, 1]})
    assert space.keys(frame) == ["1,0.5,x,False", "2,2,y,True"]
    with pytest.raises(SpaceError, match="not one of"):
        space.key({"a": 3, "f": 0.5, "s": "x", "t": True})


def load_convolution(kt_datasets: Path) -> tuple[SearchSpace, dict[str, dict[str, Any]]]:
    with gzip.open(kt_datasets / "convolution_milo" / "A100.json.gz", "rt") as handle:
        data = json.load(handle)
    spec = json.loads((kt_datasets / "spaces" / "convolution_milo.json").read_text())
    restrictions = [c["Expression"] for c in spec["ConfigurationSpace"]["Conditions"]]
    return SearchSpace(data["tune_params"], restrictions), data["cache"]


def test_keys_match_kernel_tuner_cache_of_convolution(kt_datasets: Path) -> None:
    """The restrictions and the A100 cache agree exactly: 4362 of 10240 configurations."""
    space, cache = load_convolution(kt_datasets)
    assert space.product_size == 10240
    configs = pd.DataFrame([{n: entry[n] for n in space.names} for entry in cache.values()])
    assert space.keys(configs) == list(cache)
    assert [space.key(entry) for entry in list(cache.values())[:50]] == list(cache)[:50]
    assert space.feasible_mask(configs).all()
    feasible = space.keys(space.enumerate())
    assert len(feasible) == len(cache) == 4362
    assert set(feasible) == set(cache)
    assert "16,1,1,1,0,0,0,1,15,15" in feasible


# ---------------------------------------------------------------------- encoding, neighbours


def test_encode_is_in_unit_range_and_monotone() -> None:
    space = SearchSpace(
        {
            "pow2": [1, 2, 4, 8],
            "linear": [16, 32, 48, 64],
            "scaled": [3, 1, 2],
            "kind": ["b", "a", "c"],
            "one": [7],
            "flag": [True, False],
        }
    )
    frame = space.enumerate()
    codes = space.encode(frame)
    assert ENCODING_VERSION == 1
    assert codes.shape == (len(frame), 6)
    assert codes.min() >= 0.0 and codes.max() <= 1.0
    for k, name in enumerate(space.names[:3]):
        by_value = sorted(zip(frame[name], codes[:, k], strict=True))
        assert [c for _, c in by_value] == sorted(c for _, c in by_value)
    one = lambda **kw: space.encode({**frame.iloc[0].to_dict(), **kw})[0]  # noqa: E731
    assert [one(pow2=v)[0] for v in [1, 2, 4, 8]] == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert [one(linear=v)[1] for v in [16, 32, 48, 64]] == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert [one(scaled=v)[2] for v in [3, 1, 2]] == pytest.approx([1, 0, 0.5])
    assert [one(kind=v)[3] for v in ["b", "a", "c"]] == pytest.approx([0, 0.5, 1])
    assert one()[4] == 0.0
    assert [one(flag=v)[5] for v in [True, False]] == [1.0, 0.0]
    # pure function of the space: a list of configs, a frame and a rebuilt space agree
    rebuilt = SearchSpace.from_dict(json.loads(json.dumps(space.to_dict())))
    np.testing.assert_array_equal(rebuilt.encode(frame.to_dict("records")), codes)
    with pytest.raises(SpaceError, match="not one of"):
        space.encode({**frame.iloc[0].to_dict(), "pow2": 3})


def test_index_of_gives_value_positions() -> None:
    space = SearchSpace({"a": [8, 2, 4], "s": ["x", "y"]})
    index = space.index_of(pd.DataFrame({"a": [2, 8, 4.0], "s": ["y", "x", "x"]}))
    assert index.tolist() == [[1, 1], [0, 0], [2, 0]]
    assert space.index_of({"a": 4, "s": "y"}).tolist() == [[2, 1]]


@pytest.mark.parametrize("seed", range(10))
def test_neighbours_are_the_feasible_one_step_moves(seed: int) -> None:
    params, constraints = random_space(seed)
    space = SearchSpace(params, constraints, SIZES)
    frame = space.enumerate()
    if len(frame) == 0:
        return
    feasible = set(space.keys(frame))
    config = frame.iloc[len(frame) // 2].to_dict()
    here = space.index_of(config)[0]
    got = space.neighbours(config)
    for neighbour in got:
        step = np.abs(space.index_of(neighbour)[0] - here)
        assert step.sum() == 1
        assert space.is_feasible(neighbour)
    # complete: every feasible configuration one step away is returned
    expected = {
        key
        for key, idx in zip(space.keys(frame), space.index_of(frame), strict=True)
        if np.abs(idx - here).sum() == 1
    }
    assert {space.key(n) for n in got} == expected
    assert expected <= feasible


def test_to_dict_round_trips_through_json() -> None:
    space = SearchSpace({"b": [2, 1], "a": ["x", "y"]}, ["b < N"], {"N": 2})
    data = json.loads(json.dumps(space.to_dict()))
    assert data["encoding_version"] == ENCODING_VERSION
    again = SearchSpace.from_dict(data)
    assert again == space
    assert again.names == ("b", "a")
    assert again.values["b"] == (2, 1)
    assert rows(again.enumerate()) == [(1, "x"), (1, "y")]


def test_recorded_space_is_the_recorded_set() -> None:
    recorded = [{"a": 4, "b": "y"}, {"a": 1, "b": "x"}, {"a": 1.0, "b": "x"}, {"a": 2, "b": "y"}]
    dataset = SimpleNamespace(
        path=Path("rec.json"),
        parameters={"a": [1, 2, 4], "b": ["x", "y"]},
        results={str(i): SimpleNamespace(config=c) for i, c in enumerate(recorded)},
    )
    space = RecordedSpace(dataset)  # type: ignore[arg-type]
    assert rows(space.enumerate()) == [(1, "x"), (2, "y"), (4, "y")]
    assert len(space) == 3 and space.product_size == 6
    assert space.is_feasible({"a": 2, "b": "y"}) and not space.is_feasible({"a": 2, "b": "x"})
    frame = pd.DataFrame({"a": [1, 1, 3], "b": ["x", "y", "x"]})
    assert space.feasible_mask(frame).tolist() == [True, False, False]
    assert space.violated({"a": 2, "b": "x"}) == ["recorded in rec.json"]
    assert space.violated({"a": 1, "b": "x"}) == []
    assert sorted(space.keys(space.sample(10, np.random.default_rng(0)))) == ["1,x", "2,y", "4,y"]
    assert space.neighbours({"a": 2, "b": "y"}) == [{"a": 4, "b": "y"}]
    assert space.to_dict()["recording"] == "rec.json"
