"""An installed plugin that fails to import, validate or answer a hook is left out alone:
one WARNING, listed as broken, a typed error for what only it could provide, and
everything else works. Each case is a real distribution found through its entry point
(``plugin_helpers``)."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from plugin_helpers import (
    BROKEN,
    GOOD,
    INVALID_RETURN,
    MISSING_IMPORT,
    MISTYPED_HOOK,
    RAISING_HOOK,
    WRONG_ARGUMENT,
    Distribution,
    installed,
)

from ckptstore import CheckpointManager, LocalSession
from ckptstore.errors import BrokenPluginError, PluginError, UnknownPluginError
from ckptstore.plugin import _loading, hookimpl
from ckptstore.plugin._registry import Registry, reset_registry

ERRORS = {
    MISSING_IMPORT: "ModuleNotFoundError: No module named 'ckptstore_no_such_dependency'",
    MISTYPED_HOOK: "PluginValidationError: unknown hook 'ckptstore_db_type' in plugin",
    WRONG_ARGUMENT: "Argument(s) {'action'} are declared in the hookimpl but can not be found",
    RAISING_HOOK: "RuntimeError: the raising plugin's DB types are not configured",
    INVALID_RETURN: "InvalidPluginError: plugin 'instance' returned InstanceFormat() from "
    "ckptstore_db_types; it must return subclasses of DBType",
}
"""What each broken distribution's error says (on one line)."""


@pytest.fixture
def site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[Path]:
    """``GOOD`` and the distributions the test is parametrized with (all of ``BROKEN``
    by default) installed on ``sys.path``, in a process that has warned about none."""
    distributions: tuple[Distribution, ...] = getattr(request, "param", BROKEN)
    monkeypatch.delenv("CKPTSTORE_DISABLE_PLUGINS", raising=False)
    monkeypatch.setattr(_loading, "_warned", set())
    with installed(tmp_path / "site", GOOD, *distributions) as path:
        yield path


def warnings_about(caplog: pytest.LogCaptureFixture, distribution: Distribution) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and distribution.label in record.getMessage()
    ]


