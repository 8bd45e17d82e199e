"""Histogram buckets shared by the metric families."""

# Latency buckets from 0.5 ms to 60 s: small models answer in ~1 ms, generation runs for seconds.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.004,
    0.008,
    0.016,
    0.032,
    0.064,
    0.128,
    0.256,
    0.512,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
