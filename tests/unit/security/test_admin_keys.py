"""Admin keys: the file's format, and what passes the check."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorgate.errors import ConfigError, Unauthenticated
from tensorgate.security.admin_keys import AdminKeys

KEY = "an-admin-key-of-some-length"


def test_a_key_from_the_file_passes_with_the_bearer_scheme(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# the operators' keys\n\n  {KEY}  \nanother-admin-key-123456\n")
    keys = AdminKeys.from_file(path)
    keys.check(f"Bearer {KEY}")
    keys.check("bearer another-admin-key-123456")
    for bad in (None, KEY, f"Basic {KEY}", f"Bearer {KEY}x", "Bearer ", f"Bearer {KEY[:-1]}"):
        with pytest.raises(Unauthenticated):
            keys.check(bad)


def test_the_file_holds_no_secret_in_memory(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(KEY + "\n")
    assert KEY not in repr(vars(AdminKeys.from_file(path)))


@pytest.mark.parametrize("text", ["", "# only a comment\n", "short\n"])
def test_a_file_without_a_usable_key_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(ConfigError, match="admin_keys_file"):
        AdminKeys.from_file(path)
