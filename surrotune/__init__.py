"""surrotune: a GPU kernel auto-tuner whose Optuna sampler learns from every trial.

The public API is re-exported here; ``tests/test_exported_members.py`` checks ``__all__``.
"""

from typing import TYPE_CHECKING, Any

from surrotune.errors import SurrotuneError
from surrotune.experiment import Experiment, ExperimentError, load_experiment
from surrotune.result import USER_ATTRS, Result, Status
from surrotune.space import SearchSpace

if TYPE_CHECKING:
    from surrotune.surrogate.sampler import SurrogateSampler

__all__ = [
    "USER_ATTRS",
    "Experiment",
    "ExperimentError",
    "Result",
    "SearchSpace",
    "Status",
    "SurrogateSampler",
    "SurrotuneError",
    "load_experiment",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import the sampler (and with it XGBoost and scikit-learn, ~1 s) only when asked for, so
    that ``surrotune show`` and friends start fast."""
    if name == "SurrogateSampler":
        from surrotune.surrogate.sampler import SurrogateSampler

        return SurrogateSampler
    raise AttributeError(f"module 'surrotune' has no attribute {name!r}")
