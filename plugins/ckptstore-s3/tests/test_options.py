"""Where S3 settings come from (keyword arguments, then environment variables, then
defaults) and that credentials never show in ``repr``."""

from __future__ import annotations

import pickle

import pytest
from ckptstore_s3 import S3Options, S3Path

from ckptstore.testing import imported_modules

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
KEY_ID = "AKIAIOSFODNN7EXAMPLE"


def test_keyword_arguments_win_over_the_aws_variables() -> None:
    env = {
        "AWS_ENDPOINT_URL_S3": "http://from-env-s3:1",
        "AWS_ENDPOINT_URL": "http://from-env:1",
        "AWS_REGION": "eu-west-1",
        "AWS_PROFILE": "envprofile",
    }
    from_env = S3Options.resolve({}, env)
    assert from_env.endpoint_url == "http://from-env-s3:1"
    assert (from_env.region, from_env.profile) == ("eu-west-1", "envprofile")
    given = S3Options.resolve(
        {"endpoint_url": "http://given:2", "region": "us-west-2", "profile": "mine"}, env
    )
    assert given.endpoint_url == "http://given:2"
    assert (given.region, given.profile) == ("us-west-2", "mine")


def test_generic_endpoint_variable_and_s3fs_style_names() -> None:
    options = S3Options.resolve(
        {
            "client_kwargs": {"endpoint_url": "http://via-client-kwargs:3", "region_name": "r1"},
            "aws_access_key_id": KEY_ID,
            "aws_secret_access_key": SECRET,
        },
        {"AWS_ENDPOINT_URL": "http://generic:1", "AWS_DEFAULT_REGION": "r0"},
    )
    assert options.endpoint_url == "http://via-client-kwargs:3"
    assert options.region == "r1"
    assert (options.key, options.secret) == (KEY_ID, SECRET)
    assert S3Options.resolve({}, {"AWS_ENDPOINT_URL": "http://generic:1"}).endpoint_url == (
        "http://generic:1"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"part_size": 1 << 20}, "part_size must be between 5 MiB and 5 GiB"),
        ({"max_concurrency": 0}, "at least 1"),
        ({"part_size": 64 << 20, "buffer_bytes": 32 << 20}, "must hold at least one part"),
        ({"retries": -1}, "attempts must be at least 1"),
    ],
)
def test_bad_values_say_what_is_allowed(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        S3Options.resolve(options, {})


def test_credentials_stay_out_of_repr_and_messages() -> None:
    options = S3Options.resolve(
        {"key": KEY_ID, "secret": SECRET, "token": "FwoGZXIvYXdzEXAMPLETOKEN"}, {}
    )
    text = repr(options)
    assert "credentials=explicit" in text
    for value in (KEY_ID, SECRET, "FwoGZXIvYXdzEXAMPLETOKEN"):
        assert value not in text
    assert options.mask(f"signed with {SECRET} by {KEY_ID}") == "signed with *** by ***"
    from_env = S3Options.resolve({}, {"AWS_SECRET_ACCESS_KEY": SECRET})
    assert from_env.mask(f"x{SECRET}x") == "x***x"


def test_path_repr_and_pickle_keep_options_but_show_no_secret() -> None:
    storage = S3Path(
        "s3://bucket/run", endpoint_url="http://127.0.0.1:9", key=KEY_ID, secret=SECRET
    )
    assert repr(storage) == "S3Path('s3://bucket/run', endpoint_url='http://127.0.0.1:9')"
    assert SECRET not in repr(storage.options)
    assert KEY_ID not in repr(storage.options)
    clone = pickle.loads(pickle.dumps(storage))
    assert isinstance(clone, S3Path)
    assert (clone.bucket, clone.prefix, clone.options.secret) == ("bucket", "run", SECRET)


def test_a_url_must_name_a_bucket() -> None:
    with pytest.raises(ValueError, match="names a bucket"):
        S3Path("s3://", endpoint_url="http://127.0.0.1:9")


def test_registering_the_plugin_imports_no_http_client() -> None:
    """aiohttp and botocore take 0.2-0.3 s to import: a process that builds ckptstore's
    plugin registry (every CLI command, every first save) pays it only when it opens an
    s3:// path (s3fs brings them) or judges a failed request."""
    probe = (
        "import ckptstore, ckptstore_s3.plugin\n"
        "assert ckptstore.plugin.get_registry().path_type_for('s3://bucket/run').name == 's3'\n"
    )
    assert imported_modules(probe, ["aiohttp", "botocore", "s3fs"]) == []
