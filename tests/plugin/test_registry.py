"""The plugin registry: entry-point discovery, lookups, conflicts, disabling, reporters."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from ckpt_helpers import DBTypesPlugin, PathTypesPlugin, ReportRecorder, build_counter_job
from plugin_helpers import GOOD, installed

from ckptstore import (
    CheckpointManager,
    JobRunner,
    LocalSession,
    MultiNodeCheckpointManager,
)
from ckptstore.builtin import LocalPath, NpzDB
from ckptstore.errors import DuplicatePluginError, InvalidPluginError, UnknownPluginError
from ckptstore.plugin import PROJECT_NAME, hookimpl
from ckptstore.plugin._db_type import DBLocation, DBType, WrittenDB
from ckptstore.plugin._registry import BUILTIN_PLUGINS, Registry, get_registry, reset_registry
from ckptstore.records._stats import NodeStats

DIST = GOOD.package


@pytest.fixture
def test_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An installed distribution providing DB type ``testfmt`` through the ``ckptstore``
    entry-point group, exactly as a pip-installed plugin would (a dist-info directory
    with ``entry_points.txt``, on ``sys.path``)."""
    monkeypatch.delenv("CKPTSTORE_DISABLE_PLUGINS", raising=False)
    with installed(tmp_path / "site", GOOD) as site:
        yield site


def test_a_plugin_from_an_installed_distribution_is_found(
    test_distribution: Path, tmp_path: Path
) -> None:
    registry = reset_registry()
    db_type = registry.db_type("testfmt")
    assert type(db_type).__module__ == f"{DIST}.plugin"
    plugins = {info.name: info for info in registry.plugins()}
    assert plugins["testfmt"].distribution == "ckptstore-testfmt 1.2.3"
    assert plugins["testfmt"].db_types == ("testfmt",)
    # and it works end to end with no change in the core
    session = LocalSession()
    session.workspace("n")["w"] = np.arange(3.0)
    manager = CheckpointManager(str(tmp_path / "ckpt"), "n", "testfmt")
    session.run(manager.init(["n"]))
    session.run(manager.save(1))
    session.workspace("n")["w"] = np.zeros(3)
    session.run(manager.load(1))
    assert session.workspace("n")["w"].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("value", ["1", "all", "true", "yes", "*", "ALL"])
