"""Report building and its JSON and CSV forms."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tensorgate.bench.report import CSV_COLUMNS, build_report, render_table, report_json, warnings, write_csv
from tensorgate.bench.results import RunResult, merge
from tensorgate.bench.server_metrics import ServerDelta
from tensorgate.bench.slo import parse_slo


def _result() -> RunResult:
    return RunResult(
        latencies=[0.001 * (i + 1) for i in range(100)],
        errors={"http 503": 3, "timeout": 1},
        elapsed_s=2.0,
    )


def test_json_has_every_statistic() -> None:
    slos = [parse_slo("p99=50ms"), parse_slo("p99.99=1s")]
    report = build_report("concurrency", 8, _result(), slos, ServerDelta(requests={"success": 100.0}))
    document = json.loads(json.dumps(report_json(report)))
    assert document["requests"] == 104 and document["successes"] == 100
    assert document["errors"] == {"http 503": 3, "timeout": 1}
    assert document["throughput_rps"] == pytest.approx(52.0)
    latency = document["latency_s"]
    assert set(latency) >= {"mean", "p50", "p90", "p95", "p99", "p99.9", "p99.99", "max", "min", "count"}
    assert latency["p50"] == pytest.approx(0.0505)
    assert document["slos"][0] == {
        "slo": "p99=50ms",
        "measured_s": pytest.approx(0.09901),
        "limit_s": 0.05,
        "met": False,
    }
    assert document["slos"][1]["met"] is True
    assert document["server"]["requests_by_outcome"] == {"success": 100.0}
    assert document["server"]["mean_queue_s"] is None  # NaN becomes null
    assert not report.slos_met


def test_csv_one_row_per_run(tmp_path: Path) -> None:
    reports = [build_report("rate", rate, _result(), []) for rate in (10, 20)]
    path = tmp_path / "out.csv"
    write_csv(reports, path)
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == CSV_COLUMNS
    assert [r["level"] for r in rows] == ["10", "20"]
    assert rows[0]["p50_ms"] == "50.500" and rows[0]["errors"] == "4" and rows[0]["slos_met"] == "true"
    assert rows[0]["ttft_p50_ms"] == ""


def test_streaming_fields() -> None:
    result = RunResult(latencies=[0.5, 0.6], ttft=[0.1, 0.2], itl=[0.01] * 10, tokens=12, elapsed_s=1.0)
    report = build_report("concurrency", 1, result, [])
    document = report_json(report)
    assert document["streaming"]["tokens_per_s"] == pytest.approx(12.0)
    assert document["streaming"]["ttft_s"]["p50"] == pytest.approx(0.15)
    assert "TTFT" in render_table([report])


def test_tail_warning_and_table() -> None:
    result = RunResult(latencies=[0.001] * 95 + [0.050] * 5, elapsed_s=1.0)
    report = build_report("concurrency", 4, result, [parse_slo("p50=1us")])
    notes = warnings(report)
    assert any("P99/P50" in n for n in notes)
    table = render_table([report])
    assert "c=4" in table and "MISSED" in table


def test_merge_concatenates() -> None:
    a = RunResult(latencies=[1.0], errors={"x": 1}, tokens=2, elapsed_s=2.0)
    b = RunResult(latencies=[2.0, 3.0], errors={"x": 2, "y": 1}, tokens=3, elapsed_s=2.5)
    merged = merge([a, b])
    assert sorted(merged.latencies) == [1.0, 2.0, 3.0]
    assert merged.errors == {"x": 3, "y": 1}
    assert merged.tokens == 5 and merged.elapsed_s == 2.5
    assert merged.completed == 7


def test_progress_line() -> None:
    from tensorgate.bench.progress import progress_line

    line = progress_line(2.0, 10.0, RunResult(latencies=[0.1] * 9, errors={"timeout": 1}))
    assert "2.0/10 s" in line and "10 req" in line and "5.0 req/s" in line and "1 errors" in line
