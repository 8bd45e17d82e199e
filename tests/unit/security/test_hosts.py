"""The Host allowlist against DNS rebinding: names, ports, IPv6 literals, and the bind's default."""

from __future__ import annotations

import pytest

from tensorgate.errors import PermissionDenied
from tensorgate.security.hosts import HostAllowlist, host_name


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("localhost", "localhost"),
        ("LOCALHOST:8080", "localhost"),
        ("127.0.0.1:80", "127.0.0.1"),
        ("[::1]:8080", "::1"),
        ("[::1]", "::1"),
        ("api.example.com.", "api.example.com"),
        (" api.example.com:443 ", "api.example.com"),
        ("evil.example:notaport", "evil.example:notaport"),
    ],
)
def test_host_name(value: str, name: str) -> None:
    assert host_name(value) == name


def test_bound_to_loopback_only_loopback_names_are_answered() -> None:
    hosts = HostAllowlist.for_bind("127.0.0.1", None)
    for good in ("localhost:8080", "127.0.0.1:8080", "[::1]:8080", None):
        hosts.check(good)
    for bad in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example", "localhost.evil.example", ""):
        with pytest.raises(PermissionDenied) as refused:
            hosts.check(bad)
        assert "evil" not in str(refused.value)  # the name is not echoed


def test_bound_elsewhere_every_name_is_answered_unless_a_list_is_given() -> None:
    HostAllowlist.for_bind("0.0.0.0", None).check("anything.example")
    listed = HostAllowlist.for_bind("0.0.0.0", ["API.example.com"])
    listed.check("api.example.com:8443")
    listed.check("localhost")  # a local probe still works
    with pytest.raises(PermissionDenied):
        listed.check("evil.example")


def test_a_star_allows_every_name_even_on_loopback() -> None:
    hosts = HostAllowlist.for_bind("127.0.0.1", ["*"])
    assert not hosts.checks
    hosts.check("evil.example")
