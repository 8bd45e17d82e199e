"""Triton's system shared-memory extension through tritonclient's own utilities, over HTTP and gRPC:
register a region, infer with inputs read from it and outputs written to it, status, unregister;
every bad region, offset and size refused with 400 (INVALID_ARGUMENT) while the server stays up; a
request racing an unregister of its input or output region keeps the memory it was given; an input
from a region reaches the model as a view of the mapping, not a copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as pb_grpc
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from model_builders import write_python_model
from tritonclient.utils import InferenceServerException

from tensorgate.testing import ServerProcess

FEATURES = np.linspace(-1.0, 1.0, 16, dtype=np.float32).reshape(1, 16)
SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="needs /dev/shm")

# Adds 1, and says which file backs the memory its input array lives in (the mapping that holds the
# array's first byte, from /proc/self/maps; "" for anonymous memory such as the heap). It runs in a
# thread instance, in the server's process, and is handed the same array the ONNX backend would
# pass to onnxruntime's session.run, which takes a contiguous numpy array without copying it.
WHERE_MODEL = """
import numpy as np

from tensorgate import PythonModel


class Where(PythonModel):
    def execute(self, inputs):
        x = inputs["INPUT"]
        address = x.__array_interface__["data"][0]
        backing = ""
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                start, end = (int(bound, 16) for bound in fields[0].split("-"))
                if start <= address < end:
                    backing = fields[5] if len(fields) > 5 else ""
                    break
        return {"OUTPUT": x + 1.0, "BACKING": np.array([[backing.encode()]] * len(x), dtype=object)}
"""


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the slow model keeps a marker file while it runs a batch."""
    return tmp_path_factory.mktemp("running")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, example_repo: Path, running: Path) -> Path:
    """The bundled MLP beside a Python model that holds each batch for a while, with a marker file
    saying when one is running (to unregister a region in the middle of a request)."""
    root = tmp_path_factory.mktemp("shm-repo")
    shutil.copytree(example_repo / "mlp", root / "mlp")
    write_python_model(
        root,
        "slow",
        width=4,
        parameters={"delay_ms": 400, "running_dir": str(running)},
        health_check={"enabled": False},
    )
    write_python_model(
        root,
        "where",
        code=WHERE_MODEL,
        outputs=[
            {"name": "OUTPUT", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "BACKING", "datatype": "BYTES", "shape": [-1, 1]},
        ],
        health_check={"enabled": False},
    )
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with ServerProcess("--model-repository", str(repo), "--shared-memory", "system") as server:
        yield server


class Regions:
    """Shared-memory objects this test created, destroyed at the end whatever happened."""

    def __init__(self) -> None:
        self.handles: list[Any] = []

    def create(self, size: int) -> tuple[str, Any]:
        key = f"/tg-test-{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key.strip("/"), key, size)
        self.handles.append(handle)
        return key, handle

    def destroy(self, handle: Any) -> None:
        if handle in self.handles:
            self.handles.remove(handle)
            shm.destroy_shared_memory_region(handle)

    def close(self) -> None:
        for handle in list(self.handles):
            self.destroy(handle)


@pytest.fixture
def regions() -> Iterator[Regions]:
    created = Regions()
    try:
        yield created
    finally:
        created.close()


