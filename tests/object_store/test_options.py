"""Settings every object store shares: where they come from, the common rules (also
run by every plugin through the kit), credentials kept out of text."""

from __future__ import annotations

import pytest
from object_store_fakes import MemoryOptions, MemoryStorePath

from ckptstore.testing.object_store import OptionsConformance


class TestMemoryOptions(OptionsConformance):
    path_type = MemoryStorePath


def test_defaults_and_where_the_rest_comes_from() -> None:
    options = MemoryOptions.resolve(
        {"cache_size": 3, "retry_base_delay": 0.5, "retry_max_delay": 2}, {"MEMORY_TOKEN": "t0ken"}
    )
    assert options.retry.attempts == 8  # seven retries by default
    assert (options.retry.base_delay, options.retry.max_delay) == (0.5, 2.0)
    assert options.passthrough == {"cache_size": 3}
    assert options.token == "t0ken"
    assert options.endpoint == "memory"
    assert MemoryOptions.resolve({"endpoint_url": "http://x:1"}, {}).endpoint == "http://x:1"


@pytest.mark.parametrize(
    ("part_size", "max_concurrency", "buffer_bytes", "in_flight"),
    [(16, 16, 256, 15), (16, 4, 256, 4), (16, 16, 16, 1), (16, 16, 48, 2)],
)
def test_a_write_stream_keeps_within_its_buffer(
    part_size: int, max_concurrency: int, buffer_bytes: int, in_flight: int
) -> None:
    options = MemoryOptions(
        part_size=part_size, max_concurrency=max_concurrency, buffer_bytes=buffer_bytes
    )
    assert options.stream_parts_in_flight == in_flight


def test_credentials_are_masked() -> None:
    options = MemoryOptions.resolve({"token": "sekrit-token"}, {})
    assert options.mask("Bearer sekrit-token refused") == "Bearer *** refused"
