"""Triton's example clients (triton-inference-server/client, ``src/python/examples``), their flows run with
``tritonclient`` against Triton's example repository served by tensorgate.

Each test is named after the example whose calls it makes, with the same data and the same checks
(the scripts themselves ship in no package this suite can install; ``docs/coming-from-triton.md``
lists how the unchanged scripts ran). The models and their ``config.pbtxt`` files are Triton's:
``triton_repository.py``.
"""

from __future__ import annotations

import asyncio
import queue
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpclient_aio
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import (
    InferenceServerException,
    deserialize_bytes_tensor,
    serialize_byte_tensor,
    serialized_byte_size,
)

from tensorgate.testing import ServerProcess

INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.ones((1, 16), dtype=np.int32)
PROTOCOLS = ("http", "grpc")


def _client(server: ServerProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_address, concurrency=2)
    return grpcclient.InferenceServerClient(server.grpc_address)


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture()
def client(triton_server: ServerProcess, protocol: str) -> Iterator[Any]:
    c = _client(triton_server, protocol)
    yield c
    c.close()


def _module(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def _simple_inputs(module: Any, input1: np.ndarray = INPUT1, binary: tuple[bool, bool] = (True, True)) -> list[Any]:
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    if module is httpclient:  # the HTTP example sends INPUT0 as JSON and INPUT1 as binary
        inputs[0].set_data_from_numpy(INPUT0, binary_data=binary[0])
        inputs[1].set_data_from_numpy(input1, binary_data=binary[1])
    else:
        inputs[0].set_data_from_numpy(INPUT0)
        inputs[1].set_data_from_numpy(input1)
    return inputs


def _check_simple(result: Any, input1: np.ndarray = INPUT1) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), INPUT0 + input1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), INPUT0 - input1)


# -- simple_{http,grpc}_infer_client.py ------------------------------------------------------------


