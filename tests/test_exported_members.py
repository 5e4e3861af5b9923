"""The public API: ``surrotune.__all__`` and each public module's ``__all__`` are true and sorted.

"Sorted" is ruff's RUF022 order (the one ``ruff check`` enforces): SCREAMING_CASE constants first,
then CamelCase classes, then everything else, each group in plain string order.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
import types

import pytest

import surrotune


def _public_modules() -> list[str]:
    """Every module and package under surrotune/ whose dotted name has no ``_`` component."""
    names = ["surrotune"]
    for info in pkgutil.walk_packages(surrotune.__path__, "surrotune."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


PUBLIC_MODULES = _public_modules()


def _ruff_order(name: str) -> tuple[int, str]:
    if len(name) > 1 and name.isupper():
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


def test_the_walk_finds_the_package_s_modules() -> None:
    """Guards the parametrisation below against a walk that silently finds nothing."""
    for expected in ("surrotune.cli", "surrotune.storage", "surrotune.backends.replay",
                     "surrotune.backends.cuda", "surrotune.analysis.export"):  # fmt: skip
        assert expected in PUBLIC_MODULES


def test_top_level_all_is_sorted_and_every_name_exists() -> None:
    names = surrotune.__all__
    assert names == sorted(names, key=_ruff_order)
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(surrotune, name), name
    assert isinstance(surrotune.__version__, str)


def test_top_level_names_are_the_library_s_own() -> None:
    """Everything re-exported at the top is defined inside surrotune, not borrowed."""
    for name in surrotune.__all__:
        value = getattr(surrotune, name)
        module = getattr(value, "__module__", None)
        if module is not None:
            assert module.split(".")[0] == "surrotune", (name, module)


def test_every_public_module_imports_without_cupy() -> None:
    """Imported in a fresh interpreter in which ``import cupy`` fails, as on a machine without a
    GPU (this one may have CuPy installed)."""
    script = (
        "import importlib, json, sys\n"
        "for blocked in ('cupy', 'cupyx', 'cupy_backends'):\n"
        "    sys.modules[blocked] = None\n"
        "failed = {}\n"
        f"for name in {PUBLIC_MODULES!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed[name] = f'{type(exc).__name__}: {exc}'\n"
        "print(json.dumps(failed))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_module_defines_a_true_all(name: str) -> None:
    module = importlib.import_module(name)
    assert isinstance(module, types.ModuleType)
    names = getattr(module, "__all__", None)
    assert names is not None, f"{name} defines no __all__"
    assert isinstance(names, list | tuple)
    assert all(isinstance(n, str) for n in names), names
    assert len(names) == len(set(names)), f"{name}.__all__ repeats a name"
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"
    assert list(names) == sorted(names, key=_ruff_order), f"{name}.__all__ is not sorted"