@pytest.mark.parametrize(
    "site", [(broken,) for broken in BROKEN], indirect=True, ids=lambda p: p[0].entry_point
)
def test_each_broken_plugin_is_left_out_alone_with_one_warning(
    site: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (broken,) = [d for d in BROKEN if (site / d.package).is_dir()]
    with caplog.at_level(logging.WARNING):
        registry = reset_registry()
    assert [(b.name, b.distribution) for b in registry.broken_plugins] == [
        (broken.entry_point, broken.label)
    ]
    assert ERRORS[broken] in registry.broken_plugins[0].error
    assert "\n" not in registry.broken_plugins[0].error
    (warning,) = warnings_about(caplog, broken)
    assert f"ckptstore plugin {broken.entry_point!r} from {broken.label} is broken" in warning
    assert ERRORS[broken] in warning
    assert f"CKPTSTORE_DISABLE_PLUGINS={broken.entry_point}" in warning
    # everything else works, the other installed plugin included
    assert type(registry.db_type("testfmt")).__module__ == f"{GOOD.package}.plugin"
    assert {"npz", "zarr", "testfmt"} <= set(registry.db_types)
    infos = {info.name: info for info in registry.plugins()}
    assert infos[broken.entry_point].error == registry.broken_plugins[0].error
    assert infos[broken.entry_point].distribution == broken.label
    assert infos[GOOD.entry_point].error is None
    assert infos[GOOD.entry_point].db_types == ("testfmt",)
    assert broken.entry_point not in {
        registry.plugin_manager.get_name(p) for p in registry.plugin_manager.get_plugins()
    }


def test_the_warning_is_logged_once_per_process(
    site: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert len(reset_registry().broken_plugins) == len(BROKEN)
    for broken in BROKEN:
        assert len(warnings_about(caplog, broken)) == 1, broken


def test_saves_and_loads_work_beside_broken_plugins(site: Path, tmp_path: Path) -> None:
    reset_registry()
    for db_type in ("npz", "testfmt"):
        session = LocalSession()
        session.workspace("n")["w"] = np.arange(3.0)
        manager = CheckpointManager(str(tmp_path / db_type), "n", db_type)
        session.run(manager.init(["n"]))
        session.run(manager.save(1))
        session.workspace("n")["w"] = np.zeros(3)
        session.run(manager.load(1))
        assert session.workspace("n")["w"].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("site", [(RAISING_HOOK,)], indirect=True)
def test_what_a_broken_plugin_declared_raises_a_typed_error_naming_it(site: Path) -> None:
    registry = reset_registry()
    for ask in (
        lambda: registry.open_path("raising://bucket/run"),
        lambda: registry.path_type_for("/tmp/run", path_type="raisingpath"),
    ):
        with pytest.raises(BrokenPluginError) as info:
            ask()
        error = info.value
        assert isinstance(error, UnknownPluginError)
        assert isinstance(error, PluginError)
        assert isinstance(error, KeyError)
        assert error.declared is True
        assert error.broken == (
            (RAISING_HOOK.entry_point, RAISING_HOOK.label, ERRORS[RAISING_HOOK]),
        )
        message = str(error)
        assert "comes from a broken plugin that was left out: plugin 'raising'" in message
        assert RAISING_HOOK.label in message
        assert ERRORS[RAISING_HOOK] in message
        assert "CKPTSTORE_DISABLE_PLUGINS=raising" in message
    # its DB types hook failed: an unknown DB type may have been its
    with pytest.raises(BrokenPluginError, match=r"unknown db type 'raisingfmt'.*may come") as db:
        registry.db_type("raisingfmt")
    assert db.value.declared is False
    # it did answer the other hooks: an unknown catalog is not its
    with pytest.raises(UnknownPluginError) as catalog:
        registry.metadata_handler("nosuchcatalog")
    assert type(catalog.value) is UnknownPluginError


@pytest.mark.parametrize("site", [(MISSING_IMPORT,)], indirect=True)
def test_a_name_nobody_provides_names_the_plugins_that_failed_before_declaring(
    site: Path,
) -> None:
    registry = reset_registry()
    with pytest.raises(BrokenPluginError) as info:
        registry.db_type("missingfmt")
    error = info.value
    assert error.declared is False
    assert (error.kind, error.name) == ("db type", "missingfmt")
    assert {"npz", "zarr", "testfmt"} <= set(error.installed)
    message = str(error)
    assert message.startswith("unknown db type 'missingfmt'; installed: ")
    assert "may come from a broken plugin that was left out: plugin 'missingdep'" in message
    assert ERRORS[MISSING_IMPORT] in message
    assert "CKPTSTORE_DISABLE_PLUGINS=missingdep" in message
    # a URL fsspec serves still goes to fsspec
    assert registry.path_type_for("memory://run").name == "fsspec"


@pytest.mark.parametrize("site", [(MISSING_IMPORT,)], indirect=True)
def test_the_install_hint_for_a_well_known_name_stays(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPTSTORE_DISABLE_PLUGINS", "s3")
    with pytest.raises(BrokenPluginError) as info:
        reset_registry().open_path("s3://bucket/run")
    assert "plugin 'missingdep'" in str(info.value)
    assert str(info.value).endswith(
        "otherwise, to use 's3', install the S3 plugin from a ckptstore checkout: "
        "`pip install ./plugins/ckptstore-s3`."
    )


def test_disabled_broken_plugins_are_neither_loaded_nor_warned_about(
    site: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    names = ",".join(broken.entry_point for broken in BROKEN)
    monkeypatch.setenv("CKPTSTORE_DISABLE_PLUGINS", names)
    with caplog.at_level(logging.WARNING):
        registry = reset_registry()
    assert registry.broken_plugins == ()
    assert caplog.records == []
    assert "testfmt" in registry.db_types
    with pytest.raises(UnknownPluginError) as info:
        registry.db_type("missingfmt")
    assert type(info.value) is UnknownPluginError


class RaisingInProcess:
    @hookimpl
    def ckptstore_db_types(self) -> list[type]:
        raise RuntimeError("not configured")


def test_a_plugin_registered_in_process_whose_hook_raises_is_refused(
    registry: Registry,
) -> None:
    before = dict(registry.db_types)
    with pytest.raises(RuntimeError, match="not configured"):
        registry.register(RaisingInProcess(), name="raising_in_process")
    assert dict(registry.db_types) == before
    assert registry.broken_plugins == ()
    assert "raising_in_process" not in {info.name for info in registry.plugins()}


def test_broken_plugin_errors_survive_pickling() -> None:
    error = BrokenPluginError(
        "db type", "fast", ["npz"], [("fast", "ckptstore-fast 0.1", "E: x")], declared=False
    )
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.kind, copy.name, copy.installed, copy.broken, copy.declared) == (
        "db type",
        "fast",
        ("npz",),
        (("fast", "ckptstore-fast 0.1", "E: x"),),
        False,
    )
    assert str(copy) == str(error)