def test_disabling_all_entry_point_plugins(
    test_distribution: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("CKPTSTORE_DISABLE_PLUGINS", value)
    registry = reset_registry()
    assert "testfmt" not in registry.db_types
    assert {info.name for info in registry.plugins()} == set(BUILTIN_PLUGINS)
    with pytest.raises(UnknownPluginError):
        registry.db_type("testfmt")


def test_disabling_a_comma_list_of_plugins(
    test_distribution: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPTSTORE_DISABLE_PLUGINS", "something_else, testfmt")
    assert "testfmt" not in reset_registry().db_types
    monkeypatch.setenv("CKPTSTORE_DISABLE_PLUGINS", "something_else")
    assert "testfmt" in reset_registry().db_types


def test_the_builtins_are_ordinary_plugins(registry: Registry) -> None:
    assert PROJECT_NAME == "ckptstore"
    names = {info.name: info for info in registry.plugins()}
    assert set(BUILTIN_PLUGINS) <= set(names)
    assert names["ckptstore.formats._npz_db"].db_types == ("npz",)
    assert names["ckptstore.formats._zarr_db"].db_types == ("zarr",)
    assert names["ckptstore.builtin._json_catalog"].metadata_handlers == ("json",)
    assert names["ckptstore.builtin._copy_upload"].upload_builders == ("copy",)
    assert names["ckptstore.paths._local_path"].path_types == ("local (local paths, file, local)",)
    assert names["ckptstore.paths._fsspec_path"].path_types == ("fsspec (*)",)
    assert get_registry() is registry


def test_unknown_names_list_what_is_installed_and_which_package_provides_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CKPTSTORE_DISABLE_PLUGINS", "1")
    registry = reset_registry()
    with pytest.raises(UnknownPluginError) as info:
        registry.open_path("s3://bucket/run")
    message = str(info.value)
    assert "unknown path type 's3'" in message
    assert "`pip install ./plugins/ckptstore-s3`" in message
    assert (
        "installed: file://, local paths, local://, other URLs fsspec knows (memory://, "
        "ftp://...)." in message
    )
    assert isinstance(info.value, KeyError)
    with pytest.raises(UnknownPluginError, match=r"pip install \./plugins/ckptstore-gcs"):
        registry.path_type_for("gs://bucket/run")
    with pytest.raises(
        UnknownPluginError, match=r"pip install \./plugins/ckptstore-lmdb"
    ) as db_info:
        registry.db_type("lmdb")
    assert {"npz", "zarr"} <= set(db_info.value.installed)
    with pytest.raises(UnknownPluginError, match="see `ckptstore plugins`"):
        registry.metadata_handler("nosuchcatalog")
    with pytest.raises(UnknownPluginError, match="unknown path type 'nosuchproto'"):
        registry.path_type_for("nosuchproto://x")
    with pytest.raises(UnknownPluginError, match="unknown path type 'ftpx'"):
        registry.path_type_for("/tmp/x", path_type="ftpx")


def test_lookups_accept_names_and_instances(registry: Registry) -> None:
    instance = NpzDB()
    assert registry.db_type(instance) is instance
    assert isinstance(registry.db_type("npz"), NpzDB)
    with pytest.raises(InvalidPluginError, match="got int"):
        registry.db_type(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidPluginError, match=r"cp_accessible\); got object"):
        registry.metadata_handler(object())  # type: ignore[arg-type]
    assert registry.upload_builder(None) is None
    assert registry.path_type_for("memory://x").name == "fsspec"
    assert registry.path_type_for("/x", path_type="local") is LocalPath


class OtherNpz(NpzDB):
    name = "npz"


def test_two_plugins_claiming_one_name_fail_loudly(registry: Registry) -> None:
    with pytest.raises(DuplicatePluginError) as info:
        registry.register(DBTypesPlugin(OtherNpz), name="impostor")
    assert info.value.name == "npz"
    assert info.value.providers == ("ckptstore.formats._npz_db", "impostor")
    assert "CKPTSTORE_DISABLE_PLUGINS" in str(info.value)


def test_a_refused_plugin_leaves_the_registry_as_it_was(registry: Registry) -> None:
    with pytest.raises(DuplicatePluginError):
        registry.register(DBTypesPlugin(OtherNpz), name="impostor")
    assert "impostor" not in {info.name for info in registry.plugins()}
    assert registry.db_types["npz"] is NpzDB
    recorder = ReportRecorder()
    registry.register(recorder, name="recorder")  # the registry still works
    registry.report("checkpoint_save", {})
    assert recorder.actions() == ["checkpoint_save"]


def test_the_same_class_from_two_plugins_is_not_a_conflict(registry: Registry) -> None:
    registry.register(DBTypesPlugin(NpzDB), name="again")
    assert registry.db_types["npz"] is NpzDB


def test_two_path_types_claiming_one_protocol_fail_loudly(registry: Registry) -> None:
    class FileToo(LocalPath):
        name = "file_too"
        protocols: ClassVar[tuple[str, ...]] = ("file",)

    with pytest.raises(DuplicatePluginError, match="URL protocol 'file'"):
        registry.register(PathTypesPlugin(FileToo), name="file_too")


class NoName(DBType):
    def write(self, db: DBLocation, blobs: Mapping[str, np.ndarray]) -> WrittenDB:
        return WrittenDB({})


class EmptyName(NpzDB):
    name = ""


class NotADBType:
    name = "fake"


@pytest.mark.parametrize(
    ("provided", "message"),
    [
        ([NpzDB()], "must return subclasses of DBType"),
        (["npz"], "must return subclasses of DBType"),
        ([NotADBType], "must return subclasses of DBType"),
        ([NoName], "has no 'name'"),
        ([EmptyName], "has no 'name'"),
    ],
)
def test_invalid_plugins_are_rejected(
    registry: Registry, provided: list[Any], message: str
) -> None:
    class Bad:
        @hookimpl
        def ckptstore_db_types(self) -> list[Any]:
            return provided

    with pytest.raises(InvalidPluginError, match=message):
        registry.register(Bad(), name="bad")


class FailingReporter:
    @hookimpl
    def ckptstore_report(self, action_name: str, stats: Mapping[str, NodeStats]) -> None:
        raise RuntimeError("reporter is broken")


class StatsOnlyReporter:
    def __init__(self) -> None:
        self.seen: list[int] = []

    @hookimpl
    def ckptstore_report(self, stats: Mapping[str, NodeStats]) -> None:
        self.seen.append(len(stats))


def test_a_failing_reporter_does_not_break_checkpointing(
    registry: Registry, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry.register(FailingReporter(), name="failing")
    recorder, stats_only = ReportRecorder(), StatsOnlyReporter()
    registry.register(recorder, name="recorder")
    registry.register(stats_only, name="stats_only")
    job, _ = build_counter_job(epochs=2)
    runner = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), "npz"))
    assert runner.train(LocalSession()) == 2
    assert runner.committed_epochs == [0, 1, 2]
    assert runner.save_failures == []
    assert recorder.actions() == ["checkpoint_save"] * 3
    assert stats_only.seen == [1, 1, 1]
    assert "reporter plugin 'failing' failed" in caplog.text


def test_unregister_removes_what_a_plugin_provided(registry: Registry) -> None:
    class Extra(NpzDB):
        name = "extra"

    plugin = DBTypesPlugin(Extra)
    registry.register(plugin, name="extra")
    assert registry.db_types["extra"] is Extra
    registry.unregister(plugin)
    assert "extra" not in registry.db_types


def test_a_mistyped_plugin_name_gets_the_closest_installed_one() -> None:
    registry = get_registry()
    with pytest.raises(UnknownPluginError, match=r"'nzp' \(did you mean 'npz'\?\)") as info:
        registry.db_type("nzp")
    assert info.value.suggestion == "npz"
    with pytest.raises(UnknownPluginError) as far:
        registry.db_type("parquet")
    assert far.value.suggestion is None
    assert "did you mean" not in str(far.value)
    with pytest.raises(UnknownPluginError, match=r"did you mean 'json'\?"):
        registry.metadata_handler("jsno")