def _expected(server: ServerProcess) -> np.ndarray:
    with httpclient.InferenceServerClient(server.http_address) as client:
        request = httpclient.InferInput("features", [1, 16], "FP32")
        request.set_data_from_numpy(FEATURES)
        result = client.infer("mlp", [request])
        answer = result.as_numpy("probabilities")
        assert answer is not None
        return answer


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_through_shared_memory(server: ServerProcess, regions: Regions, protocol: str) -> None:
    expected = _expected(server)
    in_key, in_handle = regions.create(FEATURES.nbytes + 128)
    out_key, out_handle = regions.create(256)
    shm.set_shared_memory_region(in_handle, [FEATURES], offset=128)  # a window past a header
    client: Any
    module: Any
    if protocol == "http":
        client, module = httpclient.InferenceServerClient(server.http_address), httpclient
    else:
        client, module = grpcclient.InferenceServerClient(server.grpc_address), grpcclient
    try:
        client.unregister_system_shared_memory()
        client.register_system_shared_memory("input", in_key, FEATURES.nbytes + 128)
        client.register_system_shared_memory("output", out_key, 128, offset=64)
        request = module.InferInput("features", [1, 16], "FP32")
        request.set_shared_memory("input", FEATURES.nbytes, offset=128)
        output = module.InferRequestedOutput("probabilities")
        output.set_shared_memory("output", expected.nbytes, offset=16)
        result = client.infer("mlp", [request], outputs=[output])
        answer = result.get_output("probabilities")
        # As Triton answers: name, datatype and shape, no data and no parameters (Triton's C++ client
        # reads binary_data_size from any output with parameters), and over gRPC one empty raw entry.
        if protocol == "http":
            assert answer == {"name": "probabilities", "datatype": "FP32", "shape": [1, 3]}
        else:
            assert not answer.parameters and list(answer.shape) == [1, 3] and answer.datatype == "FP32"
            assert list(result.get_response().raw_output_contents) == [b""]
        # The output region's window starts 64 bytes into the object, and the output 16 bytes into it.
        written = shm.get_contents_as_numpy(out_handle, np.float32, [1, 3], offset=64 + 16)
        np.testing.assert_allclose(written, expected, rtol=1e-6)

        status = client.get_system_shared_memory_status()
        if protocol == "http":
            listed = {region["name"]: region for region in status}
            assert listed["output"] == {"name": "output", "key": out_key, "offset": 64, "byte_size": 128}
        else:
            listed = dict(status.regions)
            assert listed["output"].key == out_key and listed["output"].offset == 64
            assert listed["output"].byte_size == 128
        assert set(listed) == {"input", "output"}
        client.unregister_system_shared_memory("input")
        remaining = client.get_system_shared_memory_status()
        names = [r["name"] for r in remaining] if protocol == "http" else list(remaining.regions)
        assert names == ["output"]
        client.unregister_system_shared_memory()
        empty = client.get_system_shared_memory_status()
        assert (len(empty) if protocol == "http" else len(empty.regions)) == 0
    finally:
        client.unregister_system_shared_memory()
        client.close()


def test_grpc_mixed_outputs_and_raw_inputs(server: ServerProcess, regions: Regions) -> None:
    """Some tensors in shared memory, others in the message: each reads and answers right."""
    key, handle = regions.create(4 * 4 * 2)
    shm.set_shared_memory_region(handle, [np.arange(8, dtype=np.float32).reshape(2, 4)])
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        client.register_system_shared_memory("slow-in", key, 32)
        try:
            request = grpcclient.InferInput("INPUT", [2, 4], "FP32")
            request.set_shared_memory("slow-in", 32)
            result = client.infer("slow", [request], outputs=[grpcclient.InferRequestedOutput("OUTPUT")])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT"), np.arange(8, dtype=np.float32).reshape(2, 4) + 1)
        finally:
            client.unregister_system_shared_memory("slow-in")