def test_simple_http_infer_client(triton_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(triton_server.http_address)
    input1 = np.full((1, 16), -1, dtype=np.int32)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    outputs.append(httpclient.InferRequestedOutput("OUTPUT1", binary_data=False))
    result = client.infer(
        "simple",
        _simple_inputs(httpclient, input1, (False, True)),
        outputs=outputs,
        query_params={"test_1": 1, "test_2": 2},
        headers={"test": "1"},
        request_compression_algorithm="gzip",
        response_compression_algorithm="deflate",
    )
    _check_simple(result, input1)
    _check_simple(client.infer("simple", _simple_inputs(httpclient, input1)), input1)  # no requested outputs
    statistics = client.get_inference_statistics(model_name="simple")
    assert len(statistics["model_stats"]) == 1
    with pytest.raises(InferenceServerException) as caught:
        client.infer("wrong_model_name", _simple_inputs(httpclient))
    assert caught.value.message().startswith("Request for unknown model")
    client.close()


def test_simple_grpc_infer_client(triton_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(triton_server.grpc_address)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    for compression in (None, "gzip", "deflate"):
        result = client.infer(
            "simple",
            _simple_inputs(grpcclient),
            outputs=outputs,
            headers={"test": "1"},
            client_timeout=10,
            compression_algorithm=compression,
        )
        _check_simple(result)
    _check_simple(client.infer("simple", _simple_inputs(grpcclient), outputs=None))
    assert len(client.get_inference_statistics(model_name="simple").model_stats) == 1
    client.close()


# -- simple_{http,grpc}_async_infer_client.py, and the asyncio ones -----------------------------------


def test_simple_async_infer_clients(client: Any, protocol: str) -> None:
    module = _module(protocol)
    if protocol == "http":
        handles = [client.async_infer("simple", _simple_inputs(module)) for _ in range(2)]
        for handle in handles:
            _check_simple(handle.get_result())
        return
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def callback(result: Any, error: Any) -> None:
        answers.put((result, error))

    client.async_infer("simple", _simple_inputs(module), callback, client_timeout=10)
    result, error = answers.get(timeout=30)
    assert error is None
    _check_simple(result)


async def test_simple_aio_infer_clients(triton_server: ServerProcess) -> None:
    async with httpclient_aio.InferenceServerClient(triton_server.http_address) as http:
        results = await asyncio.gather(*(http.infer("simple", _simple_inputs(httpclient)) for _ in range(2)))
        for result in results:
            _check_simple(result)
        with pytest.raises(InferenceServerException) as caught:
            await http.infer("wrong_model_name", _simple_inputs(httpclient))
        assert caught.value.message().startswith("Request for unknown model")
        assert len((await http.get_inference_statistics(model_name="simple"))["model_stats"]) == 1
    async with grpcclient_aio.InferenceServerClient(triton_server.grpc_address) as rpc:
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
        _check_simple(await rpc.infer("simple", _simple_inputs(grpcclient), outputs=outputs))
        results = await asyncio.gather(*(rpc.infer("simple", _simple_inputs(grpcclient)) for _ in range(2)))
        for result in results:
            _check_simple(result)
        assert len((await rpc.get_inference_statistics(model_name="simple")).model_stats) == 1


# -- simple_{http,grpc}_string_infer_client.py -------------------------------------------------------


def _strings(values: np.ndarray) -> np.ndarray:
    return np.array([str(v).encode() for v in values.reshape(-1)], dtype=np.object_).reshape(values.shape)


def test_simple_string_infer_clients(client: Any, protocol: str) -> None:
    module = _module(protocol)
    in0, in1 = _strings(INPUT0), _strings(INPUT1)
    inputs = [module.InferInput("INPUT0", [1, 16], "BYTES"), module.InferInput("INPUT1", [1, 16], "BYTES")]
    if protocol == "http":  # INPUT0 binary, INPUT1 JSON; OUTPUT0 binary, OUTPUT1 JSON
        inputs[0].set_data_from_numpy(in0, binary_data=True)
        inputs[1].set_data_from_numpy(in1, binary_data=False)
        outputs = [module.InferRequestedOutput("OUTPUT0", binary_data=True)]
        outputs.append(module.InferRequestedOutput("OUTPUT1", binary_data=False))
    else:
        inputs[0].set_data_from_numpy(in0)
        inputs[1].set_data_from_numpy(in1)
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple_string", inputs, outputs=outputs)
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    for i in range(16):
        assert int(out0[0][i]) == INPUT0[0][i] + INPUT1[0][i]
        assert int(out1[0][i]) == INPUT0[0][i] - INPUT1[0][i]
    # simple_identity: a NUL inside a string, and raw bytes, survive binary and JSON.
    for payload in (
        np.array([[b"he\x00llo"]], dtype=np.object_),
        np.array([[b"\x00\x01\x02\x03"]], dtype=np.object_),
    ):
        for binary in (True, False) if protocol == "http" else (True,):
            identity = module.InferInput("INPUT0", [1, 1], "BYTES")
            if protocol == "http":
                identity.set_data_from_numpy(payload, binary_data=binary)
                wanted = [module.InferRequestedOutput("OUTPUT0", binary_data=binary)]
            else:
                identity.set_data_from_numpy(payload)
                wanted = [module.InferRequestedOutput("OUTPUT0")]
            if not binary and payload[0][0] == b"\x00\x01\x02\x03":
                continue  # not UTF-8: JSON cannot carry it (Triton's example sends it binary only too)
            got = client.infer("simple_identity", [identity], outputs=wanted).as_numpy("OUTPUT0")
            # tritonclient hands back JSON strings as str, binary ones as bytes
            assert got[0][0] == (payload[0][0] if binary else payload[0][0].decode())


# -- simple_{http,grpc}_shm_client.py (and reuse_infer_objects_client.py's cleanup) ------------------


def test_simple_shm_clients(client: Any, protocol: str) -> None:
    module = _module(protocol)
    tag = uuid.uuid4().hex[:8]
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()  # as the example: must succeed on a server without GPUs
    byte_size = INPUT0.size * INPUT0.itemsize
    out_handle = shm.create_shared_memory_region("output_data", f"/output_simple_{tag}", byte_size * 2)
    in_handle = shm.create_shared_memory_region("input_data", f"/input_simple_{tag}", byte_size * 2)
    try:
        client.register_system_shared_memory("output_data", f"/output_simple_{tag}", byte_size * 2)
        shm.set_shared_memory_region(in_handle, [INPUT0])
        shm.set_shared_memory_region(in_handle, [INPUT1], offset=byte_size)
        client.register_system_shared_memory("input_data", f"/input_simple_{tag}", byte_size * 2)
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("input_data", byte_size)
        inputs[1].set_shared_memory("input_data", byte_size, offset=byte_size)
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("output_data", byte_size)
        outputs[1].set_shared_memory("output_data", byte_size, offset=byte_size)
        result = client.infer("simple", inputs, outputs=outputs)
        for name, offset, expected in (("OUTPUT0", 0, INPUT0 + INPUT1), ("OUTPUT1", byte_size, INPUT0 - INPUT1)):
            answer = result.get_output(name)
            if protocol == "http":
                shape, datatype = answer["shape"], answer["datatype"]
            else:
                shape, datatype = list(answer.shape), answer.datatype
            assert (shape, datatype) == ([1, 16], "INT32")
            got = shm.get_contents_as_numpy(out_handle, np.int32, shape, offset=offset)
            np.testing.assert_array_equal(got, expected)
        if protocol == "grpc":  # one empty raw entry per output, all of them in shared memory
            assert list(result.get_response().raw_output_contents) == [b"", b""]
        status = client.get_system_shared_memory_status()
        names = {r["name"] for r in status} if protocol == "http" else set(status.regions)
        assert names == {"input_data", "output_data"}
        client.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(out_handle)
        shm.destroy_shared_memory_region(in_handle)


def test_simple_shm_string_clients(client: Any, protocol: str) -> None:
    module = _module(protocol)
    tag = uuid.uuid4().hex[:8]
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    in0, in1 = _strings(INPUT0), _strings(INPUT1)
    expected0, expected1 = _strings(INPUT0 + INPUT1), _strings(INPUT0 - INPUT1)
    serialized = [serialize_byte_tensor(t) for t in (in0, in1, expected0, expected1)]
    sizes = [serialized_byte_size(t) for t in serialized]
    handles = [
        shm.create_shared_memory_region(name, f"/{name}_{tag}", size)
        for name, size in zip(("input0_data", "input1_data", "output0_data", "output1_data"), sizes, strict=True)
    ]
    try:
        shm.set_shared_memory_region(handles[0], [serialized[0]])
        shm.set_shared_memory_region(handles[1], [serialized[1]])
        for name, size in zip(("input0_data", "input1_data", "output0_data", "output1_data"), sizes, strict=True):
            client.register_system_shared_memory(name, f"/{name}_{tag}", size)
        inputs = [module.InferInput("INPUT0", [1, 16], "BYTES"), module.InferInput("INPUT1", [1, 16], "BYTES")]
        inputs[0].set_shared_memory("input0_data", sizes[0])
        inputs[1].set_shared_memory("input1_data", sizes[1])
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("output0_data", sizes[2])
        outputs[1].set_shared_memory("output1_data", sizes[3])
        client.infer("simple_string", inputs, outputs=outputs)
        got0 = shm.get_contents_as_numpy(handles[2], np.object_, [1, 16])
        got1 = shm.get_contents_as_numpy(handles[3], np.object_, [1, 16])
        assert got0.tolist() == expected0.tolist() and got1.tolist() == expected1.tolist()
        client.unregister_system_shared_memory()
    finally:
        for handle in handles:
            shm.destroy_shared_memory_region(handle)


def test_reuse_infer_objects_client(client: Any, protocol: str) -> None:
    """The same InferInput objects through shared memory, then inline, then shared memory again."""
    module = _module(protocol)
    tag = uuid.uuid4().hex[:8]
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    size = INPUT0.nbytes
    handles = [shm.create_shared_memory_region(n, f"/{n}_{tag}", size) for n in ("i0", "i1", "o0", "o1")]
    try:
        shm.set_shared_memory_region(handles[0], [INPUT0])
        shm.set_shared_memory_region(handles[1], [INPUT1])
        for name in ("i0", "i1", "o0", "o1"):
            client.register_system_shared_memory(name, f"/{name}_{tag}", size)
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]

        def through_regions() -> None:
            inputs[0].set_shared_memory("i0", size)
            inputs[1].set_shared_memory("i1", size)
            outputs[0].set_shared_memory("o0", size)
            outputs[1].set_shared_memory("o1", size)
            client.infer("simple", inputs, outputs=outputs)
            np.testing.assert_array_equal(shm.get_contents_as_numpy(handles[2], np.int32, [1, 16]), INPUT0 + INPUT1)
            np.testing.assert_array_equal(shm.get_contents_as_numpy(handles[3], np.int32, [1, 16]), INPUT0 - INPUT1)

        through_regions()
        inputs[0].set_data_from_numpy(INPUT0)  # inline data again: the region is forgotten
        inputs[1].set_data_from_numpy(INPUT1 * 2)
        for output in outputs:
            output.unset_shared_memory()
        _check_simple(client.infer("simple", inputs, outputs=outputs), INPUT1 * 2)
        through_regions()
        client.unregister_system_shared_memory()
    finally:
        for handle in handles:
            shm.destroy_shared_memory_region(handle)


# -- simple_{http,grpc}_health_metadata.py ------------------------------------------------------------


def test_simple_health_metadata_clients(client: Any, protocol: str) -> None:
    if protocol == "http":
        assert client.is_server_live(query_params={"test_1": 1, "test_2": 2})
        assert client.is_server_ready() and client.is_model_ready("simple")
        assert client.get_server_metadata()["name"] == "triton"
        assert client.get_model_metadata("simple", query_params={"test_1": 1})["name"] == "simple"
    else:
        headers = {"test": "1", "dummy": "2"}
        assert client.is_server_live(headers=headers) and client.is_server_ready(headers=headers)
        assert client.is_model_ready("simple", headers=headers)
        assert client.get_server_metadata(headers=headers).name == "triton"
        assert client.get_model_metadata("simple", headers=headers).name == "simple"
        assert client.get_model_config("simple", headers=headers).config.name == "simple"
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata("wrong_model_name")
    assert "Request for unknown model" in caught.value.message()


# -- grpc_explicit_{int,int8,byte}_content_client.py (the raw gRPC messages) --------------------------


def _raw_request(model: str, datatype: str, field: str, values: list[Any]) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model, model_version="")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1, 16])
        getattr(tensor.contents, field).extend(values)
    for name in ("OUTPUT0", "OUTPUT1"):
        request.outputs.add(name=name)
    return request


