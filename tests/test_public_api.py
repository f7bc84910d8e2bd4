"""The public API: no ``Any`` in its type hints (every name in ``ckptstore.__all__`` and
in each subpackage's ``__all__``, including the methods and properties of exported
classes), and a narrow front door (``ckptstore`` itself: what a training script writes)."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import ckptstore
from ckptstore.builtin import LocalPath
from ckptstore.errors import BrokenPluginError
from ckptstore.plugin import DBType

PUBLIC_MODULES = [
    "ckptstore",
    "ckptstore.errors",
    "ckptstore.io",
    "ckptstore.records",
    "ckptstore.execution",
    "ckptstore.plugin",
    "ckptstore.object_store",
    "ckptstore.dask_session",
    "ckptstore.tools",
    "ckptstore.checkpoint",
    "ckptstore.protocol",
    "ckptstore.builtin",
    "ckptstore.formats",
    "ckptstore.paths",
]


def _callables(obj: object) -> Iterator[tuple[str, Callable[..., object]]]:
    if inspect.isclass(obj):
        for attr, value in vars(obj).items():
            if attr.startswith("_") and attr not in ("__init__", "__call__"):
                continue
            label = f"{obj.__module__}.{obj.__qualname__}.{attr}"
            if inspect.isfunction(value):
                yield label, value
            elif isinstance(value, classmethod | staticmethod):
                yield label, value.__func__
            elif isinstance(value, property) and value.fget is not None:
                yield label, value.fget
    elif inspect.isfunction(obj):
        yield f"{obj.__module__}.{obj.__qualname__}", obj


def signatures_with_any() -> set[str]:
    """``qualname:parameter`` of every public signature whose type hint mentions Any."""
    found: set[str] = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            for label, function in _callables(getattr(module, name)):
                for parameter, hint in function.__annotations__.items():
                    if _mentions_any(hint, function):
                        found.add(f"{label}:{parameter}")
    return found


def _mentions_any(hint: object, function: Callable[..., object]) -> bool:
    """Whether ``hint`` (a string under ``from __future__ import annotations``) names
    ``Any``, directly or through an alias it refers to."""
    if not isinstance(hint, str):
        return "typing.Any" in repr(hint)
    if re.search(r"\bAny\b", hint):
        return True
    try:  # names imported only under TYPE_CHECKING stay unresolved: judged by text
        value = eval(hint, getattr(function, "__globals__", {}))
    except NameError:
        return False
    return "typing.Any" in repr(value)


def test_public_signatures_have_no_any() -> None:
    assert sorted(signatures_with_any()) == []


def test_the_check_sees_any() -> None:
    def sample(value: Any) -> None: ...

    assert _mentions_any("Any", sample)
    assert _mentions_any("dict[str, Any]", sample)
    assert not _mentions_any("dict[str, object]", sample)


def test_the_front_door_holds_what_a_training_script_writes() -> None:
    """``ckptstore`` exports at most 30 names; plugin contracts, built-in classes and the
    other errors live in their subpackages (``ckptstore.plugin``, ``ckptstore.builtin``,
    ``ckptstore.errors``...)."""
    assert len(ckptstore.__all__) <= 30
    for name in ckptstore.__all__:
        assert getattr(ckptstore, name) is not None


def test_a_name_that_moved_still_works_with_a_warning_naming_its_home() -> None:
    for name, home, value in [
        ("LocalPath", "ckptstore.builtin", LocalPath),
        ("DBType", "ckptstore.plugin", DBType),
        ("BrokenPluginError", "ckptstore.errors", BrokenPluginError),
    ]:
        with pytest.warns(DeprecationWarning, match=f"from {home} import {name}"):
            assert getattr(ckptstore, name) is value
    with pytest.raises(AttributeError, match="no attribute 'Nonesuch'"):
        ckptstore.Nonesuch  # noqa: B018
