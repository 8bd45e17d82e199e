"""The fuzz targets: every decoder a client's bytes reach, each with the inputs to throw at it.

A target is a function from one generated example to nothing: it runs the decoder the way the
server runs it (the same entry point, limits and follow-up validation) and either returns (the
input decoded) or raises. :func:`check` holds the property every target must keep: an input
either decodes or is refused with the project's client error for that layer (a
:class:`~tensorgate.errors.TensorgateError` whose code maps to a 4xx / a client gRPC status, an
HPACK error; the HTTP/2 connection handles its own errors, so there it is a GOAWAY other than
INTERNAL_ERROR, nothing logged as unexpected, and no gRPC call left running once the connection
is gone). Any other exception, a client error with a server code, two decoders that should agree
and do not, or a single example taking longer than :data:`SLOW_EXAMPLE_S` is a failure.

Inputs come from two kinds of strategies, both bounded in size so no example can hang:

- mutations of the seed corpus (``tests/fuzz/corpus``, written by ``make_corpus.py``): bytes
  flipped, set, inserted (including tokens that matter to the format), deleted, duplicated,
  truncated;
- structured documents of the right shape with wrong types, huge or negative numbers, NaN and
  Infinity tokens, deep nesting, unicode and NUL bytes.

Used by ``tests/fuzz/test_fuzz_decoders.py`` (bounded for CI) and ``benchmarks/bench_fuzz.py``
(throughput); ``tests/e2e/test_fuzz_live.py`` sends the corpus, mutated the same ways (drawn from
a seeded ``random.Random``, which is faster), to a live server.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import logging
import math
import struct
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
from google.protobuf.message import DecodeError
from hpack import Decoder, Encoder, HPACKError
from hypothesis import strategies as st

from tensorgate.errors import ErrorCode, InvalidInput, TensorgateError
from tensorgate.models.validation import TensorRules
from tensorgate.protocols.grpc import codec as grpc_codec
from tensorgate.protocols.grpc.call import CallSettings, open_call
from tensorgate.protocols.grpc.generated import grpc_service_pb2 as pb
from tensorgate.protocols.grpc.http2 import frames as f
from tensorgate.protocols.grpc.http2.connection import Http2Limits, Http2ServerConnection
from tensorgate.protocols.grpc.http2.header_blocks import HeaderBlocks
from tensorgate.protocols.grpc.methods import MethodTable
from tensorgate.protocols.grpc.raw_inputs import ReceivedInfer, receive_infer_request
from tensorgate.protocols.http.json_tensors import MIN_FAST_BYTES
from tensorgate.protocols.http.openai_codec import ChatRequest, CompletionRequest, parse
from tensorgate.protocols.http.openai_routes import _prompts
from tensorgate.protocols.http.v1_codec import decode_predict
from tensorgate.protocols.http.v2_codec import DecodeLimits, decode_infer, loads_object, parse_header_length
from tensorgate.types import DataType, InferRequest, TensorSpec

CORPUS = Path(__file__).resolve().parent / "corpus"
# The largest example a mutation may grow to (the large-body seeds of the V2 fast path aside).
MAX_BYTES = 8192
# One example taking longer than this is a failure: a decoder whose cost grows faster than its input.
SLOW_EXAMPLE_S = 5.0

HTTP_LIMITS = DecodeLimits()  # the server's defaults
GRPC_LIMITS = grpc_codec.GrpcLimits()
HTTP2_LIMITS = Http2Limits(max_concurrent_streams=8, stream_window=1 << 16, connection_window=1 << 20)
CALL_SETTINGS = CallSettings(max_receive_bytes=1 << 16, max_send_bytes=1 << 20)
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"

# -- what counts as a client error ----------------------------------------------------------------

# The codes that are the client's doing. NOT_IMPLEMENTED (501 / UNIMPLEMENTED) is the deliberate
# answer for a V2 extension this server does not offer (classification), not a failure of it.
CLIENT_CODES = frozenset(
    {
        ErrorCode.INVALID_ARGUMENT,
        ErrorCode.NOT_FOUND,
        ErrorCode.TOO_LARGE,
        ErrorCode.UNSUPPORTED_MEDIA,
        ErrorCode.PERMISSION_DENIED,
        ErrorCode.METHOD_NOT_ALLOWED,
        ErrorCode.NOT_IMPLEMENTED,
    }
)
# gRPC statuses a malformed request may get; INTERNAL and UNKNOWN are the server's failures.
GRPC_CLIENT_STATUSES = frozenset(
    {
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "UNIMPLEMENTED",
        "RESOURCE_EXHAUSTED",
        "PERMISSION_DENIED",
        "FAILED_PRECONDITION",
        "OUT_OF_RANGE",
    }
)


def is_client_error(exc: BaseException) -> bool:
    return isinstance(exc, TensorgateError) and exc.code in CLIENT_CODES


def is_grpc_client_error(exc: BaseException) -> bool:
    return isinstance(exc, TensorgateError) and exc.grpc_status in GRPC_CLIENT_STATUSES


def is_hpack_client_error(exc: BaseException) -> bool:
    # What the connection turns into COMPRESSION_ERROR (HPACKError) or a reset stream (bad UTF-8).
    return isinstance(exc, HPACKError | UnicodeDecodeError)


class UnexpectedOutcome(AssertionError):
    """A target's input got an answer that is no client error (or two decoders disagreed)."""


# -- known bugs: reported, not yet fixed (found by a fuzzer in code another change owns) ----------


@dataclass(frozen=True)
class KnownBug:
    """A reported bug the fuzzers find, counted instead of failing until its fix lands.

    Each gets a strict-xfail reproducer in a ``test_known_bugs.py``: once the bug is fixed that test
    passes, which fails the run, and the entry here is to be deleted.
    """

    id: str
    where: str
    summary: str
    matches: Callable[[str, Any, BaseException], bool]


KNOWN_BUGS: tuple[KnownBug, ...] = ()  # none open: each found so far is fixed, with a regression test
KNOWN_HITS: Counter[str] = Counter()


def known_bug(target: str, example: Any, exc: BaseException) -> KnownBug | None:
    return next((bug for bug in KNOWN_BUGS if bug.matches(target, example, exc)), None)


# -- the models the examples are meant for ------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int

    def rules(self, name: str) -> TensorRules:
        return TensorRules(name, self.inputs, self.outputs, self.max_batch_size)