def test_grpc_explicit_content_clients(triton_server: ServerProcess) -> None:
    with grpc.insecure_channel(triton_server.grpc_address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        # int_contents in, raw_output_contents out (what the example reads)
        answer = stub.ModelInfer(_raw_request("simple", "INT32", "int_contents", list(range(16))))
        assert len(answer.raw_output_contents) == 2
        np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0], np.int32), np.arange(16) * 2)
        # contents and raw_input_contents together: the message the example looks for. As the
        # example sends it: one raw entry for two inputs, so the contents must be named before
        # the count of raw entries is checked.
        both = _raw_request("simple", "INT32", "int_contents", list(range(16)))
        both.raw_input_contents.extend([np.arange(8, dtype=np.int32).tobytes()])
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(both)
        assert (
            "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'"
            in caught.value.details()
        )
        # INT8 through int_contents, then a version string that is not a number
        answer = stub.ModelInfer(_raw_request("simple_int8", "INT8", "int_contents", list(range(16))))
        np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[1], np.int8), np.zeros(16))
        wrong = _raw_request("simple_int8", "INT8", "int_contents", list(range(16)))
        wrong.model_version = "wrong_specification"
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(wrong)
        assert (
            "failed to get model version from specified version string 'wrong_specification'" in caught.value.details()
        )
        # bytes_contents in; the outputs are serialized BYTES tensors in raw_output_contents
        texts = [str(i).encode() for i in range(16)]
        answer = stub.ModelInfer(_raw_request("simple_string", "BYTES", "bytes_contents", texts))
        sums = deserialize_bytes_tensor(answer.raw_output_contents[0])
        assert [int(v) for v in sums] == [2 * i for i in range(16)]