def _register(server: ServerProcess, name: str, **document: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/systemsharedmemory/region/{name}/register", json=document)


def test_bad_registrations_are_refused_with_400(server: ServerProcess, regions: Regions, tmp_path: Path) -> None:
    key, _ = regions.create(64)
    outside = tmp_path / "secret"
    outside.write_bytes(b"x" * 4096)
    link = SHM / f"tg-test-link-{uuid.uuid4().hex[:8]}"
    link.symlink_to(outside)
    try:
        bad = {
            "past the end": ("r1", {"key": key, "offset": 0, "byte_size": 65}),
            "offset past the end": ("r2", {"key": key, "offset": 60, "byte_size": 8}),
            "negative offset": ("r3", {"key": key, "offset": -1, "byte_size": 8}),
            "zero size": ("r4", {"key": key, "offset": 0, "byte_size": 0}),
            "size not a number": ("r5", {"key": key, "offset": 0, "byte_size": "64"}),
            "escapes /dev/shm": ("r6", {"key": "../../etc/passwd", "offset": 0, "byte_size": 8}),
            "a path below it": ("r7", {"key": "/a/b", "offset": 0, "byte_size": 8}),
            "dot-dot": ("r8", {"key": "..", "offset": 0, "byte_size": 8}),
            "absolute path": ("r9", {"key": str(outside), "offset": 0, "byte_size": 8}),
            "a symlink out": ("r10", {"key": link.name, "offset": 0, "byte_size": 8}),
            "missing": ("r11", {"key": "/tg-test-no-such-region", "offset": 0, "byte_size": 8}),
            "no key": ("r12", {"offset": 0, "byte_size": 8}),
            "bad name": ("a%20b", {"key": key, "offset": 0, "byte_size": 8}),
        }
        for what, (name, document) in bad.items():
            answer = _register(server, name, **document)
            assert answer.status_code == 400, (what, answer.text)
            message = answer.json()["error"]
            assert "/dev/shm" not in message and str(tmp_path) not in message and "passwd" not in message, message
        assert _register(server, "twice", key=key, offset=0, byte_size=64).status_code == 200
        again = _register(server, "twice", key=key, offset=0, byte_size=64)
        assert again.status_code == 400 and "already registered" in again.json()["error"]
        status = httpx.get(f"{server.url}/v2/systemsharedmemory/status").json()
        assert [region["name"] for region in status] == ["twice"]  # nothing of the refused ones
        missing = httpx.post(f"{server.url}/v2/systemsharedmemory/region/nope/unregister")
        assert missing.status_code == 400 and "nope" in missing.json()["error"]
    finally:
        link.unlink()
        httpx.post(f"{server.url}/v2/systemsharedmemory/unregister")
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def _infer_with(server: ServerProcess, parameters: dict[str, Any]) -> httpx.Response:
    body = {"inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "parameters": parameters}]}
    return httpx.post(f"{server.url}/v2/models/mlp/infer", json=body)


def test_bad_tensor_windows_are_refused_with_400(server: ServerProcess, regions: Regions) -> None:
    key, _ = regions.create(4096)
    assert _register(server, "win", key=key, offset=1024, byte_size=128).status_code == 200
    try:
        region = {"shared_memory_region": "win"}
        bad = {
            "past the window": {**region, "shared_memory_byte_size": 64, "shared_memory_offset": 65},
            "larger than the window": {**region, "shared_memory_byte_size": 256},
            "size unlike the shape": {**region, "shared_memory_byte_size": 60},
            "negative offset": {**region, "shared_memory_byte_size": 64, "shared_memory_offset": -8},
            "no byte size": dict(region),
            "unknown region": {"shared_memory_region": "other", "shared_memory_byte_size": 64},
            "region not a string": {"shared_memory_region": 7, "shared_memory_byte_size": 64},
        }
        for what, parameters in bad.items():
            answer = _infer_with(server, parameters)
            assert answer.status_code == 400, (what, answer.text)
            assert "/dev/shm" not in answer.json()["error"]
        good = _infer_with(server, {**region, "shared_memory_byte_size": 64, "shared_memory_offset": 64})
        assert good.status_code == 200, good.text

        # The object shrinks under a registered region: refused before a byte is read (no SIGBUS).
        os.truncate(SHM / key.strip("/"), 1024 + 32)
        shrunk = _infer_with(server, {**region, "shared_memory_byte_size": 64})
        assert shrunk.status_code == 400 and "smaller than when it was registered" in shrunk.json()["error"]
    finally:
        httpx.post(f"{server.url}/v2/systemsharedmemory/region/win/unregister")
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def _grpc_infer_with(server: ServerProcess, parameters: dict[str, Any]) -> grpc.RpcError:
    """A ModelInfer whose one input names its shared memory with exactly ``parameters`` (built by
    hand: tritonclient's InferInput only sends well-formed ones); the error it was refused with."""
    request = pb.ModelInferRequest(model_name="mlp")
    tensor = request.inputs.add(name="features", datatype="FP32", shape=[1, 16])
    for key, value in parameters.items():
        if isinstance(value, str):
            tensor.parameters[key].string_param = value
        else:
            tensor.parameters[key].int64_param = value
    with grpc.insecure_channel(server.grpc_address) as channel, pytest.raises(grpc.RpcError) as caught:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    return caught.value


def test_grpc_bad_tensor_windows_are_invalid_argument(server: ServerProcess, regions: Regions) -> None:
    key, _ = regions.create(4096)
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        client.register_system_shared_memory("gwin", key, 128, offset=1024)
        try:
            region = {"shared_memory_region": "gwin"}
            bad = {
                "past the window": {**region, "shared_memory_byte_size": 64, "shared_memory_offset": 65},
                "larger than the window": {**region, "shared_memory_byte_size": 256},
                "size unlike the shape": {**region, "shared_memory_byte_size": 60},
                "negative offset": {**region, "shared_memory_byte_size": 64, "shared_memory_offset": -8},
                "negative size": {**region, "shared_memory_byte_size": -64},
                "size not a number": {**region, "shared_memory_byte_size": "64"},
                "no byte size": dict(region),
                "unknown region": {"shared_memory_region": "other", "shared_memory_byte_size": 64},
                "region not a string": {"shared_memory_region": 7, "shared_memory_byte_size": 64},
            }
            for what, parameters in bad.items():
                error = _grpc_infer_with(server, parameters)
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (what, error.details())
                assert "/dev/shm" not in (error.details() or ""), (what, error.details())
            request = grpcclient.InferInput("features", [1, 16], "FP32")
            request.set_shared_memory("gwin", 64, offset=64)
            assert client.infer("mlp", [request]).as_numpy("probabilities") is not None  # the good window
        finally:
            client.unregister_system_shared_memory("gwin")
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def test_an_input_from_shared_memory_reaches_the_model_without_a_copy(server: ServerProcess, regions: Regions) -> None:
    """A single request's input is a view of the registered mapping when the model gets it: the
    memory backing the array is the region's object in /dev/shm, where an inline input's is not."""
    values = np.arange(4, dtype=np.float32).reshape(1, 4)
    key, handle = regions.create(values.nbytes)
    shm.set_shared_memory_region(handle, [values])
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        client.register_system_shared_memory("zero-copy", key, values.nbytes)
        try:
            from_region = grpcclient.InferInput("INPUT", [1, 4], "FP32")
            from_region.set_shared_memory("zero-copy", values.nbytes)
            result = client.infer("where", [from_region])
            inline = grpcclient.InferInput("INPUT", [1, 4], "FP32")
            inline.set_data_from_numpy(values)
            copied = client.infer("where", [inline])
        finally:
            client.unregister_system_shared_memory("zero-copy")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT"), values + 1)
    assert result.as_numpy("BACKING")[0, 0].decode() == f"/dev/shm/{key.strip('/')}"
    assert "/dev/shm/" not in copied.as_numpy("BACKING")[0, 0].decode()


def test_an_output_too_large_for_its_window_is_refused(server: ServerProcess, regions: Regions) -> None:
    key, _ = regions.create(64)
    assert _register(server, "small", key=key, offset=0, byte_size=8).status_code == 200
    try:
        body = {
            "inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32", "data": FEATURES.ravel().tolist()}],
            "outputs": [
                {
                    "name": "probabilities",
                    "parameters": {"shared_memory_region": "small", "shared_memory_byte_size": 8},
                }
            ],
        }
        answer = httpx.post(f"{server.url}/v2/models/mlp/infer", json=body)
        assert answer.status_code == 400 and "needs 12 bytes" in answer.json()["error"]
    finally:
        httpx.post(f"{server.url}/v2/systemsharedmemory/region/small/unregister")


