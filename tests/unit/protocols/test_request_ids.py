"""Client request ids: echoed when short and plain, replaced otherwise."""

from __future__ import annotations

import pytest

from tensorgate.protocols.request_ids import MAX_REQUEST_ID_CHARS, client_request_id


@pytest.mark.parametrize(
    "value", ["abc-123", "0f8c2e1a-9b7d-4c3e-8a61-2f5d9e0b7c44", "a" * MAX_REQUEST_ID_CHARS, "x:y/z=1"]
)
def test_plain_ids_are_kept(value: str) -> None:
    assert client_request_id(value) == value


@pytest.mark.parametrize(
    "value", [None, "", "a" * (MAX_REQUEST_ID_CHARS + 1), "two words", "tab\there", "nul\x00", "caf\u00e9", "\x7f"]
)
def test_anything_else_is_replaced(value: str | None) -> None:
    assert client_request_id(value) is None
