"""The registry: every installed plugin's DB types, path types, metadata handlers and
upload builders, gathered once into read-only maps.

Built-ins are ordinary plugins (``BUILTIN_PLUGINS``); installed distributions come in
through the ``ckptstore`` entry-point group unless ``CKPTSTORE_DISABLE_PLUGINS`` is set
(``1``/``all`` blocks every entry-point plugin; a comma-separated list blocks those).

Example::

    >>> registry = get_registry()
    >>> registry.db_type("npz")
    NpzDB()
    >>> registry.open_path("memory://ckpt")
    FsspecPath('memory://ckpt')
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

import pluggy

from ckptstore.errors import (
    DuplicatePluginError,
    InvalidPluginError,
    UnknownPluginError,
)
from ckptstore.plugin import _spec as spec
from ckptstore.plugin._db_type import DBType
from ckptstore.plugin._markers import PROJECT_NAME
from ckptstore.plugin._metadata import MetadataHandler, MetadataHandlerLike
from ckptstore.plugin._path_type import PathType
from ckptstore.plugin._upload import UploadTaskGroupBuilder
from ckptstore.records._stats import NodeStats

__all__ = ["BUILTIN_PLUGINS", "PluginInfo", "Registry", "get_registry", "reset_registry"]

log = logging.getLogger(__name__)

BUILTIN_PLUGINS = (
    "ckptstore.builtin._local_path",
    "ckptstore.builtin._fsspec_path",
    "ckptstore.builtin._npz_db",
    "ckptstore.builtin._zarr_db",
    "ckptstore.builtin._json_catalog",
    "ckptstore.builtin._sqlite_catalog",
    "ckptstore.builtin._copy_upload",
)
DISABLE_ENV = "CKPTSTORE_DISABLE_PLUGINS"
WILDCARD = "*"

_S3_HINT = "install the S3 plugin from a ckptstore checkout: `pip install ./plugins/ckptstore-s3`"
_GCS_HINT = (
    "install the GCS plugin from a ckptstore checkout: `pip install ./plugins/ckptstore-gcs`"
)
INSTALL_HINTS: Mapping[tuple[str, str], str] = MappingProxyType(
    {
        ("path type", "s3"): _S3_HINT,
        ("path type", "s3a"): _S3_HINT,
        ("path type", "gs"): _GCS_HINT,
        ("path type", "gcs"): _GCS_HINT,
        ("db type", "lmdb"): "install the LMDB plugin from a ckptstore checkout: "
        "`pip install ./plugins/ckptstore-lmdb`",
    }
)
"""Which distribution provides a well-known name, for "unknown name" errors."""

T = TypeVar("T")


@dataclass(frozen=True)
class PluginInfo:
    """One registered plugin and what it provides (for ``ckptstore plugins``)."""

    name: str
    distribution: str | None
    db_types: tuple[str, ...]
    path_types: tuple[str, ...]
    metadata_handlers: tuple[str, ...]
    upload_builders: tuple[str, ...]
    reports: bool


def build_plugin_manager() -> pluggy.PluginManager:
    """A plugin manager with the hook specs, the built-ins and (unless disabled) every
    plugin installed under the ``ckptstore`` entry-point group."""
    manager = pluggy.PluginManager(PROJECT_NAME)
    manager.add_hookspecs(spec)
    for module_name in BUILTIN_PLUGINS:
        manager.register(importlib.import_module(module_name), name=module_name)
    disabled = os.environ.get(DISABLE_ENV, "").strip()
    if disabled.lower() not in ("1", "all", "true", "yes", "*"):
        for name in filter(None, (part.strip() for part in disabled.split(","))):
            manager.set_blocked(name)
        manager.load_setuptools_entrypoints(PROJECT_NAME)
    manager.check_pending()
    return manager


class Registry:
    """Read-only maps from names to the classes installed plugins provide.

    Example::

        >>> registry = get_registry()
        >>> {"npz", "zarr"} <= set(registry.db_types)
        True
        >>> registry.path_type_for("s3://b/x")  # S3Path, or UnknownPluginError with a hint
        <class 'ckptstore_s3.path.S3Path'>
    """

    def __init__(self, plugin_manager: pluggy.PluginManager | None = None) -> None:
        self.plugin_manager = plugin_manager or build_plugin_manager()
        self._gather()

    def _gather(self) -> None:
        hook = self.plugin_manager.hook
        self.db_types: Mapping[str, type[DBType]] = self._collect(
            "db type", hook.ckptstore_db_types, DBType
        )
        self.path_types: Mapping[str, type[PathType]] = self._collect(
            "path type", hook.ckptstore_path_types, PathType
        )
        self.metadata_handlers: Mapping[str, type[MetadataHandler]] = self._collect(
            "metadata handler", hook.ckptstore_metadata_handlers, MetadataHandler
        )
        self.upload_builders: Mapping[str, type[UploadTaskGroupBuilder]] = self._collect(
            "upload builder", hook.ckptstore_upload_builders, UploadTaskGroupBuilder
        )
        protocols: dict[str, type[PathType]] = {}
        for cls in self.path_types.values():
            for protocol in cls.protocols:
                if protocol in protocols:
                    raise DuplicatePluginError(
                        "URL protocol", protocol, [protocols[protocol].name, cls.name]
                    )
                protocols[protocol] = cls
        self.protocols: Mapping[str, type[PathType]] = MappingProxyType(protocols)

    def _collect(self, kind: str, hook: Any, base: type) -> Mapping[str, Any]:
        found: dict[str, type] = {}
        providers: dict[str, str] = {}
        for impl in hook.get_hookimpls():
            provided = impl.function() or []
            for cls in provided:
                if not (isinstance(cls, type) and issubclass(cls, base)):
                    raise InvalidPluginError(
                        f"plugin {impl.plugin_name!r} returned {cls!r} from {hook.name}; "
                        f"it must return subclasses of {base.__name__}"
                    )
                name = getattr(cls, "name", None)
                if not isinstance(name, str) or not name:
                    raise InvalidPluginError(
                        f"{cls.__qualname__} from plugin {impl.plugin_name!r} has no 'name'; "
                        f'give every {kind} class a `name = "..."` attribute'
                    )
                if name in found and found[name] is not cls:
                    raise DuplicatePluginError(kind, name, [providers[name], impl.plugin_name])
                found[name] = cls
                providers[name] = impl.plugin_name
        return MappingProxyType(found)

    def register(self, plugin: object, name: str | None = None) -> None:
        """Register an in-process plugin (an object or module with hook functions)."""
        self.plugin_manager.register(plugin, name=name)
        try:
            self.plugin_manager.check_pending()
            self._gather()
        except Exception:
            # a refused plugin must not stay registered (nor leave the maps half-updated)
            self.plugin_manager.unregister(plugin)
            self._gather()
            raise

    def unregister(self, plugin: object) -> None:
        """Remove a plugin registered with :meth:`register`."""
        self.plugin_manager.unregister(plugin)
        self._gather()

    # -- lookups ----------------------------------------------------------------------

    def _lookup(self, kind: str, table: Mapping[str, T], name: str) -> T:
        try:
            return table[name]
        except KeyError:
            raise UnknownPluginError(kind, name, table, INSTALL_HINTS.get((kind, name))) from None

    def db_type(self, spec: str | DBType) -> DBType:
        """A DB type instance from a registered name or an instance."""
        instance: DBType = self._instance("db type", self.db_types, spec, DBType)
        return instance

    def metadata_handler(
        self, spec: str | MetadataHandler | MetadataHandlerLike | None
    ) -> MetadataHandler | MetadataHandlerLike | None:
        """A metadata handler from a registered name, an instance or ``None``. Objects
        that only duck-type the Caffe2 protocol are accepted as they are."""
        if spec is None or not isinstance(spec, str):
            return spec
        handler: MetadataHandler = self._instance(
            "metadata handler", self.metadata_handlers, spec, MetadataHandler
        )
        return handler

    def upload_builder(
        self, spec: str | UploadTaskGroupBuilder | None
    ) -> UploadTaskGroupBuilder | None:
        """An upload builder from a registered name, an instance or ``None``."""
        if spec is None or not isinstance(spec, str):
            return spec
        builder: UploadTaskGroupBuilder = self._instance(
            "upload builder", self.upload_builders, spec, UploadTaskGroupBuilder
        )
        return builder

    def _instance(self, kind: str, table: Mapping[str, type], spec: Any, base: type) -> Any:
        if isinstance(spec, base):
            return spec
        if isinstance(spec, str):
            cls = self._lookup(kind, table, spec)
            try:
                return cls()
            except TypeError as error:
                raise InvalidPluginError(
                    f"{kind} {spec!r} needs arguments ({error}); pass an instance "
                    f"({cls.__name__}(...)) instead of its name"
                ) from None
        raise InvalidPluginError(
            f"expected a {kind} name or a {base.__name__} instance, got {type(spec).__name__}"
        )

    def path_type_for(self, url: str, path_type: str | None = None) -> type[PathType]:
        """The path type class serving ``url`` (or the one named ``path_type``)."""
        if path_type is not None:
            return self._lookup("path type", self.path_types, path_type)
        protocol = url.split("://", 1)[0].lower() if "://" in url else ""
        cls = self.protocols.get(protocol)
        if cls is not None:
            return cls
        fallback = self.protocols.get(WILDCARD)
        hint = INSTALL_HINTS.get(("path type", protocol))
        if fallback is not None and hint is None and _fsspec_knows(protocol):
            return fallback
        raise UnknownPluginError("path type", protocol, map(_served, self.protocols), hint)

    def open_path(self, url: str, path_type: str | None = None, **options: object) -> PathType:
        """A path type instance rooted at ``url``; ``options`` go to its constructor."""
        return self.path_type_for(url, path_type)(url, **options)

    # -- reports ----------------------------------------------------------------------

    def report(self, action_name: str, stats: Mapping[str, NodeStats]) -> None:
        """Broadcast a report to every ``ckptstore_report`` implementation. A failing
        reporter is logged and does not affect checkpointing or the other reporters."""
        for impl in self.plugin_manager.hook.ckptstore_report.get_hookimpls():
            arguments = {"action_name": action_name, "stats": stats}
            try:
                impl.function(**{name: arguments[name] for name in impl.argnames})
            except Exception:
                log.warning("reporter plugin %r failed", impl.plugin_name, exc_info=True)

    def plugins(self) -> list[PluginInfo]:
        """Every registered plugin and what it provides."""
        manager = self.plugin_manager
        distributions = {
            manager.get_name(plugin): f"{dist.project_name} {dist.version}"
            for plugin, dist in manager.list_plugin_distinfo()
        }

        def provided(hook_name: str) -> dict[str, tuple[Any, ...]]:
            hook = getattr(manager.hook, hook_name)
            return {impl.plugin_name: tuple(impl.function() or ()) for impl in hook.get_hookimpls()}

        db_types = provided("ckptstore_db_types")
        path_types = provided("ckptstore_path_types")
        handlers = provided("ckptstore_metadata_handlers")
        builders = provided("ckptstore_upload_builders")
        reporters = {impl.plugin_name for impl in manager.hook.ckptstore_report.get_hookimpls()}
        infos = []
        for plugin in manager.get_plugins():
            name = manager.get_name(plugin) or repr(plugin)
            infos.append(
                PluginInfo(
                    name=name,
                    distribution=distributions.get(name),
                    db_types=tuple(cls.name for cls in db_types.get(name, ())),
                    path_types=tuple(
                        f"{cls.name} ({', '.join(p or 'local paths' for p in cls.protocols)})"
                        for cls in path_types.get(name, ())
                    ),
                    metadata_handlers=tuple(cls.name for cls in handlers.get(name, ())),
                    upload_builders=tuple(cls.name for cls in builders.get(name, ())),
                    reports=name in reporters,
                )
            )
        return sorted(infos, key=lambda info: (info.distribution is not None, info.name))


def _served(protocol: str) -> str:
    """How an error names the URLs served for a registered ``protocol``."""
    if protocol == WILDCARD:
        return "other URLs fsspec knows (memory://, ftp://...)"
    return f"{protocol}://" if protocol else "local paths"


def _fsspec_knows(protocol: str) -> bool:
    import fsspec

    return protocol in fsspec.available_protocols()


_registry: Registry | None = None
_registry_lock = threading.Lock()


def get_registry() -> Registry:
    """The process-wide registry, built on first use."""
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = Registry()
        return _registry


def reset_registry(factory: Callable[[], Registry] | None = None) -> Registry:
    """Rebuild the process-wide registry (after installing or disabling plugins)."""
    global _registry
    with _registry_lock:
        _registry = factory() if factory is not None else Registry()
        return _registry
