"""What a backend is: something that turns a batch of configurations into Results.

Batches, not single configurations, are the unit so that a backend can compile a whole batch in
parallel on the CPU cores while the GPU measures the previous one. Optional capabilities (device
description, preparing the next batch, profiling) get Protocols of their own rather than
``NotImplementedError`` stubs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from surrotune.result import ParamValue, Result

__all__ = ["Backend", "DescribesDevice", "Prepares"]


@runtime_checkable
class Backend(Protocol):
    """Evaluates configurations. ``evaluate`` returns one Result per config, in order."""

    def evaluate(self, configs: Sequence[Mapping[str, ParamValue]]) -> list[Result]: ...

    def close(self) -> None: ...


@runtime_checkable
class DescribesDevice(Protocol):
    """A backend that can say which device its Results were measured on."""

    def device(self) -> dict[str, Any]: ...


@runtime_checkable
class Prepares(Protocol):
    """A backend that can start on a batch before it is evaluated (compile it, say).

    ``prepare`` returns at once; a later ``evaluate`` of the same configurations uses what it
    started. The runner calls it for batch k+1 before evaluating batch k, so that the CPU cores
    compile while the GPU measures. Preparing configurations that are never evaluated must be
    harmless: the runner does that when a run stops between the two calls.
    """

    def prepare(self, configs: Sequence[Mapping[str, ParamValue]]) -> None: ...
