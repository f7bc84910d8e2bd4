"""Installed plugin distributions for tests, good and broken, laid out as pip leaves
them: the package, and a ``*.dist-info`` directory with ``METADATA`` and an
``entry_points.txt`` declaring the ``ckptstore`` entry point. Put the site directory on
``sys.path`` (or ``PYTHONPATH`` of a subprocess) and ckptstore finds them."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Distribution:
    """One plugin distribution: ``package/plugin.py`` holds ``source``, registered as
    entry point ``entry_point`` of the ``ckptstore`` group."""

    name: str
    package: str
    entry_point: str
    source: str
    version: str = "0.1"

    @property
    def label(self) -> str:
        """How ckptstore names it: ``"<distribution> <version>"``."""
        return f"{self.name} {self.version}"

    def install(self, site: Path) -> None:
        package = site / self.package
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "plugin.py").write_text(textwrap.dedent(self.source))
        info = site / f"{self.package}-{self.version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {self.name}\nVersion: {self.version}\n"
        )
        (info / "entry_points.txt").write_text(
            f"[ckptstore]\n{self.entry_point} = {self.package}.plugin\n"
        )
        (info / "RECORD").write_text("")


GOOD = Distribution(
    "ckptstore-testfmt",
    "ckptstore_testfmt",
    "testfmt",
    """
    from ckptstore.builtin import NpzDB
    from ckptstore.plugin import hookimpl


    class TestFormat(NpzDB):
        name = "testfmt"


    @hookimpl
    def ckptstore_db_types():
        return [TestFormat]
    """,
    version="1.2.3",
)
"""A working plugin: DB type ``testfmt``."""

MISSING_IMPORT = Distribution(
    "ckptstore-missingdep",
    "ckptstore_missingdep",
    "missingdep",
    """
    import ckptstore_no_such_dependency

    from ckptstore.builtin import NpzDB
    from ckptstore.plugin import hookimpl


    class MissingFormat(NpzDB):
        name = "missingfmt"


    @hookimpl
    def ckptstore_db_types():
        return [MissingFormat]
    """,
)
"""Fails to import: its dependency is not installed."""

MISTYPED_HOOK = Distribution(
    "ckptstore-typo",
    "ckptstore_typo",
    "typo",
    """
    from ckptstore.builtin import NpzDB
    from ckptstore.plugin import hookimpl


    class TypoFormat(NpzDB):
        name = "typofmt"


    @hookimpl
    def ckptstore_db_type():  # the hook is ckptstore_db_types
        return [TypoFormat]
    """,
)
"""Fails validation: a hook name pluggy does not know."""

WRONG_ARGUMENT = Distribution(
    "ckptstore-wrongarg",
    "ckptstore_wrongarg",
    "wrongarg",
    """
    from ckptstore.plugin import hookimpl


    @hookimpl
    def ckptstore_report(action, stats):  # the argument is action_name
        print(action, len(stats))
    """,
)
"""Fails validation: a hook argument the hook does not have."""

RAISING_HOOK = Distribution(
    "ckptstore-raising",
    "ckptstore_raising",
    "raising",
    """
    from ckptstore.builtin import LocalPath
    from ckptstore.plugin import hookimpl


    class RaisingPath(LocalPath):
        name = "raisingpath"
        protocols = ("raising",)


    @hookimpl
    def ckptstore_path_types():
        return [RaisingPath]


    @hookimpl
    def ckptstore_db_types():
        raise RuntimeError("the raising plugin's DB types are not configured")
    """,
)
"""Imports and validates, but its ``ckptstore_db_types`` raises when called (after
``ckptstore_path_types`` declared URL protocol ``raising://``)."""

INVALID_RETURN = Distribution(
    "ckptstore-instance",
    "ckptstore_instance",
    "instance",
    """
    from ckptstore.builtin import NpzDB
    from ckptstore.plugin import hookimpl


    class InstanceFormat(NpzDB):
        name = "instancefmt"


    @hookimpl
    def ckptstore_db_types():
        return [InstanceFormat()]  # the hook returns classes
    """,
)
"""Its hook answers, with an instance where a class belongs."""

BROKEN = (MISSING_IMPORT, MISTYPED_HOOK, WRONG_ARGUMENT, RAISING_HOOK, INVALID_RETURN)
"""One distribution per way a plugin breaks."""


def install(site: Path, *distributions: Distribution) -> Path:
    """Install ``distributions`` into the directory ``site`` (created); returns it."""
    site.mkdir(parents=True, exist_ok=True)
    for distribution in distributions:
        distribution.install(site)
    return site


@contextmanager
def installed(site: Path, *distributions: Distribution) -> Iterator[Path]:
    """Install ``distributions`` into ``site`` and put it first on ``sys.path`` for the
    ``with`` block; afterwards take it off and forget the modules imported from it."""
    install(site, *distributions)
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        yield site
    finally:
        sys.path.remove(str(site))
        packages = {distribution.package for distribution in distributions}
        for name in [name for name in sys.modules if name.split(".")[0] in packages]:
            del sys.modules[name]
        importlib.invalidate_caches()
