"""``GrpcStreamTarget`` against a gRPC server that answers a request more than once, as Triton's
decoupled models do: a call ends with the answer marked ``triton_final_response``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np

from tensorgate.bench.inputs import Tensor
from tensorgate.bench.targets.base import parse_endpoint
from tensorgate.bench.targets.grpc_v2 import STREAM_METHOD, GrpcStreamTarget, infer_request_bytes
from tensorgate.protocols.grpc.generated import grpc_service_pb2 as pb

SERVICE, METHOD = STREAM_METHOD.strip("/").split("/")


def _answer(request: Any, *, final: bool | None, error: str = "") -> Any:
    answer = pb.ModelStreamInferResponse(error_message=error)
    answer.infer_response.id = request.id
    if final is not None:
        answer.infer_response.parameters["triton_final_response"].bool_param = final
    return answer


async def _decoupled(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    """Request ``fail-*``: a partial answer, then a final one that reports an error; ``ok-*``: a
    partial and a clean final answer; ``unmarked-*``: one answer with no final flag (a server that
    does not mark them)."""
    async for request in requests:
        if request.id.startswith("unmarked"):
            yield _answer(request, final=None)
            continue
        yield _answer(request, final=False)
        yield _answer(request, final=True, error="boom" if request.id.startswith("fail") else "")


def _request(request_id: str) -> bytes:
    message = pb.ModelInferRequest.FromString(
        infer_request_bytes("m", None, (Tensor("x", "FP32", np.zeros((1, 2), np.float32)),))
    )
    message.id = request_id
    return bytes(message.SerializeToString())


def _calls(ids: list[str]) -> list[str | None]:
    async def run() -> list[str | None]:
        streams = 0

        async def counted(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            nonlocal streams
            streams += 1
            async for answer in _decoupled(requests, context):
                yield answer

        server = grpc.aio.server()
        handler = grpc.stream_stream_rpc_method_handler(
            counted,
            request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=lambda m: m.SerializeToString(),
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        target = GrpcStreamTarget(parse_endpoint(f"127.0.0.1:{port}", 8081), [_request(i) for i in ids])
        try:
            # One after another, so every call rides the same stream: an answer left unread by one
            # call would be taken as the next call's (an ``ok`` call's final answer as a ``fail``
            # call's, whatever reads the answers arrive in).
            errors = [(await target.call(index)).error for index in range(len(ids))]
            assert streams == 1
            return errors
        finally:
            await target.aclose()
            await server.stop(None)

    return asyncio.run(run())


def test_a_call_reads_through_to_the_final_answer() -> None:
    assert _calls(["ok-0", "fail-1", "ok-2", "fail-3"]) == [None, "grpc stream error", None, "grpc stream error"]


def test_unmarked_answers_end_the_call_at_the_first() -> None:
    assert _calls(["unmarked-0", "ok-1", "unmarked-2", "fail-3"]) == [None, None, None, "grpc stream error"]
