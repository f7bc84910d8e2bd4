"""ckptstore's built-in plugins. Each module is an ordinary plugin (its hooks are found
like any installed plugin's), registered from ``BUILTIN_PLUGINS`` in
:mod:`ckptstore.plugin.registry`."""
