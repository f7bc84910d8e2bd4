"""pluggy markers for ckptstore hooks (project and entry-point group ``ckptstore``)."""

import pluggy

PROJECT_NAME = "ckptstore"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
