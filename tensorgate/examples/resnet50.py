"""ResNet-50 in torch: torchvision's ``resnet50(weights=None)``, layer for layer, with its initialization.

Written out here because torchvision's wheels import only beside their own torch build. Bottleneck
blocks [3, 4, 6, 3] with the stride on the 3x3 convolution (ResNet v1.5, torchvision's), 25.6 M
parameters; the exported graph adds a softmax, so it answers ``probabilities`` as the bundled
``cnn`` does.
"""

from __future__ import annotations

import torch
from torch import nn

SIZE = 224
CLASSES = 1000
BLOCKS = (3, 4, 6, 3)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, blocks: tuple[int, ...] = BLOCKS, width: int = 64, classes: int = CLASSES) -> None:
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(width, blocks[0])
        self.layer2 = self._layer(width * 2, blocks[1], 2)
        self.layer3 = self._layer(width * 4, blocks[2], 2)
        self.layer4 = self._layer(width * 8, blocks[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * Bottleneck.expansion, classes)
        for m in self.modules():  # torchvision's initialization
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * Bottleneck.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(planes * Bottleneck.expansion),
            )
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Classifier(nn.Module):
    """The network and a softmax: ``image`` FP32 [N, 3, 224, 224] -> ``probabilities`` FP32 [N, 1000]."""

    def __init__(self, net: ResNet) -> None:
        super().__init__()
        self.net = net

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.net(image).softmax(1)


def build(seed: int = 7, width: int = 64, blocks: tuple[int, ...] = BLOCKS) -> Classifier:
    """ResNet-50 with random weights (fixed seed); ``width`` 64 is torchvision's, smaller for tests."""
    torch.manual_seed(seed)
    return Classifier(ResNet(blocks, width)).eval()


def export_onnx(model: Classifier, path: str, opset: int = 17) -> None:
    torch.onnx.export(
        model,
        (torch.zeros(1, 3, SIZE, SIZE),),
        path,
        input_names=["image"],
        output_names=["probabilities"],
        dynamic_axes={"image": {0: "batch"}, "probabilities": {0: "batch"}},
        opset_version=opset,
        dynamo=False,
    )


def export_program(model: Classifier, path: str, max_batch: int = 64) -> None:
    """The same network for ``backend: torch``, as a ``torch.export`` program with a free batch axis."""
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    with torch.no_grad():
        program = torch.export.export(model, (torch.zeros(2, 3, SIZE, SIZE),), dynamic_shapes={"image": {0: batch}})
    torch.export.save(program, path)
