"""Writes the fuzzers' seed corpus, ``tests/fuzz/corpus/``: small valid requests of every kind a
client can send, which the fuzz targets mutate. Deterministic; run it again after changing it:

    .venv/bin/python tests/fuzz/make_corpus.py

Layout (one directory per decoder; a file's stem starts with the model it is meant for, which the
live fuzz test, ``tests/e2e/test_fuzz_live.py``, uses to pick the URL):

- ``v2_json/*.json``: V2 JSON infer bodies;
- ``v2_binary/*.bin``: V2 bodies with Triton's binary extension; the JSON header is the first JSON
  value of the file, so its length (``Inference-Header-Content-Length``) is where that value ends;
- ``v1/*.json``: V1 ``:predict`` bodies;
- ``openai/chat-*.json`` and ``openai/completions-*.json``: OpenAI request bodies;
- ``grpc/*.pb``: serialized ``ModelInferRequest`` messages;
- ``http2/*.bin``: what a gRPC client writes on a connection: the preface, SETTINGS, HEADERS, DATA;
- ``hpack/*.bin``: HPACK header blocks, in the order one connection's decoder would read them.
"""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import numpy as np
from hpack import Encoder

from tensorgate.protocols.grpc.generated import grpc_service_pb2 as pb
from tensorgate.protocols.grpc.http2 import frames as f
from tensorgate.protocols.grpc.http2.header_blocks import HeaderBlocks

CORPUS = Path(__file__).resolve().parent / "corpus"
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"


def _json(document: object) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def _prefixed(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def v2_json() -> dict[str, bytes]:
    return {
        "echo-flat.json": _json(
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.5, -3.0, 4.0]}]}
        ),
        "echo-nested-outputs.json": _json(
            {
                "id": "req-1",
                "inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [2, 4], "data": [[1, 2, 3, 4], [5, 6, 7, 8]]}
                ],
                "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
                "parameters": {"binary_data_output": False, "priority": 1, "timeout": 5000000},
            }
        ),
        "echo-binary-output.json": _json(
            {
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [0, 0.5, 1e-3, 7]}],
                "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
            }
        ),
        "echo_bytes-text.json": _json(
            {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": ["hello", "wörld ✓"]}]}
        ),
        "mlp-features.json": _json(
            {
                "inputs": [
                    {
                        "name": "features",
                        "datatype": "FP32",
                        "shape": [1, 16],
                        "data": [round(0.1 * i - 0.8, 2) for i in range(16)],
                    }
                ]
            }
        ),
        "pair-two-inputs.json": _json(
            {
                "inputs": [
                    {"name": "a", "datatype": "INT64", "shape": [2, 2], "data": [1, -2, 3, 9007199254740993]},
                    {"name": "b", "datatype": "FP32", "shape": [2, 2], "data": [[0.5, 1.5], [2.5, 3.5]]},
                ],
                "outputs": [{"name": "a_out"}, {"name": "b_out", "parameters": {"binary_data": False}}],
            }
        ),
    }


def v2_binary() -> dict[str, bytes]:
    def body(header: dict[str, object], blob: bytes) -> bytes:
        return _json(header) + blob

    values = np.array([[1.0, -2.0, 3.5, 1e30]], dtype=np.float32)
    texts = [b"alpha", "βeta".encode(), b"", b"\x00\xff"]
    features = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    return {
        "echo-fp32.bin": body(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "datatype": "FP32",
                        "shape": [1, 4],
                        "parameters": {"binary_data_size": values.nbytes},
                    }
                ],
                "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
            },
            values.tobytes(),
        ),
        "echo_bytes-prefixed.bin": body(
            {
                "inputs": [
                    {
                        "name": "TEXT",
                        "datatype": "BYTES",
                        "shape": [4],
                        "parameters": {"binary_data_size": len(_prefixed(texts))},
                    }
                ],
                "parameters": {"binary_data_output": True},
            },
            _prefixed(texts),
        ),
        "pair-mixed.bin": body(
            {
                "inputs": [
                    {"name": "a", "datatype": "INT64", "shape": [1, 2], "parameters": {"binary_data_size": 16}},
                    {"name": "b", "datatype": "FP32", "shape": [1, 2], "data": [0.25, -0.25]},
                ]
            },
            np.array([7, -7], dtype="<i8").tobytes(),
        ),
        "mlp-batch.bin": body(
            {
                "inputs": [
                    {
                        "name": "features",
                        "datatype": "FP32",
                        "shape": [2, 16],
                        "parameters": {"binary_data_size": features.nbytes},
                    }
                ],
                "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
            },
            features.tobytes(),
        ),
    }


