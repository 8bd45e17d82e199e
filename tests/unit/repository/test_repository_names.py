"""Model names and versions as they appear in URLs, configs and directory names."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorgate.errors import InvalidInput
from tensorgate.names import check_model_name, is_valid_model_name, parse_version

SPEC = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@pytest.mark.parametrize("name", ["a", "mlp", "resnet-50", "bert_base.v2", "a..b", "model..1", "9", "x" * 128])
def test_valid(name: str) -> None:
    assert is_valid_model_name(name)
    assert check_model_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "...",
        "..my_model",
        "../etc",
        "a/../b",
        "model/..",
        "/abs",
        "model/sub",
        " ..",
        "a\0b",
        "a b",
        "-x",
        "_x",
        "x" * 129,
        "é",
        "a\n",
        "a\\b",
    ],
)
def test_invalid(name: str) -> None:
    assert not is_valid_model_name(name)
    with pytest.raises(InvalidInput, match="invalid model name"):
        check_model_name(name)


@given(st.text(max_size=140))
def test_matches_the_documented_pattern(name: str) -> None:
    assert is_valid_model_name(name) == bool(SPEC.match(name) and name == name.rstrip("\n"))
    if is_valid_model_name(name):
        assert name not in (".", "..") and "/" not in name


@pytest.mark.parametrize(("text", "version"), [("1", 1), ("42", 42), ("999999999999999999", 999999999999999999)])
def test_versions(text: str, version: int) -> None:
    assert parse_version(text) == version


@pytest.mark.parametrize("text", ["0", "01", "-1", "+1", "1.0", "x", "", " 1", "1" * 19, "\u0661"])
def test_invalid_versions(text: str) -> None:
    with pytest.raises(InvalidInput, match="failed to get model version from specified version string"):
        parse_version(text)
