"""ckptstore's plugin system, built on pluggy.

Plugins are modules or objects with functions marked ``@hookimpl``; installed
distributions register them under the ``ckptstore`` entry-point group. The hooks are
specified in :mod:`ckptstore.plugin.spec`; the plugin authors' guide is
``docs/plugins.md``.

Example::

    from ckptstore.plugin import hookimpl

    @hookimpl
    def ckptstore_db_types():
        return [MyFormat]
"""

from ckptstore.plugin.markers import PROJECT_NAME, hookimpl, hookspec
from ckptstore.plugin.registry import PluginInfo, Registry, get_registry, reset_registry

__all__ = [
    "PROJECT_NAME",
    "PluginInfo",
    "Registry",
    "get_registry",
    "hookimpl",
    "hookspec",
    "reset_registry",
]
