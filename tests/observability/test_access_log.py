"""The access log writes one JSON line per request, in batches."""

from __future__ import annotations

import io

import orjson
import pytest

from tensorgate.observability.access_log import AccessLog


def test_lines_are_json_with_the_fields_given_and_written_on_flush() -> None:
    stream = io.BytesIO()
    log = AccessLog(stream)
    log.record({"request_id": "a", "status": 200})
    log.record({"request_id": "b", "status": 503})
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["request_id"], line["status"]) for line in lines] == [("a", 200), ("b", 503)]
    assert all(line["logger"] == "tensorgate.access" and line["ts"].endswith("Z") for line in lines)


async def test_on_the_event_loop_lines_are_buffered_until_flushed() -> None:
    stream = io.BytesIO()
    log = AccessLog(stream)
    log.record({"request_id": "a"})
    assert stream.getvalue() == b""
    log.flush()
    assert orjson.loads(stream.getvalue())["request_id"] == "a"


def test_disabled_log_writes_nothing() -> None:
    stream = io.BytesIO()
    AccessLog(stream, enabled=False).record({"request_id": "a"})
    assert stream.getvalue() == b""


def test_text_lines_carry_the_same_fields_as_json() -> None:
    stream = io.BytesIO()
    log = AccessLog(stream, fmt="text")
    log.record(
        {
            "request_id": "r-1",
            "protocol": "grpc",
            "method": "ModelInfer",
            "model": "mlp",
            "version": "2",
            "status": "OK",
            "queue_ms": 1.25,
            "compute_ms": 0.5,
            "total_ms": 2.0,
        }
    )
    [line] = stream.getvalue().decode().splitlines()
    assert " ACCESS  grpc ModelInfer mlp OK " in line
    for part in ("model=mlp", "version=2", "queue_ms=1.25", "compute_ms=0.50", "total_ms=2.00", "request_id=r-1"):
        assert part in line.split(), line


def test_each_line_carries_its_own_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    """The line prefix is made once per millisecond: records in the same one share it, the next differs."""
    stream = io.BytesIO()
    log = AccessLog(stream)
    times = iter([1_700_000_000.1234, 1_700_000_000.1236, 1_700_000_000.1251, 1_700_000_001.0])
    monkeypatch.setattr("tensorgate.observability.access_log.time.time", lambda: next(times))
    for index in range(4):
        log.record({"request_id": str(index)})
    log.flush()
    stamps = [orjson.loads(line)["ts"] for line in stream.getvalue().splitlines()]
    assert stamps == [
        "2023-11-14T22:13:20.123Z",
        "2023-11-14T22:13:20.123Z",
        "2023-11-14T22:13:20.125Z",
        "2023-11-14T22:13:21.000Z",
    ]
