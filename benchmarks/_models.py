"""Models the benchmarks build for themselves (random weights, fixed seeds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Basic blocks per stage: ResNet-18 and ResNet-34 differ only in these.
RESNET_BLOCKS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


def resnet_input_stub() -> bytes:
    """An ONNX model with ResNet's input and output (FP32 [batch, 3, 224, 224] -> [batch, 1000]) that
    costs next to nothing to run: a mean per channel, then a fixed projection. Serving it measures
    what a ResNet-sized request costs the server and the client outside the model."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).standard_normal((3, 1000)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["input"], ["means"], axes=[2, 3], keepdims=0),
            helper.make_node("MatMul", ["means", "weights"], ["logits"]),
        ],
        "resnet_input_stub",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1000])],
        [numpy_helper.from_array(weights, "weights")],
    )
    return bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())


def export_resnet18(path: Path) -> Path:
    """A ResNet-18-shaped network (random weights), input ``input`` FP32 [batch, 3, 224, 224]."""
    return export_resnet(path, 18)


def export_resnet(path: Path, depth: int) -> Path:
    """A ResNet-``depth``-shaped network (18 or 34; random weights), input ``input`` FP32 [batch, 3, 224, 224]."""
    if path.exists():
        return path
    import torch

    model = resnet_module(depth)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        model,
        (torch.zeros(1, 3, 224, 224),),
        str(path),
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    return path


def trace_resnet(path: Path, depth: int) -> Path:
    """The same network as :func:`export_resnet` (the same seed, so the same weights), as TorchScript."""
    if path.exists():
        return path
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        traced = torch.jit.trace(resnet_module(depth), torch.zeros(1, 3, 224, 224))
    torch.jit.save(traced, str(path))
    return path


def resnet_module(depth: int) -> Any:
    """The ResNet-``depth``-shaped torch module, random weights from seed 0, in eval mode."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(y)) + self.down(x))

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
            )
            layers = []
            cin = 64
            stages = ((64, 1), (128, 2), (256, 2), (512, 2))
            for (cout, stride), blocks in zip(stages, RESNET_BLOCKS[depth], strict=True):
                layers += [Block(cin, cout, stride), *(Block(cout, cout, 1) for _ in range(blocks - 1))]
                cin = cout
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(torch.mean(x, dim=(2, 3), keepdim=True), 1))

    torch.manual_seed(0)
    return ResNet().eval()
