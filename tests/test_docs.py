"""The Python examples in the docs run as written and do what the text says."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def python_blocks(page: str) -> list[str]:
    return BLOCK.findall((DOCS / page).read_text())


@pytest.mark.parametrize("index", [0, 1])
def test_sampler_page_examples_find_the_optimum(
    index: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = python_blocks("sampler.md")
    assert len(blocks) == 2
    script = tmp_path / f"example_{index}.py"
    script.write_text(blocks[index])
    namespace = runpy.run_path(str(script))
    study = namespace["study"]
    assert study.best_value <= 0.1 + 1e-9  # the optimum of each example's objective
    failed = [t for t in study.trials if t.state.name == "FAIL"]
    assert study.best_params in ({"block": 256, "tile": 4, "unroll": 0},
                                 {"BLOCK": 256, "TILE": 4, "VEC": 1})  # fmt: skip
    assert len(failed) < len(study.trials) // 2  # it learns to avoid the failing region
    assert str(study.best_params) in capsys.readouterr().out