# -- simple_grpc_keepalive_client.py, simple_grpc_custom_args_client.py --------------------------------


def test_grpc_keepalive_and_custom_args_clients(triton_server: ServerProcess) -> None:
    keepalive = grpcclient.KeepAliveOptions(
        keepalive_time_ms=2**31 - 1,
        keepalive_timeout_ms=20000,
        keepalive_permit_without_calls=False,
        http2_max_pings_without_data=2,
    )
    with grpcclient.InferenceServerClient(triton_server.grpc_address, keepalive_options=keepalive) as client:
        _check_simple(client.infer("simple", _simple_inputs(grpcclient), headers={"test": "1"}))
    channel_args = [
        ("grpc.max_send_message_length", 1 << 20),
        ("grpc.max_receive_message_length", 1 << 20),
        ("grpc.keepalive_time_ms", 2**31 - 1),
        ("grpc.dns_enable_srv_queries", 0),
    ]
    with grpcclient.InferenceServerClient(triton_server.grpc_address, channel_args=channel_args) as client:
        _check_simple(client.infer("simple", _simple_inputs(grpcclient)))


# -- the ensemble shape of an example repository: config.pbtxt read, Triton names everywhere -----------


def test_the_repository_is_served_as_triton_configured_it(client: Any, protocol: str) -> None:
    config = client.get_model_config("simple")
    if protocol == "grpc":
        config = {
            "max_batch_size": config.config.max_batch_size,
            "input": [{"dims": list(config.config.input[0].dims)}],
        }
    assert config["max_batch_size"] == 8 and [int(d) for d in config["input"][0]["dims"]] == [16]
    metadata = client.get_model_metadata("simple_identity")
    platform = metadata["platform"] if protocol == "http" else metadata.platform
    assert platform == "python"
    with pytest.raises(InferenceServerException) as caught:  # over max_batch_size: 9 rows
        rows = [
            _module(protocol).InferInput("INPUT0", [9, 16], "INT32"),
            _module(protocol).InferInput("INPUT1", [9, 16], "INT32"),
        ]
        rows[0].set_data_from_numpy(np.zeros((9, 16), np.int32))
        rows[1].set_data_from_numpy(np.zeros((9, 16), np.int32))
        client.infer("simple", rows)
    assert "inference request batch-size must be <= 8 for 'simple'" in caught.value.message()
