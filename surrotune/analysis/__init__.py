"""Offline analysis of stored studies: reports, learned failure rules, exports, the winner.

Everything reads the Optuna storage alone (no GPU, template or experiment file):

- :mod:`~surrotune.analysis.trials`: a study as one table, every trial and every field;
- :mod:`~surrotune.analysis.report`: ``surrotune analyze`` (Markdown, HTML and PNG figures),
  built from :mod:`~surrotune.analysis.rules` (failure regions),
  :mod:`~surrotune.analysis.importance` (fANOVA, the surrogate's importance, partial
  dependence), :mod:`~surrotune.analysis.noise` (spread of the repeats, ranking within noise),
  :mod:`~surrotune.analysis.compare` (several studies) and :mod:`~surrotune.analysis.plots`,
  rendered by :mod:`~surrotune.analysis.document` (Markdown and one HTML page);
- :mod:`~surrotune.analysis.export` and :mod:`~surrotune.analysis.table`: ``surrotune export``
  (recording, Kernel Tuner cache, T4, CSV, Parquet);
- :mod:`~surrotune.analysis.best`: ``surrotune best`` (JSON or a C header).

The names below are imported on first use (PEP 562), so that the command line does not pay for
Matplotlib or scikit-learn before it needs them.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from surrotune.analysis.best import best_configuration, format_header
    from surrotune.analysis.compare import Comparison, compare_studies
    from surrotune.analysis.export import (
        ExportError,
        export_kernel_tuner,
        export_recording,
        export_study,
        export_t4,
    )
    from surrotune.analysis.importance import Importance, parameter_importance
    from surrotune.analysis.noise import Noise, measurement_noise
    from surrotune.analysis.report import Report, write_report
    from surrotune.analysis.rules import learn_rules, rule_mask
    from surrotune.analysis.table import read_table, table_dataset, write_table
    from surrotune.analysis.trials import (
        AnalysisError,
        StudyTrials,
        open_studies,
        open_study,
        read_study_trials,
    )

__all__ = [
    "AnalysisError",
    "Comparison",
    "ExportError",
    "Importance",
    "Noise",
    "Report",
    "StudyTrials",
    "best_configuration",
    "compare_studies",
    "export_kernel_tuner",
    "export_recording",
    "export_study",
    "export_t4",
    "format_header",
    "learn_rules",
    "measurement_noise",
    "open_studies",
    "open_study",
    "parameter_importance",
    "read_study_trials",
    "read_table",
    "rule_mask",
    "table_dataset",
    "write_report",
    "write_table",
]

#: where each public name lives
_HOMES = {
    "AnalysisError": "trials",
    "Comparison": "compare",
    "ExportError": "export",
    "Importance": "importance",
    "Noise": "noise",
    "Report": "report",
    "StudyTrials": "trials",
    "best_configuration": "best",
    "compare_studies": "compare",
    "export_kernel_tuner": "export",
    "export_recording": "export",
    "export_study": "export",
    "export_t4": "export",
    "format_header": "best",
    "learn_rules": "rules",
    "measurement_noise": "noise",
    "open_studies": "trials",
    "open_study": "trials",
    "parameter_importance": "importance",
    "read_study_trials": "trials",
    "read_table": "table",
    "rule_mask": "rules",
    "table_dataset": "table",
    "write_report": "report",
    "write_table": "table",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use and keep the name here."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'surrotune.analysis' has no attribute {name!r}")
    value = getattr(import_module(f"surrotune.analysis.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
