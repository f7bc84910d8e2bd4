"""No ``Any`` in the type hints of the public API: every name in ``ckptstore.__all__``
and in each subpackage's ``__all__``, including the methods and properties of exported
classes."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

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
