"""``tensorgate bench`` against a real ``tensorgate serve``: counts agree with the server's own metrics."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest

from tensorgate.bench.inputs import Tensor
from tensorgate.bench.server_metrics import parse_samples
from tensorgate.bench.targets.base import parse_endpoint
from tensorgate.bench.targets.grpc_v2 import GrpcStreamTarget, GrpcTarget, infer_request_bytes
from tensorgate.cli.main import main
from tensorgate.testing import ServerProcess

SUCCESS_KEY = "tensorgate_requests_total"


def _successes(server: ServerProcess) -> float:
    samples = parse_samples(httpx.get(server.metrics_url, timeout=5.0).text)
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == SUCCESS_KEY and dict(labels).get("model") == "mlp" and dict(labels).get("outcome") == "success"
    )


@pytest.mark.parametrize(
    ("protocol", "load"), [("v2-json", ["-n", "300"]), ("v2-binary", ["-n", "300"]), ("v2-binary", ["-z", "2s"])]
)
def test_request_count_matches_the_server_counter(
    example_server: ServerProcess, tmp_path: Path, protocol: str, load: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    before = _successes(example_server)
    out = tmp_path / "report.json"
    code = main(
        ["bench", "mlp", "-u", example_server.url, "--protocol", protocol, "-c", "4", *load, "--json", str(out),
         "--metrics-url", example_server.metrics_url, "--slo", "p99=5s"]
    )  # fmt: skip
    served = _successes(example_server) - before
    assert code == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["errors"] == {}
    assert run["server"]["requests_by_outcome"] == {"success": served}
    assert run["server"]["mean_batch_size"] >= 1
    if load[0] == "-n":  # every request sent is counted
        assert run["requests"] == served == 300
    else:  # what completes inside the window; each of the 4 clients' last request may end after it
        assert 0 < run["requests"] <= served <= run["requests"] + 4
        assert run["elapsed_s"] == pytest.approx(2.0)
    assert "c=4" in capsys.readouterr().out


def test_open_loop_with_csv_and_plot(example_server: ServerProcess, tmp_path: Path) -> None:
    before = _successes(example_server)
    csv_path, png = tmp_path / "r.csv", tmp_path / "cdf.png"
    code = main(
        ["bench", "-m", "mlp", "-u", example_server.url, "--rate", "200", "-n", "150", "--csv", str(csv_path),
         "--plot", str(png)]
    )  # fmt: skip
    assert code == 0
    with csv_path.open(newline="") as handle:
        (row,) = csv.DictReader(handle)
    assert row["mode"] == "rate" and row["requests"] == "150"
    assert _successes(example_server) - before == 150
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missed_slo_exits_3(example_server: ServerProcess) -> None:
    assert main(["bench", "mlp", "-u", example_server.url, "-n", "20", "--slo", "p50=1us"]) == 3


def test_sweep_over_two_processes(example_server: ServerProcess, tmp_path: Path) -> None:
    before = _successes(example_server)
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    code = main(
        ["bench", "mlp", "-u", example_server.url, "--protocol", "v1", "--sweep", "2,4", "-n", "100",
         "--processes", "2", "--json", str(out), "--plot", str(png)]
    )  # fmt: skip
    assert code == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["level"] for r in runs] == [2, 4]
    assert all(r["requests"] == 100 and r["errors"] == {} for r in runs)
    assert _successes(example_server) - before == 200
    assert png.stat().st_size > 0


def test_unknown_model_fails_cleanly(example_server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "nope", "-u", example_server.url, "-n", "1"]) == 1
    assert "404" in capsys.readouterr().err


def test_input_file_and_shape_override(example_server: ServerProcess, tmp_path: Path) -> None:
    requests = tmp_path / "requests.json"
    rows = [[0.1] * 16, [0.2] * 16]
    requests.write_text(
        json.dumps([{"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 16], "data": rows}]}])
    )
    before = _successes(example_server)
    assert main(["bench", "mlp", "-u", example_server.url, "-n", "10", "--input-file", str(requests)]) == 0
    assert main(["bench", "mlp", "-u", example_server.url, "-n", "10", "--shape", "features=3,16"]) == 0
    assert _successes(example_server) - before == 20
    assert main(["bench", "mlp", "-u", example_server.url, "-n", "1", "--shape", "nope=1"]) == 1


@pytest.mark.parametrize("protocol", ["grpc", "grpc-stream"])
def test_grpc_count_matches_the_server_counter(example_server: ServerProcess, tmp_path: Path, protocol: str) -> None:
    before = _successes(example_server)
    out = tmp_path / "report.json"
    code = main(
        ["bench", "mlp", "-u", example_server.grpc_address, "--protocol", protocol, "-c", "3", "-n", "150",
         "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["errors"] == {}
    assert run["requests"] == 150 == _successes(example_server) - before


def test_grpc_clients_each_have_their_own_connection(example_server: ServerProcess) -> None:
    # Like the HTTP targets: c calls in flight hold c connections, reused call after call.
    features = Tensor("features", "FP32", np.zeros((1, 16), np.float32))
    request = infer_request_bytes("mlp", None, (features,))
    port = example_server.ports["grpc"]

    def connections() -> int:  # this process's connections to the gRPC port
        me = psutil.Process()
        # net_connections from psutil 6 on; kserve, in the test dependencies, holds psutil below 6
        list_connections = getattr(me, "net_connections", None) or me.connections
        return sum(1 for c in list_connections("tcp") if c.raddr and c.raddr.port == port and c.status == "ESTABLISHED")

    async def run() -> tuple[int, int]:
        target = GrpcTarget(parse_endpoint(example_server.grpc_address, 8081), [request])
        try:
            for _ in range(3):
                outcomes = await asyncio.gather(*(target.call(i) for i in range(4)))
                assert all(o.error is None for o in outcomes)
            return len(target._all), connections()
        finally:
            await target.aclose()

    opened, during = asyncio.run(run())
    assert opened == 4
    assert during == 4


def _mlp_request(columns: int = 16) -> bytes:
    return infer_request_bytes("mlp", None, (Tensor("features", "FP32", np.zeros((1, columns), np.float32)),))


def test_grpc_stream_keeps_its_streams_through_failed_requests(example_server: ServerProcess) -> None:
    # A request the model refuses (17 features for 16) answers with error_message on a stream
    # that goes on: the same four streams carry every call.
    endpoint = parse_endpoint(example_server.grpc_address, 8081)

    async def run() -> tuple[list[str | None], int]:
        target = GrpcStreamTarget(endpoint, [_mlp_request(), _mlp_request(17)])
        try:
            errors = []
            for _ in range(3):
                outcomes = await asyncio.gather(*(target.call(i) for i in range(4)))
                errors += [o.error for o in outcomes]
            return errors, len(target._channels)
        finally:
            await target.aclose()

    before = _successes(example_server)
    errors, channels = asyncio.run(run())
    assert errors == [None, "grpc stream error", None, "grpc stream error"] * 3
    assert channels == 4
    assert _successes(example_server) - before == 6


def test_grpc_stream_cancelled_call_is_not_reused(example_server: ServerProcess) -> None:
    # The runner cancels a call at its timeout; an answer still on its way must not be read as the
    # next request's, so that stream is closed and the next call opens another, on the same
    # connection.
    endpoint = parse_endpoint(example_server.grpc_address, 8081)

    async def run() -> tuple[str | None, set[Any], set[Any], int]:
        target = GrpcStreamTarget(endpoint, [_mlp_request()])
        try:
            first = asyncio.create_task(target.call(0))
            await asyncio.sleep(0)  # the call has opened its stream and waits on the network
            cancelled = set(target._streams)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            outcome = await target.call(1)
            return outcome.error, cancelled, set(target._streams), len(target._channels)
        finally:
            await target.aclose()

    error, cancelled, after, channels = asyncio.run(run())
    assert error is None
    assert len(cancelled) == 1 and len(after) == 1 and not cancelled & after
    assert channels == 1
