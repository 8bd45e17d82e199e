"""The KServe Python SDK (``kserve`` from PyPI): its REST client (V2 and V1) and its gRPC client, with
its own ``InferRequest`` / ``InferInput``, against Triton's example repository served by tensorgate.

The SDK runs in a process of its own (``kserve_sdk_client.py``: it cannot share a process with
tritonclient); this test starts it and checks what it saw.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tensorgate.testing import ServerProcess

DIFFERENCES = [i - 1 for i in range(16)]


@pytest.fixture(scope="module")
def seen(triton_server: ServerProcess) -> dict[str, Any]:
    script = Path(__file__).with_name("kserve_sdk_client.py")
    done = subprocess.run(
        [sys.executable, str(script), triton_server.http_address, triton_server.grpc_address],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _sums_and_differences(outputs: dict[str, list[Any]]) -> tuple[list[int], list[int]]:
    return [int(v) for v in outputs["OUTPUT0"]], [int(v) for v in outputs["OUTPUT1"]]


EXPECTED = ([i + 1 for i in range(16)], DIFFERENCES)


def test_rest_v2_health_and_readiness(seen: dict[str, Any]) -> None:
    rest = seen["rest_v2"]
    assert (rest["live"], rest["ready"], rest["model_ready"], rest["unknown_model_ready"]) == (True, True, True, False)


@pytest.mark.parametrize("form", ["json", "binary"])
def test_rest_v2_infer_int32_and_bytes(seen: dict[str, Any], form: str) -> None:
    rest = seen["rest_v2"]
    assert rest[f"int32_{form}"]["id"] == "sdk-1"  # the SDK requires and reads the answer's id
    assert _sums_and_differences(rest[f"int32_{form}"]["outputs"]) == EXPECTED
    assert rest[f"bytes_{form}"]["OUTPUT0"] == [str(2 * i) for i in range(16)]
    assert rest[f"bytes_{form}"]["OUTPUT1"] == ["0"] * 16


def test_rest_v2_output_subset_and_errors(seen: dict[str, Any]) -> None:
    rest = seen["rest_v2"]
    assert rest["subset"] == ["OUTPUT1"]
    error = rest["unknown_model_error"]
    assert error["status"] == 404 and "Request for unknown model: 'nope' is not found" in error["message"]


def test_rest_v1(seen: dict[str, Any]) -> None:
    v1 = seen["rest_v1"]
    assert v1["live"] is True and v1["model_ready"] is True
    prediction = v1["predictions"][0]
    assert (prediction["OUTPUT0"], prediction["OUTPUT1"]) == EXPECTED


@pytest.mark.parametrize("form", ["contents", "raw"])
def test_grpc(seen: dict[str, Any], form: str) -> None:
    rpc = seen["grpc"]
    assert (rpc["live"], rpc["ready"], rpc["model_ready"]) == (True, True, True)
    assert rpc[f"int32_{form}"]["id"] == "sdk-1"
    assert _sums_and_differences(rpc[f"int32_{form}"]["outputs"]) == EXPECTED
    assert rpc[f"bytes_{form}"]["OUTPUT0"] == [str(2 * i) for i in range(16)]
    assert rpc["subset"] == ["OUTPUT0"]
    error = rpc["unknown_model_error"]
    assert error["code"] == "StatusCode.NOT_FOUND" and "Request for unknown model: 'nope'" in error["details"]
