"""``backend: torch`` end to end: a TorchScript file and a torch.export program, served as exported,
answer what the same module answers in-process (1e-5), batch concurrent requests, and fail their
load with a message when config.yaml does not fit the model or the device is missing."""

from __future__ import annotations

import concurrent.futures
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml

torch = pytest.importorskip("torch")

from tensorgate.testing import ServerProcess  # noqa: E402


class Net(torch.nn.Module):  # type: ignore[misc]
    """Two outputs, to check that they come back by their declared names."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.hidden = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.hidden(x))
        logits = self.head(h)
        return logits, torch.softmax(logits, dim=-1)


CONFIG: dict[str, Any] = {
    "backend": "torch",
    "max_batch_size": 8,
    "dynamic_batching": {"max_queue_delay_ms": 20},
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}],
    "outputs": [
        {"name": "logits", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]},
    ],
    "torch": {"intra_op_threads": 1},
    "health_check": {"enabled": False},
}


def _write(repo: Path, name: str, filename: str, module: Any, config: dict[str, Any]) -> None:
    directory = repo / name / "1"
    directory.mkdir(parents=True)
    if filename == "model.pt":
        with warnings.catch_warnings():  # TorchScript is deprecated, but it is what many teams have
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.save(torch.jit.script(module), directory / filename)
    else:
        batch = torch.export.Dim("batch", min=1, max=64)
        program = torch.export.export(module, (torch.zeros(2, 8),), dynamic_shapes={"x": {0: batch}})
        torch.export.save(program, directory / filename)
    (repo / name / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def net() -> Net:
    return Net().eval()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, net: Net) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("torch-repo")
    _write(repo, "scripted", "model.pt", net, CONFIG)
    _write(repo, "exported", "model.pt2", net, CONFIG)
    wrong = {**CONFIG, "outputs": CONFIG["outputs"][:1]}  # the model returns two
    _write(repo, "wrong_outputs", "model.pt", net, wrong)
    _write(repo, "on_gpu", "model.pt", net, {**CONFIG, "instance_group": [{"kind": "gpu", "count": 1}]})
    no_inputs = {k: v for k, v in CONFIG.items() if k != "inputs"}
    _write(repo, "undeclared", "model.pt", net, no_inputs)
    with ServerProcess("--model-repository", str(repo), wait_ready=False) as server:
        server.wait_loaded()
        yield server


def _expected(net: Net, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.inference_mode():
        logits, probabilities = net(torch.from_numpy(x))
    return logits.numpy(), probabilities.numpy()


@pytest.mark.parametrize("model", ["scripted", "exported"])
def test_outputs_equal_torch_in_process(server: ServerProcess, net: Net, model: str) -> None:
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    logits, probabilities = _expected(net, x)
    body = {"inputs": [{"name": "x", "shape": [3, 8], "datatype": "FP32", "data": x.ravel().tolist()}]}
    answer = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body)
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in answer.json()["outputs"]}
    np.testing.assert_allclose(outputs["logits"], logits, atol=1e-5)
    np.testing.assert_allclose(outputs["probabilities"], probabilities, atol=1e-5)
    assert httpx.get(f"{server.url}/v2/models/{model}").json()["platform"] == "pytorch_libtorch"


def test_concurrent_requests_are_batched(server: ServerProcess, net: Net) -> None:
    rows = np.random.default_rng(2).standard_normal((16, 1, 8)).astype(np.float32)
    before = httpx.get(f"{server.url}/v2/models/scripted/stats").json()["model_stats"][0]

    def infer(x: np.ndarray) -> np.ndarray:
        with grpcclient.InferenceServerClient(server.grpc_address) as client:
            request = grpcclient.InferInput("x", [1, 8], "FP32")
            request.set_data_from_numpy(x)
            return np.asarray(client.infer("scripted", [request]).as_numpy("logits"))

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(infer, rows))
    for x, answer in zip(rows, answers, strict=True):
        np.testing.assert_allclose(answer, _expected(net, x)[0], atol=1e-5)
    after = httpx.get(f"{server.url}/v2/models/scripted/stats").json()["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 16
    assert after["execution_count"] - before["execution_count"] < 16  # some requests shared a batch


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("wrong_outputs", "returns 2 output(s); config.yaml declares 1"),
        ("on_gpu", "no CUDA device"),
        ("undeclared", "declares its inputs in config.yaml"),
    ],
)
def test_a_model_that_does_not_fit_fails_its_load_with_the_reason(
    server: ServerProcess, model: str, reason: str
) -> None:
    if model == "on_gpu" and torch.cuda.is_available():
        pytest.skip("this host has a CUDA device")
    index = httpx.get(f"{server.url}/v2/models/{model}/ready")
    assert index.status_code != 200
    assert reason in server.log()
