"""IOSettings: validation, overrides and the CKPTSTORE_IO_* environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ckptstore import IOSettings
from ckptstore.builtin import LocalPath
from ckptstore.errors import JobConfigurationError


def test_defaults() -> None:
    settings = IOSettings()
    assert settings.chunk_bytes == 16 << 20
    assert settings.concurrency == 4
    assert settings.memory_budget == 256 << 20
    assert settings.verify is True


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"chunk_bytes": 4095}, "chunk_bytes"),
        ({"concurrency": 0}, "concurrency"),
        ({"chunk_bytes": 1 << 20, "memory_budget": (1 << 20) - 1}, "memory_budget"),
    ],
)
def test_invalid_settings_are_refused(arguments: dict[str, Any], message: str) -> None:
    """In the library's hierarchy, and still the matching built-in."""
    with pytest.raises(JobConfigurationError, match=message) as caught:
        IOSettings(**arguments)
    assert isinstance(caught.value, ValueError)


def test_a_budget_under_the_local_chunk_names_both_ways_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Local disk moves 32 MiB chunks: a budget lowered under that through the
    environment is refused with the variables that fix it."""
    monkeypatch.setenv("CKPTSTORE_IO_MEMORY_BUDGET", str(16 << 20))
    with pytest.raises(JobConfigurationError, match="CKPTSTORE_IO_MEMORY_BUDGET") as caught:
        LocalPath(str(tmp_path)).default_io.with_environment()
    assert "CKPTSTORE_IO_CHUNK_BYTES" in str(caught.value)
    monkeypatch.setenv("CKPTSTORE_IO_CHUNK_BYTES", str(16 << 20))
    settings = LocalPath(str(tmp_path)).default_io.with_environment()
    assert (settings.chunk_bytes, settings.memory_budget) == (16 << 20, 16 << 20)


def test_merged_applies_only_given_values() -> None:
    merged = IOSettings().merged(concurrency=9, chunk_bytes=None, verify=False)
    assert merged == IOSettings(concurrency=9, verify=False)


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTSTORE_IO_CHUNK_BYTES", "65536")
    monkeypatch.setenv("CKPTSTORE_IO_CONCURRENCY", "2")
    monkeypatch.setenv("CKPTSTORE_IO_MEMORY_BUDGET", "131072")
    monkeypatch.setenv("CKPTSTORE_IO_VERIFY", "off")
    settings = IOSettings(concurrency=8).with_environment()
    assert settings == IOSettings(
        chunk_bytes=65536, concurrency=2, memory_budget=131072, verify=False
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0", False), ("false", False), ("No", False), ("OFF", False), ("1", True), ("yes", True)],
)
def test_verify_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: bool
) -> None:
    monkeypatch.setenv("CKPTSTORE_IO_VERIFY", value)
    assert IOSettings(verify=not expected).with_environment().verify is expected


def test_unset_or_empty_environment_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CHUNK_BYTES", "CONCURRENCY", "MEMORY_BUDGET", "VERIFY"):
        monkeypatch.setenv(f"CKPTSTORE_IO_{name}", "")
    settings = IOSettings(concurrency=3)
    assert settings.with_environment() == settings


def test_environment_values_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTSTORE_IO_CONCURRENCY", "0")
    with pytest.raises(ValueError, match="concurrency"):
        IOSettings().with_environment()
    monkeypatch.setenv("CKPTSTORE_IO_CONCURRENCY", "many")
    with pytest.raises(ValueError, match="many"):
        IOSettings().with_environment()
