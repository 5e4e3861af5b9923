"""Learned failure rules recover the known failure regions of the convolution recordings.

The convolution benchmark's search space (``spaces/convolution_milo.json``) restricts the
shared-memory tile: ``use_shmem == 0 or (block_size_x * tile_size_x + 14) * (block_size_y *
tile_size_y + 14) < 12 * 1024`` (floats: 48 KB). The recordings hold only configurations within
the restrictions, and on the AMD W7800 every configuration whose input tile exceeds the 64 KB of
local data share, ``(block_size_x * tile_size_x + 14) * (block_size_y * tile_size_y + 14) >
16384`` floats, fails to compile (all of them with ``use_shmem == 0``: the restriction keeps the
``use_shmem == 1`` ones below it). That curve in the tile extents ``block_size_x * tile_size_x``
and ``block_size_y * tile_size_y`` is the region the rules must recover.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analysis_studies import KT_DATASETS, Storages

from surrotune.analysis import learn_rules, open_study, read_study_trials, rule_mask
from surrotune.analysis.rules import covered
from surrotune.backends.replay import load_dataset, load_restrictions
from surrotune.expressions import Expression
from surrotune.surrogate.rules import FailureRule, learn_failure_rules

#: the W7800's compile-failure region: the input tile over the 64 KB local data share
FOOTPRINT = "(block_size_x * tile_size_x + 14) * (block_size_y * tile_size_y + 14)"
REGION = f"use_shmem == 0 and {FOOTPRINT} > 16384"
TILE_EXTENTS = ("block_size_x * tile_size_x", "block_size_y * tile_size_y")


def region(frame: pd.DataFrame) -> np.ndarray:
    expression = Expression.parse(REGION)
    env = {name: frame[name].to_numpy() for name in expression.names}
    return np.asarray(expression.evaluate(env), dtype=bool)


@pytest.fixture(scope="module")
def w7800() -> pd.DataFrame:
    path = KT_DATASETS / "convolution_milo" / "W7800.json.gz"
    if not path.is_file():
        pytest.skip(f"shared recording not found at {path}")
    return load_dataset(path).to_frame().reset_index(drop=True)


def test_the_region_is_the_shared_memory_footprint(w7800: pd.DataFrame) -> None:
    """The premise: the W7800's failures are exactly the footprint region, and the recording
    obeys the benchmark's own shared-memory restriction."""
    failed = (w7800["status"] != "ok").to_numpy()
    assert set(w7800.loc[failed, "status"]) == {"compile"}
    assert np.array_equal(failed, region(w7800))
    restrictions = load_restrictions(KT_DATASETS / "spaces" / "convolution_milo.json")
    shared = next(r for r in restrictions if "use_shmem == 0 or" in r)
    assert "12*1024" in shared.replace(" ", "")
    expression = Expression.parse(shared)
    env = {name: w7800[name].to_numpy() for name in expression.names}
    assert np.asarray(expression.evaluate(env)).all()


def test_rules_on_the_whole_recording_recover_the_region(w7800: pd.DataFrame) -> None:
    names = [c for c in w7800.columns if c.startswith(("block_", "tile_", "read_", "use_",
                                                          "filter_"))]  # fmt: skip
    rules = learn_rules(w7800, names, w7800["status"].tolist())
    truth = region(w7800)
    hit = covered(rules, w7800)
    assert (hit & ~truth).sum() == 0, "a rule covers configurations outside the region"
    assert (hit & truth).sum() >= 0.85 * truth.sum()  # 106 of 116
    for rule in rules:
        assert rule.status == "compile" and rule.precision == 1.0
        assert rule.support == int((rule_mask(rule, w7800) & truth).sum())
    # the rules speak of the tile extents, the footprint's factors
    assert sum(any(e in c for c in r.conditions for e in TILE_EXTENTS) for r in rules) >= 3
    # one tree alone (what a tuning run stores) finds only part of it: the covering pays
    single = covered(learn_failure_rules(w7800, names, w7800["status"].tolist()), w7800)
    assert (hit & truth).sum() > (single & truth).sum()


def test_rules_of_a_replayed_study_recover_the_region(storages: Storages) -> None:
    study = read_study_trials(open_study(str(storages.conv), "W7800"))
    configs = study.configs().reset_index(drop=True)
    statuses = study.measured["status"].tolist()
    truth = region(configs)
    assert np.array_equal(truth, np.asarray(statuses) != "ok") and truth.sum() >= 15
    rules = learn_rules(configs, list(study.parameters), statuses)
    hit = covered(rules, configs)
    assert (hit & ~truth).sum() == 0
    assert (hit & truth).sum() >= 0.9 * truth.sum()
    assert any(TILE_EXTENTS[0] in c for r in rules for c in r.conditions)


def test_report_lists_the_rules_with_support_and_precision(conv_report: Path) -> None:
    text = (conv_report / "report.md").read_text()
    w7800 = text.split("## Study 'W7800'", 1)[1].split("## Study 'A100'", 1)[0]
    rows = [line for line in w7800.splitlines() if "| compile |" in line and "*" in line]
    assert rows, text
    for row in rows:
        _, status, support, matched, precision = [c.strip() for c in row.strip("|").split("|")]
        assert status == "compile" and precision == "100 %" and support == matched
    assert "together they cover" in w7800


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("bx * by >= 64", [False, True, True]),
        ("bx == 8", [True, False, False]),
        ("bx <= 16", [True, True, False]),
        ("kind == 'fast'", [False, True, False]),
        ("kind != 'fast'", [True, False, True]),
    ],
)
def test_rule_mask_reads_every_condition_form(condition: str, expected: list[bool]) -> None:
    frame = pd.DataFrame({"bx": [8, 16, 32], "by": [4, 4, 2], "kind": ["slow", "fast", "slow"]})
    rule = FailureRule((condition,), "resource", 1, 1)
    assert rule_mask(rule, frame).tolist() == expected


def test_rule_mask_of_a_conjunction() -> None:
    frame = pd.DataFrame({"bx": [8, 16, 32], "by": [4, 4, 2]})
    rule = FailureRule(("bx >= 16", "by == 4"), "resource", 1, 1)
    assert rule_mask(rule, frame).tolist() == [False, True, False]
