"""The built-in metadata handlers and upload builder pass their conformance kits."""

from __future__ import annotations

import pytest

from ckptstore.builtin._copy_upload import CopyUpload
from ckptstore.builtin._json_catalog import JsonCatalog
from ckptstore.testing.conformance import (
    BuilderFactory,
    HandlerFactory,
    MetadataHandlerConformance,
    UploadBuilderConformance,
)


class TestJsonCatalog(MetadataHandlerConformance):
    @pytest.fixture
    def make_handler(self) -> HandlerFactory:
        return JsonCatalog


class TestCopyUpload(UploadBuilderConformance):
    @pytest.fixture
    def make_builder(self) -> BuilderFactory:
        return CopyUpload
