"""V1 ``:predict`` meets the same routing as every other way in: one version is picked per request.

Under a traffic split whose versions take different inputs, a request is decoded against the
version it then runs on (it used to decode against one pick and run on another). Generation's
side of the same door: ``tests/llm/test_generation_traffic.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import yaml
from onnx import TensorProto, helper

from tensorgate.models.traffic import key_point, pick
from tensorgate.testing import ServerProcess

STICKY = "x-user"


def _adder(input_name: str, addend: float) -> bytes:
    """``output`` = ``input_name`` + ``addend``, FP32 [-1, 4]."""
    graph = helper.make_graph(
        [helper.make_node("Add", [input_name, "addend"], ["output"])],
        "adder",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor("addend", TensorProto.FLOAT, [1], [addend])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture(scope="module")
def split_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``split``: version 1 takes ``a`` and adds 1, version 2 takes ``b`` and adds 2; 50/50 by sticky key."""
    repo = tmp_path_factory.mktemp("split")
    for version, (name, addend) in {1: ("a", 1.0), 2: ("b", 2.0)}.items():
        (repo / "split" / str(version)).mkdir(parents=True)
        (repo / "split" / str(version) / "model.onnx").write_bytes(_adder(name, addend))
    config = {"max_batch_size": 8, "traffic": {"weights": {1: 50, 2: 50}, "sticky_header": STICKY}}
    (repo / "split" / "config.yaml").write_text(yaml.safe_dump(config))
    with ServerProcess("--model-repository", str(repo)) as server:
        yield server


def _key_for(version: int) -> str:
    """A sticky key the 50/50 split sends to ``version``."""
    for index in range(1000):
        key = f"user-{index}"
        if pick([(1, 50.0), (2, 50.0)], key_point(key)) == version:
            return key
    raise AssertionError("no key found")


@pytest.mark.parametrize("version", [1, 2])
def test_v1_decodes_against_the_version_it_runs_on(split_server: ServerProcess, version: int) -> None:
    headers = {STICKY: _key_for(version)}
    with httpx.Client(base_url=split_server.url, timeout=10) as client:
        for _ in range(20):  # a decode against the other version's input would fail half of these
            answer = client.post("/v1/models/split:predict", json={"instances": [[1, 2, 3, 4]]}, headers=headers)
            assert answer.status_code == 200, answer.text
            assert answer.json()["predictions"] == [[1 + version, 2 + version, 3 + version, 4 + version]]


def test_v1_errors_name_the_version_it_would_run_on(split_server: ServerProcess) -> None:
    headers = {STICKY: _key_for(2)}
    with httpx.Client(base_url=split_server.url, timeout=10) as client:
        answer = client.post("/v1/models/split:predict", json={"inputs": {"a": [[1, 2, 3, 4]]}}, headers=headers)
    assert answer.status_code == 400
    assert "'a'" in answer.json()["error"]  # version 2 takes 'b': the named input is refused by it
