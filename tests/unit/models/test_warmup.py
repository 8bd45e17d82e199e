"""Warm-up samples: zeros, random and file inputs shaped from the specs, run on every instance."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from tensorgate.backends.base import Device
from tensorgate.config.model_config import WarmupSample
from tensorgate.errors import ModelLoadError
from tensorgate.instances.base import Instance, ModelFailed
from tensorgate.models.warmup import build_sample, warm_up
from tensorgate.types import Array, DataType, TensorSpec

SPECS = (
    TensorSpec("image", DataType.FP32, (-1, 3, 4)),
    TensorSpec("ids", DataType.INT64, (-1, -1)),
    TensorSpec("flag", DataType.BOOL, (-1,)),
    TensorSpec("text", DataType.BYTES, (-1,)),
)


def test_zeros_take_the_batch_size_and_one_for_other_dynamic_dimensions(tmp_path: Path) -> None:
    sample = build_sample(WarmupSample(inputs="zeros", batch_size=4), SPECS, True, tmp_path)
    assert sample["image"].shape == (4, 3, 4) and sample["image"].dtype == np.float32 and not sample["image"].any()
    assert sample["ids"].shape == (4, 1) and sample["ids"].dtype == np.int64
    assert sample["flag"].dtype == np.bool_ and sample["text"].tolist() == [b""] * 4


def test_random_inputs_are_of_each_datatype_and_the_same_every_time(tmp_path: Path) -> None:
    first = build_sample(WarmupSample(inputs="random", batch_size=2), SPECS, True, tmp_path)
    again = build_sample(WarmupSample(inputs="random", batch_size=2), SPECS, True, tmp_path)
    assert first["image"].dtype == np.float32 and first["image"].std() > 0
    assert first["ids"].dtype == np.int64 and first["flag"].dtype == np.bool_
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])  # a fixed seed: reproducible warm-ups


def test_unbatched_models_keep_their_own_leading_dimension(tmp_path: Path) -> None:
    spec = (TensorSpec("x", DataType.FP32, (2, 5)),)
    assert build_sample(WarmupSample(batch_size=8), spec, False, tmp_path)["x"].shape == (2, 5)


def test_file_inputs_come_from_a_json_file_beside_the_config(tmp_path: Path) -> None:
    spec = (TensorSpec("x", DataType.FP32, (-1, 2)),)
    (tmp_path / "sample.json").write_text(json.dumps({"x": {"data": [1, 2, 3, 4], "shape": [2, 2]}}))
    sample = build_sample(WarmupSample(inputs="file", file="sample.json"), spec, True, tmp_path)
    assert sample["x"].dtype == np.float32 and sample["x"].tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("../outside.json", None, "must lie inside the model directory"),
        ("broken.json", "{not json", "cannot be read as JSON"),
        ("other.json", '{"y": {"data": [1]}}', "has no data for input 'x'"),
    ],
)
def test_bad_warm_up_files_fail_the_load(tmp_path: Path, name: str, content: str | None, message: str) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    target = (model_dir / name).resolve()
    target.write_text(content if content is not None else '{"x": {"data": [1, 2]}}')
    spec = (TensorSpec("x", DataType.FP32, (-1, 2)),)
    with pytest.raises(ModelLoadError, match=message):
        build_sample(WarmupSample(inputs="file", file=name), spec, True, model_dir)


class Recording(Instance):
    def __init__(self, name: str, fail: bool = False) -> None:
        super().__init__(name, Device())
        self.calls: list[tuple[int, ...]] = []
        self.fail = fail

    async def start(self) -> None:
        return None

    def input_specs(self) -> tuple[TensorSpec, ...]:
        return SPECS

    def output_specs(self) -> tuple[TensorSpec, ...]:
        return SPECS

    async def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.calls.append(inputs["image"].shape)
        if self.fail:
            raise ModelFailed("bad kernel")
        return dict(inputs)

    @property
    def healthy(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


async def test_every_sample_runs_its_count_on_every_instance(tmp_path: Path) -> None:
    instances = [Recording("a"), Recording("b")]
    samples = [WarmupSample(batch_size=1, count=2), WarmupSample(inputs="random", batch_size=4, count=1)]
    await asyncio.gather(*(warm_up(i, samples, SPECS, True, tmp_path) for i in instances))
    for instance in instances:
        assert instance.calls == [(1, 3, 4), (1, 3, 4), (4, 3, 4)]


async def test_a_model_that_fails_its_warm_up_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="warm-up sample 'first' failed: bad kernel"):
        await warm_up(Recording("a", fail=True), [WarmupSample(name="first")], SPECS, True, tmp_path)
