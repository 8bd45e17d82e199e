"""Every decoder a client's bytes reach, fuzzed.

The property, held by ``fuzz_targets.check``: any input either decodes or is refused with the
project's client error (a 4xx / client gRPC status, an HTTP/2 connection error that is not
INTERNAL_ERROR, an HPACK error); never another exception, never a log of an unexpected error,
never one example slower than ``SLOW_EXAMPLE_S``. Inputs are mutations of the seed corpus
(``corpus/``) and structured documents with wrong types, bounded in size.

Bounded for CI: the examples per target below keep this folder under 30 s on 2 cores. A longer run
is opt-in: ``TENSORGATE_FUZZ_EXAMPLES=100000 .venv/bin/python -m pytest tests/fuzz`` sets every
target's count (about 300 examples/s each; most of it is Hypothesis generating them). Runs are
not derandomized, so each explores new inputs; a failure prints its input and a
``@reproduce_failure`` blob, Hypothesis keeps it in ``.hypothesis/`` and replays it first next time,
and ``--hypothesis-seed=N`` repeats a whole run.
"""

from __future__ import annotations

import os
from typing import Any

from fuzz_targets import TARGETS, check
from hypothesis import HealthCheck, given, settings


def fuzz_settings(examples: int) -> settings:
    override = os.environ.get("TENSORGATE_FUZZ_EXAMPLES")
    return settings(
        max_examples=int(override) if override else examples,
        deadline=None,  # the harness has its own bound per example (SLOW_EXAMPLE_S)
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
            HealthCheck.filter_too_much,
        ],
    )


@fuzz_settings(1200)
@given(TARGETS["v2_json"].examples)
def test_v2_json_body(example: bytes) -> None:
    check(TARGETS["v2_json"], example)


@fuzz_settings(800)
@given(TARGETS["v2_binary"].examples)
def test_v2_binary_extension_body(example: tuple[bytes, str | None]) -> None:
    check(TARGETS["v2_binary"], example)


@fuzz_settings(800)
@given(TARGETS["v1"].examples)
def test_v1_predict_body(example: tuple[str, bytes]) -> None:
    check(TARGETS["v1"], example)


@fuzz_settings(800)
@given(TARGETS["openai"].examples)
def test_openai_request(example: tuple[str, bytes]) -> None:
    check(TARGETS["openai"], example)


@fuzz_settings(800)
@given(TARGETS["grpc"].examples)
def test_grpc_model_infer_request(example: bytes) -> None:
    check(TARGETS["grpc"], example)


@fuzz_settings(800)
@given(TARGETS["http2"].examples)
def test_http2_frames(example: tuple[bytes, list[int]]) -> None:
    check(TARGETS["http2"], example)


@fuzz_settings(1200)
@given(TARGETS["hpack"].examples)
def test_hpack_header_blocks(example: list[Any]) -> None:
    check(TARGETS["hpack"], example)
