"""What a run says, as a table for people and JSON/CSV for pipelines.

:func:`build_report` is pure: a :class:`RunResult` (plus SLOs and the server's deltas) becomes
an immutable :class:`RunReport`; the writers only format. Times are seconds in JSON and
milliseconds in the table and CSV columns named ``*_ms``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorgate.bench.results import RunResult
from tensorgate.bench.server_metrics import ServerDelta
from tensorgate.bench.slo import Slo, extra_percentiles
from tensorgate.bench.stats import REPORTED, TAIL_RATIO_WARNING, Summary, summarize
from tensorgate.bench.units import format_ms


@dataclass(frozen=True, slots=True)
class SloCheck:
    text: str
    measured_s: float
    limit_s: float
    met: bool


@dataclass(frozen=True, slots=True)
class SequenceLoad:
    """What a ``--sequences`` run offered and what became of its sequences."""

    chunks: int  # per sequence
    interval_s: float  # between a sequence's chunks
    completed: int  # sequences sent to their end
    failed: int  # sequences cut short by a failed chunk

    def describe(self, sequences: float) -> str:
        rate = sequences / self.interval_s
        return (
            f"{sequences:g} concurrent sequences of {self.chunks} chunks, one every {self.interval_s * 1000:g} ms "
            f"({rate:,.1f} chunks/s offered); {self.completed} sequences completed, {self.failed} cut short"
        )


@dataclass(frozen=True, slots=True)
class RunReport:
    mode: str  # "concurrency" (closed loop), "rate" (open loop) or "sequences" (real-time streams)
    level: float
    requests: int
    successes: int
    errors: dict[str, int]
    elapsed_s: float
    throughput: float
    latency: Summary
    ttft: Summary | None
    itl: Summary | None
    tokens: int
    tokens_per_s: float
    slos: tuple[SloCheck, ...]
    server: ServerDelta | None
    sequences: SequenceLoad | None = None

    @property
    def slos_met(self) -> bool:
        return all(check.met for check in self.slos)

    @property
    def label(self) -> str:
        if self.mode == "sequences":
            return f"seq={self.level:g}"
        return f"c={self.level:g}" if self.mode == "concurrency" else f"rate={self.level:g}/s"


def build_report(
    mode: str,
    level: float,
    result: RunResult,
    slos: Sequence[Slo],
    server: ServerDelta | None = None,
    sequences: tuple[int, float] | None = None,
) -> RunReport:
    """``sequences``: (chunks per sequence, interval in seconds) for a ``--sequences`` run."""
    latency = summarize(result.latencies, extra_percentiles(list(slos)))
    streaming = bool(result.ttft)
    return RunReport(
        mode=mode,
        level=level,
        requests=result.completed,
        successes=result.successes,
        errors=dict(sorted(result.errors.items())),
        elapsed_s=result.elapsed_s,
        throughput=result.throughput,
        latency=latency,
        ttft=summarize(result.ttft) if streaming else None,
        itl=summarize(result.itl) if streaming else None,
        tokens=result.tokens,
        tokens_per_s=result.tokens_per_s,
        slos=tuple(SloCheck(s.text, s.measured(latency), s.limit_s, s.met(latency)) for s in slos),
        server=server,
        sequences=None
        if sequences is None
        else SequenceLoad(sequences[0], sequences[1], result.sequences, result.sequences_failed),
    )


def warnings(report: RunReport) -> list[str]:
    notes = []
    ratio = report.latency.tail_ratio
    if not math.isnan(ratio) and ratio > TAIL_RATIO_WARNING:
        notes.append(
            f"{report.label}: P99/P50 = {ratio:.1f} (> {TAIL_RATIO_WARNING:g}): long tail: look for queueing or pauses"
        )
    if report.errors:
        notes.append(f"{report.label}: {sum(report.errors.values())} of {report.requests} requests failed")
    if report.requests == 0:
        notes.append(f"{report.label}: no request completed")
    return notes


def _q(q: float) -> str:
    return f"p{q:g}"


def _summary_json(summary: Summary) -> dict[str, Any]:
    return {
        "count": summary.count,
        "mean": _num(summary.mean),
        "min": _num(summary.minimum),
        "max": _num(summary.maximum),
        **{_q(q): _num(v) for q, v in summary.percentiles.items()},
    }


def _num(value: float) -> float | None:
    return None if math.isnan(value) else value


def report_json(report: RunReport) -> dict[str, Any]:
    """One run as JSON-ready data; durations in seconds, NaN as null."""
    document: dict[str, Any] = {
        "mode": report.mode,
        "level": report.level,
        "requests": report.requests,
        "successes": report.successes,
        "errors": report.errors,
        "elapsed_s": report.elapsed_s,
        "throughput_rps": _num(report.throughput),
        "latency_s": _summary_json(report.latency),
        "p99_p50_ratio": _num(report.latency.tail_ratio),
        "slos": [
            {"slo": c.text, "measured_s": _num(c.measured_s), "limit_s": c.limit_s, "met": c.met} for c in report.slos
        ],
    }
    if report.ttft is not None and report.itl is not None:
        document["streaming"] = {
            "ttft_s": _summary_json(report.ttft),
            "itl_s": _summary_json(report.itl),
            "tokens": report.tokens,
            "tokens_per_s": _num(report.tokens_per_s),
        }
    if report.sequences is not None:
        load = report.sequences
        document["sequences"] = {
            "concurrent": report.level,
            "chunks_per_sequence": load.chunks,
            "chunk_interval_s": load.interval_s,
            "completed": load.completed,
            "failed": load.failed,
        }
    if report.server is not None:
        s = report.server
        document["server"] = {
            "requests_by_outcome": s.requests,
            "mean_queue_s": _num(s.queue_mean_s),
            "mean_compute_s": _num(s.compute_mean_s),
            "batch_size_buckets": s.batches,
            "mean_batch_size": _num(s.mean_batch_size),
        }
    return document


CSV_COLUMNS = [
    "mode",
    "level",
    "requests",
    "successes",
    "errors",
    "elapsed_s",
    "throughput_rps",
    "mean_ms",
    *[f"{_q(q)}_ms" for q in REPORTED],
    "max_ms",
    "p99_p50_ratio",
    "ttft_p50_ms",
    "itl_p50_ms",
    "tokens_per_s",
    "slos_met",
]


def csv_row(report: RunReport) -> dict[str, str]:
    lat = report.latency
    row = {
        "mode": report.mode,
        "level": f"{report.level:g}",
        "requests": str(report.requests),
        "successes": str(report.successes),
        "errors": str(sum(report.errors.values())),
        "elapsed_s": f"{report.elapsed_s:.6f}",
        "throughput_rps": f"{report.throughput:.3f}",
        "mean_ms": format_ms(lat.mean),
        **{f"{_q(q)}_ms": format_ms(lat.get(q)) for q in REPORTED},
        "max_ms": format_ms(lat.maximum),
        "p99_p50_ratio": f"{lat.tail_ratio:.3f}",
        "ttft_p50_ms": "" if report.ttft is None else format_ms(report.ttft.get(50.0)),
        "itl_p50_ms": "" if report.itl is None else format_ms(report.itl.get(50.0)),
        "tokens_per_s": "" if report.ttft is None else f"{report.tokens_per_s:.3f}",
        "slos_met": str(report.slos_met).lower(),
    }
    return row


def write_csv(reports: Sequence[RunReport], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for report in reports:
            writer.writerow(csv_row(report))


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_table(reports: Sequence[RunReport]) -> str:
    """The end-of-run table: one row per run (several for a sweep), then streaming, server and SLO lines."""
    header = ["load", "requests", "errors", "req/s", "mean", *[_q(q) for q in REPORTED], "max", "p99/p50"]
    rows = [
        [
            r.label,
            str(r.requests),
            str(sum(r.errors.values())),
            f"{r.throughput:,.1f}",
            format_ms(r.latency.mean),
            *[format_ms(r.latency.get(q)) for q in REPORTED],
            format_ms(r.latency.maximum),
            "-" if math.isnan(r.latency.tail_ratio) else f"{r.latency.tail_ratio:.2f}",
        ]
        for r in reports
    ]
    parts = ["latency in ms", _table(header, rows)]
    for r in reports:
        if r.sequences is not None:
            parts.append(f"{r.label}: {r.sequences.describe(r.level)}; latency is per chunk, from when it was due")
        if r.errors:
            parts.append(f"{r.label} errors: " + ", ".join(f"{k}: {v}" for k, v in r.errors.items()))
        if r.ttft is not None and r.itl is not None:
            parts.append(
                f"{r.label} streaming: TTFT p50 {format_ms(r.ttft.get(50.0))} ms, "
                f"p99 {format_ms(r.ttft.get(99.0))} ms; "
                f"ITL p50 {format_ms(r.itl.get(50.0))} ms, p99 {format_ms(r.itl.get(99.0))} ms; "
                f"{r.tokens} tokens, {r.tokens_per_s:,.1f} tokens/s"
            )
        if r.server is not None:
            parts.append(_server_line(r))
        for check in r.slos:
            verdict = "met" if check.met else "MISSED"
            parts.append(
                f"{r.label} SLO {check.text}: {verdict} (measured {format_ms(check.measured_s)} ms, "
                f"limit {format_ms(check.limit_s)} ms)"
            )
    return "\n".join(parts)


def _server_line(r: RunReport) -> str:
    s = r.server
    assert s is not None
    if s.empty:
        return f"{r.label} server: no tensorgate metrics for this model at --metrics-url"
    outcomes = ", ".join(f"{k} {v:g}" for k, v in s.requests.items()) or "none"
    batches = ", ".join(f"<={k}: {v:g}" for k, v in s.batches.items()) or "none"
    return (
        f"{r.label} server: requests {outcomes}; mean queue {format_ms(s.queue_mean_s)} ms, "
        f"mean compute {format_ms(s.compute_mean_s)} ms; mean batch {s.mean_batch_size:.2f}; batches {batches}"
    )


def search_summary(sustained: int, failed: int | None, slos: Sequence[str]) -> str:
    """The answer of ``--search``: how many concurrent real-time sequences met every objective."""
    within = ", ".join(slos) + " and no error"
    if sustained == 0:
        return f"search: no count of concurrent sequences met {within} (even {failed} did not)"
    if failed is None:
        return f"search: sustains at least {sustained} concurrent real-time sequences within {within} (--max-sequences)"
    return f"search: sustains {sustained} concurrent real-time sequences within {within}; {failed} did not"