# The live fuzz test serves these (the bundled mlp, and ONNX identities it builds for the others).
MODELS: dict[str, ModelSpec] = {
    "echo": ModelSpec(
        (TensorSpec("INPUT0", DataType.FP32, (-1, 4)),), (TensorSpec("OUTPUT0", DataType.FP32, (-1, 4)),), 64
    ),
    "echo_bytes": ModelSpec(
        (TensorSpec("TEXT", DataType.BYTES, (-1,)),), (TensorSpec("ECHO", DataType.BYTES, (-1,)),), 64
    ),
    "pair": ModelSpec(
        (TensorSpec("a", DataType.INT64, (-1, 2)), TensorSpec("b", DataType.FP32, (-1, 2))),
        (TensorSpec("a_out", DataType.INT64, (-1, 2)), TensorSpec("b_out", DataType.FP32, (-1, 2))),
        64,
    ),
    "mlp": ModelSpec(
        (TensorSpec("features", DataType.FP32, (-1, 16)),), (TensorSpec("probabilities", DataType.FP32, (-1, 3)),), 64
    ),
    # Unbatched, FP16: only the in-process targets use it (V1 reads values as the declared type).
    "half": ModelSpec((TensorSpec("h", DataType.FP16, (2,)),), (TensorSpec("h_out", DataType.FP16, (2,)),), 0),
}
RULES = {name: spec.rules(name) for name, spec in MODELS.items()}
INPUT_NAMES = sorted({s.name for spec in MODELS.values() for s in spec.inputs})
OUTPUT_NAMES = sorted({s.name for spec in MODELS.values() for s in spec.outputs})


def model_of(seed_name: str) -> str:
    """The model a corpus file is meant for: its stem up to the first '-'."""
    return seed_name.split("-", 1)[0]


def validate(request: InferRequest) -> None:
    """What the core does with a decoded request first: check it against the model it names (the
    model whose input names it uses, here, since the examples are not sent to one)."""
    names = set(request.inputs)
    model = next((name for name, spec in MODELS.items() if {s.name for s in spec.inputs} == names), "echo")
    RULES[model].check_inputs(request.inputs)
    RULES[model].check_outputs(request.outputs)


# -- the corpus ---------------------------------------------------------------------------------


def corpus(group: str) -> list[tuple[str, bytes]]:
    """(file name, bytes) of one corpus directory, sorted by name."""
    folder = CORPUS / group
    return [(path.name, path.read_bytes()) for path in sorted(folder.iterdir()) if path.is_file()]


def header_length(body: bytes) -> int:
    """Where the JSON header of a binary-extension body ends (the corpus stores bodies only)."""
    _, end = json.JSONDecoder().raw_decode(body.decode("latin-1"))  # latin-1: one char per byte
    return end


# -- mutations ----------------------------------------------------------------------------------

JSON_TOKENS = [
    b"[",
    b"]",
    b"{",
    b"}",
    b'"',
    b",",
    b":",
    b"-",
    b"0",
    b"1e999",
    b"-1e999",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"null",
    b"true",
    b"false",
    b"\x00",
    b"\xff",
    b"\xc3",
    b"\\u0000",
    b'"\\ud800"',
    b"18446744073709551616",
    b"-9223372036854775809",
    b"99999999999999999999999999",
    b"-1",
    b"1.5",
    b"1e-400",
    b"[[[[[[[[[[[[[[[[",
    b"]]]]]]]]",
    b"{}",
    b"[]",
    b'""',
    b'"data"',
    b'"shape"',
    b'"datatype"',
    b'"name"',
    b'"inputs"',
    b'"outputs"',
    b'"parameters"',
    b'"binary_data_size"',
    b'"binary_data"',
    b'"binary_data_output"',
    b'"shared_memory_region"',
    b'"classification"',
    b'"priority"',
    b'"timeout"',
    b'"BYTES"',
    b'"FP16"',
    b'"BOOL"',
    b'"UINT64"',
    b'"instances"',
    b'"b64"',
    b'"messages"',
    b'"prompt"',
    b'"model"',
    b'"role"',
    b'"content"',
    b'"stream"',
]
# Bytes that mean something in protobuf's wire format: field keys of ModelInferRequest and its
# tensors, varint continuations, lengths, and group wire types.
PROTO_TOKENS = [
    b"\x0a",
    b"\x12",
    b"\x1a",
    b"\x22",
    b"\x2a",
    b"\x32",
    b"\x3a",
    b"\x3a\x00",
    b"\x3a\xff\xff\xff\xff\x0f",
    b"\x1a\x10\x08\x03",
    b"\x80",
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
    b"\x0b",
    b"\x0c",
    b"\x00",
    b"\x7f",
    b"\x01\x00\x00\x00",
]
HTTP2_TOKENS = [
    f.PREFACE,
    f.frame(f.SETTINGS, 0, 0),
    f.frame(f.SETTINGS, f.ACK, 0),
    f.frame(f.PING, 0, 0, b"\0" * 8),
    f.window_update(0, 1),
    f.window_update(1, 0x7FFF_FFFF),
    f.rst_stream(1, f.ErrorCode.CANCEL),
    f.frame(f.CONTINUATION, 0, 1, b"\x82"),
    f.frame(f.DATA, f.END_STREAM, 1, b"\0\0\0\0\0"),
    f.frame(f.HEADERS, f.END_HEADERS, 3, b"\x83\x86"),
    b"\x00\x00\x00",
    b"\xff\xff\xff",
    b"\x00\x00\x05\x00\x01\x00\x00\x00\x01",
    b"\x80",
    b"\x3f\xe1\x1f",
    b"\x40\x00",
    b"\x00\x7f",
    b"\x01",
    b"\x08",
    b"\x28",
]


def _ops(tokens: Sequence[bytes]) -> st.SearchStrategy[tuple[str, int, Any]]:
    pos = st.integers(min_value=0, max_value=1 << 20)
    return st.one_of(
        st.tuples(st.just("flip"), pos, st.integers(0, 7)),
        st.tuples(st.just("set"), pos, st.integers(0, 255)),
        st.tuples(st.just("insert"), pos, st.sampled_from(tokens)),
        st.tuples(st.just("insert"), pos, st.binary(min_size=1, max_size=8)),
        st.tuples(st.just("delete"), pos, st.integers(1, 16)),
        st.tuples(st.just("duplicate"), pos, st.integers(1, 64)),
        st.tuples(st.just("truncate"), pos, st.just(0)),
    )


def mutate(data: bytes, ops: Sequence[tuple[str, int, Any]], max_bytes: int = MAX_BYTES) -> bytes:
    buf = bytearray(data)
    for kind, pos, arg in ops:
        size = len(buf)
        at = pos % (size + 1)
        if kind == "flip" and size:
            buf[at % size] ^= 1 << arg
        elif kind == "set" and size:
            buf[at % size] = arg
        elif kind == "insert":
            buf[at:at] = arg
        elif kind == "delete":
            del buf[at : at + arg]
        elif kind == "duplicate":
            buf[at:at] = buf[at : at + arg]
        elif kind == "truncate":
            del buf[at:]
        if len(buf) > max_bytes:
            del buf[max_bytes:]
    return bytes(buf)


def mutated(seeds: Sequence[bytes], tokens: Sequence[bytes], max_ops: int = 6) -> st.SearchStrategy[bytes]:
    """A seed with 1..max_ops mutations applied."""
    seeds = list(seeds)
    limit = max(MAX_BYTES, *(len(s) for s in seeds))
    return st.builds(  # seeds by index: a strategy holding large bytes would have a large repr
        lambda index, ops: mutate(seeds[index], ops, limit),
        st.integers(0, len(seeds) - 1),
        st.lists(_ops(tokens), min_size=1, max_size=max_ops),
    )