def test_unregistering_during_a_request_leaves_its_memory_readable(
    server: ServerProcess, regions: Regions, running: Path
) -> None:
    """The region goes from the namespace at once; the request that holds it finishes on the same
    bytes, and the next request naming it is refused."""
    values = np.arange(32, dtype=np.float32).reshape(8, 4)
    in_key, in_handle = regions.create(values.nbytes)
    out_key, out_handle = regions.create(values.nbytes)
    shm.set_shared_memory_region(in_handle, [values])
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        client.register_system_shared_memory("race-in", in_key, values.nbytes)
        client.register_system_shared_memory("race-out", out_key, values.nbytes)
        try:
            request = grpcclient.InferInput("INPUT", [8, 4], "FP32")
            request.set_shared_memory("race-in", values.nbytes)
            output = grpcclient.InferRequestedOutput("OUTPUT")
            output.set_shared_memory("race-out", values.nbytes)
            done = threading.Event()
            outcome: dict[str, Any] = {}

            def answered(result: Any, error: Any) -> None:
                outcome.update(result=result, error=error)
                done.set()

            client.async_infer("slow", [request], answered, outputs=[output])
            _wait_for(lambda: any(running.iterdir()) or done.is_set())
            assert not done.is_set(), outcome  # the model is running on the region
            # The client unregisters and destroys its input region while the model runs on it.
            client.unregister_system_shared_memory("race-in")
            regions.destroy(in_handle)
            assert done.wait(30)
            assert outcome["error"] is None, outcome
            written = shm.get_contents_as_numpy(out_handle, np.float32, [8, 4])
            np.testing.assert_array_equal(written, values + 1)
            with pytest.raises(InferenceServerException, match="no shared-memory region 'race-in'"):
                client.infer("slow", [request])
        finally:
            client.unregister_system_shared_memory()
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def test_unregistering_an_output_region_during_a_request_lets_it_finish(
    server: ServerProcess, regions: Regions, running: Path
) -> None:
    """The output's window was taken when the request was decoded: unregistered while the model runs,
    the region leaves the namespace at once, and the request still ends cleanly, writing into the
    same object (still mapped), which the client kept and can read."""
    values = np.arange(32, dtype=np.float32).reshape(8, 4)
    out_key, out_handle = regions.create(values.nbytes)
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        client.register_system_shared_memory("late-out", out_key, values.nbytes)
        try:
            request = grpcclient.InferInput("INPUT", [8, 4], "FP32")
            request.set_data_from_numpy(values)
            output = grpcclient.InferRequestedOutput("OUTPUT")
            output.set_shared_memory("late-out", values.nbytes)
            done = threading.Event()
            outcome: dict[str, Any] = {}

            def answered(result: Any, error: Any) -> None:
                outcome.update(result=result, error=error)
                done.set()

            client.async_infer("slow", [request], answered, outputs=[output])
            _wait_for(lambda: any(running.iterdir()) or done.is_set())
            assert not done.is_set(), outcome  # the model is running; its output goes to the region
            client.unregister_system_shared_memory("late-out")
            assert len(client.get_system_shared_memory_status().regions) == 0
            assert done.wait(30)
            assert outcome["error"] is None, outcome
            answer = outcome["result"].get_output("OUTPUT")
            assert not answer.parameters and list(answer.shape) == [8, 4]
            written = shm.get_contents_as_numpy(out_handle, np.float32, [8, 4])
            np.testing.assert_array_equal(written, values + 1)
            with pytest.raises(InferenceServerException, match="no shared-memory region 'late-out'"):
                client.infer("slow", [request], outputs=[output])
        finally:
            client.unregister_system_shared_memory()
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def _wait_for(condition: Any, timeout_s: float = 30.0) -> None:
    """Poll a condition that the server's progress makes true (a file it writes), up to a deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.005)


def test_the_extension_is_listed_when_on(server: ServerProcess, example_server: ServerProcess) -> None:
    assert "system_shared_memory" in httpx.get(f"{server.url}/v2").json()["extensions"]
    assert "system_shared_memory" not in httpx.get(f"{example_server.url}/v2").json()["extensions"]


def test_cuda_shared_memory_answers_as_triton_without_a_gpu(server: ServerProcess) -> None:
    """As Triton built without GPU support: registering is refused (400, INVALID_ARGUMENT, saying GPUs
    are not supported); the status lists nothing and unregistering succeeds, one region or all, so
    clients that clean up CUDA regions they never made (Triton's examples, perf_analyzer) go on."""
    assert "cuda_shared_memory" not in httpx.get(f"{server.url}/v2").json()["extensions"]
    base = f"{server.url}/v2/cudasharedmemory"
    document = {"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 8}
    refused = httpx.post(f"{base}/region/g/register", json=document)
    assert refused.status_code == 400
    assert refused.json()["error"].startswith("failed to register CUDA shared memory region: 'g', GPUs not supported")
    assert httpx.get(f"{base}/status").json() == []
    unknown = httpx.get(f"{base}/region/g/status")
    assert unknown.status_code == 404 and "Unable to find cuda shared memory region: 'g'" in unknown.json()["error"]
    for route in ("region/g/unregister", "unregister"):
        assert httpx.post(f"{base}/{route}").status_code == 200, route
    for module, address in ((httpclient, server.http_address), (grpcclient, server.grpc_address)):
        client: Any = module.InferenceServerClient(address)
        try:
            client.unregister_cuda_shared_memory()
            client.unregister_cuda_shared_memory("g")
            status = client.get_cuda_shared_memory_status()
            assert (status == []) if module is httpclient else (len(status.regions) == 0)
            with pytest.raises(InferenceServerException) as caught:
                client.register_cuda_shared_memory("g", b"", 0, 8)
            assert "GPUs not supported" in str(caught.value.message())
            if module is grpcclient:
                assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        finally:
            client.close()


def test_grpc_bad_registration_is_invalid_argument(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_address) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.register_system_shared_memory("g", "../../etc/passwd", 8)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "passwd" not in str(caught.value.message())
    with grpc.insecure_channel(server.grpc_address) as channel:  # the server still answers
        grpc.channel_ready_future(channel).result(timeout=10)


def test_the_documented_example_runs_as_written(server: ServerProcess, tmp_path: Path) -> None:
    """The example of docs/shared-memory.md, with only the address changed."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "shared-memory.md").read_text(encoding="utf-8")
    section = page[page.index("## An example") :]
    example = section[section.index("```python\n") + len("```python\n") : section.index("```\n", 10)]
    # Its own keys, so parallel runs of the suite do not meet in /dev/shm.
    suffix = uuid.uuid4().hex[:8]
    example = example.replace("localhost:8080", server.http_address)
    example = example.replace('"/features"', f'"/features-{suffix}"').replace('"/probabilities"', f'"/prob-{suffix}"')
    script = tmp_path / "example.py"
    script.write_text(example)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    printed = np.array([float(v) for v in result.stdout.replace("[", " ").replace("]", " ").split()], dtype=np.float32)
    with httpclient.InferenceServerClient(server.http_address) as client:
        x = httpclient.InferInput("features", [1, 16], "FP32")
        x.set_data_from_numpy(np.ones((1, 16), np.float32))
        expected = client.infer("mlp", [x]).as_numpy("probabilities")
    np.testing.assert_allclose(printed, np.asarray(expected).ravel(), rtol=1e-5)
