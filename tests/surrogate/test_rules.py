"""Learned failure rules: planted regions come back as readable conditions."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from surrotune.surrogate.rules import (
    FailureRule,
    learn_failure_rules,
    rules_from_attrs,
    rules_to_attrs,
)

ROOT = Path(__file__).resolve().parents[2]
GEMM = ROOT / "experiments" / "datasets" / "gemm_h200.json.gz"
CONVOLUTION = ROOT.parent / "shared" / "datasets" / "kernel_tuner" / "convolution_milo"


def grid(**values: list) -> pd.DataFrame:
    return pd.DataFrame(list(itertools.product(*values.values())), columns=list(values))


def planted() -> tuple[pd.DataFrame, list[str]]:
    frame = grid(a=[1, 2, 4, 8, 16], b=[1, 2, 4, 8, 16], c=[1, 2, 3, 4], d=[0, 1])
    statuses = [
        "resource" if a * b > 64 else "compile" if c == 3 else "ok"
        for a, b, c in zip(frame.a, frame.b, frame.c, strict=True)
    ]
    return frame, statuses


def test_rule_text_and_precision() -> None:
    rule = FailureRule(("BLOCK_M * BLOCK_K >= 4096", "DOUBLE_BUFFER == 1"), "resource", 41, 41)
    assert str(rule) == "BLOCK_M * BLOCK_K >= 4096 and DOUBLE_BUFFER == 1 → resource (41/41)"
    assert rule.precision == 1.0
    assert FailureRule((), "compile", 0, 0).precision == 0.0


def test_planted_regions_are_learned_exactly() -> None:
    frame, statuses = planted()
    rules = learn_failure_rules(frame, ["a", "b", "c", "d"], statuses)
    expected_resource = sum(s == "resource" for s in statuses)
    expected_compile = sum(s == "compile" for s in statuses)
    by_status = {rule.status: rule for rule in rules}
    assert sorted(by_status) == ["compile", "resource"], [str(r) for r in rules]
    assert len(rules) == 2, [str(r) for r in rules]
    # a * b > 64 over powers of two: the next value is 128
    assert by_status["resource"].conditions == ("a * b >= 128",)
    assert by_status["resource"].support == by_status["resource"].matched == expected_resource
    # c == 3 among a * b <= 64 (where a * b > 64 the status is resource)
    compile_rule = by_status["compile"]
    assert "c == 3" in compile_rule.conditions
    assert set(compile_rule.conditions) <= {"c == 3", "a * b <= 64"}
    assert compile_rule.precision == 1.0
    assert compile_rule.support == expected_compile
    # sorted by support, best first
    assert [r.support for r in rules] == sorted((r.support for r in rules), reverse=True)


def test_conditions_reproduce_their_counts() -> None:
    """Each printed condition, evaluated on the frame, matches the rule's support and matched."""
    frame, statuses = planted()
    status = pd.Series(statuses)
    for rule in learn_failure_rules(frame, ["a", "b", "c", "d"], statuses):
        mask = frame.eval(" and ".join(rule.conditions)).to_numpy()
        assert mask.sum() == rule.matched
        assert (status[mask] == rule.status).sum() == rule.support


def test_noise_tolerance() -> None:
    frame, _ = planted()
    statuses = ["resource" if a * b > 64 else "ok" for a, b in zip(frame.a, frame.b, strict=True)]
    rng = np.random.default_rng(0)
    inside = [i for i, s in enumerate(statuses) if s == "resource"]
    outside = [i for i, s in enumerate(statuses) if s == "ok"]
    for i in rng.choice(inside, 2, replace=False):
        statuses[i] = "ok"
    for i in rng.choice(outside, 3, replace=False):
        statuses[i] = "resource"
    rules = learn_failure_rules(frame, ["a", "b", "c", "d"], statuses)
    assert rules, "the planted region is lost to five flipped labels"
    assert all(rule.status == "resource" and rule.precision >= 0.9 for rule in rules)
    assert "a * b >= 128" in rules[0].conditions, [str(r) for r in rules]
    covered = np.zeros(len(frame), dtype=bool)
    for rule in rules:
        covered |= frame.eval(" and ".join(rule.conditions)).to_numpy()
    planted_region = (frame.a * frame.b > 64).to_numpy()
    # most of the region is found, and little outside it
    assert (covered & planted_region).sum() >= 0.6 * planted_region.sum()
    assert (covered & ~planted_region).sum() <= 3