# -- structured JSON ------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "\x00", "NaN", "1", "FP32", "BYTES", "\ud7ff\U0010ffff", "a\u0000b", "ñ"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


def deep(depth: int, leaf: Any = 0, kind: str = "list") -> Any:
    node = leaf
    for _ in range(depth):
        node = [node] if kind == "list" else {"k": node}
    return node


deep_values = st.builds(deep, st.integers(1, 160), scalars, st.sampled_from(["list", "dict"]))


def maybe(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a value of the right shape; sometimes any JSON value, or a deeply nested one."""
    return st.one_of(good, good, good, good, good, good, json_values, deep_values)


def dumps(document: Any, ascii_only: bool) -> bytes:
    """Stdlib JSON: writes NaN and Infinity tokens and integers past 64 bits, which orjson refuses."""
    return json.dumps(document, allow_nan=True, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def json_bodies(documents: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return st.builds(dumps, documents, st.booleans())


def _paths(document: Any, limit: int = 256) -> list[tuple[Any, ...]]:
    """Nodes of a JSON document by their path of keys and indexes, breadth first, at most ``limit``."""
    out: list[tuple[Any, ...]] = []
    queue: list[tuple[Any, tuple[Any, ...]]] = [(document, ())]
    while queue and len(out) < limit:
        node, path = queue.pop(0)
        out.append(path)
        if isinstance(node, dict):
            queue += [(child, (*path, key)) for key, child in node.items()]
        elif isinstance(node, list):
            queue += [(child, (*path, index)) for index, child in enumerate(node)]
    return out


def edit_tree(seed: bytes, edits: Sequence[tuple[int, str, Any]]) -> Any:
    """The JSON document ``seed`` with each edit applied at the node its index picks: ``replace`` the
    node, ``delete`` it, ``add`` a sibling (a list item, or a key of an object), ``wrap`` it in a list."""
    document = json.loads(seed)
    for index, kind, shared in edits:
        value = json.loads(json.dumps(shared))  # a fresh copy: the same list twice would make a cycle
        paths = _paths(document)
        path = paths[index % len(paths)]
        if not path:
            document = value if kind == "replace" else [document] if kind == "wrap" else document
            continue
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        if kind == "replace":
            parent[key] = value
        elif kind == "delete":
            del parent[key]
        elif kind == "add":
            if isinstance(parent, list):
                parent.insert(key, value)
            else:
                parent[f"{key}_{len(parent)}"] = value
        elif kind == "wrap":
            parent[key] = [parent[key]]
    return document


# Values that mean something to a decoder, put where they are least expected.
POINTED_VALUES = [
    None,
    True,
    0,
    -1,
    2**31,
    2**53 + 1,
    2**63,
    2**64,
    -(2**63) - 1,
    10**30,
    1.5,
    float("nan"),
    float("inf"),
    -float("inf"),
    "",
    "\x00",
    "FP16",
    "BYTES",
    "BOOL",
    "UINT64",
    [],
    {},
    [[]],
    [0, [1]],
    {"b64": "!!"},
    {"b64": "AAEC"},
    [2**62, 0],
    [0, 2**62],
    [-1, 4],
]
tree_values = st.one_of(st.sampled_from(POINTED_VALUES), st.sampled_from(POINTED_VALUES), json_values, deep_values)
tree_edits = st.lists(
    st.tuples(st.integers(0, 1 << 16), st.sampled_from(["replace", "replace", "delete", "add", "wrap"]), tree_values),
    min_size=1,
    max_size=3,
)


def edited(seeds: Sequence[bytes]) -> st.SearchStrategy[bytes]:
    """JSON seeds with their structure kept and 1..3 values changed: right shape, wrong content."""
    seeds = list(seeds)
    return st.builds(
        lambda index, edits, ascii_only: dumps(edit_tree(seeds[index], edits), ascii_only),
        st.integers(0, len(seeds) - 1),
        tree_edits,
        st.booleans(),
    )


DATATYPES = [dt.value for dt in DataType]
dims = st.one_of(
    st.integers(0, 4),
    st.integers(0, 4),
    st.integers(-3, 2**64),
    st.sampled_from([2**28, 2**31, 2**62, 2**63 - 1, 2**63, -(2**63), -1]),
)
shapes = st.lists(dims, max_size=5) | st.lists(st.integers(1, 2), min_size=30, max_size=40)
numbers = st.one_of(
    st.integers(-300, 300),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.booleans(),
)
elements = st.one_of(numbers, numbers, numbers, st.text(max_size=6), st.none())
data_lists = st.one_of(
    st.lists(elements, max_size=12),
    st.lists(st.lists(elements, max_size=4), max_size=4),
    st.lists(st.fixed_dictionaries({"b64": st.text(max_size=8)}), max_size=3),
)


@st.composite
def consistent_input(draw: st.DrawFn) -> dict[str, Any]:
    """An input whose data holds as many elements as its shape: it gets past the count checks."""
    shape = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    count = math.prod(shape)
    node: dict[str, Any] = {
        "name": draw(st.sampled_from(INPUT_NAMES)),
        "datatype": draw(st.sampled_from(DATATYPES)),
        "shape": shape,
        "data": draw(st.lists(elements, min_size=count, max_size=count)),
    }
    if draw(st.booleans()):
        node["parameters"] = draw(param_objects)
    return node


param_objects = st.fixed_dictionaries(
    {},
    optional={
        "binary_data_size": maybe(st.integers(-2, 64)),
        "binary_data": maybe(st.booleans()),
        "shared_memory_region": maybe(st.text(max_size=6)),
        "shared_memory_byte_size": maybe(st.integers(0, 64)),
        "shared_memory_offset": maybe(st.integers(-1, 64)),
        "classification": maybe(st.integers(0, 3)),
        "priority": maybe(st.integers(-1, 2**64)),
        "timeout": maybe(st.integers(-1, 2**64)),
        "binary_data_output": maybe(st.booleans()),
        "sequence_id": json_values,
    },
)
v2_input_nodes = st.one_of(
    st.fixed_dictionaries(
        {
            "name": maybe(st.sampled_from(INPUT_NAMES) | st.text(max_size=6)),
            "datatype": maybe(st.sampled_from([*DATATYPES, "FP99", "fp32", "", "BF16"])),
            "shape": maybe(shapes),
        },
        optional={"data": maybe(data_lists), "parameters": maybe(param_objects)},
    ),
    consistent_input(),
    consistent_input(),
    st.fixed_dictionaries(
        {},
        optional={"name": json_values, "datatype": json_values, "shape": json_values, "data": json_values},
    ),
)
v2_output_nodes = st.fixed_dictionaries(
    {"name": maybe(st.sampled_from(OUTPUT_NAMES) | st.text(max_size=6))},
    optional={"parameters": maybe(param_objects)},
)
v2_documents = st.fixed_dictionaries(
    {"inputs": maybe(st.lists(v2_input_nodes, max_size=3))},
    optional={
        "outputs": maybe(st.lists(v2_output_nodes, max_size=3)),
        "parameters": maybe(param_objects),
        "id": maybe(st.text(max_size=8)),
        "extra": json_values,
    },
) | st.dictionaries(st.text(max_size=8), json_values, max_size=3)


# -- V2 JSON ------------------------------------------------------------------------------------


def _large_seeds() -> list[bytes]:
    """Bodies past MIN_FAST_BYTES, which take the simdjson fast path (json_tensors.py)."""
    rng = np.random.default_rng(3)
    rows = 2500
    floats = np.round(rng.standard_normal((rows, 4)), 4).astype(np.float32)
    documents = [
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, 4], "data": floats.ravel().tolist()}]},
        {
            "inputs": [
                {"name": "a", "datatype": "INT64", "shape": [rows * 2, 2], "data": list(range(-rows * 2, rows * 2))},
                {"name": "b", "datatype": "FP32", "shape": [rows * 2, 2], "data": [0.5] * rows * 4},
            ],
            "id": "large",
        },
        {"inputs": [{"name": "INPUT0", "datatype": "UINT8", "shape": [rows * 16], "data": [7] * rows * 16}]},
    ]
    out = [orjson.dumps(document) for document in documents]
    assert all(len(body) >= MIN_FAST_BYTES for body in out)
    return out


LARGE_V2 = _large_seeds()


def _decoded_equal(a: InferRequest, b: InferRequest) -> bool:
    if a.inputs.keys() != b.inputs.keys() or a.outputs != b.outputs or a.parameters != b.parameters:
        return False
    for name, x in a.inputs.items():
        y = b.inputs[name]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.dtype == object:
            if x.tolist() != y.tolist():
                return False
        elif not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
            return False
    return True


def _decode_v2(body: bytes | memoryview, length: int | None) -> tuple[InferRequest | None, TensorgateError | None]:
    try:
        request, _ = decode_infer(body, length, "m", None, HTTP_LIMITS)
    except TensorgateError as exc:
        return None, exc
    return request, None


def run_v2_json(body: bytes) -> None:
    """A V2 JSON body as ``HttpApp._infer_v2`` decodes it (no binary header), then validated."""
    request, error = _decode_v2(body, None)
    if len(body) >= MIN_FAST_BYTES:
        # The fast path promises to change neither what a request means nor which error it gets;
        # a memoryview takes the general decoder.
        general, general_error = _decode_v2(memoryview(body), None)
        same = (
            (request is None) == (general is None)
            and (
                error is None
                or general_error is None
                or (type(error), error.message) == (type(general_error), general_error.message)
            )
            and (request is None or general is None or _decoded_equal(request, general))
        )
        if not same:
            raise UnexpectedOutcome(f"fast path {request or error!r} != general decoder {general or general_error!r}")
    if error is not None:
        raise error
    assert request is not None
    validate(request)


v2_json_examples = st.one_of(
    mutated([seed for _, seed in corpus("v2_json")], JSON_TOKENS, max_ops=3),
    edited([seed for _, seed in corpus("v2_json")]),
    edited([seed for _, seed in corpus("v2_json")]),
    json_bodies(v2_documents),
    json_bodies(v2_documents),
    st.sampled_from([seed for _, seed in corpus("v2_json")]),
    mutated(LARGE_V2, JSON_TOKENS, max_ops=3),
)


# -- V2 binary extension ------------------------------------------------------------------------

HEADER_LENGTH_JUNK = [
    "",
    " ",
    "abc",
    "-1",
    "+5",
    "1.5",
    "0x10",
    "1e3",
    "99999999999",
    "9" * 40,
    "1 2",
    "\t12 ",
    "0",
    "00000000000016",
    "\xb2",  # latin-1 superscript two: str.isdigit() says yes, int() says no
    "1\xb3",
]
latin1_text = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=255), max_size=8)


@st.composite
def binary_bodies(draw: st.DrawFn) -> tuple[bytes, str | None]:
    """A JSON header and its binary tail, with an Inference-Header-Content-Length (right or not)."""
    blobs = draw(st.lists(st.binary(max_size=48), min_size=1, max_size=3))
    nodes = []
    for blob in blobs:
        size = len(blob) + draw(st.sampled_from([0, 0, 0, 0, -1, 1, -len(blob) - 1, 2**40]))
        nodes.append(
            {
                "name": draw(st.sampled_from(INPUT_NAMES)),
                "datatype": draw(st.sampled_from(DATATYPES)),
                "shape": draw(st.lists(st.integers(0, 12), max_size=3)),
                "parameters": {"binary_data_size": draw(maybe(st.just(size)))},
            }
        )
    document: dict[str, Any] = {"inputs": draw(st.one_of(st.just(nodes), maybe(st.just(nodes))))}
    if draw(st.booleans()):
        document["outputs"] = draw(st.lists(v2_output_nodes, max_size=2))
    header = dumps(document, draw(st.booleans()))
    body = header + b"".join(blobs) + draw(st.sampled_from([b"", b"", b"\x00", b"trailing bytes"]))
    value = draw(
        st.one_of(
            st.just(str(len(header))),
            st.just(str(len(header))),
            st.builds(lambda d: str(max(0, len(header) + d)), st.integers(-8, 8)),
            st.sampled_from(HEADER_LENGTH_JUNK),
            latin1_text,
            st.none(),
        )
    )
    return body, value


@st.composite
def mutated_binary(draw: st.DrawFn) -> tuple[bytes, str | None]:
    seeds = corpus("v2_binary")
    _, seed = draw(st.sampled_from(seeds))
    length = header_length(seed)
    choice = draw(st.integers(0, 5))
    if choice >= 4:  # the header's values changed, its length told right
        header = dumps(edit_tree(seed[:length], draw(tree_edits)), draw(st.booleans()))
        return header + seed[length:], str(len(header))
    if choice == 0:  # the tail mutated, the header kept
        tail = mutate(seed[length:], draw(st.lists(_ops([b"\x00", b"\xff\xff\xff\xff"]), min_size=1, max_size=4)))
        return seed[:length] + tail, str(length)
    body = mutate(seed, draw(st.lists(_ops(JSON_TOKENS), min_size=1, max_size=5)))
    if choice == 1:
        return body, str(length)
    if choice == 2:
        return body, str(max(0, length + len(body) - len(seed)))
    return body, draw(st.sampled_from(HEADER_LENGTH_JUNK) | latin1_text)


def run_v2_binary(example: tuple[bytes, str | None]) -> None:
    """``HttpApp._infer_v2`` with the header: parse_header_length, then decode_infer with it."""
    body, value = example
    length = parse_header_length(value, len(body))
    request, _ = decode_infer(body, length, "m", None, HTTP_LIMITS)
    validate(request)


v2_binary_examples = st.one_of(
    mutated_binary(),
    mutated_binary(),
    binary_bodies(),
    st.sampled_from([(seed, str(header_length(seed))) for _, seed in corpus("v2_binary")]),
)


# -- V1 ---------------------------------------------------------------------------------------------

v1_rows = st.one_of(
    st.lists(st.lists(elements, max_size=5), max_size=4),
    st.lists(elements, max_size=5),
    st.lists(
        st.dictionaries(st.sampled_from([*INPUT_NAMES, "zz"]), maybe(st.lists(elements, max_size=3)), max_size=3),
        max_size=3,
    ),
    st.lists(st.one_of(st.text(max_size=5), st.fixed_dictionaries({"b64": maybe(st.text(max_size=8))})), max_size=4),
)
v1_documents = st.one_of(
    st.fixed_dictionaries({"instances": maybe(v1_rows)}),
    st.fixed_dictionaries(
        {"inputs": maybe(v1_rows | st.dictionaries(st.sampled_from([*INPUT_NAMES, "zz"]), maybe(v1_rows), max_size=3))}
    ),
    st.fixed_dictionaries({"instances": json_values, "inputs": json_values}),
    st.dictionaries(st.text(max_size=6), json_values, max_size=3),
)


@st.composite
def v1_examples(draw: st.DrawFn) -> tuple[str, bytes]:
    seeds = corpus("v1")
    kind = draw(st.integers(0, 6))
    if kind >= 5:
        name, seed = draw(st.sampled_from(seeds))
        return model_of(name), dumps(edit_tree(seed, draw(tree_edits)), draw(st.booleans()))
    if kind <= 1:
        name, seed = draw(st.sampled_from(seeds))
        model = model_of(name) if draw(st.booleans()) else draw(st.sampled_from(sorted(MODELS)))
        return model, mutate(seed, draw(st.lists(_ops(JSON_TOKENS), min_size=1, max_size=6)))
    if kind == 2:
        name, seed = draw(st.sampled_from(seeds))
        return model_of(name), seed
    return draw(st.sampled_from(sorted(MODELS))), draw(json_bodies(v1_documents))


def run_v1(example: tuple[str, bytes]) -> None:
    """``HttpApp._predict_v1``: the body as a JSON object, read against the model's input specs."""
    model, body = example
    spec = MODELS[model]
    request, _ = decode_predict(loads_object(body, HTTP_LIMITS), model, None, spec.inputs, spec.max_batch_size > 0)
    RULES[model].check_inputs(request.inputs)


# -- OpenAI -----------------------------------------------------------------------------------------

roles = st.sampled_from(["system", "user", "assistant", "tool", "developer"])
messages = st.fixed_dictionaries(
    {"role": maybe(roles)},
    optional={
        "content": maybe(
            st.one_of(
                st.text(max_size=10),
                st.none(),
                st.lists(
                    st.fixed_dictionaries(
                        {"type": maybe(st.just("text"))}, optional={"text": maybe(st.text(max_size=6))}
                    ),
                    max_size=3,
                ),
            )
        ),
        "name": json_values,
    },
)
_sampling = {
    "max_tokens": maybe(st.integers(-1, 2**40)),
    "temperature": maybe(st.floats(-1, 3)),
    "top_p": maybe(st.floats(-0.5, 1.5)),
    "top_k": maybe(st.integers(-3, 100)),
    "n": maybe(st.integers(-1, 20)),
    "stream": maybe(st.booleans()),
    "stop": maybe(st.one_of(st.text(max_size=4), st.lists(st.text(max_size=4), max_size=10), st.none())),
    "seed": maybe(st.integers(-(2**64), 2**64)),
    "ignore_eos": maybe(st.booleans()),
    "priority": maybe(st.integers(-1, 10)),
    "stream_options": maybe(st.fixed_dictionaries({}, optional={"include_usage": json_values})),
}
chat_documents = st.fixed_dictionaries(
    {"model": maybe(st.sampled_from(["tiny", "mlp", "nope"]))},
    optional={
        "messages": maybe(st.lists(messages, max_size=3)),
        "max_completion_tokens": maybe(st.integers(-1, 2**40)),
        "logprobs": maybe(st.booleans()),
        "top_logprobs": maybe(st.integers(-1, 8)),
        **_sampling,
    },
)
completion_documents = st.fixed_dictionaries(
    {"model": maybe(st.sampled_from(["tiny", "mlp", "nope"]))},
    optional={
        "prompt": maybe(
            st.one_of(
                st.text(max_size=10),
                st.lists(st.text(max_size=5), max_size=3),
                st.lists(st.integers(-5, 2**40), max_size=5),
                st.lists(st.lists(st.integers(-5, 50000), max_size=4), max_size=3),
                st.lists(st.one_of(st.integers(0, 9), st.text(max_size=3)), max_size=4),
            )
        ),
        "logprobs": maybe(st.integers(-1, 8)),
        "echo": maybe(st.booleans()),
        **_sampling,
    },
)


@st.composite
def openai_examples(draw: st.DrawFn) -> tuple[str, bytes]:
    kind = draw(st.integers(0, 5))
    if kind >= 4:
        name, seed = draw(st.sampled_from(corpus("openai")))
        return model_of(name), dumps(edit_tree(seed, draw(tree_edits)), draw(st.booleans()))
    if kind <= 1:
        name, seed = draw(st.sampled_from(corpus("openai")))
        route = model_of(name) if kind == 0 or draw(st.booleans()) else draw(st.sampled_from(["chat", "completions"]))
        return route, mutate(seed, draw(st.lists(_ops(JSON_TOKENS), min_size=1, max_size=6)))
    if kind == 2:
        return "chat", draw(json_bodies(chat_documents))
    return "completions", draw(json_bodies(completion_documents))


class _Tokenizer:
    """Stands in for a generative model where the request parsing needs one (prompts as ids)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))[:256]


def run_openai(example: tuple[str, bytes]) -> None:
    """``GenerationRoutes``: ``read_json``'s parse, the pydantic schema, then what the route reads of the
    request before it reaches the model (message texts, prompts, sampling parameters per choice)."""
    route, body = example
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidInput("the request body is not valid JSON") from None
    if not isinstance(document, dict):
        raise InvalidInput("the request body must be a JSON object")
    if route == "chat":
        chat = parse(ChatRequest, document)
        for message in chat.messages:
            message.text()
        top = chat.top_logprobs if chat.logprobs else None
        for index in range(chat.n):
            chat.sampling(16, top, index)
        _ = chat.include_usage
    else:
        completion = parse(CompletionRequest, document)
        _prompts(_Tokenizer(), completion.prompt)  # type: ignore[arg-type]
        for index in range(completion.n):
            completion.sampling(16, completion.logprobs, index)
        _ = completion.include_usage


# -- gRPC ModelInferRequest ---------------------------------------------------------------------

int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@st.composite
def infer_parameters(draw: st.DrawFn, target: Any) -> None:
    keys = st.sampled_from(["priority", "timeout", "binary_data", "shared_memory_region", "classification", "x"])
    for key in draw(st.lists(keys | st.text(max_size=5), max_size=3)):
        kind = draw(st.sampled_from(["bool_param", "int64_param", "string_param", "double_param", "uint64_param"]))
        value = {
            "bool_param": st.booleans(),
            "int64_param": int64s,
            "string_param": st.text(max_size=6),
            "double_param": st.floats(),
            "uint64_param": st.integers(0, 2**64 - 1),
        }[kind]
        setattr(target[key], kind, draw(value))


CONTENT_FIELDS = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": int64s,
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=6),
}


@st.composite
def infer_messages(draw: st.DrawFn) -> bytes:
    message = pb.ModelInferRequest(
        model_name=draw(st.sampled_from(sorted(MODELS)) | st.text(max_size=8)),
        model_version=draw(st.sampled_from(["", "1", "2", "0", "-1", "01", "9" * 20]) | st.text(max_size=4)),
        id=draw(st.text(max_size=6)),
    )
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        shape = draw(st.lists(st.integers(0, 4), max_size=3) | st.lists(int64s, max_size=4))
        tensor = message.inputs.add(
            name=draw(st.sampled_from(INPUT_NAMES) | st.text(max_size=4)),
            datatype=draw(st.sampled_from([*DATATYPES, "FP99", ""])),
            shape=shape,
        )
        if draw(st.integers(0, 4)) == 0:
            draw(infer_parameters(tensor.parameters))
        if raw:
            count = math.prod(shape) if all(0 <= d <= 4 for d in shape) else 1
            size = count * draw(st.sampled_from([1, 2, 4, 8]))
            message.raw_input_contents.append(draw(st.binary(min_size=size, max_size=size) | st.binary(max_size=40)))
        else:
            for field_name in draw(st.lists(st.sampled_from(sorted(CONTENT_FIELDS)), max_size=2)):
                getattr(tensor.contents, field_name).extend(draw(st.lists(CONTENT_FIELDS[field_name], max_size=8)))
    if raw and draw(st.integers(0, 3)) == 0:
        message.raw_input_contents.append(draw(st.binary(max_size=8)))  # one entry too many
    for _ in range(draw(st.integers(0, 2))):
        output = message.outputs.add(name=draw(st.sampled_from(OUTPUT_NAMES) | st.text(max_size=4)))
        if draw(st.booleans()):
            draw(infer_parameters(output.parameters))
    if draw(st.booleans()):
        draw(infer_parameters(message.parameters))
    return bytes(message.SerializeToString())


grpc_seeds = [seed for _, seed in corpus("grpc")]


def _without_raw(message: Any) -> bytes:
    """The message's other fields, serialized the same way each time (bytes compare NaN too)."""
    rest = pb.ModelInferRequest()
    rest.CopyFrom(message)
    del rest.raw_input_contents[:]
    return bytes(rest.SerializeToString(deterministic=True))


def run_grpc(data: bytes) -> None:
    """``ModelInfer``'s request deserializer (``receive_infer_request``), then ``codec.decode_infer``
    and validation, as the servicer runs them; and the deserializer's split must be what upb makes of
    the whole message."""
    received = receive_infer_request(data)  # documented never to raise: any exception is a failure
    try:
        whole = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        whole = None
    if (whole is None) != (received.error is not None):
        raise UnexpectedOutcome(
            f"upb {'refuses' if whole is None else 'parses'} it, the splitter says {received.error}"
        )
    if whole is not None:
        lifted = [bytes(view) for view in received.raw]
        if lifted != list(whole.raw_input_contents):
            raise UnexpectedOutcome("raw_input_contents differ from upb's")
        if _without_raw(received.message) != _without_raw(whole):
            raise UnexpectedOutcome("the message without raw_input_contents differs from upb's")
    if received.error is not None:
        raise InvalidInput(received.error)  # what the servicer answers
    request = grpc_codec.decode_infer(received.message, GRPC_LIMITS, received.raw)
    if request.model in RULES:
        RULES[request.model].check_inputs(request.inputs)
        RULES[request.model].check_outputs(request.outputs)


grpc_examples = st.one_of(
    mutated(grpc_seeds, PROTO_TOKENS),
    mutated(grpc_seeds, PROTO_TOKENS),
    infer_messages(),
    st.builds(mutate, infer_messages(), st.lists(_ops(PROTO_TOKENS), min_size=1, max_size=3)),
    st.sampled_from(grpc_seeds),
)


# -- HTTP/2 frames and the gRPC calls on them ---------------------------------------------------


class _Transport:
    """What the connection writes to, kept to be read back."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 50000) if name == "peername" else default


async def _echo(request: bytes, context: Any) -> bytes:
    return request


async def _bidi(requests: Any, context: Any) -> Any:
    async for request in requests:
        yield request[::-1]


async def _model_infer(request: ReceivedInfer, context: Any) -> Any:
    """The servicer's ModelInfer up to the model: decode, and answer a client error with its status."""
    if request.error is not None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
    try:
        decoded = grpc_codec.decode_infer(request.message, GRPC_LIMITS, request.raw)
    except TensorgateError as exc:
        await context.abort(grpc.StatusCode[exc.grpc_status], exc.message)
    return pb.ModelInferResponse(model_name=decoded.model)


def _methods() -> MethodTable:
    table = MethodTable()
    echo = {
        "Unary": grpc.unary_unary_rpc_method_handler(_echo),
        "Bidi": grpc.stream_stream_rpc_method_handler(_bidi),
    }
    table.add_registered_method_handlers("test.Echo", echo)
    infer = grpc.unary_unary_rpc_method_handler(
        _model_infer,
        request_deserializer=receive_infer_request,
        response_serializer=pb.ModelInferResponse.SerializeToString,
    )
    table.add_registered_method_handlers("inference.GRPCInferenceService", {"ModelInfer": infer})
    return table


METHODS = _methods()


class _ErrorLog(logging.Handler):
    """ERROR records of tensorgate's loggers: the transport logs there what it did not expect."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


ERRORS = _ErrorLog()
_LOOP: asyncio.AbstractEventLoop | None = None


def _loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = asyncio.new_event_loop()
    return _LOOP


def close_loop() -> None:
    global _LOOP
    if _LOOP is not None and not _LOOP.is_closed():
        _LOOP.close()
    _LOOP = None


def feed(data: bytes, cuts: Sequence[int] = ()) -> Fed:
    """Feed one connection ``data`` (cut at ``cuts``) on the fuzzers' event loop."""
    return _loop().run_until_complete(_feed(data, cuts))


def frames_written(written: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream id, payload) of each frame the connection wrote."""
    out, pos = [], 0
    while pos + f.HEADER_BYTES <= len(written):
        length, kind, flags, stream_id = f.parse_header(written, pos)
        out.append((kind, flags, stream_id, written[pos + f.HEADER_BYTES : pos + f.HEADER_BYTES + length]))
        pos += f.HEADER_BYTES + length
    return out


def goaway_codes(written: bytes) -> list[int]:
    """The error codes of the GOAWAY frames the connection wrote."""
    return [
        struct.unpack_from(">I", payload, 4)[0]
        for kind, _, _, payload in frames_written(written)
        if kind == f.GOAWAY and len(payload) >= 8
    ]


@dataclass
class Fed:
    """What feeding a connection did: the bytes it wrote, the calls still running when the client's
    bytes were all read (the connection then ends), and those still running after it ended."""

    written: bytes
    running: int
    outliving: int


async def _feed(data: bytes, cuts: Sequence[int]) -> Fed:
    transport = _Transport()
    calls: set[Any] = set()
    conn: Http2ServerConnection

    def opener(stream: Any, headers: Any) -> Any:
        return open_call(stream, headers, conn, METHODS, CALL_SETTINGS, calls)

    conn = Http2ServerConnection(opener, HTTP2_LIMITS, lambda _: None)
    conn.connection_made(transport)  # type: ignore[arg-type]
    points = sorted({cut % (len(data) + 1) for cut in cuts} | {0, len(data)})
    for start, end in itertools.pairwise(points):
        conn.data_received(data[start:end])
        for _ in range(3):  # the calls opened run as far as they can
            await asyncio.sleep(0)
        if conn.closed:
            break
    running = sum(1 for call in calls if call.task is not None and not call.task.done())
    conn.connection_lost(None)
    tasks = [call.task for call in calls if call.task is not None]
    pending: set[Any] = set()
    if tasks:  # every call ends with its connection: a cancelled call needs a few turns of the loop
        _, pending = await asyncio.wait(tasks, timeout=1.0)
    for task in pending:
        task.cancel()
    return Fed(b"".join(transport.written), running, len(pending))


def run_http2(example: tuple[bytes, list[int]]) -> None:
    """``Http2ServerConnection.data_received`` with the bytes in the given pieces, the real gRPC calls
    (``call.open_call``) on the streams, serving an echo and ModelInfer's decoding."""
    data, cuts = example
    ERRORS.records.clear()
    logger = logging.getLogger("tensorgate")
    logger.addHandler(ERRORS)
    try:
        fed = feed(data, cuts)
    finally:
        logger.removeHandler(ERRORS)
    if fed.outliving:
        raise UnexpectedOutcome(f"{fed.outliving} gRPC call(s) still running after their connection ended")
    if ERRORS.records:
        record = ERRORS.records[0]
        detail = logging.Formatter().formatException(record.exc_info) if record.exc_info else ""
        raise UnexpectedOutcome(f"logged: {record.getMessage()}\n{detail}")
    if f.ErrorCode.INTERNAL_ERROR in goaway_codes(fed.written):
        raise UnexpectedOutcome("the connection ended with INTERNAL_ERROR")


REQUEST_FIELDS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", INFER_PATH),
    (":authority", "127.0.0.1"),
    ("te", "trailers"),
    ("content-type", "application/grpc"),
]
header_names = st.sampled_from(
    [
        ":method",
        ":path",
        ":scheme",
        ":authority",
        ":status",
        "te",
        "content-type",
        "grpc-timeout",
        "grpc-encoding",
        "grpc-accept-encoding",
        "x-request-id",
        "authorization",
        "trace-bin",
        "Upper",
        "connection",
        "",
    ]
)
header_values = st.sampled_from(
    [
        "POST",
        "GET",
        INFER_PATH,
        "/test.Echo/Unary",
        "/test.Echo/Bidi",
        "/nope",
        "",
        "application/grpc",
        "application/grpc+proto",
        "text/plain",
        "trailers",
        "gzip",
        "deflate",
        "br",
        "identity",
        "5S",
        "1n",
        "99999999H",
        "123456789S",
        "1x",
        "-1S",
        "AAEC",
        "%%%",
    ]
) | st.text(max_size=8)


