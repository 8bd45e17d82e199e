"""Model names and versions as they may appear in URLs, configs and directory names."""

from __future__ import annotations

import re

from tensorgate.errors import InvalidInput

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_VERSION = re.compile(r"[1-9][0-9]{0,17}")


def is_valid_model_name(name: str) -> bool:
    # The pattern cannot start with '.', so '.' and '..' and any path separator are excluded.
    return _NAME.fullmatch(name) is not None


def check_model_name(name: str) -> str:
    if not is_valid_model_name(name):
        raise InvalidInput(
            "invalid model name: names are 1-128 characters of letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def is_valid_version(text: str) -> bool:
    """A positive integer in ASCII digits with no leading zero, as URLs and directory names write it."""
    return _VERSION.fullmatch(text) is not None


def parse_version(text: str) -> int:
    """A version from a URL or directory name: a positive integer (Triton's words when it is not)."""
    if _VERSION.fullmatch(text) is None:
        raise InvalidInput(
            f"failed to get model version from specified version string '{text[:32]}', "
            "version should be an integral value > 0"
        )
    return int(text)
