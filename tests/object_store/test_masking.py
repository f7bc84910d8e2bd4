"""Credential values are masked in any text, the longest first; very short values are
left alone."""

from __future__ import annotations

from ckptstore.object_store._masking import mask


def test_every_credential_value_is_masked_longest_first() -> None:
    text = "signed with abcd-long-secret by abcd (abcd)"
    assert mask(text, ["abcd", "abcd-long-secret"]) == "signed with *** by *** (***)"


def test_values_shorter_than_four_characters_are_left_alone() -> None:
    assert mask("user abc said abc", ["abc"]) == "user abc said abc"
    assert mask("nothing to hide", []) == "nothing to hide"
