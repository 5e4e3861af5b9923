"""Kernel templates: CUDA source with ``${NAME}`` placeholders for the tuning parameters.

A template is plain text, not a macro language: rendering substitutes each ``${NAME}`` with the
configuration's value and nothing else, so what nvcc compiles is exactly what a person reads in
the file with the numbers filled in. Only the braced form is a placeholder; a bare ``$NAME`` is
left alone, so shell snippets or inline PTX in comments cannot be mistaken for parameters.
Values are written as C literals: integers as is, booleans as ``1``/``0`` (so they work in
``#if`` and in ``constexpr`` arithmetic), floats with ``repr`` so that no digit is lost.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from surrotune.errors import SurrotuneError

__all__ = ["PLACEHOLDER", "Template", "TemplateError"]

#: a placeholder: ``${NAME}`` where NAME is a C/Python identifier
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_]\w*)\}")


class TemplateError(SurrotuneError, ValueError):
    """A template that cannot be read, or a rendering that lacks a value for a placeholder."""


def _literal(name: str, value: object) -> str:
    """``value`` as C source text; bool before int because ``bool`` is an ``int``."""
    if isinstance(value, (bool, np.bool_)):
        return "1" if value else "0"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        as_float = float(value)
        if not math.isfinite(as_float):
            raise TemplateError(
                f"${{{name}}} = {value!r} is not a finite number; C has no literal"
            )
        return repr(as_float)
    return str(value)


@dataclass(frozen=True)
class Template:
    """A kernel source with ``${NAME}`` placeholders; ``path`` is where it came from, if a file."""

    path: Path | None
    text: str

    @classmethod
    def from_file(cls, path: str | Path) -> Template:
        """Read a template; a missing or unreadable file is a :class:`TemplateError` naming it."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise TemplateError(f"cannot read kernel template {str(path)!r}: {reason}") from exc
        return cls(path=path, text=text)

    @property
    def placeholders(self) -> frozenset[str]:
        """The parameter names the template needs a value for."""
        return frozenset(PLACEHOLDER.findall(self.text))

    @property
    def sha256(self) -> str:
        """Hex digest of the text, so a recording can tell which version of a kernel it timed."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def render(self, values: Mapping[str, object]) -> str:
        """Substitute every placeholder with its value from ``values``.

        Extra values are ignored (a configuration may carry parameters the source does not use);
        a missing one is a :class:`TemplateError` that names every missing placeholder.
        """
        missing = sorted(self.placeholders - set(values))
        if missing:
            where = f" in {str(self.path)!r}" if self.path is not None else ""
            names = ", ".join("${" + name + "}" for name in missing)
            raise TemplateError(
                f"no value for placeholder(s) {names}{where}; "
                f"got values for: {', '.join(sorted(values)) or '(none)'}"
            )
        return PLACEHOLDER.sub(lambda match: _literal(match[1], values[match[1]]), self.text)
