"""The KServe Python SDK's clients against a server, run as a process of its own and reporting what they
saw as JSON (``test_kserve_sdk.py`` asserts on it).

Its own process because the KServe SDK and ``tritonclient.grpc`` register the same protobuf symbols
(``inference.ServerLiveRequest``...) in protobuf's default pool: one Python process cannot import
both, and the suite's workers import tritonclient.

Run: ``python kserve_sdk_client.py HTTP_ADDRESS GRPC_ADDRESS``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, RESTConfig
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput

INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.ones((1, 16), dtype=np.int32)


def _simple(binary: bool, outputs: list[str] | None = None) -> InferRequest:
    inputs = [InferInput("INPUT0", [1, 16], "INT32"), InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(INPUT0, binary_data=binary)
    inputs[1].set_data_from_numpy(INPUT1, binary_data=binary)
    requested = None if outputs is None else [RequestedOutput(name) for name in outputs]
    return InferRequest("simple", inputs, request_id="sdk-1", request_outputs=requested)


def _strings(binary: bool) -> InferRequest:
    values = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    inputs = [InferInput("INPUT0", [1, 16], "BYTES"), InferInput("INPUT1", [1, 16], "BYTES")]
    for tensor in inputs:
        tensor.set_data_from_numpy(values, binary_data=binary)
    return InferRequest("simple_string", inputs)


def _outputs(response: Any) -> dict[str, list[Any]]:
    out = {}
    for output in response.outputs:
        array = output.as_numpy()
        values = array.reshape(-1).tolist()
        out[output.name] = [v.decode() if isinstance(v, bytes) else v for v in values]
    return out


async def _rest_v2(base: str) -> dict[str, Any]:
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=30))
    report: dict[str, Any] = {
        "live": await client.is_server_live(base),
        "ready": await client.is_server_ready(base),
        "model_ready": await client.is_model_ready(base, "simple"),
        "unknown_model_ready": await client.is_model_ready(base, "nope"),
    }
    for binary in (False, True):
        answer = await client.infer(base, _simple(binary), model_name="simple")
        report[f"int32_{'binary' if binary else 'json'}"] = {"id": answer.id, "outputs": _outputs(answer)}
        strings = await client.infer(base, _strings(binary), model_name="simple_string")
        report[f"bytes_{'binary' if binary else 'json'}"] = _outputs(strings)
    subset = await client.infer(base, _simple(False, ["OUTPUT1"]), model_name="simple")
    report["subset"] = sorted(_outputs(subset))
    try:
        await client.infer(base, _simple(False), model_name="nope")
        report["unknown_model_error"] = None
    except httpx.HTTPStatusError as exc:
        report["unknown_model_error"] = {"status": exc.response.status_code, "message": str(exc)}
    await client.close()
    return report


async def _rest_v1(base: str) -> dict[str, Any]:
    client = InferenceRESTClient(RESTConfig(protocol="v1", timeout=30))
    instances = {"instances": [{"INPUT0": INPUT0[0].tolist(), "INPUT1": INPUT1[0].tolist()}]}
    answer = await client.infer(base, instances, model_name="simple")
    report = {
        "live": await client.is_server_live(base),
        "model_ready": await client.is_model_ready(base, "simple"),
        "predictions": answer["predictions"],
    }
    await client.close()
    return report


async def _grpc(address: str) -> dict[str, Any]:
    client = InferenceGRPCClient(address, timeout=30)
    report: dict[str, Any] = {
        "live": await client.is_server_live(),
        "ready": await client.is_server_ready(),
        "model_ready": await client.is_model_ready("simple"),
    }
    for binary in (False, True):  # typed contents, then raw_input_contents
        answer = await client.infer(_simple(binary))
        report[f"int32_{'raw' if binary else 'contents'}"] = {"id": answer.id, "outputs": _outputs(answer)}
        strings = await client.infer(_strings(binary))
        report[f"bytes_{'raw' if binary else 'contents'}"] = _outputs(strings)
    report["subset"] = sorted(_outputs(await client.infer(_simple(True, ["OUTPUT0"]))))
    try:
        await client.infer(InferRequest("nope", _simple(True).inputs))
        report["unknown_model_error"] = None
    except Exception as exc:  # grpc.aio.AioRpcError
        report["unknown_model_error"] = {"code": str(exc.code()), "details": exc.details()}  # type: ignore[attr-defined]
    await client.close()
    return report


async def main(http_address: str, grpc_address: str) -> None:
    base = f"http://{http_address}"
    report = {"rest_v2": await _rest_v2(base), "rest_v1": await _rest_v1(base), "grpc": await _grpc(grpc_address)}
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
