"""surrotune: a GPU kernel auto-tuner whose Optuna sampler learns from every trial.

The public API is re-exported here, lazily (PEP 562): ``import surrotune.backends.nvrtc`` in a
compile child, or ``surrotune show``, must not pay for pandas, Optuna or XGBoost (about 0.5 s
per process, times one compile process per core). ``tests/test_exported_members.py`` checks
``__all__``.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from surrotune.errors import SurrotuneError
    from surrotune.experiment import Experiment, ExperimentError, load_experiment
    from surrotune.result import USER_ATTRS, Result, Status
    from surrotune.space import SearchSpace
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

#: where each public name lives
_HOMES = {
    "USER_ATTRS": "surrotune.result",
    "Experiment": "surrotune.experiment",
    "ExperimentError": "surrotune.experiment",
    "Result": "surrotune.result",
    "SearchSpace": "surrotune.space",
    "Status": "surrotune.result",
    "SurrogateSampler": "surrotune.surrogate.sampler",
    "SurrotuneError": "surrotune.errors",
    "load_experiment": "surrotune.experiment",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use and keep the name here."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'surrotune' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
