"""``tensorgate bench``: the load generator operators use to prove latency SLOs.

One module per concept, following the path of a run: ``inputs`` (what to send), ``targets``
(how to send it, one module per protocol over ``http_client``), ``arrivals`` and ``runner``
(when to send it), ``stats`` and ``slo`` (what the latencies say), ``server_metrics`` (what
the server says), ``report`` and ``plot`` (how it is shown).
"""
