"""surrotune: a GPU kernel auto-tuner whose Optuna sampler learns from every trial.

The public API is re-exported here; ``tests/test_exported_members.py`` checks ``__all__``.
"""

from surrotune.experiment import Experiment, ExperimentError, load_experiment
from surrotune.result import USER_ATTRS, Result, Status

__all__ = ["USER_ATTRS", "Experiment", "ExperimentError", "Result", "Status", "load_experiment"]

__version__ = "0.1.0"
