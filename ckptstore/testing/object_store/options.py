"""The rules every object store's options follow, whatever the store (no server).

Example::

    >>> import contextlib, io, pytest
    >>> kit = '''
    ... from ckptstore.testing.object_store import OptionsConformance
    ... from ckptstore_s3 import S3Path
    ...
    ... class TestS3Options(OptionsConformance):
    ...     path_type = S3Path  # MyStorePath
    ... '''
    >>> _ = open("test_s3_options_kit.py", "w").write(kit)
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
    ...     code = pytest.main(["-q", "test_s3_options_kit.py"])
    >>> int(code), out.getvalue().splitlines()[-1]
    (0, '3 passed...')
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from ckptstore.object_store import ObjectStorePath

__all__ = ["OptionsConformance"]


class OptionsConformance:
    """What every object store's options do: ``<ENV_PREFIX>_PART_SIZE``,
    ``_MAX_CONCURRENCY`` and ``_RETRIES`` apply unless keyword arguments say otherwise,
    unknown names are refused with the accepted ones, a write stream holds a part.

    Example::

        >>> import contextlib, io, pytest
        >>> kit = '''
        ... from ckptstore.testing.object_store import OptionsConformance
        ... from ckptstore_gcs import GCSPath
        ...
        ... class TestGCSOptions(OptionsConformance):
        ...     path_type = GCSPath
        ... '''
        >>> _ = open("test_gcs_options_kit.py", "w").write(kit)
        >>> with contextlib.redirect_stdout(io.StringIO()) as out:  # i.e. run pytest
        ...     code = pytest.main(["-q", "test_gcs_options_kit.py"])
        >>> int(code), out.getvalue().splitlines()[-1]
        (0, '3 passed...')
    """

    path_type: ClassVar[type[ObjectStorePath[Any, Any]]]

    def test_the_ckptstore_variables_yield_to_keyword_arguments(self) -> None:
        options_type = self.path_type.options_type
        prefix = options_type.ENV_PREFIX
        env = {
            f"{prefix}_PART_SIZE": str(8 << 20),
            f"{prefix}_MAX_CONCURRENCY": "3",
            f"{prefix}_RETRIES": "2",
        }
        found = options_type.resolve({}, env)
        assert (found.part_size, found.max_concurrency, found.retry.attempts) == (8 << 20, 3, 3)
        given = options_type.resolve(
            {"part_size": 6 << 20, "max_concurrency": 5, "retries": 0}, env
        )
        assert (given.part_size, given.max_concurrency, given.retry.attempts) == (6 << 20, 5, 1)

    def test_unknown_options_are_refused_with_the_accepted_list(self) -> None:
        options_type = self.path_type.options_type
        refused = rf"unknown {options_type.STORE} storage option\(s\) \['endpoint'\].*endpoint_url"
        with pytest.raises(TypeError, match=refused):
            options_type.resolve({"endpoint": "http://x:1"}, {})

    def test_a_write_stream_holds_at_least_one_part(self) -> None:
        with pytest.raises(ValueError, match="must hold at least one part"):
            self.path_type.options_type.resolve(
                {"part_size": 64 << 20, "buffer_bytes": 32 << 20}, {}
            )