@st.composite
def header_lists(draw: st.DrawFn) -> list[tuple[str, str]]:
    fields = list(REQUEST_FIELDS)
    fields[2] = (":path", draw(st.sampled_from([INFER_PATH, "/test.Echo/Unary", "/test.Echo/Bidi", "/nope"])))
    if draw(st.booleans()):
        fields.append(("grpc-timeout", draw(header_values)))
    if draw(st.booleans()):
        fields.append(("grpc-encoding", draw(st.sampled_from(["gzip", "deflate", "identity", "br"]))))
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(fields)))
        fields.insert(at, (draw(header_names), draw(header_values)))
    if draw(st.integers(0, 5)) == 0 and fields:
        del fields[draw(st.integers(0, len(fields) - 1))]
    return fields


def _grpc_message(payload: bytes, flag: int) -> bytes:
    return bytes([flag]) + struct.pack(">I", len(payload)) + payload


message_payloads = st.one_of(
    st.sampled_from(grpc_seeds),
    st.binary(max_size=32),
    st.builds(gzip.compress, st.sampled_from(grpc_seeds)),
    st.builds(zlib.compress, st.sampled_from([b"x" * 100, *grpc_seeds])),
)
stream_ids = st.sampled_from([0, 1, 1, 1, 3, 3, 5, 2, 0x7FFF_FFFF])


