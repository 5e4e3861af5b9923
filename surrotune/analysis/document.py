"""The report as one document, rendered twice: Markdown beside its figures, and one HTML page.

The report is built as a list of blocks (headings, paragraphs, tables, figures) and rendered to
Markdown (``report.md``, which links the PNG files) and to a self-contained HTML page
(``report.html``: the figures embedded as base64, a table of contents, one inline style sheet, no
script, nothing fetched). Table cells are formatted once, for both. Paragraphs use two pieces of
inline Markdown, ``code`` and ``**bold**``, which the HTML rendering translates.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["Document"]

_BOLD = re.compile(r"\*\*(.+?)\*\*")


@dataclass
class Document:
    """Headings, paragraphs, tables and figures, rendered to Markdown and to HTML."""

    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(("heading", (level, text)))

    def text(self, text: str) -> None:
        if text:
            self.blocks.append(("text", text))

    def table(self, frame: pd.DataFrame, caption: str = "") -> None:
        if not frame.empty:
            self.blocks.append(("table", (_formatted(frame), caption)))

    def figure(self, path: Path, caption: str) -> None:
        self.blocks.append(("figure", (path, caption)))

    def markdown(self) -> str:
        out = []
        for kind, payload in self.blocks:
            if kind == "heading":
                level, text = payload
                out.append(f"{'#' * level} {text}")
            elif kind == "text":
                out.append(payload)
            elif kind == "table":
                frame, caption = payload
                out.append((f"{caption}\n\n" if caption else "") + _markdown_table(frame))
            else:
                path, caption = payload
                out.append(f"![{caption}]({path.name})\n\n*{caption}*")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        body: list[str] = []
        toc: list[tuple[int, str, str]] = []
        for kind, payload in self.blocks:
            if kind == "heading":
                level, text = payload
                anchor = f"s{len(toc)}"
                toc.append((level, text, anchor))
                body.append(f'<h{level} id="{anchor}">{html.escape(text)}</h{level}>')
            elif kind == "text":
                body.append(f"<p>{_inline(payload)}</p>")
            elif kind == "table":
                frame, caption = payload
                cap = f"<caption>{_inline(caption)}</caption>" if caption else ""
                table = frame.to_html(index=False, border=0, escape=True, na_rep="")
                body.append(table.replace('<table class="dataframe">', f"<table>{cap}", 1))
            else:
                path, caption = payload
                data = base64.b64encode(path.read_bytes()).decode("ascii")
                body.append(
                    f'<figure><img alt="{html.escape(caption)}" '
                    f'src="data:image/png;base64,{data}"/>'
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>"
                )
        links = "".join(
            f'<li class="l{level}"><a href="#{anchor}">{html.escape(text)}</a></li>'
            for level, text, anchor in toc
            if level <= 3
        )
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
            f"<nav><ul>{links}</ul></nav><main>{''.join(body)}</main></body></html>\n"
        )


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:0;display:flex;color:#222}"
    "nav{width:15rem;flex:none;padding:1rem;border-right:1px solid #ddd;height:100vh;"
    "position:sticky;top:0;overflow:auto;font-size:.85rem}nav ul{list-style:none;padding:0}"
    "nav .l3{padding-left:1rem}main{padding:1rem 2rem;max-width:75rem;overflow-x:auto}"
    "table{border-collapse:collapse;font-size:.8rem;margin:.5rem 0 1rem}"
    "td,th{border-bottom:1px solid #e3e3e3;padding:.2rem .5rem;text-align:right}"
    "th{background:#f4f4f4}caption{text-align:left;font-weight:600;padding:.3rem 0}"
    "figure{margin:1rem 0}img{max-width:100%}figcaption{font-size:.8rem;color:#555}"
    "code{background:#f4f4f4;padding:0 .2rem}"
)


def _inline(text: str) -> str:
    """The Markdown this report writes inline (``code``, ``**bold**``) as HTML, the rest
    escaped."""
    parts = text.split("`")
    return "".join(
        f"<code>{html.escape(p)}</code>"
        if i % 2
        else _BOLD.sub(r"<strong>\1</strong>", html.escape(p))
        for i, p in enumerate(parts)
    )


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, float | np.floating):
        value = float(value)
        if value == 0 or (1e-3 <= abs(value) < 1e6):
            return f"{value:.6g}"
        return f"{value:.3e}"
    return str(value)


def _formatted(frame: pd.DataFrame) -> pd.DataFrame:
    """Every cell as text, formatted once for both renderings."""
    return pd.DataFrame({str(c): [_cell(v) for v in frame[c]] for c in frame.columns})


def _markdown_table(frame: pd.DataFrame) -> str:
    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    lines = [row(list(frame.columns)), "|" + "---|" * len(frame.columns)]
    lines += [row(list(r)) for r in frame.itertuples(index=False)]
    return "\n".join(lines)
