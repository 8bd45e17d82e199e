"""The gRPC transport's kept header blocks against the ``hpack`` package alone, per call.

``tensorgate/protocols/grpc/http2/header_blocks.py`` wraps ``hpack``'s Encoder and Decoder and keeps
the blocks that repeat from call to call. One connection's header work per unary call, as a gRPC
client's calls give it: decode the request's block (a client's repeated headers and a fresh
``x-request-id``), encode the response headers and the trailers (with that request id). Both
sides code the same header lists in one process, in alternating rounds; the figure is
microseconds per call, and the ratio of the two in each round.

Run: ``python benchmarks/bench_hpack.py [--calls 20000] [--rounds 5]``; writes
``benchmarks/out/bench_hpack.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hpack import Decoder, Encoder

from tensorgate.protocols.grpc.http2.header_blocks import HeaderBlocks, Headers

OUT = Path(__file__).parent / "out"
STEM = Path(__file__).stem

REQUEST: Headers = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/inference.GRPCInferenceService/ModelInfer"),
    (":authority", "127.0.0.1:8001"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
    ("grpc-accept-encoding", "identity,deflate,gzip"),
    ("user-agent", "grpc-python/1.81.1 grpc-c/51.0.0 (linux; chttp2)"),
]
RESPONSE: Headers = [(":status", "200"), ("content-type", "application/grpc"), ("grpc-accept-encoding", "gzip")]


def request_blocks(calls: int) -> list[bytes]:
    """What a client's encoder sends for ``calls`` calls on one connection, each with its request id."""
    client = Encoder()
    return [client.encode([*REQUEST, ("x-request-id", f"req-{i:08d}")]) for i in range(calls)]


def per_call_us(blocks: list[bytes], decode: Callable[[bytes], object], encode: Callable[[Headers], bytes]) -> float:
    started = time.perf_counter()
    for index, block in enumerate(blocks):
        decode(block)
        encode(RESPONSE)
        encode([("grpc-status", "0"), ("x-request-id", f"req-{index:08d}")])
    return (time.perf_counter() - started) / len(blocks) * 1e6


def plain(blocks: list[bytes]) -> float:
    decoder, encoder = Decoder(), Encoder()
    return per_call_us(blocks, decoder.decode, encoder.encode)


def kept(blocks: list[bytes]) -> float:
    coder = HeaderBlocks()
    return per_call_us(blocks, coder.decode, coder.encode)


def check_same(blocks: list[bytes]) -> None:
    """Both coders read the client's blocks alike, and each reads back what the other writes."""
    ours, theirs = HeaderBlocks(), Decoder()
    for block in blocks:
        if [tuple(f) for f in ours.decode(block)] != [tuple(f) for f in theirs.decode(block)]:
            raise AssertionError("the kept blocks decode a request otherwise than hpack")
    encoder, reader = HeaderBlocks(), Decoder()
    for index in range(len(blocks)):
        trailers = [("grpc-status", "0"), ("x-request-id", f"req-{index:08d}")]
        for fields in (RESPONSE, trailers):
            if [tuple(f) for f in reader.decode(encoder.encode(fields))] != fields:
                raise AssertionError("hpack reads back other fields than the kept blocks wrote")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    blocks = request_blocks(args.calls)
    check_same(blocks[:200])
    results: dict[str, list[float]] = {"hpack": [], "kept blocks": []}
    for index in range(args.rounds):
        order = [("hpack", plain), ("kept blocks", kept)]
        for name, run in order if index % 2 == 0 else order[::-1]:
            results[name].append(run(blocks))
    ratios = [a / b for a, b in zip(results["hpack"], results["kept blocks"], strict=True)]
    lines = [
        f"## HPACK: kept header blocks against the hpack package alone ({STEM}.py)",
        "",
        f"One connection's header work per unary gRPC call (decode the request's block, encode the response "
        f"headers and the trailers), {args.calls:,} calls per run, {args.rounds} rounds alternating, in one "
        "process. Microseconds per call, median over rounds.",
        "",
        "| coder | µs per call | rounds |",
        "|---|---:|---|",
        *(
            f"| {name} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |"
            for name, values in results.items()
        ),
        "",
        f"- hpack / kept blocks: **{statistics.median(ratios):.1f}x** (rounds {min(ratios):.1f}-{max(ratios):.1f}).",
        "",
    ]
    text = "\n".join(lines)
    (OUT / f"{STEM}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
