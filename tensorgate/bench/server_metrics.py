"""``--metrics-url``: the server's own view of a run, from Prometheus text scraped before and after.

Deltas of tensorgate's metrics for the benchmarked model: requests by outcome, mean queue and
compute time per request (histogram ``_sum``/``_count``), and how many batches of each size ran.
A server without these metrics (any other V2 server) yields an empty delta, never an error:
the client-side numbers stand on their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

REQUESTS = "tensorgate_requests_total"
QUEUE = "tensorgate_queue_duration_seconds"
COMPUTE = "tensorgate_compute_duration_seconds"
BATCH = "tensorgate_batch_size"


def parse_samples(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return samples


def scrape(url: str, timeout_s: float = 5.0) -> Samples | None:
    """The metrics at ``url``; None when they cannot be fetched or read (reported, not fatal)."""
    import httpx  # the bench extra's, imported here so that the ``tensorgate`` command does not need it

    try:
        response = httpx.get(url, timeout=timeout_s)
        response.raise_for_status()
        return parse_samples(response.text)
    except (httpx.HTTPError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class ServerDelta:
    """What the server counted for one model between two scrapes."""

    requests: dict[str, float] = field(default_factory=dict)
    queue_mean_s: float = math.nan
    compute_mean_s: float = math.nan
    batches: dict[str, float] = field(default_factory=dict)  # upper bucket bound -> batches in that bucket
    mean_batch_size: float = math.nan

    @property
    def empty(self) -> bool:
        return not self.requests and not self.batches and math.isnan(self.queue_mean_s)


def _sum_for(samples: Samples, name: str, model: str, **match: str) -> float:
    total = 0.0
    for (sample_name, labels), value in samples.items():
        if sample_name != name:
            continue
        label_map = dict(labels)
        if label_map.get("model") == model and all(label_map.get(k) == v for k, v in match.items()):
            total += value
    return total


def _labels(samples: Samples, name: str, model: str, label: str) -> set[str]:
    return {
        dict(labels)[label]
        for (sample_name, labels) in samples
        if sample_name == name and dict(labels).get("model") == model and label in dict(labels)
    }


def _mean(before: Samples, after: Samples, name: str, model: str) -> float:
    count = _sum_for(after, name + "_count", model) - _sum_for(before, name + "_count", model)
    total = _sum_for(after, name + "_sum", model) - _sum_for(before, name + "_sum", model)
    return total / count if count > 0 else math.nan


def _bound(le: str) -> float:
    return math.inf if le in ("+Inf", "inf") else float(le)


def metrics_delta(before: Samples, after: Samples, model: str) -> ServerDelta:
    """The change between two scrapes for ``model`` (all its versions together)."""
    requests = {}
    for outcome in sorted(_labels(after, REQUESTS, model, "outcome")):
        change = _sum_for(after, REQUESTS, model, outcome=outcome) - _sum_for(before, REQUESTS, model, outcome=outcome)
        if change:
            requests[outcome] = change
    batches: dict[str, float] = {}
    previous = 0.0
    for le in sorted(_labels(after, BATCH + "_bucket", model, "le"), key=_bound):
        cumulative = _sum_for(after, BATCH + "_bucket", model, le=le) - _sum_for(
            before, BATCH + "_bucket", model, le=le
        )
        if cumulative - previous:
            batches[f"{_bound(le):g}"] = cumulative - previous
        previous = cumulative
    return ServerDelta(
        requests=requests,
        queue_mean_s=_mean(before, after, QUEUE, model),
        compute_mean_s=_mean(before, after, COMPUTE, model),
        batches=batches,
        mean_batch_size=_mean(before, after, BATCH, model),
    )
