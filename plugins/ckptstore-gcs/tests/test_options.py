"""Where GCS settings come from (keyword arguments, then environment variables, then
defaults) and that credentials never show in ``repr`` or messages."""

from __future__ import annotations

import pickle
import sys

import pytest
from ckptstore_gcs import GCSOptions, GCSPath

from ckptstore.testing import imported_modules

SERVICE_ACCOUNT = {
    "type": "service_account",
    "client_email": "ckpt@example.iam.gserviceaccount.com",
    "private_key_id": "0123456789abcdef0123456789abcdef01234567",
    "private_key": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END",
}


def test_an_emulator_from_the_environment_unless_told_otherwise() -> None:
    env = {"STORAGE_EMULATOR_HOST": "127.0.0.1:9023", "GOOGLE_CLOUD_PROJECT": "env-project"}
    from_env = GCSOptions.resolve({}, env)
    assert from_env.endpoint_url == "http://127.0.0.1:9023"
    assert from_env.token == "anon"  # emulators take no credentials
    assert from_env.project == "env-project"
    given = GCSOptions.resolve(
        {"endpoint_url": "http://given:1/", "project": "p", "token": "cloud"}, env
    )
    assert (given.endpoint_url, given.project, given.token) == ("http://given:1", "p", "cloud")


def test_real_gcs_by_default() -> None:
    options = GCSOptions.resolve({}, {})
    assert options.endpoint_url == "https://storage.googleapis.com"
    assert options.token is None
    assert "endpoint_url" not in options.gcsfs_kwargs()


def test_parts_of_less_than_256_kib_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 256 KiB"):
        GCSOptions.resolve({"part_size": 1024}, {})


def test_credentials_stay_out_of_repr_and_messages() -> None:
    options = GCSOptions.resolve({"token": SERVICE_ACCOUNT}, {})
    assert "credentials=explicit" in repr(options)
    assert SERVICE_ACCOUNT["private_key"] not in repr(options)
    text = f"key {SERVICE_ACCOUNT['private_key_id']} failed"
    assert options.mask(text) == "key *** failed"
    bearer = GCSOptions.resolve({"token": "ya29.a0AfH6SMBexampleAccessToken"}, {})
    assert bearer.mask("Bearer ya29.a0AfH6SMBexampleAccessToken") == "Bearer ***"


def test_path_repr_and_pickle() -> None:
    storage = GCSPath("gs://bucket/run", endpoint_url="http://127.0.0.1:9", token="anon")
    assert repr(storage) == "GCSPath('gs://bucket/run', endpoint_url='http://127.0.0.1:9')"
    clone = pickle.loads(pickle.dumps(storage))
    assert (clone.bucket, clone.prefix, clone.options.endpoint_url) == (
        "bucket",
        "run",
        "http://127.0.0.1:9",
    )


def test_registering_the_plugin_imports_neither_gcsfs_nor_aiohttp() -> None:
    """gcsfs and aiohttp take 0.2-0.3 s each to import: a process that builds
    ckptstore's plugin registry (every CLI command, every first save) pays it only when
    it opens a gs:// path."""
    probe = (
        "import ckptstore, ckptstore_gcs.plugin\n"
        "assert ckptstore.plugin.get_registry().path_type_for('gs://bucket/run').name == 'gcs'\n"
    )
    assert imported_modules(probe, ["aiohttp", "gcsfs"]) == []
    GCSPath("gs://bucket/run", endpoint_url="http://127.0.0.1:1", token="anon")
    assert "gcsfs" in sys.modules  # opened when a path is made
