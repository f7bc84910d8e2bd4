"""Credential values are masked in any text, the longest first; very short values are
left alone."""

from __future__ import annotations

from ckptstore.object_store._masking import credential_values, mask, url_secrets


def test_every_credential_value_is_masked_longest_first() -> None:
    text = "signed with abcd-long-secret by abcd (abcd)"
    assert mask(text, ["abcd", "abcd-long-secret"]) == "signed with *** by *** (***)"


def test_values_shorter_than_four_characters_are_left_alone() -> None:
    assert mask("user abc said abc", ["abc"]) == "user abc said abc"
    assert mask("nothing to hide", []) == "nothing to hide"


def test_credential_values_are_found_by_name_at_any_depth() -> None:
    options = {
        "secret": "s3cr3t-value",
        "part_size": 8 << 20,
        "anon": False,
        "client_kwargs": {"aws_session_token": "t0ken-value", "region_name": "eu-west-1"},
        "config_kwargs": {"retries": {"api_key": ["k3y-1", "k3y-2"]}},
        "password": 12345678,
    }
    assert sorted(credential_values(options)) == sorted(
        ["s3cr3t-value", "t0ken-value", "k3y-1", "k3y-2", "12345678"]
    )
    assert credential_values({"bogus": "hidden-too"}, also=["bogus"]) == ["hidden-too"]
    assert credential_values({"token": None, "session": True}) == []


def test_an_escaped_value_is_masked_as_repr_shows_it() -> None:
    value = "back\\slash-secret"
    message = f"refused {value!r}"
    assert value not in mask(message, credential_values({"secret": value}))
    assert "slash-secret" not in mask(message, credential_values({"secret": value}))


def test_url_credentials() -> None:
    assert url_secrets("s3://bucket/run") == []
    assert url_secrets("ftp://me:hunter22@host/x?sig=abcdef&x=1") == ["hunter22", "abcdef"]
    assert url_secrets("http://[broken") == []
