"""Loading installed plugins one at a time, so that one broken plugin is left out alone.

pluggy's ``load_setuptools_entrypoints`` stops at the first plugin that fails to import
or validate, and every save and CLI command fails with it. Here each entry point of the
``ckptstore`` group is imported, registered and validated inside its own ``try``: a
failure becomes a :class:`BrokenPlugin` record (its distribution, entry-point name and
error on one line), logged once per process as a WARNING naming
``CKPTSTORE_DISABLE_PLUGINS``, and the other plugins load as usual.

Example::

    >>> broken = BrokenPlugin("fast", "ckptstore-fast 0.1", "ImportError: no numba")
    >>> broken.may_provide("db type"), broken.declares("db type", "fast")
    (True, False)
    >>> broken.remedy()
    'fix or reinstall ckptstore-fast 0.1, or set CKPTSTORE_DISABLE_PLUGINS=fast to stop loading it'
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import pluggy

from ckptstore.plugin import _spec as spec
from ckptstore.plugin._markers import PROJECT_NAME

__all__ = [
    "BUILTIN_PLUGINS",
    "DISABLE_ENV",
    "BrokenPlugin",
    "LoadedPlugins",
    "load_plugins",
    "one_line",
    "warn_once",
]

log = logging.getLogger(__name__)

BUILTIN_PLUGINS = (
    "ckptstore.paths._local_path",
    "ckptstore.paths._fsspec_path",
    "ckptstore.formats._npz_db",
    "ckptstore.formats._zarr_db",
    "ckptstore.builtin._json_catalog",
    "ckptstore.builtin._sqlite_catalog",
    "ckptstore.builtin._copy_upload",
)
DISABLE_ENV = "CKPTSTORE_DISABLE_PLUGINS"
_DISABLE_ALL = ("1", "all", "true", "yes", "*")
_MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class BrokenPlugin:
    """An installed plugin left out because it failed to import, validate or answer a hook.

    ``declared`` maps each kind of extension (``"db type"``, ``"path type"``...) whose
    hook answered before the plugin failed to the names it gave (a path type's name and
    its URL protocols); a kind not in it is unknown: the plugin may provide anything.
    """

    name: str
    """The entry-point name (what ``CKPTSTORE_DISABLE_PLUGINS`` takes)."""
    distribution: str
    """The distribution and version it came from (``"ckptstore-fast 0.1"``)."""
    error: str
    """Why it was left out, on one line (``"ModuleNotFoundError: No module named 'x'"``)."""
    declared: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))

    def declares(self, kind: str, name: str) -> bool:
        """Whether the plugin said it provides the ``kind`` called ``name``."""
        return name in self.declared.get(kind, frozenset())

    def may_provide(self, kind: str) -> bool:
        """Whether the plugin failed before saying what ``kind`` it provides."""
        return kind not in self.declared

    def remedy(self) -> str:
        """What the user can do about it."""
        return (
            f"fix or reinstall {self.distribution}, or set {DISABLE_ENV}={self.name} "
            "to stop loading it"
        )


@dataclass(frozen=True)
class LoadedPlugins:
    """A plugin manager with the built-ins and every installed plugin that loaded, the
    distribution of each installed one, and the installed plugins that did not load."""

    manager: pluggy.PluginManager
    distributions: Mapping[str, str]
    broken: tuple[BrokenPlugin, ...]


def load_plugins() -> LoadedPlugins:
    """The hook specs, the built-ins and (unless ``CKPTSTORE_DISABLE_PLUGINS`` blocks
    them: ``1``/``all`` every one, a comma-separated list those entry-point names) every
    plugin installed under the ``ckptstore`` entry-point group, each loaded alone."""
    manager = pluggy.PluginManager(PROJECT_NAME)
    manager.add_hookspecs(spec)
    for module_name in BUILTIN_PLUGINS:
        manager.register(importlib.import_module(module_name), name=module_name)
    manager.check_pending()
    distributions: dict[str, str] = {}
    broken: list[BrokenPlugin] = []
    disabled = os.environ.get(DISABLE_ENV, "").strip()
    if disabled.lower() in _DISABLE_ALL:
        return LoadedPlugins(manager, MappingProxyType(distributions), ())
    for name in filter(None, (part.strip() for part in disabled.split(","))):
        manager.set_blocked(name)
    seen: set[str] = set()
    for entry_point in importlib.metadata.entry_points(group=PROJECT_NAME):
        name = entry_point.name
        if name in seen or manager.has_plugin(name) or manager.is_blocked(name):
            continue
        seen.add(name)
        distribution = _describe(entry_point.dist)
        try:
            _register(manager, entry_point)
        except Exception as error:
            broken.append(BrokenPlugin(name, distribution, one_line(error)))
        else:
            distributions[name] = distribution
    return LoadedPlugins(manager, MappingProxyType(distributions), tuple(broken))


def _register(manager: pluggy.PluginManager, entry_point: importlib.metadata.EntryPoint) -> None:
    """Import ``entry_point`` and register it, or leave the manager as it was and raise."""
    plugin = entry_point.load()
    manager.register(plugin, name=entry_point.name)
    try:
        manager.check_pending()  # an unknown hook name (a typo) is only found here
    except Exception:
        manager.unregister(plugin)
        raise


def _describe(distribution: importlib.metadata.Distribution | None) -> str:
    if distribution is None:
        return "an unknown distribution"
    name = distribution.metadata["Name"] or "an unnamed distribution"
    return f"{name} {distribution.version}"


def one_line(error: BaseException) -> str:
    """``"Type: message"`` on one line (pluggy's validation errors span several).

    Example::

        >>> one_line(ValueError("bad hook\\nargument 'x'"))
        "ValueError: bad hook; argument 'x'"
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {'; '.join(lines)}" if lines else type(error).__name__
    if len(text) > _MAX_ERROR_CHARS:
        text = text[: _MAX_ERROR_CHARS - 3] + "..."
    return text


_warned: set[tuple[str, str, str]] = set()
_warned_lock = threading.Lock()


def warn_once(broken: BrokenPlugin) -> None:
    """Log one WARNING per broken plugin (and error) per process, however often the
    registry is rebuilt."""
    key = (broken.name, broken.distribution, broken.error)
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(
        "ckptstore plugin %r from %s is broken and was left out (everything else works): %s; %s.",
        broken.name,
        broken.distribution,
        broken.error,
        broken.remedy(),
    )
