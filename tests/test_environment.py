"""CKPTSTORE_* environment variables: an unusable value names the variable and the fix,
wherever it is read (I/O settings, object-store options, local durability)."""

from __future__ import annotations

import pytest

from ckptstore._environment import choice_variable, int_variable
from ckptstore.errors import EnvironmentVariableError
from ckptstore.io._settings import IOSettings
from ckptstore.paths._local_path import LocalPath


def test_integers_and_choices() -> None:
    env = {"A": "8_388_608", "B": "", "C": "fsync"}
    assert int_variable(env, "A") == 8 << 20
    assert int_variable(env, "B") is None
    assert int_variable(env, "MISSING") is None
    assert choice_variable(env, "C", ("fsync", "none")) == "fsync"
    assert choice_variable(env, "B", ("fsync",)) is None


def test_an_unusable_value_names_the_variable_and_the_fix() -> None:
    with pytest.raises(EnvironmentVariableError) as info:
        int_variable({"CKPTSTORE_X": "4k"}, "CKPTSTORE_X")
    assert "CKPTSTORE_X='4k'" in str(info.value)
    assert "unset CKPTSTORE_X" in str(info.value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(EnvironmentVariableError, match="one of fsync, none"):
        choice_variable({"D": "fast"}, "D", ("none", "fsync"))


@pytest.mark.parametrize(
    "variable",
    ["CKPTSTORE_IO_CHUNK_BYTES", "CKPTSTORE_IO_CONCURRENCY", "CKPTSTORE_IO_MEMORY_BUDGET"],
)
def test_io_settings_name_the_variable(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(variable, "lots")
    with pytest.raises(EnvironmentVariableError, match=variable):
        IOSettings().with_environment()


def test_io_settings_still_read_good_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTSTORE_IO_CONCURRENCY", "9")
    assert IOSettings().with_environment().concurrency == 9


def test_local_durability_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("CKPTSTORE_DURABILITY", "sometimes")
    with pytest.raises(EnvironmentVariableError, match="CKPTSTORE_DURABILITY='sometimes'"):
        LocalPath(str(tmp_path))
    monkeypatch.setenv("CKPTSTORE_DURABILITY", "none")
    assert LocalPath(str(tmp_path)).durability == "none"


@pytest.mark.parametrize("suffix", ["RETRIES", "PART_SIZE", "MAX_CONCURRENCY"])
def test_object_store_options_name_the_variable(suffix: str) -> None:
    from ckptstore_s3 import S3Options

    variable = f"CKPTSTORE_S3_{suffix}"
    with pytest.raises(EnvironmentVariableError, match=variable):
        S3Options.resolve({}, {variable: "many"})
    assert S3Options.resolve({}, {"CKPTSTORE_S3_RETRIES": "2"}).retry.attempts == 3
