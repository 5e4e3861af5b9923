"""Templates: ${NAME} placeholders are found and substituted as C literals; nothing else moves."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from surrotune.template import Template, TemplateError

SOURCE = """\
// $HOME and $NOT_A_PARAM stay as they are; ${ BAD } is not a name
constexpr int BX = ${BLOCK_X};
constexpr int TILE = ${BLOCK_X} * ${TILE_Y};
constexpr bool FAST = ${FAST};
constexpr float ALPHA = ${ALPHA};
"""


def test_placeholders_are_the_braced_names_only() -> None:
    template = Template(path=None, text=SOURCE)
    assert template.placeholders == frozenset({"BLOCK_X", "TILE_Y", "FAST", "ALPHA"})


def test_render_substitutes_every_occurrence_as_c_literals() -> None:
    template = Template(path=None, text=SOURCE)
    rendered = template.render(
        {"BLOCK_X": 32, "TILE_Y": np.int64(4), "FAST": True, "ALPHA": 0.1, "UNUSED": 7}
    )
    assert "constexpr int BX = 32;" in rendered
    assert "constexpr int TILE = 32 * 4;" in rendered
    assert "constexpr bool FAST = 1;" in rendered
    assert "constexpr float ALPHA = 0.1;" in rendered
    assert "$HOME and $NOT_A_PARAM" in rendered
    assert "${ BAD }" in rendered
    assert "${" not in rendered.replace("${ BAD }", "")


@pytest.mark.parametrize(
    ("value", "literal"),
    [(False, "0"), (np.bool_(True), "1"), (1e-5, "1e-05"), (2.0, "2.0"), (np.float32(0.5), "0.5")],
)
def test_literals(value: object, literal: str) -> None:
    assert Template(path=None, text="x = ${V};").render({"V": value}) == f"x = {literal};"


def test_float_keeps_every_digit() -> None:
    value = 0.1 + 0.2
    rendered = Template(path=None, text="${V}").render({"V": value})
    assert float(rendered) == value


def test_non_finite_float_is_refused() -> None:
    with pytest.raises(TemplateError, match=r"\$\{V\}"):
        Template(path=None, text="${V}").render({"V": float("nan")})


def test_missing_value_names_every_missing_placeholder_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "kernel.cu"
    path.write_text(SOURCE, encoding="utf-8")
    template = Template.from_file(path)
    with pytest.raises(TemplateError) as info:
        template.render({"BLOCK_X": 32, "FAST": 0})
    message = str(info.value)
    assert "${ALPHA}" in message
    assert "${TILE_Y}" in message
    assert "${BLOCK_X}" not in message
    assert "kernel.cu" in message


def test_from_file_reads_text_and_path(tmp_path: Path) -> None:
    path = tmp_path / "kernel.cu"
    path.write_text(SOURCE, encoding="utf-8")
    template = Template.from_file(path)
    assert template.path == path
    assert template.text == SOURCE
    assert template.sha256 == hashlib.sha256(SOURCE.encode("utf-8")).hexdigest()


def test_sha256_changes_with_the_text() -> None:
    assert Template(None, "a ${X}").sha256 != Template(None, "b ${X}").sha256


def test_missing_file_is_a_template_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.cu"
    with pytest.raises(TemplateError, match=r"nope\.cu"):
        Template.from_file(missing)


def test_undecodable_file_is_a_template_error(tmp_path: Path) -> None:
    path = tmp_path / "binary.cu"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(TemplateError, match=r"binary\.cu"):
        Template.from_file(path)


def test_template_error_is_a_value_error() -> None:
    assert issubclass(TemplateError, ValueError)