def test_string_parameter_conditions() -> None:
    frame = grid(layout=["row", "col", "tiled"], x=[1, 2, 3, 4, 5, 6], y=[0, 1])
    statuses = [
        "runtime" if layout == "row" and x >= 4 else "ok"
        for layout, x in zip(frame.layout, frame.x, strict=True)
    ]
    rules = learn_failure_rules(frame, ["layout", "x", "y"], statuses, min_support=3)
    assert len(rules) == 1, [str(r) for r in rules]
    rule = rules[0]
    assert set(rule.conditions) == {"layout == 'row'", "x >= 4"}
    assert (rule.status, rule.support, rule.matched) == ("runtime", 6, 6)


def test_no_failures_no_rules() -> None:
    frame = grid(a=[1, 2, 4], b=[1, 2])
    assert learn_failure_rules(frame, ["a", "b"], ["ok"] * len(frame)) == []
    assert learn_failure_rules(frame.iloc[:0], ["a", "b"], []) == []


def test_constraint_rows_are_ignored() -> None:
    frame, statuses = planted()
    # constraint rows outside the grid would move the printed bounds if they were counted
    extra = grid(a=[32], b=[32], c=[1, 2, 3, 4], d=[0, 1])
    both = pd.concat([frame, extra], ignore_index=True)
    with_constraint = statuses + ["constraint"] * len(extra)
    assert learn_failure_rules(both, ["a", "b", "c", "d"], with_constraint) == (
        learn_failure_rules(frame, ["a", "b", "c", "d"], statuses)
    )


def test_attrs_round_trip_through_json() -> None:
    frame, statuses = planted()
    rules = learn_failure_rules(frame, ["a", "b", "c", "d"], statuses)
    attrs = json.loads(json.dumps(rules_to_attrs(rules)))
    assert rules_from_attrs(attrs) == rules


def test_max_rules_and_statuses_length() -> None:
    frame, statuses = planted()
    assert len(learn_failure_rules(frame, ["a", "b", "c", "d"], statuses, max_rules=1)) == 1
    with pytest.raises(ValueError):
        learn_failure_rules(frame, ["a", "b"], statuses[:-1])


def test_gemm_h200_recording_has_a_shared_memory_rule() -> None:
    from surrotune.backends.replay import load_dataset

    dataset = load_dataset(GEMM)
    frame = dataset.to_frame()
    rules = learn_failure_rules(frame, list(dataset.parameters), frame["status"].tolist())
    drivers = ("BLOCK_K", "BLOCK_M", "BLOCK_N", "DOUBLE_BUFFER")
    good = [
        rule
        for rule in rules
        if rule.status == "resource"
        and rule.precision >= 0.95
        and any(driver in condition for condition in rule.conditions for driver in drivers)
    ]
    assert good, [str(r) for r in rules]


@pytest.mark.skipif(not (CONVOLUTION / "A100.json.gz").exists(), reason="shared data absent")
def test_convolution_a100_recording() -> None:
    from surrotune.backends.replay import load_dataset

    dataset = load_dataset(CONVOLUTION / "A100.json.gz")
    frame = dataset.to_frame()
    rules = learn_failure_rules(frame, list(dataset.parameters), frame["status"].tolist())
    assert rules
    assert all(rule.precision >= 0.9 and rule.support >= 5 for rule in rules)
    assert rules[0].status == "resource"
