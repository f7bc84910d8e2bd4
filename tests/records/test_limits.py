"""Limits: validation and the CKPTSTORE_LIMIT_* environment variables."""

from __future__ import annotations

import pytest

from ckptstore.errors import EnvironmentVariableError, JobConfigurationError
from ckptstore.records import Limits


@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_a_limit_that_is_not_a_positive_integer_is_refused_with_its_variable(
    value: object,
) -> None:
    with pytest.raises(JobConfigurationError, match="CKPTSTORE_LIMIT_MAX_BLOBS") as caught:
        Limits(max_blobs=value)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert "max_blobs" in str(caught.value)


def test_the_environment_sets_a_limit_and_an_empty_variable_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CKPTSTORE_LIMIT_MAX_BLOBS", "1_000")
    monkeypatch.setenv("CKPTSTORE_LIMIT_MAX_NDIM", "")
    limits = Limits().with_environment()
    assert limits.max_blobs == 1000
    assert limits.max_ndim == Limits().max_ndim


def test_a_variable_that_is_not_a_number_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTSTORE_LIMIT_MAX_BLOBS", "lots")
    with pytest.raises(EnvironmentVariableError, match="CKPTSTORE_LIMIT_MAX_BLOBS"):
        Limits().with_environment()