def v1() -> dict[str, bytes]:
    return {
        "echo-instances.json": _json({"instances": [[1, 2, 3, 4], [0.5, 0.25, 0.125, 0]]}),
        "echo-inputs.json": _json({"inputs": [[9, 8, 7, 6]]}),
        "echo_bytes-instances.json": _json({"instances": ["plain text", {"b64": "AAEC/w=="}]}),
        "pair-named.json": _json({"instances": [{"a": [1, 2], "b": [0.5, 1.5]}, {"a": [3, 4], "b": [2.5, 3.5]}]}),
        "pair-columns.json": _json({"inputs": {"a": [[1, 2]], "b": [[0.5, 0.75]]}}),
        "mlp-instances.json": _json({"instances": [[0.0625 * i for i in range(16)]]}),
    }


def openai() -> dict[str, bytes]:
    return {
        "chat-simple.json": _json(
            {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0}
        ),
        "chat-parts-stream.json": _json(
            {
                "model": "tiny",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": " two"}]},
                    {"role": "assistant", "content": None},
                ],
                "stream": True,
                "stream_options": {"include_usage": True},
                "n": 2,
                "seed": 11,
                "stop": ["\n", "END"],
                "logprobs": True,
                "top_logprobs": 2,
                "max_completion_tokens": 16,
                "top_p": 0.9,
                "top_k": 40,
            }
        ),
        "completions-text.json": _json(
            {"model": "tiny", "prompt": "the cat", "max_tokens": 4, "logprobs": 1, "echo": False, "stop": "."}
        ),
        "completions-batch.json": _json(
            {"model": "tiny", "prompt": ["a b", "c d"], "n": 1, "temperature": 1.5, "seed": 3, "priority": 2}
        ),
        "completions-token-ids.json": _json({"model": "tiny", "prompt": [[1, 2, 3], [4, 5]], "ignore_eos": True}),
    }


def grpc_requests() -> dict[str, bytes]:
    out: dict[str, pb.ModelInferRequest] = {}
    m = pb.ModelInferRequest(model_name="echo", id="g-1")
    m.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4]).contents.fp32_contents.extend([1, 2, 3, 4])
    out["echo-contents.pb"] = m
    m = pb.ModelInferRequest(model_name="echo", model_version="1")
    m.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 4])
    m.raw_input_contents.append(np.arange(8, dtype="<f4").tobytes())
    m.outputs.add(name="OUTPUT0").parameters["binary_data"].bool_param = True
    out["echo-raw.pb"] = m
    m = pb.ModelInferRequest(model_name="echo_bytes")
    m.inputs.add(name="TEXT", datatype="BYTES", shape=[2]).contents.bytes_contents.extend([b"hi", b"\x00\x01"])
    out["echo_bytes-contents.pb"] = m
    m = pb.ModelInferRequest(model_name="echo_bytes")
    m.inputs.add(name="TEXT", datatype="BYTES", shape=[3])
    m.raw_input_contents.append(_prefixed([b"x", b"", "ü".encode()]))
    out["echo_bytes-raw.pb"] = m
    m = pb.ModelInferRequest(model_name="pair", id="pair-7")
    m.inputs.add(name="a", datatype="INT64", shape=[1, 2]).contents.int64_contents.extend([5, -5])
    m.inputs.add(name="b", datatype="FP32", shape=[1, 2]).contents.fp32_contents.extend([0.5, 2.0])
    m.outputs.add(name="a_out")
    m.parameters["priority"].int64_param = 1
    m.parameters["timeout"].int64_param = 2_000_000
    out["pair-contents-params.pb"] = m
    m = pb.ModelInferRequest(model_name="mlp", model_version="1")
    m.inputs.add(name="features", datatype="FP32", shape=[1, 16])
    m.raw_input_contents.append(np.linspace(0, 1, 16, dtype="<f4").tobytes())
    out["mlp-raw.pb"] = m
    return {name: message.SerializeToString() for name, message in out.items()}


def _request_headers(path: str = INFER_PATH, **extra: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "127.0.0.1"),
        ("te", "trailers"),
        ("content-type", "application/grpc"),
        ("user-agent", "fuzz/1"),
        *extra.items(),
    ]


