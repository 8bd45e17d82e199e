"""The memory residency keys: server.memory_budget_bytes and server.default_residency (also as
flags), and a model's model_residency (refused where it cannot apply)."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from tensorgate.cli.serve import add_arguments, build_config
from tensorgate.config.model_config import ModelConfig
from tensorgate.config.server_config import ServerConfig


def _from_flags(*argv: str) -> ServerConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return build_config(parser.parse_args(list(argv)))[0]


def test_unbounded_and_resident_by_default() -> None:
    section = ServerConfig().server
    assert section.memory_budget_bytes is None and section.default_residency == "resident"
    assert ModelConfig().model_residency is None  # the server's default applies


def test_flags_set_the_budget_and_the_default_residency() -> None:
    section = _from_flags("--memory-budget-bytes", "1048576", "--default-residency", "on_demand").server
    assert section.memory_budget_bytes == 1 << 20 and section.default_residency == "on_demand"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"server": {"memory_budget_bytes": 0}}, "greater than or equal to 1"),
        ({"server": {"default_residency": "lazy"}}, "'resident' or 'on_demand'"),
    ],
)
def test_bad_server_keys_are_refused(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ServerConfig.model_validate(data)


def test_on_demand_is_refused_where_it_cannot_apply() -> None:
    assert ModelConfig(backend="python", model_residency="on_demand").model_residency == "on_demand"
    with pytest.raises(ValidationError, match="not for the llm backend"):
        ModelConfig(backend="llm", model_residency="on_demand")
