"""The Result record: invariants, and the round trip through user attributes and recordings."""

from __future__ import annotations

import json

import pytest

from surrotune.result import USER_ATTRS, Result, Status


def test_ok_needs_a_finite_objective() -> None:
    with pytest.raises(ValueError, match="finite objective"):
        Result({"a": 1}, Status.OK)
    with pytest.raises(ValueError, match="finite objective"):
        Result({"a": 1}, Status.OK, objective=float("nan"))


def test_failures_drop_the_objective() -> None:
    result = Result({"a": 1}, "compile", objective=3.0, error="boom")
    assert result.status is Status.COMPILE and result.objective is None and not result.ok


def test_user_attrs_round_trip_and_are_documented() -> None:
    result = Result(
        {"a": 16, "b": "x"}, Status.OK, objective=1.5, times_ms=(1.4, 1.5, 1.7),
        compile_time_ms=800.0, benchmark_time_ms=12.0, registers=40, shared_bytes=8192,
        local_bytes=0, threads_per_block=256, verification_error=1e-7, counters={"sm": 50.0},
    )  # fmt: skip
    attrs = result.to_user_attrs(["a", "b"])
    json.dumps(attrs)  # storable as Optuna user attributes
    assert set(attrs) == set(USER_ATTRS)
    assert attrs["time_ms"] == 1.5 and attrs["config_key"] == "16,x"
    assert Result.from_user_attrs(result.config, attrs) == result


def test_record_round_trip() -> None:
    result = Result({"a": 2}, Status.RESOURCE, error="too many resources", registers=255)
    assert Result.from_record(json.loads(json.dumps(result.to_record()))) == result


def test_fail_without_status_is_generic_failure() -> None:
    assert Result.from_user_attrs({"a": 1}, {}).status is Status.RUNTIME


def test_constraint_is_not_an_evaluation() -> None:
    assert not Status.CONSTRAINT.counts_as_evaluation
    assert all(s.counts_as_evaluation for s in Status if s is not Status.CONSTRAINT)


def test_docs_list_every_attribute() -> None:
    from pathlib import Path

    from surrotune.runner import RUNNER_ATTRS

    page = (Path(__file__).resolve().parents[1] / "docs" / "trials.md").read_text()
    for name in [*USER_ATTRS, *RUNNER_ATTRS]:
        assert f"| `{name}` |" in page, name