def _message(payload: bytes, compressed: bool = False) -> bytes:
    return (b"\x01" if compressed else b"\x00") + struct.pack(">I", len(payload)) + payload


def http2() -> dict[str, bytes]:
    request = grpc_requests()["echo-raw.pb"]
    start = f.PREFACE + f.settings({f.INITIAL_WINDOW_SIZE: 1 << 20, f.MAX_FRAME_SIZE: 1 << 16})
    ack = f.frame(f.SETTINGS, f.ACK, 0)
    out: dict[str, bytes] = {}

    enc = Encoder()
    out["infer-one-call.bin"] = (
        start
        + ack
        + f.frame(f.HEADERS, f.END_HEADERS, 1, enc.encode(_request_headers(**{"grpc-timeout": "5S"})))
        + f.frame(f.DATA, f.END_STREAM, 1, _message(request))
    )

    enc = Encoder()
    block = enc.encode(_request_headers("/test.Echo/Unary", **{"grpc-encoding": "gzip", "x-request-id": "r-1"}))
    out["echo-gzip-continuation.bin"] = (
        start
        + f.frame(f.HEADERS, 0, 1, block[:10])
        + f.frame(f.CONTINUATION, f.END_HEADERS, 1, block[10:])
        + f.window_update(0, 1 << 20)
        + f.frame(f.DATA, f.END_STREAM, 1, _message(gzip.compress(b"compress me" * 20), compressed=True))
        + f.frame(f.PING, 0, 0, b"12345678")
    )

    enc = Encoder()
    padded = bytes([3]) + _message(b"echo this") + b"\0\0\0"
    priority = struct.pack(">IB", 0, 15)
    out["echo-two-streams.bin"] = (
        start
        + f.frame(
            f.HEADERS, f.END_HEADERS | f.PRIORITY_FLAG, 1, priority + enc.encode(_request_headers("/test.Echo/Unary"))
        )
        + f.frame(f.DATA, f.END_STREAM | f.PADDED, 1, padded)
        + f.frame(f.HEADERS, f.END_HEADERS, 3, enc.encode(_request_headers("/test.Echo/Unary")))
        + f.frame(f.DATA, 0, 3, _message(b"first half"))
        + f.window_update(3, 4096)
        + f.frame(f.PRIORITY, 0, 3, struct.pack(">IB", 1, 200))
        + f.frame(f.DATA, f.END_STREAM, 3, _message(b"second"))
        + f.goaway(3, f.ErrorCode.NO_ERROR)
    )

    enc = Encoder()
    out["infer-reset.bin"] = (
        start
        + f.frame(f.HEADERS, f.END_HEADERS, 1, enc.encode(_request_headers()))
        + f.frame(f.DATA, 0, 1, _message(request)[:12])
        + f.rst_stream(1, f.ErrorCode.CANCEL)
        + f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 5, enc.encode(_request_headers("/test.Echo/Missing")))
    )
    return out


def hpack_blocks() -> dict[str, bytes]:
    """Blocks 01-03 come from one encoder, in order (each refers to the table the ones before built)."""
    ours = HeaderBlocks()
    request = _request_headers(**{"grpc-timeout": "100m"})
    first = ours.encode(request)  # literals, entering the dynamic table
    with_literals = ours.encode([*request, ("x-request-id", "abc-123"), ("traceparent", "00-x")])
    again = ours.encode(request)  # only references now: the block the decoder keeps
    plain = Encoder()
    raw = plain.encode([(":status", "200"), ("content-type", "application/grpc")], huffman=False)
    return {
        "01-request-first.bin": first,
        "02-references-and-literals.bin": with_literals,
        "03-request-again.bin": again,
        "04-size-update.bin": b"\x3f\xe1\x1f" + raw,  # a dynamic table size update to 4096, then fields
        "05-never-indexed.bin": b"\x10\x0dauthorization\x06secret" + b"\x82",
    }


def main() -> None:
    groups = {
        "v2_json": v2_json(),
        "v2_binary": v2_binary(),
        "v1": v1(),
        "openai": openai(),
        "grpc": grpc_requests(),
        "http2": http2(),
        "hpack": hpack_blocks(),
    }
    for group, files in groups.items():
        folder = CORPUS / group
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.iterdir():
            if stale.name not in files:
                stale.unlink()
        for name, data in files.items():
            (folder / name).write_bytes(data)
    print(f"wrote {sum(len(files) for files in groups.values())} files under {CORPUS}")


if __name__ == "__main__":
    main()
