"""The exceptions surrotune raises for bad input, with one root so the CLI catches them once.

The tree::

    SurrotuneError                      anything the user can fix; the CLI prints it, exits 2
    ├── ExperimentError (ValueError)    the experiment file: file, key, what was expected
    ├── DatasetError (ValueError)       a recording that cannot be read
    ├── SpaceError (ValueError)         a search space that cannot be built or enumerated
    │   └── SpaceTooLarge               too large to enumerate: sample instead
    ├── TemplateError (ValueError)      a kernel template that cannot be read or rendered
    ├── StorageError (ValueError)       a storage URL that cannot be opened
    └── SetupError (ValueError)         a run that cannot start (mismatched study, missing extra)

A configuration that fails to compile, launch or verify is *not* an exception here: it is a
Result with a Status (``surrotune.result``), because a failing configuration costs one trial,
never the run.
"""

from __future__ import annotations

__all__ = ["SurrotuneError"]


class SurrotuneError(Exception):
    """Root of the errors a user can fix; messages say what was expected and what was found."""
