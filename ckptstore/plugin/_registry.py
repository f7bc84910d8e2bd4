"""The registry: every installed plugin's DB types, path types, metadata handlers and
upload builders, gathered once into read-only maps.

Built-ins are ordinary plugins (``BUILTIN_PLUGINS``); installed distributions come in
through the ``ckptstore`` entry-point group unless ``CKPTSTORE_DISABLE_PLUGINS`` is set
(``1``/``all`` blocks every entry-point plugin; a comma-separated list blocks those).
An installed plugin that fails to import, validate or answer a hook is left out alone
(:mod:`ckptstore.plugin._loading`): asking for what it provides raises
:class:`~ckptstore.errors.BrokenPluginError`, and everything else works.

Example::

    >>> registry = get_registry()
    >>> registry.db_type("npz")
    NpzDB()
    >>> registry.open_path("memory://ckpt")
    FsspecPath('memory://ckpt')
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

import pluggy
from pluggy import HookImpl

from ckptstore.errors import (
    BrokenPluginError,
    DuplicatePluginError,
    InvalidPluginError,
    UnknownPluginError,
)
from ckptstore.plugin._db_type import DBType
from ckptstore.plugin._loading import (
    BUILTIN_PLUGINS,
    BrokenPlugin,
    load_plugins,
    one_line,
    warn_once,
)
from ckptstore.plugin._metadata import MetadataHandler, MetadataHandlerLike, as_metadata_handler
from ckptstore.plugin._path_type import PathType
from ckptstore.plugin._upload import UploadTaskGroupBuilder
from ckptstore.records import NodeStats

__all__ = [
    "BUILTIN_PLUGINS",
    "BrokenPlugin",
    "PluginInfo",
    "Registry",
    "get_registry",
    "reset_registry",
]

log = logging.getLogger(__name__)

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
    """One plugin and what it provides, as ``ckptstore plugins`` shows it.

    ``error`` says why an installed plugin was left out (it then provides nothing)."""

    name: str
    distribution: str | None
    db_types: tuple[str, ...]
    path_types: tuple[str, ...]
    metadata_handlers: tuple[str, ...]
    upload_builders: tuple[str, ...]
    reports: bool
    error: str | None = None


REGISTRATION_HOOKS: tuple[tuple[str, str, type], ...] = (
    ("db type", "ckptstore_db_types", DBType),
    ("path type", "ckptstore_path_types", PathType),
    ("metadata handler", "ckptstore_metadata_handlers", MetadataHandler),
    ("upload builder", "ckptstore_upload_builders", UploadTaskGroupBuilder),
)
"""Each kind of extension, the hook that lists its classes and their base class."""


class Registry:
    """Read-only maps from names to the classes installed plugins provide.

    Example::

        >>> registry = get_registry()
        >>> {"npz", "zarr"} <= set(registry.db_types)
        True
        >>> registry.path_type_for("s3://b/x")  # S3Path, or UnknownPluginError with a hint
        <class 'ckptstore_s3.path.S3Path'>
        >>> registry.broken_plugins  # installed plugins left out, with their errors
        ()
    """

    def __init__(self, plugin_manager: pluggy.PluginManager | None = None) -> None:
        if plugin_manager is None:
            loaded = load_plugins()
            plugin_manager = loaded.manager
            self._distributions = dict(loaded.distributions)
            self._broken = list(loaded.broken)
        else:
            self._distributions = {}
            self._broken = []
        self.plugin_manager = plugin_manager
        for broken in self._broken:
            warn_once(broken)
        self._gather()  # a plugin whose hook fails is left out (and warned about) here

    @property
    def broken_plugins(self) -> tuple[BrokenPlugin, ...]:
        """The installed plugins left out because they failed to import, validate or
        answer a hook."""
        return tuple(self._broken)

    def _gather(self) -> None:
        provided = self._call_registration_hooks()
        self._provided = provided
        self.db_types: Mapping[str, type[DBType]] = _by_name("db type", provided["db type"])
        self.path_types: Mapping[str, type[PathType]] = _by_name("path type", provided["path type"])
        self.metadata_handlers: Mapping[str, type[MetadataHandler]] = _by_name(
            "metadata handler", provided["metadata handler"]
        )
        self.upload_builders: Mapping[str, type[UploadTaskGroupBuilder]] = _by_name(
            "upload builder", provided["upload builder"]
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

    def _call_registration_hooks(self) -> dict[str, dict[str, tuple[Any, ...]]]:
        """Per kind, each plugin's classes in registration order. A plugin whose hook
        raises or returns something invalid fails: an installed one is left out (and
        recorded as broken), any other (built-in or registered in-process) raises."""
        provided: dict[str, dict[str, tuple[Any, ...]]] = {}
        failures: dict[str, dict[str, Exception]] = {}
        for kind, hook_name, base in REGISTRATION_HOOKS:
            provided[kind] = {}
            for impl in getattr(self.plugin_manager.hook, hook_name).get_hookimpls():
                try:
                    provided[kind][impl.plugin_name] = _checked_classes(kind, hook_name, base, impl)
                except Exception as error:
                    failures.setdefault(impl.plugin_name, {})[kind] = error
        for name, errors in failures.items():
            if name not in self._distributions:
                raise next(iter(errors.values()))
        for name, errors in failures.items():
            declared = {
                kind: frozenset(_names(by_plugin.pop(name, ())))
                for kind, by_plugin in provided.items()
                if kind not in errors
            }
            self._leave_out(name, next(iter(errors.values())), declared)
        return provided

    def _leave_out(self, name: str, error: Exception, declared: dict[str, frozenset[str]]) -> None:
        """Unregister the installed plugin ``name`` and record it as broken."""
        self.plugin_manager.unregister(name=name)
        broken = BrokenPlugin(
            name, self._distributions.pop(name), one_line(error), MappingProxyType(declared)
        )
        self._broken.append(broken)
        warn_once(broken)

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
            raise self._unknown(kind, name, table) from None

    def _unknown(self, kind: str, name: str, installed: Iterable[str]) -> UnknownPluginError:
        """The error for a ``kind`` called ``name`` nobody registered: it names the
        broken plugins that declared it or, failing that, those that might have."""
        hint = INSTALL_HINTS.get((kind, name))
        declaring = [broken for broken in self._broken if broken.declares(kind, name)]
        suspects = declaring or [broken for broken in self._broken if broken.may_provide(kind)]
        if not suspects:
            return UnknownPluginError(kind, name, installed, hint)
        return BrokenPluginError(
            kind,
            name,
            installed,
            [(broken.name, broken.distribution, broken.error) for broken in suspects],
            declared=bool(declaring),
            hint=hint,
        )

    def db_type(self, spec: str | DBType) -> DBType:
        """A DB type instance from a registered name or an instance."""
        instance: DBType = self._instance("db type", self.db_types, spec, DBType)
        return instance

    def metadata_handler(
        self, spec: str | MetadataHandler | MetadataHandlerLike | None
    ) -> MetadataHandler | None:
        """A metadata handler from a registered name, an instance or ``None``. An object
        that only duck-types the Caffe2 protocol is wrapped in a
        :class:`~ckptstore.plugin.Caffe2Handler`."""
        if spec is None:
            return None
        if not isinstance(spec, str):
            return as_metadata_handler(spec)
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
        declared = any(broken.declares("path type", protocol) for broken in self._broken)
        if fallback is not None and hint is None and not declared and _fsspec_knows(protocol):
            return fallback
        raise self._unknown("path type", protocol, map(_served, self.protocols))

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
        """Every registered plugin and what it provides, and every broken one with its
        error: the built-ins first, then the installed plugins, by name."""
        manager = self.plugin_manager
        reporters = {impl.plugin_name for impl in manager.hook.ckptstore_report.get_hookimpls()}
        infos = []
        for plugin in manager.get_plugins():
            name = manager.get_name(plugin) or repr(plugin)
            own = {kind: by_plugin.get(name, ()) for kind, by_plugin in self._provided.items()}
            infos.append(
                PluginInfo(
                    name=name,
                    distribution=self._distributions.get(name),
                    db_types=tuple(cls.name for cls in own["db type"]),
                    path_types=tuple(
                        f"{cls.name} ({', '.join(p or 'local paths' for p in cls.protocols)})"
                        for cls in own["path type"]
                    ),
                    metadata_handlers=tuple(cls.name for cls in own["metadata handler"]),
                    upload_builders=tuple(cls.name for cls in own["upload builder"]),
                    reports=name in reporters,
                )
            )
        for broken in self._broken:
            infos.append(
                PluginInfo(
                    name=broken.name,
                    distribution=broken.distribution,
                    db_types=(),
                    path_types=(),
                    metadata_handlers=(),
                    upload_builders=(),
                    reports=False,
                    error=broken.error,
                )
            )
        return sorted(infos, key=lambda info: (info.distribution is not None, info.name))


def _checked_classes(kind: str, hook_name: str, base: type, impl: HookImpl) -> tuple[Any, ...]:
    """What ``impl`` of the registration hook ``hook_name`` returns, each a named
    subclass of ``base``."""
    returned: Any = impl.function()
    provided: tuple[Any, ...] = tuple(returned or ())
    for cls in provided:
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise InvalidPluginError(
                f"plugin {impl.plugin_name!r} returned {cls!r} from {hook_name}; "
                f"it must return subclasses of {base.__name__}"
            )
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise InvalidPluginError(
                f"{cls.__qualname__} from plugin {impl.plugin_name!r} has no 'name'; "
                f'give every {kind} class a `name = "..."` attribute'
            )
    return provided


def _by_name(kind: str, by_plugin: Mapping[str, tuple[Any, ...]]) -> Mapping[str, Any]:
    """One read-only map from name to class; two plugins giving one name two classes
    is an error naming both."""
    found: dict[str, type] = {}
    providers: dict[str, str] = {}
    for plugin_name, classes in by_plugin.items():
        for cls in classes:
            name = cls.name
            if name in found and found[name] is not cls:
                raise DuplicatePluginError(kind, name, [providers[name], plugin_name])
            found[name] = cls
            providers[name] = plugin_name
    return MappingProxyType(found)


def _names(classes: Iterable[Any]) -> Iterator[str]:
    """The names a plugin's classes are asked for by: each class's ``name`` and, for a
    path type, the URL protocols it serves."""
    for cls in classes:
        yield cls.name
        yield from getattr(cls, "protocols", ())


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
