"""``tensorgate bench``: load a model server (ours or any that speaks the protocol) and check SLOs.

``--sequences N`` drives N concurrent sequences (Triton's sequence batcher: streams of audio chunks)
at real-time pace instead of independent requests, and checks the real-time speech SLO per chunk
unless ``--slo`` gives others; ``--search`` finds how many such sequences the server sustains.

Exit status: 0 when every ``--slo`` is met (``--search``: when some count of sequences met them),
3 when one is missed, 1 when the run could not be set up or no request succeeded, 2 for bad
arguments (argparse).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import random
import sys
from pathlib import Path
from typing import Any

from tensorgate.bench.inputs import load_input_file, parse_shape_override
from tensorgate.bench.job import Job, execute
from tensorgate.bench.parallel import run_processes
from tensorgate.bench.prepare import model_inputs, openai_requests, tensor_requests
from tensorgate.bench.progress import Progress
from tensorgate.bench.report import (
    RunReport,
    build_report,
    render_table,
    report_json,
    search_summary,
    warnings,
    write_csv,
)
from tensorgate.bench.results import RunResult
from tensorgate.bench.runner import DEFAULT_MAX_INFLIGHT, LoadSpec
from tensorgate.bench.sequences import SequenceSpec
from tensorgate.bench.server_metrics import metrics_delta, scrape
from tensorgate.bench.slo import REAL_TIME_SPEECH, Slo, parse_slo, real_time_speech
from tensorgate.bench.stream_search import StreamSearch
from tensorgate.bench.targets.base import PROTOCOLS, Endpoint, is_grpc, parse_endpoint
from tensorgate.bench.targets.factory import is_streaming
from tensorgate.bench.targets.openai import DEFAULT_PROMPT
from tensorgate.bench.targets.sequences import SEQUENCE_PROTOCOLS
from tensorgate.bench.units import parse_duration
from tensorgate.clock import MonotonicClock
from tensorgate.memory import tune_malloc

SLO_MISSED = 3


def _argument(convert: Any, what: str) -> Any:
    def parse(text: str) -> Any:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{what}: {exc}") from None

    return parse


def _levels(text: str) -> list[float]:
    values = [float(v) for v in text.split(",") if v.strip()]
    if not values or any(v <= 0 for v in values):
        raise ValueError("give positive numbers, e.g. 1,2,4,8")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help="model name (or use -m)")
    parser.add_argument("-m", "--model", dest="model_flag", metavar="MODEL", help="model name")
    parser.add_argument("--model-version", help="model version (default: the server's choice)")
    parser.add_argument(
        "-u",
        "--url",
        help="server URL (default http://127.0.0.1:8080; 127.0.0.1:8081 for grpc; https://, grpcs:// for TLS)",
    )
    parser.add_argument(
        "--protocol", choices=PROTOCOLS, help="wire protocol (default v2-json; grpc-stream with --sequences)"
    )
    load = parser.add_argument_group("load")
    load.add_argument("-c", "--concurrency", type=int, default=None, help="closed loop: requests in flight (default 1)")
    load.add_argument("--rate", type=float, help="open loop: Poisson arrivals at this many requests/s")
    load.add_argument(
        "-z",
        "--duration",
        type=_argument(parse_duration, "--duration"),
        help="run time, e.g. 30s (default 10s unless -n is given)",
    )
    load.add_argument("-n", "--requests", type=int, help="counted requests to send (after warm-up)")
    load.add_argument("--warmup", type=_argument(parse_duration, "--warmup"), default=0.0, help="seconds not counted")
    load.add_argument(
        "--sweep", type=_argument(_levels, "--sweep"), help="concurrencies (or rates with --rate) to run in turn"
    )
    load.add_argument("--processes", type=int, default=1, help="spread the client over N processes")
    load.add_argument("--timeout", type=_argument(parse_duration, "--timeout"), default=30.0, help="per request")
    load.add_argument("--max-inflight", type=int, default=DEFAULT_MAX_INFLIGHT, help="open loop: cap on outstanding")
    streams = parser.add_argument_group("sequences (stateful streams, Triton's sequence batcher)")
    streams.add_argument(
        "--sequences",
        type=int,
        metavar="N",
        help="drive N concurrent sequences at real-time pace; latency per chunk (default SLO: "
        f"{', '.join(REAL_TIME_SPEECH)})",
    )
    streams.add_argument("--chunks-per-sequence", type=int, default=20, metavar="K", help="chunks in a sequence")
    streams.add_argument(
        "--chunk-interval-ms", type=float, default=100.0, metavar="T", help="a sequence sends a chunk every T ms"
    )
    streams.add_argument(
        "--search",
        action="store_true",
        help="find the most concurrent sequences that meet the SLOs with no error, from --sequences up",
    )
    streams.add_argument("--max-sequences", type=int, default=1024, help="--search: the most sequences to try")
    streams.add_argument("--sequence-id-base", type=int, help="the first sequence id (default: a random one)")
    data = parser.add_argument_group("inputs")
    data.add_argument("--batch-size", type=int, default=1, help="first dimension when metadata says -1")
    data.add_argument(
        "--shape",
        action="append",
        default=[],
        type=_argument(parse_shape_override, "--shape"),
        help="name=1,3,224,224 (repeatable)",
    )
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--input-file", type=Path, help="JSON list of requests (V2 bodies with data, or OpenAI bodies)")
    data.add_argument("--prompt", default=DEFAULT_PROMPT, help="OpenAI protocols: the prompt")
    data.add_argument("--max-tokens", type=int, default=64, help="OpenAI protocols: tokens to generate")
    data.add_argument("--api-key", help="an API key or token, sent as 'Authorization: Bearer' (gRPC metadata too)")
    data.add_argument("--tenant", help="the tenant to queue as, sent as 'X-Tenant' (gRPC metadata too): fair sharing")
    data.add_argument("--cacert", type=Path, help="the CA of an https:// or grpcs:// server (default: the system's)")
    out = parser.add_argument_group("report")
    out.add_argument(
        "--slo",
        action="append",
        default=[],
        type=_argument(parse_slo, "--slo"),
        help="p99=80ms, mean=5ms ... (repeatable); exit 3 when missed",
    )
    out.add_argument("--json", type=Path, help="write the report as JSON here")
    out.add_argument("--csv", type=Path, help="write one CSV row per run here")
    out.add_argument("--plot", type=Path, help="PNG: latency-throughput for a sweep, CDF for a single run")
    out.add_argument("--metrics-url", help="Prometheus URL of the server, scraped before and after each run")


def _spec(args: argparse.Namespace, level: float | None) -> tuple[str, float, LoadSpec]:
    duration = args.duration if args.duration is not None or args.requests is not None else 10.0
    common = {
        "duration_s": duration,
        "requests": args.requests,
        "warmup_s": args.warmup,
        "timeout_s": args.timeout,
        "seed": args.seed,
        "max_inflight": args.max_inflight,
    }
    if args.rate is not None:
        rate = level if level is not None else args.rate
        return "rate", rate, LoadSpec(rate=rate, **common)
    concurrency = int(level) if level is not None else (args.concurrency or 1)
    return "concurrency", concurrency, LoadSpec(concurrency=concurrency, **common)


def _run_one(job: Job, processes: int) -> RunResult:
    if processes > 1:
        return run_processes(job, processes)
    planned = job.spec.duration_s + job.spec.warmup_s if job.spec.duration_s else None
    progress = Progress(MonotonicClock(), planned) if Progress.wanted() else None
    return execute(job, progress)


def _write(args: argparse.Namespace, reports: list[RunReport], last: RunResult) -> None:
    if args.json is not None:
        document = {
            "protocol": args.protocol,
            "url": args.url,
            "model": args.model,
            "model_version": args.model_version,
            "runs": [report_json(r) for r in reports],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.csv is not None:
        write_csv(reports, args.csv)
    if args.plot is not None:
        from tensorgate.bench.plot import plot_cdf, plot_sweep

        if len(reports) > 1:
            plot_sweep(reports, args.plot)
        else:
            plot_cdf(last.latencies, reports[0].label, args.plot)


def _installed(package: str) -> bool:
    try:
        importlib.import_module(package)
    except ImportError:
        return False
    return True


def run(args: argparse.Namespace) -> int:
    args.model = args.model_flag or args.model
    if not args.model:
        print("tensorgate bench: give a model name (positional or -m)", file=sys.stderr)
        return 2
    if not _installed("httpx"):  # the metadata and metrics fetches; an install without the bench extra
        print("tensorgate bench: needs httpx: pip install 'tensorgate[bench]'", file=sys.stderr)
        return 1
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:  # before any load is sent
        print("tensorgate bench: --plot needs matplotlib: pip install 'tensorgate[bench]'", file=sys.stderr)
        return 2
    if args.concurrency is not None and args.rate is not None:
        print("tensorgate bench: -c and --rate exclude each other", file=sys.stderr)
        return 2
    problem = _sequence_arguments(args)
    if problem:
        print(f"tensorgate bench: {problem}", file=sys.stderr)
        return 2
    args.protocol = args.protocol or ("grpc-stream" if args.sequences is not None else "v2-json")
    tune_malloc()  # the client shares the machine with the server it measures: it must cost little
    try:
        return _bench(args)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"tensorgate bench: {exc}", file=sys.stderr)
        return 1


def _bench(args: argparse.Namespace) -> int:
    grpc = is_grpc(args.protocol)
    args.url = args.url or ("127.0.0.1:8081" if grpc else "http://127.0.0.1:8080")
    ca_file = None if args.cacert is None else str(args.cacert)
    endpoint = parse_endpoint(
        args.url, 8081 if grpc else 8080, ca_file=ca_file, credential=args.api_key, tenant=args.tenant
    )
    file_requests = load_input_file(json.loads(args.input_file.read_text())) if args.input_file else None
    tensors, documents = [], []
    if is_streaming(args.protocol):
        documents = openai_requests(
            file_requests, args.protocol == "openai-chat", args.model, args.prompt, args.max_tokens
        )
    else:
        metas = None
        if file_requests is None:
            metas = model_inputs(args.protocol, endpoint, args.model, args.model_version, args.timeout)
        tensors = tensor_requests(file_requests, metas, args.batch_size, dict(args.shape), args.seed)
    if args.sequences is not None:
        return _bench_sequences(args, endpoint, tensors)
    slos: list[Slo] = args.slo
    reports: list[RunReport] = []
    last = RunResult()
    for level in args.sweep or [None]:
        mode, value, spec = _spec(args, level)
        job = Job(args.protocol, endpoint, args.model, args.model_version, spec, tensors, documents)
        before = scrape(args.metrics_url) if args.metrics_url else None
        last = _run_one(job, max(1, args.processes))
        after = scrape(args.metrics_url) if args.metrics_url else None
        server = None
        if args.metrics_url:
            if before is None or after is None:
                print(f"tensorgate bench: could not scrape {args.metrics_url}", file=sys.stderr)
            else:
                server = metrics_delta(before, after, args.model)
        reports.append(build_report(mode, value, last, slos, server))
    print(render_table(reports))
    for note in [n for r in reports for n in warnings(r)]:
        print(f"warning: {note}", file=sys.stderr)
    _write(args, reports, last)
    if any(not r.slos_met for r in reports):
        return SLO_MISSED
    return 0 if any(r.successes for r in reports) else 1


def _sequence_arguments(args: argparse.Namespace) -> str | None:
    """What is wrong with the sequence options, if anything."""
    if args.sequences is None:
        if args.search:
            return "--search needs --sequences N (the count it starts from)"
        return None
    if args.sequences < 1 or args.chunks_per_sequence < 1 or not args.chunk_interval_ms > 0:
        return "--sequences and --chunks-per-sequence must be at least 1, --chunk-interval-ms positive"
    if args.concurrency is not None or args.rate is not None or args.sweep or args.requests is not None:
        return "--sequences sets the load itself: leave out -c, --rate, --sweep and -n (-z runs sequences back to back)"
    if args.protocol is not None and args.protocol not in SEQUENCE_PROTOCOLS:
        return f"--sequences speaks {', '.join(SEQUENCE_PROTOCOLS)}, not {args.protocol}"
    if args.search and not 1 <= args.sequences <= args.max_sequences:
        return "--search starts at --sequences, which must be within 1..--max-sequences"
    if args.sequence_id_base is not None and not 1 <= args.sequence_id_base < 2**62:
        return "--sequence-id-base must be within 1..2**62"
    return None


def _bench_sequences(args: argparse.Namespace, endpoint: Endpoint, tensors: list[Any]) -> int:
    """One run of ``--sequences N``, or the runs of ``--search``."""
    slos: list[Slo] = args.slo or real_time_speech()
    # Ids apart from any other client's (random), and from one run of a search to the next.
    base = args.sequence_id_base or random.SystemRandom().randrange(1, 2**61)
    interval_s = args.chunk_interval_ms / 1000.0
    reports: list[RunReport] = []
    results: list[RunResult] = []

    def one(count: int) -> RunReport:
        spec = SequenceSpec(
            slots=count,
            chunks=args.chunks_per_sequence,
            interval_s=interval_s,
            duration_s=args.duration,
            warmup_s=args.warmup,
            timeout_s=args.timeout,
            first_id=base + len(reports) * 2**40,
        )
        job = Job(args.protocol, endpoint, args.model, args.model_version, spec, tensors)
        before = scrape(args.metrics_url) if args.metrics_url else None
        result = _run_sequences(job, max(1, args.processes))
        results.append(result)
        after = scrape(args.metrics_url) if args.metrics_url else None
        server = metrics_delta(before, after, args.model) if before is not None and after is not None else None
        report = build_report("sequences", count, result, slos, server, (args.chunks_per_sequence, interval_s))
        reports.append(report)
        return report

    if not args.search:
        one(args.sequences)
    else:
        search = StreamSearch(start=args.sequences, limit=args.max_sequences)
        while (count := search.next()) is not None:
            report = one(count)
            search.record(count, report.slos_met and not report.errors and report.successes > 0)
    print(render_table(reports))
    if args.search:
        print(search_summary(search.sustained, search.failed, [s.text for s in slos]))
    for note in [n for r in reports for n in warnings(r)]:
        print(f"warning: {note}", file=sys.stderr)
    _write(args, reports, results[-1])
    if args.search and args.json is not None:
        document = json.loads(args.json.read_text())
        document["search"] = {
            "sustained": search.sustained,
            "first_failed": search.failed,
            "slos": [s.text for s in slos],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.search:
        return 0 if search.sustained else SLO_MISSED
    if not reports[0].slos_met:
        return SLO_MISSED
    return 0 if reports[0].successes else 1


def _run_sequences(job: Job, processes: int) -> RunResult:
    if processes > 1:
        return run_processes(job, processes)
    assert isinstance(job.spec, SequenceSpec)
    spec = job.spec
    planned = (spec.duration_s or spec.chunks * spec.interval_s) + spec.warmup_s
    progress = Progress(MonotonicClock(), planned) if Progress.wanted() else None
    return execute(job, progress)
