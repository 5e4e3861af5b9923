"""The surrogate sampler: XGBoost performance model, failure classifier, diversity.

``SurrogateSampler`` is a plain Optuna sampler; the models and acquisition functions it glues
together live in their own modules and are usable (and tested) without a Study.
"""

from surrotune.surrogate.feasibility import FeasibilityModel
from surrotune.surrogate.features import FEATURES_VERSION
from surrotune.surrogate.performance import PerformanceModel
from surrotune.surrogate.sampler import SurrogateSampler

__all__ = ["FEATURES_VERSION", "FeasibilityModel", "PerformanceModel", "SurrogateSampler"]
