"""The surrogate sampler: XGBoost performance model, failure classifier, diversity, rules.

``SurrogateSampler`` is a plain Optuna sampler; the models and acquisition functions it glues
together live in their own modules and are usable (and tested) without a Study. The names below
are imported on first use: the models pull in XGBoost and scikit-learn (about a second), which a
command such as ``surrotune show`` should not pay for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from surrotune.surrogate.bundle import ModelBundle, load_bundle
    from surrotune.surrogate.feasibility import FeasibilityModel
    from surrotune.surrogate.features import FEATURES_VERSION
    from surrotune.surrogate.performance import PerformanceModel
    from surrotune.surrogate.sampler import SurrogateSampler
    from surrotune.surrogate.transfer import WarmStart

__all__ = [
    "FEATURES_VERSION",
    "FeasibilityModel",
    "ModelBundle",
    "PerformanceModel",
    "SurrogateSampler",
    "WarmStart",
    "load_bundle",
]

_HOMES = {
    "FEATURES_VERSION": "features",
    "FeasibilityModel": "feasibility",
    "ModelBundle": "bundle",
    "PerformanceModel": "performance",
    "SurrogateSampler": "sampler",
    "WarmStart": "transfer",
    "load_bundle": "bundle",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"surrotune.surrogate.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'surrotune.surrogate' has no attribute {name!r}")
