"""The documentation of the offline analysis says what the code does."""

from __future__ import annotations

import re
from pathlib import Path

from surrotune.analysis.best import BEST_FORMATS
from surrotune.analysis.export import FORMATS
from surrotune.analysis.trials import DERIVED_COLUMNS

REPO = Path(__file__).resolve().parents[2]


def test_analysis_page_lists_every_column_and_format() -> None:
    page = (REPO / "docs" / "analysis.md").read_text()
    for column in DERIVED_COLUMNS:
        assert f"`{column}`" in page, column
    for fmt in (*FORMATS, *BEST_FORMATS):
        assert f"`{fmt}`" in page, fmt
    for command in ("surrotune analyze", "surrotune export", "surrotune best", "optuna-dashboard"):
        assert command in page


def test_readme_shows_the_commands_and_the_dashboard() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Storage and analysis", 1)[1].split("\n## ", 1)[0]
    for command in ("surrotune analyze", "surrotune export", "surrotune best"):
        assert re.search(rf"^{command} \S+", section, re.M), command
    assert "optuna-dashboard sqlite:///" in section
    assert "docs/analysis.md" in section
