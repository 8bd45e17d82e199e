"""Admin keys: the file's format, and what passes the lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorgate.errors import ConfigError
from tensorgate.security.admin_keys import ADMIN, read_admin_keys

KEY = "an-admin-key-of-some-length"


def test_a_key_from_the_file_is_the_admin_identity(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# the operators' keys\n\n  {KEY}  \nanother-admin-key-123456\n")
    keys = read_admin_keys(path)
    assert keys.lookup(KEY) is ADMIN
    assert keys.lookup("another-admin-key-123456") is ADMIN
    for bad in ("", f"{KEY}x", KEY[:-1], f"Bearer {KEY}"):
        assert keys.lookup(bad) is None


def test_the_file_holds_no_secret_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(KEY + "\n")
    assert KEY not in repr(vars(read_admin_keys(path)))


@pytest.mark.parametrize("text", ["", "# only a comment\n", "short\n"])
def test_a_file_without_a_usable_key_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(ConfigError, match="admin_keys_file"):
        read_admin_keys(path)
