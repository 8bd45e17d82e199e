"""The access log writes one JSON line per request, in batches."""

from __future__ import annotations

import io
from typing import Any

import orjson
import pytest

from tensorgate.observability.access_log import AccessLog


def record(log: AccessLog, request_id: str, status: int | str = 200, **fields: Any) -> None:
    """One HTTP request's record, the fields not given set to typical values."""
    values: dict[str, Any] = {
        "protocol": "http",
        "method": "POST",
        "path": "/v2/models/mlp/infer",
        "model": "mlp",
        "version": "1",
        "queue_s": 0.001,
        "compute_s": 0.002,
        "total_s": 0.004,
    }
    values.update(fields)
    log.record(request_id=request_id, status=status, **values)


def test_lines_are_json_with_the_fields_given_and_written_on_flush() -> None:
    stream = io.BytesIO()
    log = AccessLog(stream)
    record(log, "a", 200)
    record(log, "b", 503, queue_s=0.25)
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["request_id"], line["status"]) for line in lines] == [("a", 200), ("b", 503)]
    assert all(line["logger"] == "tensorgate.access" and line["ts"].endswith("Z") for line in lines)
    assert lines[0]["path"] == "/v2/models/mlp/infer" and lines[0]["model"] == "mlp" and lines[0]["version"] == "1"
    assert (lines[0]["queue_ms"], lines[0]["compute_ms"], lines[0]["total_ms"]) == (1.0, 2.0, 4.0)
    assert lines[1]["queue_ms"] == 250.0


def test_a_grpc_line_has_no_path() -> None:
    stream = io.BytesIO()
    log = AccessLog(stream)
    record(log, "g", "OK", protocol="grpc", method="ModelInfer", path=None)
    line = orjson.loads(stream.getvalue())
    assert "path" not in line and (line["protocol"], line["method"], line["status"]) == ("grpc", "ModelInfer", "OK")


async def test_on_the_event_loop_lines_are_buffered_until_flushed() -> None:
    stream = io.BytesIO()
    log = AccessLog(stream)
    record(log, "a")
    assert stream.getvalue() == b""
    log.flush()
    assert orjson.loads(stream.getvalue())["request_id"] == "a"


def test_disabled_log_writes_nothing() -> None:
    stream = io.BytesIO()
    record(AccessLog(stream, enabled=False), "a")
    assert stream.getvalue() == b""


def test_text_lines_carry_the_same_fields_as_json() -> None:
    stream = io.BytesIO()
    log = AccessLog(stream, fmt="text")
    record(
        log,
        "r-1",
        "OK",
        protocol="grpc",
        method="ModelInfer",
        path=None,
        version="2",
        queue_s=0.00125,
        compute_s=0.0005,
        total_s=0.002,
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
        record(log, str(index))
    log.flush()
    stamps = [orjson.loads(line)["ts"] for line in stream.getvalue().splitlines()]
    assert stamps == [
        "2023-11-14T22:13:20.123Z",
        "2023-11-14T22:13:20.123Z",
        "2023-11-14T22:13:20.125Z",
        "2023-11-14T22:13:21.000Z",
    ]
