"""What every kernel template's tests read the same way: the space its header declares, the
feasible configurations of that space, and its experiment's reference function.

Each template states its parameters, constraints and feasible count in its header comment
(``//   NAME  in [v1, v2, ...]``, a ``// Constraints`` block, ``// Feasible configurations: N of
M.``): the tests hold the header, the experiment file and the constraints to the same space.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from surrotune.expressions import Expression


def declared_space(text: str) -> tuple[dict[str, list[int]], list[str], tuple[int, int]]:
    """The parameter lists, constraints and (feasible, total) counts of a template's header."""
    params = {
        match[1]: [int(v) for v in match[2].split(",")]
        for match in re.finditer(r"^//\s+(\w+)\s+in \[([^\]]*)\]", text, re.MULTILINE)
    }
    block = text.split("// Constraints", 1)[1].split("// Feasible", 1)[0]
    constraints = [line[2:].strip() for line in block.splitlines()[1:] if line.startswith("//")]
    counts = re.search(r"// Feasible configurations: (\d+) of (\d+)\.", text)
    assert counts is not None
    return params, [c for c in constraints if c], (int(counts[1]), int(counts[2]))


def feasible(params: Mapping[str, list[int]], constraints: list[str]) -> dict[str, np.ndarray]:
    """Every configuration of the product that meets ``constraints``, column by column."""
    grids = np.meshgrid(*(np.array(v) for v in params.values()), indexing="ij")
    env = {name: grid.ravel() for name, grid in zip(params, grids, strict=True)}
    mask = np.ones(next(iter(env.values())).shape, dtype=bool)
    for text in constraints:
        mask &= np.asarray(Expression.parse(text, known=params).evaluate(env), dtype=bool)
    return {name: values[mask] for name, values in env.items()}


def assert_in_declared_space(configs: Iterable[Mapping[str, int]], constraints: list[str]) -> None:
    """Fail on the first configuration that breaks one of ``constraints``."""
    for c in configs:
        env = {name: np.array([value]) for name, value in c.items()}
        assert all(Expression.parse(text).evaluate(env).all() for text in constraints), (
            f"{c} breaks a declared constraint"
        )


def load_reference(path: Path) -> Callable[..., dict[str, Any]]:
    """The ``reference`` function of an experiment's reference file, imported from its path."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reference  # type: ignore[no-any-return]
