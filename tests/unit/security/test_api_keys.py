"""The API keys file: its format, its errors (naming the line), and reloading without a restart."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tls_material import key_line

from tensorgate.clock import ManualClock
from tensorgate.errors import ConfigError
from tensorgate.security.api_keys import RECHECK_S, ApiKeysFile, parse_api_keys
from tensorgate.security.identity import Limits

KEY_A, KEY_B = "key-of-team-a-0123456789", "key-of-team-b-0123456789"


def test_a_line_gives_a_name_roles_models_and_limits() -> None:
    text = "\n".join(
        [
            "# comment",
            key_line(KEY_A, "team-a", "infer", "resnet,bert", "rate=5", "burst=10", "inflight=2"),
            key_line(KEY_B, "ops", "admin,metrics", "*") + "  # trailing comment",
            "",
        ]
    )
    table = parse_api_keys(text, "keys", defaults=Limits(requests_per_s=100, max_inflight=50))
    a, b = table.lookup(KEY_A), table.lookup(KEY_B)
    assert a is not None and b is not None
    assert (a.name, a.roles, a.models) == ("team-a", {"infer"}, {"resnet", "bert"})
    assert a.limits == Limits(5.0, 10, 2)
    assert (b.name, b.roles, b.models) == ("ops", {"admin", "metrics"}, None)
    assert b.limits == Limits(100.0, None, 50)  # the config's defaults where the line sets none
    assert table.lookup("key-of-team-a-012345678") is None
    assert table.lookup(KEY_A.upper()) is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (f"{KEY_A} team-a infer", "SHA-256 as 64 hex digits"),  # the key itself, not its hash
        (key_line(KEY_A, "team-a", "root"), "roles must be among"),
        (key_line(KEY_A, "team!", "infer"), "the name must be"),
        (key_line(KEY_A, "team-a", "infer", "../etc"), "models must be"),
        (key_line(KEY_A, "team-a", "infer", "*", "rate=fast"), "'rate' must be a number"),
        (key_line(KEY_A, "team-a", "infer", "*", "rate=0"), "above 0"),
        (key_line(KEY_A, "team-a", "infer", "*", "colour=blue"), "unknown field"),
        ("abc", "expected '<sha256 of the key>"),
    ],
)
def test_a_bad_line_is_refused_with_its_line_number_and_what_was_expected(line: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_api_keys(f"# header\n{line}\n", "keys.txt")
    assert str(caught.value).startswith("keys.txt:2:") and expected in str(caught.value)
    assert KEY_A not in str(caught.value)


def test_two_lines_may_not_share_a_name() -> None:
    text = key_line(KEY_A, "team", "infer") + "\n" + key_line(KEY_B, "team", "infer") + "\n"
    with pytest.raises(ConfigError, match="keys:2: the name 'team'"):
        parse_api_keys(text, "keys")


def _rewrite(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a new inode, as an operator's editor or a secret mount swaps files


def test_the_file_reloads_when_it_changes_and_a_broken_new_file_keeps_the_old_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(key_line(KEY_A, "team-a", "infer") + "\n")
    clock = ManualClock()
    keys = ApiKeysFile(path, clock)
    assert keys.lookup(KEY_A) is not None and keys.lookup(KEY_B) is None
    _rewrite(path, key_line(KEY_B, "team-b", "infer") + "\n")  # A revoked, B added
    assert keys.lookup(KEY_A) is not None  # looked at again at most once a second
    clock.advance(RECHECK_S)
    assert keys.lookup(KEY_A) is None and keys.lookup(KEY_B) is not None
    _rewrite(path, "not a key line\n")
    clock.advance(RECHECK_S)
    assert keys.lookup(KEY_B) is not None  # the broken file is logged; B stays in force
    path.unlink()
    clock.advance(RECHECK_S)
    assert keys.lookup(KEY_B) is not None


def test_a_server_does_not_start_on_a_broken_or_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        ApiKeysFile(tmp_path / "missing", ManualClock())
    (tmp_path / "bad").write_text("x y\n")
    with pytest.raises(ConfigError, match="bad:1"):
        ApiKeysFile(tmp_path / "bad", ManualClock())
