"""``tensorgate bench``: the load generator operators use to prove latency SLOs.

One module per concept, following the path of a run: ``inputs`` and ``prepare`` (what to
send), ``targets`` (how to send it, one module per protocol, HTTP ones over ``http_client``),
``arrivals``, ``runner``, ``job`` and ``parallel`` (when and from where to send it; ``sequences``
and ``stream_search`` for stateful streams at real-time pace),
``results``, ``stats`` and ``slo`` (what the latencies say), ``server_metrics`` (what the server
says), ``report``, ``progress`` and ``plot`` (how it is shown). The command is
``tensorgate/cli/bench.py``.
"""