@st.composite
def frame_sequences(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """A preface and a run of frames a client might (or should never) send; lengths mostly true."""
    encoder = Encoder()
    out = [f.PREFACE if draw(st.integers(0, 30)) else draw(st.binary(max_size=24))]
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["headers", "headers", "data", "data", "control", "raw"]))
        sid = draw(stream_ids)
        if kind == "headers":
            block = encoder.encode(draw(header_lists()), huffman=draw(st.booleans()))
            flags = draw(st.sampled_from([f.END_HEADERS, f.END_HEADERS | f.END_STREAM, 0, f.PADDED | f.END_HEADERS]))
            if flags & f.PADDED:
                block = bytes([2]) + block + b"\0\0"
            if draw(st.booleans()) and not flags & f.END_HEADERS:
                out.append(
                    f.frame(f.HEADERS, flags, sid, block[:4]) + f.frame(f.CONTINUATION, f.END_HEADERS, sid, block[4:])
                )
                continue
            out.append(f.frame(f.HEADERS, flags, sid, block))
        elif kind == "data":
            payload = _grpc_message(draw(message_payloads), draw(st.sampled_from([0, 0, 1, 2])))
            if draw(st.integers(0, 3)) == 0:
                payload = payload[: draw(st.integers(0, len(payload)))]
            flags = draw(st.sampled_from([f.END_STREAM, 0, f.PADDED | f.END_STREAM]))
            if flags & f.PADDED:
                payload = bytes([draw(st.integers(0, 4))]) + payload + b"\0" * 3
            out.append(f.frame(f.DATA, flags, sid, payload))
        elif kind == "control":
            out.append(
                draw(
                    st.sampled_from(
                        [
                            f.settings({f.INITIAL_WINDOW_SIZE: 0}),
                            f.settings({f.INITIAL_WINDOW_SIZE: 2**31}),
                            f.settings({f.MAX_FRAME_SIZE: 100}),
                            f.settings({f.HEADER_TABLE_SIZE: 0, f.ENABLE_PUSH: 2}),
                            f.frame(f.SETTINGS, 0, 0, b"\0\0\0"),
                            f.frame(f.SETTINGS, f.ACK, 0, b"\0" * 6),
                            f.frame(f.PING, 0, 0, b"\0" * 7),
                            f.frame(f.PING, 0, 1, b"\0" * 8),
                            f.window_update(0, 0),
                            f.window_update(1, 0x7FFF_FFFF),
                            f.window_update(9, 1),
                            f.frame(f.WINDOW_UPDATE, 0, 0, b"\0\0"),
                            f.rst_stream(1, f.ErrorCode.CANCEL),
                            f.rst_stream(0, f.ErrorCode.CANCEL),
                            f.frame(f.RST_STREAM, 0, 1, b"\0"),
                            f.frame(f.PRIORITY, 0, 1, b"\0" * 5),
                            f.frame(f.PRIORITY, 0, 0, b"\0" * 5),
                            f.frame(f.PRIORITY, 0, 1, b"\0" * 4),
                            f.goaway(0, f.ErrorCode.NO_ERROR),
                            f.frame(f.GOAWAY, 0, 1, b"\0" * 8),
                            f.frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\0\0\0\x02\x82"),
                            f.frame(f.CONTINUATION, f.END_HEADERS, 1, b"\x82"),
                            f.frame(0x42, 0xFF, 7, b"unknown type"),
                        ]
                    )
                )
            )
        else:
            payload = draw(st.binary(max_size=24))
            length = len(payload) + draw(st.sampled_from([0, 0, 0, -1, 1, 1 << 20]))
            head = f.header(draw(st.integers(0, 12)), draw(st.integers(0, 255)), sid, max(0, length))
            out.append(head + payload)
    data = b"".join(out)
    return data, draw(st.lists(st.integers(0, len(data)), max_size=4))


