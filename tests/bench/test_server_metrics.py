"""Server-side deltas from two Prometheus scrapes; servers without tensorgate's metrics yield nothing."""

from __future__ import annotations

import math

import pytest

from tensorgate.bench.server_metrics import metrics_delta, parse_samples

BEFORE = """\
# TYPE tensorgate_requests counter
tensorgate_requests_total{model="mlp",version="1",outcome="success"} 10.0
tensorgate_requests_total{model="cnn",version="1",outcome="success"} 5.0
# TYPE tensorgate_queue_duration_seconds histogram
tensorgate_queue_duration_seconds_bucket{model="mlp",version="1",le="+Inf"} 10.0
tensorgate_queue_duration_seconds_count{model="mlp",version="1"} 10.0
tensorgate_queue_duration_seconds_sum{model="mlp",version="1"} 0.01
# TYPE tensorgate_batch_size histogram
tensorgate_batch_size_bucket{model="mlp",version="1",le="1.0"} 2.0
tensorgate_batch_size_bucket{model="mlp",version="1",le="2.0"} 4.0
tensorgate_batch_size_bucket{model="mlp",version="1",le="4.0"} 4.0
tensorgate_batch_size_bucket{model="mlp",version="1",le="+Inf"} 4.0
tensorgate_batch_size_count{model="mlp",version="1"} 4.0
tensorgate_batch_size_sum{model="mlp",version="1"} 6.0
"""

AFTER = """\
# TYPE tensorgate_requests counter
tensorgate_requests_total{model="mlp",version="1",outcome="success"} 110.0
tensorgate_requests_total{model="mlp",version="1",outcome="queue_full"} 3.0
tensorgate_requests_total{model="cnn",version="1",outcome="success"} 50.0
# TYPE tensorgate_queue_duration_seconds histogram
tensorgate_queue_duration_seconds_bucket{model="mlp",version="1",le="+Inf"} 110.0
tensorgate_queue_duration_seconds_count{model="mlp",version="1"} 110.0
tensorgate_queue_duration_seconds_sum{model="mlp",version="1"} 0.21
# TYPE tensorgate_batch_size histogram
tensorgate_batch_size_bucket{model="mlp",version="1",le="1.0"} 2.0
tensorgate_batch_size_bucket{model="mlp",version="1",le="2.0"} 4.0
tensorgate_batch_size_bucket{model="mlp",version="1",le="4.0"} 29.0
tensorgate_batch_size_bucket{model="mlp",version="1",le="+Inf"} 29.0
tensorgate_batch_size_count{model="mlp",version="1"} 29.0
tensorgate_batch_size_sum{model="mlp",version="1"} 106.0
"""


def test_delta_for_one_model() -> None:
    delta = metrics_delta(parse_samples(BEFORE), parse_samples(AFTER), "mlp")
    assert delta.requests == {"queue_full": 3.0, "success": 100.0}
    assert delta.queue_mean_s == pytest.approx(0.002)
    assert math.isnan(delta.compute_mean_s)
    assert delta.batches == {"4": 25.0}
    assert delta.mean_batch_size == pytest.approx(4.0)
    assert not delta.empty


def test_server_without_tensorgate_metrics() -> None:
    other = "# TYPE http_requests counter\nhttp_requests_total 7.0\n"
    delta = metrics_delta(parse_samples(other), parse_samples(other), "mlp")
    assert delta.empty
    assert delta.requests == {} and delta.batches == {}


def test_unknown_model_is_empty() -> None:
    assert metrics_delta(parse_samples(BEFORE), parse_samples(AFTER), "nope").empty