http2_seeds = [seed for _, seed in corpus("http2")]


@st.composite
def mutated_streams(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    seed = draw(st.sampled_from(http2_seeds))
    # Mostly past the preface: a broken preface ends the connection before anything else is read.
    ops = draw(st.lists(_ops(HTTP2_TOKENS), min_size=1, max_size=5))
    if draw(st.integers(0, 9)):
        prefix = len(f.PREFACE)
        ops = [(kind, prefix + pos % (len(seed) - prefix + 1), arg) for kind, pos, arg in ops]
    data = mutate(seed, ops)
    return data, draw(st.lists(st.integers(0, len(data)), max_size=4))


http2_examples = st.one_of(
    mutated_streams(),
    mutated_streams(),
    frame_sequences(),
    frame_sequences(),
    st.tuples(st.sampled_from(http2_seeds), st.lists(st.integers(0, 300), max_size=6)),
)


# -- HPACK header blocks --------------------------------------------------------------------------


def run_hpack(blocks: list[bytes]) -> None:
    """``HeaderBlocks.decode`` (the connection's, with its kept blocks and literal fast path) over a
    sequence of blocks, against a plain ``hpack`` Decoder: the same fields or the same refusal."""
    limit = HTTP2_LIMITS.max_header_list_bytes
    ours, reference = HeaderBlocks(limit), Decoder(limit)
    for block in blocks:
        got: Any
        want: Any
        try:
            got = ours.decode(block)
        except Exception as exc:
            if not is_hpack_client_error(exc):
                raise
            got = exc
        try:
            want = reference.decode(block)
        except (HPACKError, UnicodeDecodeError) as exc:
            want = exc
        if isinstance(got, Exception) or isinstance(want, Exception):
            if type(got) is not type(want):
                raise UnexpectedOutcome(f"HeaderBlocks gives {got!r}, hpack {want!r} for {block!r}")
            if isinstance(got, HPACKError):
                raise got  # a connection error: the connection (and its tables) end here
            continue  # bad UTF-8 loses only its stream; the connection and its table go on
        if list(got) != list(want):
            raise UnexpectedOutcome(f"HeaderBlocks gives {got!r}, hpack {want!r} for {block!r}")


hpack_seeds = [seed for _, seed in corpus("hpack")]
hpack_examples = st.one_of(
    st.lists(st.sampled_from(hpack_seeds) | mutated(hpack_seeds, HTTP2_TOKENS, max_ops=3), min_size=1, max_size=5),
    st.builds(  # the blocks one connection would send, in order, one of them mutated
        lambda index, ops: [mutate(b, ops) if i == index else b for i, b in enumerate(hpack_seeds[:3])],
        st.integers(0, 2),
        st.lists(_ops(HTTP2_TOKENS), min_size=1, max_size=3),
    ),
    st.lists(st.binary(max_size=24), min_size=1, max_size=3),
    st.just(hpack_seeds[:3]),
)


# -- the targets --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str
    describe: str
    examples: st.SearchStrategy[Any]
    run: Callable[[Any], None]
    client_error: Callable[[BaseException], bool]


TARGETS: dict[str, Target] = {
    target.name: target
    for target in (
        Target(
            "v2_json",
            "V2 JSON infer body: v2_codec.decode_infer (+ json_tensors fast path), then validation",
            v2_json_examples,
            run_v2_json,
            is_client_error,
        ),
        Target(
            "v2_binary",
            "V2 binary extension: parse_header_length + decode_infer with the JSON/binary split",
            v2_binary_examples,
            run_v2_binary,
            is_client_error,
        ),
        Target(
            "v1",
            "V1 :predict body: loads_object + v1_codec.decode_predict, then validation",
            v1_examples(),
            run_v1,
            is_client_error,
        ),
        Target(
            "openai",
            "OpenAI chat/completions: JSON + openai_codec.parse + what the routes read before the model",
            openai_examples(),
            run_openai,
            is_client_error,
        ),
        Target(
            "grpc",
            "gRPC ModelInferRequest bytes: raw_inputs.receive_infer_request + codec.decode_infer",
            grpc_examples,
            run_grpc,
            is_grpc_client_error,
        ),
        Target(
            "http2",
            "HTTP/2 frames: Http2ServerConnection.data_received with real gRPC calls on the streams",
            http2_examples,
            run_http2,
            lambda exc: False,  # data_received handles everything itself; nothing may come out of it
        ),
        Target(
            "hpack",
            "HPACK header blocks: HeaderBlocks.decode, differential against hpack's Decoder",
            hpack_examples,
            run_hpack,
            is_hpack_client_error,
        ),
    )
}


def check(target: Target, example: Any) -> str:
    """Run one example. Returns ``"decoded"``, ``"refused"`` (a client error) or ``"known"`` (a known
    bug, see :data:`KNOWN_BUGS`); raises :class:`UnexpectedOutcome` for anything else."""
    started = time.perf_counter()
    try:
        target.run(example)
        outcome = "decoded"
    except UnexpectedOutcome:
        raise
    except Exception as exc:
        if target.client_error(exc):
            outcome = "refused"
        else:
            bug = known_bug(target.name, example, exc)
            if bug is None:
                detail = f" ({exc.code.value})" if isinstance(exc, TensorgateError) else ""
                raise UnexpectedOutcome(
                    f"{target.name}: {type(exc).__name__}{detail} is not a client error: {exc}; input {example!r}"
                ) from exc
            KNOWN_HITS[bug.id] += 1
            outcome = "known"
    elapsed = time.perf_counter() - started
    if elapsed > SLOW_EXAMPLE_S:
        raise UnexpectedOutcome(f"{target.name}: one example took {elapsed:.1f} s; input {example!r}")
    return outcome
